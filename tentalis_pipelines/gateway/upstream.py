"""Forwarding to an upstream OpenAI-compatible server (vLLM, llama.cpp, Ollama, another gateway) while
recording every call: the request goes on as the client sent it; the reply comes back as the server
sent it (streamed or not) and its choices are landed like the embedded backend's. Token ids and
log-probs are recorded when the server returns them (vLLM's ``return_token_ids``, OpenAI ``logprobs``);
with a local tokenizer (``--model``) the prompt ids are the locally templated prompt.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx


class UpstreamError(Exception):
    def __init__(self, status: int, body: Any):
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body


class Upstream:
    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)

    def first_model(self) -> str:
        """The first model the upstream lists (what the gateway serves when --model-name is not given)."""
        try:
            r = httpx.get(self.base_url + "/models", headers=self.client.headers, timeout=30)
            r.raise_for_status()
            return r.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise RuntimeError(f"cannot list the upstream's models at {self.base_url}/models ({type(exc).__name__}): "
                               "pass --model-name") from None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.client.post(path, json=body)
        if r.status_code >= 400:
            raise UpstreamError(r.status_code, _json_or_text(r))
        return r.json()

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | None]:
        """The upstream's SSE chunks as dicts; None for its ``[DONE]``."""
        async with self.client.stream("POST", path, json=body) as r:
            if r.status_code >= 400:
                await r.aread()
                raise UpstreamError(r.status_code, _json_or_text(r))
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    yield None
                    return
                yield json.loads(data)

    async def aclose(self) -> None:
        await self.client.aclose()


def _json_or_text(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return {"error": {"message": r.text[:2000], "type": "upstream_error"}}


class StreamAccumulator:
    """Rebuilds each choice (content, tool calls, token ids, log-probs, finish) from streamed chunks."""

    def __init__(self) -> None:
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.id: str | None = None
        self.prompt_token_ids: list[int] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        self.id = self.id or chunk.get("id")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("prompt_token_ids"):
            self.prompt_token_ids = chunk["prompt_token_ids"]
        for ch in chunk.get("choices") or []:
            c = self.choices.setdefault(ch.get("index", 0), {"content": "", "tool_calls": {}, "token_ids": [], "logprobs": [],
                                                             "finish_reason": None})
            delta = ch.get("delta") or {}
            if "text" in ch:  # /v1/completions chunks
                c["content"] += ch.get("text") or ""
            c["content"] += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = c["tool_calls"].setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                                       "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            c["token_ids"] += ch.get("token_ids") or []
            lp = ch.get("logprobs") or {}
            c["logprobs"] += [x.get("logprob") for x in (lp.get("content") or [])]
            c["logprobs"] += list(lp.get("token_logprobs") or [])
            if ch.get("finish_reason"):
                c["finish_reason"] = ch["finish_reason"]


def choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """Per-token log-probs of a non-streamed choice (chat or completions shape), or None."""
    lp = choice.get("logprobs") or {}
    if lp.get("content"):
        return [x.get("logprob") for x in lp["content"]]
    if lp.get("token_logprobs"):
        return list(lp["token_logprobs"])
    return None


async def forward(gw, endpoint: str, body, tenant: str, session_id: str):
    """Answer one request from the upstream server and land its choices like the embedded backend's."""
    import time
    import uuid

    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    from tentalis_pipelines.gateway import app as gwapp
    from tentalis_pipelines.gateway import landing
    from tentalis_pipelines.gateway.chat import ChatTemplateError, render_chat

    chat = endpoint == "chat.completions"
    path = "/chat/completions" if chat else "/completions"
    payload = body.model_dump(exclude_none=True, exclude={"return_token_ids"} if not body.return_token_ids else set())
    payload["model"] = gw.model_id  # the client may have used an alias ("tentalis", "default")
    if chat:
        messages = payload["messages"]
        messages_json = landing.dumps(messages)
    else:
        messages_json = landing.dumps(body.prompt)
    prompt_ids: list[int] = []
    if gw.tokenizer is not None:
        try:
            prompt_ids = (render_chat(gw.tokenizer, messages, body.tools)[1] if chat
                          else list(gw.tokenizer(body.prompt if isinstance(body.prompt, str) else body.prompt[0],
                                                 add_special_tokens=False)["input_ids"]))
        except ChatTemplateError:
            prompt_ids = []
    call = gwapp.Call(endpoint=endpoint, body=body, tenant=tenant, session_id=session_id, response_id="",
                       created=int(time.time()), t0=time.perf_counter(), messages_json=messages_json,
                       tools_json=landing.dumps(getattr(body, "tools", None) or []), prompt_ids=prompt_ids,
                       max_tokens=getattr(body, "max_completion_tokens", None) or body.max_tokens,
                       policy_version=f"upstream:{payload['model']}", backend="openai")

    def ids_of(text: str, given: list[int] | None) -> list[int]:
        if given:
            return list(given)
        return list(gw.tokenizer(text, add_special_tokens=False)["input_ids"]) if gw.tokenizer is not None and text else []

    def response_of(content: str | None, tool_calls: list | None) -> dict:
        if not chat:
            return {"text": content or ""}
        msg: dict = {"role": "assistant", "content": content}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return msg

    if not body.stream:
        try:
            out = await gw.upstream.post(path, payload)
        except UpstreamError as exc:
            return JSONResponse(exc.body, status_code=exc.status if 400 <= exc.status < 600 else 502)
        call.response_id = out.get("id") or f"up-{uuid.uuid4().hex}"
        if out.get("prompt_token_ids"):
            call.prompt_ids = list(out["prompt_token_ids"])
        rows = []
        for ch in out.get("choices", []):
            msg = ch.get("message") or {}
            content = msg.get("content") if chat else ch.get("text")
            rows.append(gwapp.turn_row(call, ch.get("index", 0), response_of(content, msg.get("tool_calls")),
                                        ids_of(content or "", ch.get("token_ids")), choice_logprobs(ch),
                                        ch.get("finish_reason") or "stop", stream=False))
        await run_in_threadpool(gwapp.acknowledge, gw, session_id, tenant, rows, body.metadata)
        return JSONResponse(out, headers={"X-Session-Id": session_id})

    async def relay():
        acc = StreamAccumulator()
        try:
            async for chunk in gw.upstream.stream(path, payload):
                if chunk is None:
                    break
                acc.add(chunk)
                yield gwapp.sse_event(chunk)
        except UpstreamError as exc:
            yield gwapp.sse_event(exc.body if isinstance(exc.body, dict) else {"error": {"message": str(exc.body)}})
            return
        call.response_id = acc.id or f"up-{uuid.uuid4().hex}"
        if acc.prompt_token_ids:
            call.prompt_ids = list(acc.prompt_token_ids)
        rows = []
        for idx, c in sorted(acc.choices.items()):
            calls = [c["tool_calls"][k] for k in sorted(c["tool_calls"])] or None
            lps = [x for x in c["logprobs"] if x is not None] or None
            rows.append(gwapp.turn_row(call, idx, response_of(c["content"] or None if calls else c["content"], calls),
                                        ids_of(c["content"], c["token_ids"]), lps, c["finish_reason"] or "stop", stream=True))
        await run_in_threadpool(gwapp.acknowledge, gw, session_id, tenant, rows, body.metadata)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(relay(), media_type="text/event-stream", headers={"X-Session-Id": session_id})
