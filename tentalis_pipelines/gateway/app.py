"""The OpenAI-compatible FastAPI app: routes, request models, errors, and the acknowledgement rule.

A turn is acknowledged only once it is durable: a non-streamed response is sent after its turns are
fsynced to the WAL; a streamed one ends with ``data: [DONE]`` only after that (the chunks before it
carry the text as the model writes it). Errors are OpenAI-style JSON (``{"error": {"message", "type",
"param", "code"}}``) with a 4xx status, and land nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tentalis_pipelines.activity import ActivityMiddleware, ActivityRecorder, activity_path
from tentalis_pipelines.gateway import landing
from tentalis_pipelines.gateway.auth import LOCAL_TENANT, AuthError, KeyStore
from tentalis_pipelines.gateway.chat import (
    ChatTemplateError,
    maybe_tool_call_prefix,
    parse_tool_calls,
    render_chat,
)
from tentalis_pipelines.gateway.quarantine import QuarantineGate
from tentalis_pipelines.gateway.wal import Flusher, WriteAheadLog
from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError, now_utc
from tentalis_pipelines.redact import redact
from tentalis_pipelines.rewards.managers import review_score

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- configuration and state
@dataclass
class GatewayConfig:
    home: Path
    lakehouse: Path | str
    model_dir: Path | None = None  # the base model (embedded backend; with --upstream: its tokenizer only)
    model_name: str | None = None  # the id /v1/models lists (default: the model folder's name or the upstream's)
    upstream: str | None = None
    upstream_api_key: str | None = None
    no_auth: bool = False
    flush_interval: float = 0.5
    poll_seconds: float = 2.0
    max_body_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int = 256
    max_n: int = 16
    device: str = "auto"
    dtype: str = "auto"
    max_batch_rows: int = 64  # continuous batching: rows (choices) decoded together at most; 1 = one call at a time
    max_prompts: int = 16  # prompts one /v1/completions call may hold (a list of texts or of token-id lists)
    quarantine_per_minute: int = 30  # rejected bodies one tenant may have kept in `quarantine` per minute (0: none)
    quarantine_raw_chars: int = 8192  # of a kept rejected body, this many characters at most (the rest is clipped)


@dataclass
class Gateway:
    cfg: GatewayConfig
    lake: Lakehouse
    wal: WriteAheadLog
    flusher: Flusher
    sessions: landing.SessionRegistry
    keys: KeyStore | None
    holder: Any = None  # PolicyHolder (embedded backend)
    upstream: Any = None  # Upstream
    tokenizer: Any = None  # for --upstream with --model: templating the recorded prompt
    model_id: str = "tentalis"
    aliases: set[str] = field(default_factory=set)
    ack_lock: threading.Lock = field(default_factory=threading.Lock)
    started_at: float = field(default_factory=time.time)
    quarantine_gate: QuarantineGate | None = None


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_response(status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": redact(message), "type": type, "param": param, "code": code}}, status_code=status)


# --------------------------------------------------------------------------- request models
class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI parameters this gateway ignores (presence_penalty, ...)


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


# The seeds torch's generators take (vLLM bounds ``seed`` the same way); a larger one was a 500.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def _no_boolean(value: Any) -> Any:
    """JSON ``true``/``false`` is not a number: refused, not read as 1/0 (the rule reviews' ``score`` follows)."""
    if isinstance(value, bool):
        raise ValueError(f"a JSON boolean ({str(value).lower()}) is not a number here: send a number")
    return value


class _Sampling(_Open):
    model: str
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    user: str | None = None
    metadata: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False  # vLLM's extension: token ids on every choice (and chunk)

    @field_validator("n", "temperature", "top_p", "max_tokens", "seed", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any) -> Any:
        return _no_boolean(value)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_completion_tokens: int | None = Field(None, ge=1)

    @field_validator("top_logprobs", "max_completion_tokens", mode="before")
    @classmethod
    def _chat_numbers_are_not_booleans(cls, value: Any) -> Any:
        return _no_boolean(value)


class CompletionRequest(_Sampling):
    # Text, texts, token ids, or lists of token ids (the legacy API's four forms).
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    # echo: score the prompt (its tokens' log-probs under the served policy, at temperature 1, as vLLM's
    # echo returns them); max_tokens 0 then generates nothing. Scoring calls are not agent work: they
    # never land as turns.
    echo: bool = False
    max_tokens: int | None = Field(None, ge=0)

    @field_validator("logprobs", "max_tokens", mode="before")
    @classmethod
    def _completion_numbers_are_not_booleans(cls, value: Any) -> Any:
        return _no_boolean(value)

    @field_validator("prompt", mode="before")
    @classmethod
    def _token_ids_are_not_booleans(cls, value: Any) -> Any:
        if isinstance(value, list) and any(isinstance(x, bool) or (isinstance(x, list) and any(isinstance(y, bool) for y in x))
                                           for x in value):
            raise ValueError("a JSON boolean is not a token id: send integers")
        return value


class ReviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str | None = Field(None, min_length=1, max_length=256)
    turn_id: str | None = Field(None, min_length=1, max_length=256)
    score: float
    critique: str = ""
    hint: str = ""
    reviewer: str = Field("manager", min_length=1, max_length=256)
    rubric: str = ""
    review_id: str | None = Field(None, min_length=1, max_length=256)

    @field_validator("score", mode="before")
    @classmethod
    def _one_score_rule(cls, value: Any) -> float:
        return review_score(value)  # the rule import-reviews applies: `true` is not 1.0


# --------------------------------------------------------------------------- the body limit
class BodyLimit:
    """Refuse a request body over ``max_bytes`` with 413, counting the bytes as they arrive.

    A ``Content-Length`` over the limit is refused before any byte is read; a body without one
    (``Transfer-Encoding: chunked``) is read up to the limit and refused at the first chunk past it, the
    rest never read. A body within the limit is handed on whole (the app reads it once, from memory).
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self, size: str) -> JSONResponse:
        return error_response(413, f"request body of {size} is over the limit of {self.max_bytes} bytes "
                                   "(GatewayConfig.max_body_bytes): send a smaller body", code="request_too_large")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length", b"").decode("latin-1").strip()
        if length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(f"{length} bytes")(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, first = 0, None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: the app sees that at once
                first = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(f"more than {self.max_bytes} bytes")(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if first is None:
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        pending = [first]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


# --------------------------------------------------------------------------- app
def create_app(cfg: GatewayConfig) -> FastAPI:
    state: dict[str, Gateway] = {}
    # When the last model request was served: idle-window training starts after a quiet spell and
    # yields as soon as a request arrives (tentalis_pipelines/activity.py).
    activity = ActivityRecorder(activity_path(cfg.home))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        gw = await run_in_threadpool(_start, cfg)
        state["gw"] = gw
        app.state.gateway = gw
        activity.start()
        try:
            yield
        finally:
            activity.stop()
            await run_in_threadpool(_stop, gw)

    app = FastAPI(title="Tentalis gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(ActivityMiddleware, recorder=activity)

    def gw() -> Gateway:
        return state["gw"]

    # ---- errors: OpenAI's shape, 4xx for the client's mistakes
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return error_response(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(),
                                   code="invalid_json")
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or "body"  # the body itself (not an object): named as /v1/reviews names it
        message = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}" for e in errs[:5])
        return error_response(422, message, param=param, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)  # outermost: before anything reads a body

    async def tenant_of(authorization: str | None = Header(None)) -> str:
        g = gw()
        if g.keys is None:
            return LOCAL_TENANT
        try:
            return g.keys.tenant_for(authorization)
        except AuthError as exc:
            raise APIError(401, str(exc), type="authentication_error", code="invalid_api_key") from None

    # ---- OpenAI endpoints
    @app.get("/v1/models")
    async def models(tenant: str = Depends(tenant_of)):
        g = gw()
        return {"object": "list", "data": [{"id": g.model_id, "object": "model", "created": int(g.started_at),
                                            "owned_by": "tentalis", "policy_version": _policy_version(g)}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request, tenant: str = Depends(tenant_of),
                               x_session_id: str | None = Header(None)):
        return await _complete(gw(), "chat.completions", body, request, tenant, x_session_id)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, tenant: str = Depends(tenant_of),
                          x_session_id: str | None = Header(None)):
        return await _complete(gw(), "completions", body, request, tenant, x_session_id)

    @app.post("/v1/reviews")
    async def reviews(request: Request, tenant: str = Depends(tenant_of)):
        return await _review(gw(), request, tenant)

    # ---- Bridge API (manager agents): landing in tentalis_pipelines.gateway.bridge
    async def _bridge(fn_name: str, request: Request | None, tenant: str):
        try:
            from tentalis_pipelines.gateway import bridge
        except ImportError:
            raise APIError(501, "the Bridge API is not installed in this build", type="server_error") from None
        args: list[Any] = [gw().lake]
        kwargs: dict[str, Any] = {}
        if request is not None:
            payload = await _json_body(request)
            if not isinstance(payload, dict):
                raise APIError(422, "the request body must be a JSON object", param="body")
            args.append(payload)
            kwargs["gate"] = gw().quarantine_gate  # a tenant's rejects are kept at a bounded rate and size
        try:
            return await run_in_threadpool(getattr(bridge, fn_name), *args, tenant, **kwargs)
        except bridge.BridgeInputError as exc:
            raise APIError(422, str(exc), code="invalid_value") from None

    @app.post("/tasks/assign")
    async def tasks_assign(request: Request, tenant: str = Depends(tenant_of)):
        return await _bridge("land_task_assign", request, tenant)

    @app.post("/tasks/result")
    async def tasks_result(request: Request, tenant: str = Depends(tenant_of)):
        return await _bridge("land_task_result", request, tenant)

    @app.post("/feedback")
    async def feedback(request: Request, tenant: str = Depends(tenant_of)):
        return await _bridge("land_feedback", request, tenant)

    @app.get("/status")
    async def status(tenant: str = Depends(tenant_of)):
        return await _bridge("bridge_status", None, tenant)

    @app.get("/health")
    async def health():
        g = gw()
        holder = g.holder
        return {
            "status": "ok", "model": g.model_id, "policy_version": _policy_version(g),
            "backend": "upstream" if g.upstream is not None else "transformers",
            "wal_pending": g.flusher.pending(), "turns_flushed": g.flusher.flushed, "wal_replayed": g.flusher.replayed,
            "last_flush_ms": None if g.flusher.last_flush_seconds is None else round(g.flusher.last_flush_seconds * 1000, 1),
            "flush_error": g.flusher.last_error and redact(g.flusher.last_error),
            "serving_error": holder.last_error if holder is not None else None,
            "policy_switches": [list(s) for s in holder.switches] if holder is not None else [],
            "batching": _batching(holder),
            "quarantine_dropped": g.quarantine_gate.dropped if g.quarantine_gate is not None else 0,
        }

    return app


# --------------------------------------------------------------------------- start / stop
def _start(cfg: GatewayConfig) -> Gateway:
    from tentalis_pipelines.redact import install_log_filter

    install_log_filter()
    lake = Lakehouse(cfg.lakehouse)
    wal = WriteAheadLog(Path(cfg.home) / "gateway" / "wal")
    flusher = Flusher(wal, lambda records: landing.land_records(lake, records), interval=cfg.flush_interval)
    replayed = flusher.replay()  # what a killed gateway acknowledged lands before anything new is served
    if replayed:
        log.info("replayed %d WAL records left by the previous gateway", replayed)
    gw = Gateway(cfg=cfg, lake=lake, wal=wal, flusher=flusher, sessions=landing.SessionRegistry(lake),
                 keys=None if cfg.no_auth else KeyStore(Path(cfg.home)),
                 quarantine_gate=QuarantineGate(cfg.quarantine_per_minute, cfg.quarantine_raw_chars))
    if cfg.upstream:
        from tentalis_pipelines.gateway.upstream import Upstream

        gw.upstream = Upstream(cfg.upstream, api_key=cfg.upstream_api_key)
        gw.model_id = cfg.model_name or gw.upstream.first_model()
        if cfg.model_dir is not None:
            from transformers import AutoTokenizer

            gw.tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    else:
        from tentalis_pipelines.gateway.policy import PolicyHolder

        if cfg.model_dir is None:
            raise ValueError("the embedded backend needs a model folder (--model)")
        gw.holder = PolicyHolder(lake, cfg.model_dir, poll_seconds=cfg.poll_seconds, device=cfg.device, dtype=cfg.dtype,
                                 max_batch_rows=cfg.max_batch_rows)
        gw.holder.load()
        gw.holder.start()
        gw.model_id = cfg.model_name or Path(cfg.model_dir).name
    gw.aliases = {gw.model_id, "tentalis", "default"}
    flusher.start()
    return gw


def _stop(gw: Gateway) -> None:
    if gw.holder is not None:
        gw.holder.stop()
    gw.flusher.stop()
    gw.wal.close()
    if gw.upstream is not None:
        with contextlib.suppress(Exception):
            asyncio.run(gw.upstream.aclose())


def _batching(holder) -> dict[str, Any] | None:
    """The current policy's continuous batching: its row limit, the most rows one step decoded, the steps."""
    if holder is None:
        return None
    try:
        policy = holder.current()
    except RuntimeError:  # not loaded yet
        return None
    b = policy.batcher
    return {"max_rows": policy.max_batch_rows, "peak_rows": b.peak_rows if b else 0, "steps": b.decoder.steps if b else 0}


def _policy_version(gw: Gateway) -> str:
    if gw.upstream is not None:
        return f"upstream:{gw.model_id}"
    return gw.holder.current().version


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > request.app.state.gateway.cfg.max_body_bytes:
        raise APIError(413, "request body is over the limit", code="request_too_large")
    try:
        body = json.loads(raw or b"null")
    except RecursionError:
        raise APIError(400, "request body is not valid JSON: nested too deeply", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    try:  # an unpaired \ud800-\udfff escape decodes to a string no UTF-8 column (or response) can hold
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, "request body is not valid JSON text: it holds an unpaired surrogate escape (\\ud800-\\udfff)",
                       code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "request body is not valid JSON: nested too deeply", code="invalid_json") from None
    return body


# --------------------------------------------------------------------------- completions
@dataclass
class Call:
    """One request being answered: what lands with each of its choices."""

    endpoint: str
    body: Any
    tenant: str
    session_id: str
    response_id: str
    created: int
    t0: float
    messages_json: str
    tools_json: str
    prompt_ids: list[int]
    max_tokens: int | None
    policy_version: str
    backend: str


def _session_id(body: Any, header: str | None) -> str:
    sid = (header or body.user or "").strip()
    if len(sid) > 256:
        raise APIError(422, "the session id (X-Session-Id or user) is longer than 256 characters", param="user")
    return sid or f"sess-{uuid.uuid4().hex}"


def _unpaired_surrogate(value: Any, path: str = "") -> str | None:
    """The dotted path (``messages.0.content``) of the first string in ``value`` that UTF-8 cannot
    encode (a lone ``\\ud800``-``\\udfff`` escape, which JSON parsers accept), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        name = str(key).encode("utf-8", "backslashreplace").decode("utf-8")  # printable even when it is the bad string
        here = f"{path}.{name}" if path else name
        if name != str(key):
            return here
        hit = _unpaired_surrogate(item, here)
        if hit is not None:
            return hit
    return None


def _prompt_count(prompt: Any) -> int:
    """How many prompts a /v1/completions ``prompt`` holds (text, texts, token ids, lists of token ids)."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt)):
        return 1
    return len(prompt)


def _stops(body: Any) -> tuple[str, ...]:
    if body.stop is None:
        return ()
    return (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)


async def _complete(gw: Gateway, endpoint: str, body: Any, request: Request, tenant: str, header_sid: str | None):
    if body.model not in gw.aliases:
        raise APIError(404, f"the model {body.model!r} does not exist: this gateway serves {gw.model_id!r}", param="model",
                       code="model_not_found")
    bad = _unpaired_surrogate(body.model_dump(exclude_none=True))
    if bad is not None:
        raise APIError(400, f"{bad}: the text holds an unpaired surrogate escape (\\ud800-\\udfff), which is not valid "
                            "Unicode: send the character itself (or a valid pair of escapes)", param=bad, code="invalid_json")
    if body.n > gw.cfg.max_n:
        raise APIError(422, f"n must be at most {gw.cfg.max_n}", param="n", code="invalid_value")
    if endpoint == "completions" and _prompt_count(body.prompt) > gw.cfg.max_prompts:
        raise APIError(422, f"prompt holds {_prompt_count(body.prompt)} prompts: this gateway takes at most {gw.cfg.max_prompts} "
                            "per call (max_prompts; `tentalis serve --max-prompts`): send them in several calls",
                       param="prompt", code="too_many_prompts")
    session_id = _session_id(body, header_sid)
    try:
        await run_in_threadpool(gw.sessions.check, session_id, tenant)
    except landing.Forbidden as exc:
        raise APIError(403, str(exc), type="permission_error") from None
    if gw.upstream is not None:
        from tentalis_pipelines.gateway.upstream import forward

        return await forward(gw, endpoint, body, tenant, session_id)
    policy = gw.holder.current()  # this request finishes on this policy, whatever the pointer does meanwhile
    prompts = _prompts(policy.tokenizer, endpoint, body)
    if endpoint == "completions" and body.echo:
        return JSONResponse(await run_in_threadpool(_score, gw, policy, prompts, body))
    if endpoint == "completions" and body.max_tokens == 0:
        raise APIError(422, "max_tokens 0 generates nothing: it is only valid with echo: true (scoring the prompt)",
                       param="max_tokens", code="invalid_value")
    max_tokens = (getattr(body, "max_completion_tokens", None) or body.max_tokens or gw.cfg.default_max_tokens)
    limit = getattr(policy.model.config, "max_position_embeddings", None)
    for _, ids in prompts:
        if limit and len(ids) + max_tokens > limit:
            raise APIError(400, f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the model's context of "
                           f"{limit} tokens", param="messages" if endpoint == "chat.completions" else "prompt",
                           code="context_length_exceeded")
    rid = ("chatcmpl-" if endpoint == "chat.completions" else "cmpl-") + uuid.uuid4().hex
    calls = []
    for i, (raw, ids) in enumerate(prompts):
        calls.append(Call(endpoint=endpoint, body=body, tenant=tenant, session_id=session_id,
                           response_id=rid if len(prompts) == 1 else f"{rid}-p{i}", created=int(time.time()),
                           t0=time.perf_counter(), messages_json=raw, tools_json=landing.dumps(getattr(body, "tools", None) or []),
                           prompt_ids=ids, max_tokens=max_tokens, policy_version=policy.version, backend="transformers"))
    if body.stream:
        if len(calls) != 1:
            raise APIError(422, "stream: true takes one prompt", param="prompt")
        return StreamingResponse(_stream(gw, policy, calls[0], request), media_type="text/event-stream",
                                 headers={"X-Session-Id": session_id, "Cache-Control": "no-cache"})
    results = []
    for call in calls:
        choices = await run_in_threadpool(_decode_all, policy, call)
        results.append((call, choices))
    rows, payload = [], None
    for call, choices in results:
        turn_rows, out = _finish(gw, policy.tokenizer, call, choices)
        rows += turn_rows
        payload = out if payload is None else {**payload, "choices": payload["choices"] + [
            {**c, "index": len(payload["choices"]) + j} for j, c in enumerate(out["choices"])]}
    await run_in_threadpool(acknowledge, gw, session_id, tenant, rows, body.metadata)
    return JSONResponse(payload, headers={"X-Session-Id": session_id})


def _prompts(tokenizer, endpoint: str, body: Any) -> list[tuple[str, list[int]]]:
    """(what lands in `messages`, the exact prompt token ids) per prompt of the request."""
    if endpoint == "chat.completions":
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        try:
            _, ids = render_chat(tokenizer, messages, body.tools)
        except ChatTemplateError as exc:
            raise APIError(400, str(exc), param="messages") from None
        return [(landing.dumps(messages), ids)]
    p = body.prompt
    if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
        p = [p]  # one prompt of token ids
    prompts = [p] if isinstance(p, str) else list(p)
    if not prompts or any(not q for q in prompts):
        raise APIError(422, "prompt must be a non-empty string, list of strings, or list of token ids", param="prompt")
    out = []
    for q in prompts:
        if isinstance(q, str):
            out.append((landing.dumps(q), list(tokenizer(q, add_special_tokens=False)["input_ids"])))
            continue
        vocab = len(tokenizer)
        if any(not 0 <= i < vocab for i in q):
            raise APIError(422, f"prompt token ids must be in [0, {vocab}) for this model's tokenizer", param="prompt")
        out.append((landing.dumps(tokenizer.decode(q)), list(q)))
    return out


def _score(gw: Gateway, policy, prompts: list[tuple[str, list[int]]], body: Any) -> dict[str, Any]:
    """``echo: true``: each prompt's tokens with their log-probs under the served policy (the first is
    None: nothing predicts it), at temperature 1 like vLLM's prompt log-probs, then ``max_tokens`` sampled
    tokens (none for 0). Used as an OPD teacher (``trainer.opd_teacher`` = this server's URL)."""
    import torch

    if body.stream or body.n != 1:
        raise APIError(422, "echo: true scores prompts: use n = 1 and no stream", param="echo")
    tok = policy.tokenizer
    max_tokens = body.max_tokens if body.max_tokens is not None else gw.cfg.default_max_tokens
    choices, completion_tokens = [], 0
    for i, (_, ids) in enumerate(prompts):
        device = next(policy.model.parameters()).device
        with policy.lock, torch.inference_mode():
            x = torch.tensor([ids], device=device)
            logits = policy.model(input_ids=x, use_cache=False).logits[0, :-1].float()
            lps = torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].tolist()
        tokens, token_lps, text = [tok.decode([t]) for t in ids], [None, *lps], tok.decode(ids)
        finish = "length"
        if max_tokens > 0:
            call = Call(endpoint="completions", body=body, tenant="", session_id="", response_id="", created=0,
                         t0=time.perf_counter(), messages_json="", tools_json="", prompt_ids=ids, max_tokens=max_tokens,
                         policy_version=policy.version, backend="transformers")
            [c] = _decode_all(policy, call)
            tokens += [tok.decode([t]) for t in c.token_ids]
            token_lps += list(c.logprobs or [None] * len(c.token_ids))
            text, finish = text + c.text, c.finish_reason
            completion_tokens += len(c.token_ids)
        choices.append({"index": i, "text": text, "finish_reason": finish,
                        "logprobs": {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": None, "text_offset": []}})
    prompt_tokens = sum(len(ids) for _, ids in prompts)
    return {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()), "model": gw.model_id,
            "system_fingerprint": policy.version, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}}


def _decode_all(policy, call: Call):
    """Decode a call on the policy's running batch (it joins at the next step) and return its choices."""
    from tentalis_pipelines.gateway.sampler import batched_decode

    choices: list = []
    for _ in batched_decode(policy, call.prompt_ids, n=call.body.n, max_new_tokens=call.max_tokens,
                            temperature=call.body.temperature, top_p=call.body.top_p, stop=_stops(call.body), seed=call.body.seed,
                            choices=choices):
        pass
    return choices


def _logprob_items(tokenizer, ids: list[int], logps: list[float]) -> list[dict[str, Any]]:
    out = []
    for i, lp in zip(ids, logps):
        tok = tokenizer.decode([i])
        out.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []})
    return out


