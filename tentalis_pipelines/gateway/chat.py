"""Chat templating and tool-call parsing, from the model's tokenizer.

The prompt is ``tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=True)``: the
model's own template decides how system, user, assistant, tool calls and tool results look. A request
with tools on a ChatML model whose template cannot render tools (SmolLM2's has no ``tools`` branch)
uses ``hermes_tool_template.jinja``, the Hermes/Qwen2.5 ChatML tool template, through the same
transformers call; any other model without tool support gets a 400 that says so.

Tool calls are parsed from the completion in the Hermes/Qwen style that most transformers tool
templates emit: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import json
import re
import uuid
from functools import cache
from pathlib import Path
from typing import Any

TOOL_TEMPLATE = Path(__file__).with_name("hermes_tool_template.jinja")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"


class ChatTemplateError(ValueError):
    """The messages cannot be rendered with this model's chat template (a client error)."""


@cache
def _tool_template() -> str:
    return TOOL_TEMPLATE.read_text()


def _text(content: Any) -> str:
    """OpenAI content: a string, None (an assistant message with only tool calls) or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ChatTemplateError(f"unsupported content part {part.get('type') if isinstance(part, dict) else part!r}: "
                                        "this gateway serves a text model")
        return "".join(parts)
    raise ChatTemplateError(f"message content must be a string, null or a list of parts, not {type(content).__name__}")


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: string content, tool-call arguments as JSON objects."""
    out = []
    for m in messages:
        msg = {k: v for k, v in m.items() if v is not None}
        msg["content"] = _text(m.get("content"))
        calls = []
        for call in m.get("tool_calls") or []:
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    fn["arguments"] = args  # kept as the string the model wrote
            calls.append({**call, "function": fn})
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _needs_tools(messages: list[dict[str, Any]], tools: list | None) -> bool:
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def template_for(tokenizer, messages: list[dict[str, Any]], tools: list | None) -> str | None:
    """The chat template to use: None (the tokenizer's own) or the Hermes ChatML tool template."""
    own = getattr(tokenizer, "chat_template", None)
    if not own:
        raise ChatTemplateError("this model's tokenizer has no chat template: use /v1/completions with a prompt")
    if not _needs_tools(messages, tools) or "tool" in own:
        return None
    if "<|im_start|>" in own:
        return _tool_template()
    raise ChatTemplateError("this model's chat template does not support tools; send the request without tools")


def render_chat(tokenizer, messages: list[dict[str, Any]], tools: list | None = None) -> tuple[str, list[int]]:
    """(prompt text, prompt token ids): the exact templated prompt the model sees."""
    if not messages:
        raise ChatTemplateError("messages must not be empty")
    msgs = normalize_messages(messages)
    template = template_for(tokenizer, msgs, tools)
    kwargs: dict[str, Any] = {"add_generation_prompt": True}
    if tools:
        kwargs["tools"] = tools
    if template is not None:
        kwargs["chat_template"] = template
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, **kwargs)
    except Exception as exc:  # jinja errors: a message the template cannot render
        raise ChatTemplateError(f"the chat template cannot render these messages: {exc}") from exc
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text, list(ids)


def parse_tool_calls(text: str, *, id_prefix: str | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a completion into (content, tool_calls) in OpenAI's shape.

    Every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block whose JSON names a function
    becomes a tool call (``arguments`` serialised to a JSON string, as OpenAI sends it); a block that
    is not such JSON stays in the content. Content is the text outside the parsed blocks, stripped,
    or None when nothing but tool calls was said.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    prefix = id_prefix or f"call_{uuid.uuid4().hex[:16]}"
    for m in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append({
            "id": f"{prefix}_{len(calls)}",
            "type": "function",
            "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
        })
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def maybe_tool_call_prefix(text: str) -> bool:
    """Whether a streamed completion so far could still be (the start of) a tool call, so its content
    is held back until the end of the stream instead of being sent as text."""
    s = text.lstrip()
    return s.startswith(TOOL_CALL_OPEN) or (len(s) < len(TOOL_CALL_OPEN) and TOOL_CALL_OPEN.startswith(s))
