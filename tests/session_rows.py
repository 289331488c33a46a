"""Live-session rows as the gateway lands them: turns templated with the tokenizer's own chat template.

Each call's ``prompt_token_ids`` is ``apply_chat_template`` of the conversation so far (with the
generation prompt), its ``completion_token_ids`` the assistant text's tokens plus ``<|im_end|>`` (the
EOS the model samples). A tool call is stored as the client sees it (``tool_calls``, no content) while
the template renders the text the model wrote, as a gateway does for a template without tool support.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from tentalis_pipelines.lakehouse import Lakehouse, now_utc

SYSTEM = {"role": "system", "content": "You are a careful calculator agent. Use the tools when you need them."}
TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "a * b",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 17, "b": 23}}</tool_call>'
TOOL_CALLS = [{"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 17, "b": 23}'}}]


def tool_session_script(question: str = "What is 17 * 23?", follow_up: str = "Now add 9.") -> list[tuple[list[dict], str, list | None]]:
    """Three calls: a tool call, the answer after the tool's result, the answer to a follow-up."""
    return [
        ([SYSTEM, {"role": "user", "content": question}], CALL, TOOL_CALLS),
        ([{"role": "tool", "tool_call_id": "call_1", "content": "391"}], "17 * 23 = 391.", None),
        ([{"role": "user", "content": follow_up}], "391 + 9 = 400.", None),
    ]


def session_turns(tok, session_id: str, script, *, tenant: str = "acme", policy_version: str = "base",
                  temperature: float = 0.8, minutes_ago: float = 60.0) -> list[dict]:
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    client, rendered, rows = [], [], []
    start = now_utc() - timedelta(minutes=minutes_ago)
    for i, (added, text, tool_calls) in enumerate(script):
        client += added
        rendered += added
        prompt = list(tok.apply_chat_template(rendered, add_generation_prompt=True, tokenize=True)["input_ids"])
        completion = list(tok(text, add_special_tokens=False)["input_ids"]) + [im_end]
        response = {"role": "assistant", "content": None if tool_calls else text, **({"tool_calls": tool_calls} if tool_calls else {})}
        rid = hashlib.sha1(f"{session_id}/{i}".encode()).hexdigest()[:12]
        rows.append({
            "turn_id": f"chatcmpl-{rid}-0", "session_id": session_id, "tenant": tenant, "turn_index": i, "choice_index": 0,
            "endpoint": "chat.completions", "model": "tiny", "policy_version": policy_version, "backend": "transformers",
            "messages": json.dumps(client), "tools": json.dumps(TOOLS), "response": json.dumps(response),
            "prompt_token_ids": prompt, "completion_token_ids": completion,
            "sampling_logprobs": [-0.5 - 0.01 * j for j in range(len(completion))], "finish_reason": "tool_calls" if tool_calls else "stop",
            "temperature": temperature, "max_tokens": 64, "stream": False, "prompt_tokens": len(prompt),
            "completion_tokens": len(completion), "latency_ms": 12.0, "created_at": start + timedelta(seconds=i),
        })
        client = client + [response]
        rendered = rendered + [{"role": "assistant", "content": text}]
    return rows


def land_session(lake: Lakehouse, turns: list[dict]) -> None:
    lake.append("turns", turns)
    lake.append("sessions", [{
        "session_id": turns[0]["session_id"], "tenant": turns[0]["tenant"], "turn_count": len(turns),
        "policy_versions": sorted({t["policy_version"] for t in turns}), "models": ["tiny"],
        "first_turn_at": turns[0]["created_at"], "last_turn_at": turns[-1]["created_at"], "metadata": "{}",
    }])


def live_review(target: str, session_id: str, score: float, *, reviewer: str = "manager-1", minutes_ago: float = 30.0,
                hint: str = "") -> dict:
    """A row as ``POST /v1/reviews`` lands it (``rollout_id`` = the turn id or the session id)."""
    return {"batch_id": "live", "rollout_id": target, "manager": "api", "score": score, "critique": "", "hint": hint,
            "created_at": now_utc() - timedelta(minutes=minutes_ago), "review_id": f"rev-{target}-{reviewer}",
            "session_id": session_id, "reviewer": reviewer, "rubric": "style", "tenant": "acme"}