def _finish(gw: Gateway, tokenizer, call: Call, choices) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The turn rows (one per choice) and the response payload of a finished, non-streamed call."""
    body, chat = call.body, call.endpoint == "chat.completions"
    out_choices, rows = [], []
    for c in choices:
        if chat:
            content, tool_calls = parse_tool_calls(c.text) if body.tools else (c.text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            finish = "tool_calls" if tool_calls else c.finish_reason
            item: dict[str, Any] = {"index": c.index, "message": message, "finish_reason": finish,
                                    "logprobs": {"content": _logprob_items(tokenizer, c.token_ids, c.logprobs)} if body.logprobs else None}
            response = message
        else:
            finish = c.finish_reason
            lp = None
            if body.logprobs is not None:
                lp = {"tokens": [tokenizer.decode([i]) for i in c.token_ids], "token_logprobs": c.logprobs,
                      "top_logprobs": None, "text_offset": []}
            item = {"index": c.index, "text": c.text, "finish_reason": finish, "logprobs": lp}
            response = {"text": c.text}
        if body.return_token_ids:
            item["token_ids"] = c.token_ids
        out_choices.append(item)
        rows.append(turn_row(call, c.index, response, c.token_ids, c.logprobs, finish, stream=False))
    completion_tokens = sum(len(c.token_ids) for c in choices)
    payload: dict[str, Any] = {
        "id": call.response_id, "object": "chat.completion" if chat else "text_completion", "created": call.created,
        "model": gw.model_id, "system_fingerprint": call.policy_version, "choices": out_choices,
        "usage": {"prompt_tokens": len(call.prompt_ids), "completion_tokens": completion_tokens,
                  "total_tokens": len(call.prompt_ids) + completion_tokens},
    }
    if body.return_token_ids:
        payload["prompt_token_ids"] = call.prompt_ids
    return rows, payload


def turn_row(call: Call, choice_index: int, response: dict[str, Any], token_ids: list[int], logprobs: list[float] | None,
              finish: str, *, stream: bool) -> dict[str, Any]:
    return {
        "turn_id": f"{call.response_id}-{choice_index}", "session_id": call.session_id, "tenant": call.tenant,
        "turn_index": None, "choice_index": choice_index, "endpoint": call.endpoint, "model": call.body.model,
        "policy_version": call.policy_version, "backend": call.backend, "messages": call.messages_json, "tools": call.tools_json,
        "response": landing.dumps(response), "prompt_token_ids": list(call.prompt_ids), "completion_token_ids": list(token_ids),
        "sampling_logprobs": list(logprobs) if logprobs else None, "finish_reason": finish or "stop",
        "temperature": float(call.body.temperature), "max_tokens": call.max_tokens, "stream": stream,
        "prompt_tokens": len(call.prompt_ids), "completion_tokens": len(token_ids),
        "latency_ms": round((time.perf_counter() - call.t0) * 1000, 3), "created_at": now_utc().isoformat(),
    }


def acknowledge(gw: Gateway, session_id: str, tenant: str, rows: list[dict[str, Any]], metadata: dict | None) -> None:
    """Make a call's turns durable (fsynced WAL); only then may the client see them acknowledged."""
    with gw.ack_lock:
        index = gw.sessions.next_turn(session_id, tenant)
        records = []
        for r in rows:
            r["turn_index"] = index
            records.append({"kind": "turn", "row": r, "session_metadata": landing.dumps(metadata) if metadata else None})
        try:
            gw.wal.append(records)
        except OSError as exc:  # a full disk, an I/O error: the WAL took the append back; nothing is acknowledged
            gw.sessions.release_turn(session_id, index)
            log.error("could not make a turn durable: %s", exc)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise APIError(507 if full else 503, "the gateway could not record this turn durably "
                           f"({'no space left on its disk' if full else 'a storage error'}); it was not recorded, retry later",
                           type="server_error", code="insufficient_storage" if full else "storage_error") from exc
    gw.sessions.note_turns([r["turn_id"] for r in rows], session_id, tenant)
    gw.flusher.poke()


def sse_event(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def _stream(gw: Gateway, policy, call: Call, request: Request):
    """SSE chunks in OpenAI's format as the model writes; ``data: [DONE]`` once the turns are durable."""
    from tentalis_pipelines.gateway.sampler import batched_decode

    body, chat = call.body, call.endpoint == "chat.completions"
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()
    stops = _stops(body)
    tok = policy.tokenizer

    def work() -> None:
        choices: list = []
        try:
            steps = batched_decode(policy, call.prompt_ids, n=body.n, max_new_tokens=call.max_tokens, temperature=body.temperature,
                                   top_p=body.top_p, stop=stops, seed=body.seed, choices=choices)
            for step in steps:  # joins the running batch; closing the generator cancels the call
                loop.call_soon_threadsafe(queue.put_nowait, ("step", step, choices))
                if cancel.is_set():
                    steps.close()
                    return
            loop.call_soon_threadsafe(queue.put_nowait, ("done", None, choices))
        except Exception as exc:  # noqa: BLE001 - reported to the client as an error chunk
            loop.call_soon_threadsafe(queue.put_nowait, ("error", exc, choices))

    def chunk(choice_payloads: list[dict[str, Any]], usage: dict | None = None) -> dict[str, Any]:
        c = {"id": call.response_id, "object": "chat.completion.chunk" if chat else "text_completion", "created": call.created,
             "model": gw.model_id, "system_fingerprint": call.policy_version, "choices": choice_payloads}
        if usage is not None:
            c["usage"] = usage
        return c

    def holdback(text: str) -> int:
        """Characters at the end of ``text`` that may be the start of a stop string (not sent yet)."""
        best = 0
        for s in stops:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    best = max(best, k)
                    break
        return best

    thread = threading.Thread(target=work, name="tentalis-stream", daemon=True)
    sent: dict[int, int] = {}
    try:
        if chat:
            yield sse_event(chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                              for i in range(body.n)]))
        thread.start()
        while True:
            kind, payload, choices = await queue.get()
            if kind == "error":
                log.error("generation failed: %s", redact(str(payload)))
                yield sse_event({"error": {"message": redact(f"generation failed: {payload}"), "type": "server_error", "param": None, "code": None}})
                return
            if kind == "done":
                break
            if await request.is_disconnected():
                cancel.set()
                return  # never acknowledged: nothing lands
            step = payload
            out = []
            for idx, token_id, logp in step.tokens:
                c = choices[idx]
                done = idx in step.finished
                text = step.texts.get(idx, c.text)  # the text as of this step (the batch thread writes on)
                if chat and body.tools and maybe_tool_call_prefix(text):
                    upto = sent.get(idx, 0)  # held back until the end: it may be a tool call
                else:
                    upto = len(text) if done else len(text) - holdback(text)
                    if text and text[-1] == "\ufffd" and not done:
                        upto = min(upto, len(text) - 1)  # half of a multi-byte character
                delta_text = text[sent.get(idx, 0):max(upto, sent.get(idx, 0))]
                sent[idx] = max(upto, sent.get(idx, 0))
                item: dict[str, Any] = {"index": idx}
                if chat:
                    item["delta"] = {"content": delta_text} if delta_text else {}
                    item["logprobs"] = {"content": _logprob_items(tok, [token_id], [logp])} if body.logprobs else None
                else:
                    item["text"] = delta_text
                    item["logprobs"] = ({"tokens": [tok.decode([token_id])], "token_logprobs": [logp], "top_logprobs": None,
                                         "text_offset": []} if body.logprobs is not None else None)
                if body.return_token_ids:
                    item["token_ids"] = [token_id]
                item["finish_reason"] = None
                out.append(item)
            if out:
                yield sse_event(chunk(out))
        # the end: tool calls (or held-back text), finish reasons, then durability, then [DONE]
        rows, finals = [], []
        for c in choices:
            if chat:
                content, tool_calls = parse_tool_calls(c.text) if body.tools else (c.text, [])
                rest = "" if tool_calls else c.text[sent.get(c.index, 0):]
                delta: dict[str, Any] = {}
                if rest:
                    delta["content"] = rest
                if tool_calls:
                    delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(tool_calls)]
                    if content and not sent.get(c.index):
                        delta["content"] = content
                finish = "tool_calls" if tool_calls else c.finish_reason
                finals.append({"index": c.index, "delta": delta, "logprobs": None, "finish_reason": finish})
                response: dict[str, Any] = {"role": "assistant", "content": content}
                if tool_calls:
                    response["tool_calls"] = tool_calls
            else:
                finish = c.finish_reason
                finals.append({"index": c.index, "text": c.text[sent.get(c.index, 0):], "logprobs": None, "finish_reason": finish})
                response = {"text": c.text}
            rows.append(turn_row(call, c.index, response, c.token_ids, c.logprobs, finish, stream=True))
        yield sse_event(chunk(finals))
        try:
            await run_in_threadpool(acknowledge, gw, call.session_id, call.tenant, rows, body.metadata)
        except APIError as exc:  # not durable: an error event and no [DONE], so the client knows it was not recorded
            yield sse_event({"error": {"message": redact(exc.message), "type": exc.type, "param": None, "code": exc.code}})
            return
        if (body.stream_options or {}).get("include_usage"):
            n_out = sum(len(c.token_ids) for c in choices)
            yield sse_event(chunk([], usage={"prompt_tokens": len(call.prompt_ids), "completion_tokens": n_out,
                                        "total_tokens": len(call.prompt_ids) + n_out}))
        yield b"data: [DONE]\n\n"
    finally:
        cancel.set()


# --------------------------------------------------------------------------- reviews
async def _review(gw: Gateway, request: Request, tenant: str):
    from pydantic import ValidationError

    payload = await _json_body(request)
    raw = landing.dumps(payload)

    def reject(status: int, message: str, param: str | None = None, code: str | None = None):
        gate = gw.quarantine_gate
        try:
            if gate is None or gate.admit(tenant):  # a tenant's rejects are kept at a bounded rate and size
                gw.lake.quarantine([{"source": "gateway:/v1/reviews", "line": None,
                                     "raw": gate.clip(redact(raw)) if gate else redact(raw),
                                     "error": f"{status}: {message}", "batch_id": None, "stage": f"live_review:{tenant}"}])
        except LakehouseError:
            log.exception("could not quarantine a rejected review")
        raise APIError(status, message, param=param, code=code, type="invalid_request_error" if status != 403 else "permission_error")

    try:
        if not isinstance(payload, dict):
            raise ValueError("the request body must be a JSON object")
        review = ReviewRequest.model_validate(payload)
    except ValidationError as exc:
        e = exc.errors()[0]
        field_name = ".".join(str(x) for x in e.get("loc", ())) or "body"
        await run_in_threadpool(reject, 422, f"{field_name}: {e.get('msg')}", field_name, "invalid_value")
    except ValueError as exc:
        await run_in_threadpool(reject, 422, str(exc), "body", "invalid_value")
    if not review.session_id and not review.turn_id:
        await run_in_threadpool(reject, 422, "session_id or turn_id: one of them is required", "session_id", "invalid_value")

    def land() -> dict[str, Any]:
        session_id = review.session_id
        if review.turn_id:
            hit = gw.sessions.turn(review.turn_id)
            if hit is None:
                reject(404, f"turn {review.turn_id!r} does not exist", "turn_id", "not_found")
            if hit[1] != tenant:
                reject(403, f"turn {review.turn_id!r} belongs to another tenant")
            if session_id and session_id != hit[0]:
                reject(422, f"turn {review.turn_id!r} is not in session {session_id!r}", "session_id", "invalid_value")
            session_id = hit[0]
        owner = gw.sessions.owner(session_id)
        if owner is None:
            reject(404, f"session {session_id!r} does not exist", "session_id", "not_found")
        if owner != tenant:
            reject(403, f"session {session_id!r} belongs to another tenant")
        row = landing.review_row(tenant=tenant, session_id=session_id, turn_id=review.turn_id, score=review.score,
                                 critique=review.critique, hint=review.hint, reviewer=review.reviewer, rubric=review.rubric,
                                 review_id=review.review_id)
        target = f"turn:{review.turn_id}" if review.turn_id else f"session:{session_id}"  # as review_row derives it
        default_id = landing.default_review_id(tenant, target, review.reviewer)
        try:
            landing.check_client_review_id(gw.lake, tenant, review.review_id, default_id)
        except ValueError as exc:  # a derived-looking id that is not this tenant's: claiming it first would block its owner
            reject(422, str(exc), "review_id", "review_id_reserved")
        try:
            landing.land_review(gw.lake, row)
        except landing.Forbidden as exc:  # another tenant's review_id: never replaced, never altered
            reject(403, str(exc), "review_id", "review_id_taken")
        return {"object": "review", "review_id": row["review_id"], "batch_id": row["batch_id"], "rollout_id": row["rollout_id"],
                "session_id": session_id, "turn_id": review.turn_id, "score": row["score"], "tenant": tenant}

    return JSONResponse(await run_in_threadpool(land))
