"""An external agent's episode through the gateway: the policy is ``tentalis serve``, reached with the
official ``openai`` client and tool calls, so live agent work lands as the same rows as a batch episode.

:class:`GatewayPolicy` is a ``generate(messages)`` for :func:`~tentalis_pipelines.envs.runner.run_episode`.
Each turn it sends the conversation in OpenAI's shape (the environment's system prompt, demonstration
and instruction; each earlier reply as the gateway returned it, ``tool_calls`` included; each observation
as a ``role: tool`` message answering the call it ran, or as a user message after a reply without one)
with ``tools`` = :data:`TOOLS` (``bash`` and ``submit``), ``logprobs`` and vLLM's ``return_token_ids``
extension, under one session id (``X-Session-Id``). The gateway renders the tools into the prompt (the
Hermes template for a ChatML model such as SmolLM2), parses ``<tool_call>`` blocks into ``tool_calls``
and lands every call as a ``turns`` row with its exact prompt and completion token ids and sampling
log-probs. The reply becomes the environment's action (:func:`action_text`): a ``bash`` call runs its
command, ``submit`` submits its answer, and a reply without a tool call is given to the environment as
written (a fenced bash block still works; anything else is a format error, as in a batch episode).

:func:`run_gateway_episode` runs the episode and then posts the verifier's verdict as the session's
review (``POST /v1/reviews``, reviewer ``verifier``; score, critique and hint as an environment batch's
review). The ``fresh_sessions`` sensor then cuts the session into a sessions batch that trains on it:
the turns' token ids, the assistant-only mask and the verdict as every turn's reward.

One difference from a batch episode: a batch episode's turns extend one context token for token
(``ChatPolicy``), one training segment; the gateway renders each request's messages again, and a reply's
tokens re-rendered (a tool call as the template writes it) need not be the tokens the model sampled, so
such an episode may land as several segments (each turn still trains on its own exact tokens).
"""

from __future__ import annotations

import json
import time
from typing import Any

from tentalis_pipelines.envs.base import Environment, Episode
from tentalis_pipelines.envs.runner import PolicyOutput, run_episode

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run one shell command in the task's working directory and see its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command line"}},
                   "required": ["command"]}}}
SUBMIT = {"type": "function", "function": {
    "name": "submit", "description": "Finish the task: give the answer to a question, or nothing after editing files.",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string", "description": "the answer, if asked for one"}},
                   "required": []}}}
TOOLS = [BASH, SUBMIT]
NOT_RUN = "not run: one command per turn (only the first tool call runs)"


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = (call.get("function") or {}).get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return {}
    return args if isinstance(args, dict) else {}


def action_text(content: str | None, tool_calls: list[dict[str, Any]] | None) -> str:
    """What the environment gets from a reply: its first tool call as one bash block (``bash`` runs
    ``command``, ``submit`` becomes ``submit ANSWER``), else the reply's text as written. A call of
    another function, or without its argument, is passed on as the text it was, so the environment
    counts it as a format error."""
    for call in tool_calls or []:
        name = (call.get("function") or {}).get("name")
        args = _arguments(call)
        if name == "bash" and isinstance(args.get("command"), str) and args["command"].strip():
            return f"```bash\n{args['command'].strip()}\n```"
        if name == "submit":
            answer = args.get("answer")
            answer = "" if answer is None else str(answer).strip()
            return f"```bash\nsubmit {answer}\n```" if answer else "```bash\nsubmit\n```"
        break
    return content or ""


class GatewayPolicy:
    """A terminal agent whose model is the gateway (see the module doc). One per episode: it keeps the
    replies the gateway returned, so each request carries them exactly, tool calls and all."""

    def __init__(self, client: Any, model: str, *, session_id: str, max_tokens: int = 128, temperature: float = 1.0,
                 seed: int | None = None, tools: list[dict[str, Any]] | None = None):
        self.client, self.model, self.session_id = client, model, session_id
        self.max_tokens, self.temperature, self.seed = int(max_tokens), float(temperature), seed
        self.tools = TOOLS if tools is None else tools
        self.replies: list[dict[str, Any]] = []  # the assistant messages, as the gateway returned them
        self.texts: list[str] = []  # what the environment got from each (action_text)

    def openai_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The environment's conversation in OpenAI's shape: replies with their tool calls, and each
        observation as the tool result of the call that ran (a user message when none did)."""
        # The runner shows role and content only, so a demonstration's assistant message looks like a reply:
        # this agent's replies are the last len(self.replies) assistant messages, and must read as it sent them.
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        mine = assistant[len(assistant) - len(self.replies):] if self.replies else []
        if len(assistant) < len(self.replies) or any(messages[i]["content"] != t for i, t in zip(mine, self.texts)):
            raise ValueError("the conversation does not hold this agent's replies: use one GatewayPolicy per episode")
        out: list[dict[str, Any]] = []
        turn, pending = 0, None
        for i, m in enumerate(messages):
            if i in mine:
                reply = self.replies[turn]
                turn += 1
                out.append(reply)
                calls = reply.get("tool_calls") or []
                pending = calls[0]["id"] if calls else None
                out += [{"role": "tool", "tool_call_id": c["id"], "content": NOT_RUN} for c in calls[1:]]
            elif pending is not None and m["role"] == "user":
                out.append({"role": "tool", "tool_call_id": pending, "content": m["content"]})
                pending = None
            else:
                out.append({"role": m["role"], "content": m["content"]})
        return out

    def __call__(self, messages: list[dict[str, Any]]) -> PolicyOutput:
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {"seed": self.seed} if self.seed is not None else {}
        resp = self.client.chat.completions.create(
            model=self.model, messages=self.openai_messages(messages), tools=self.tools, max_tokens=self.max_tokens,
            temperature=self.temperature, logprobs=True, extra_body={"return_token_ids": True},
            extra_headers={"X-Session-Id": self.session_id}, **kwargs)
        choice = resp.choices[0]
        calls = [c.model_dump() for c in (choice.message.tool_calls or [])]
        reply: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
        if calls:
            reply["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]} for c in calls]
        self.replies.append(reply)
        self.texts.append(action_text(choice.message.content, reply.get("tool_calls")))
        lps = [x.logprob for x in choice.logprobs.content] if choice.logprobs and choice.logprobs.content else None
        return PolicyOutput(text=self.texts[-1],
                            token_ids=(choice.model_extra or {}).get("token_ids"), logprobs=lps,
                            prompt_token_ids=(resp.model_extra or {}).get("prompt_token_ids"),
                            finish_reason=choice.finish_reason or "stop", info={"seconds": time.perf_counter() - t0})


def post_verdict(client: Any, session_id: str, episode: Episode, *, check_kind: str = "answer") -> dict[str, Any]:
    """Post the episode's verdict as the session's review (``POST /v1/reviews``, reviewer ``verifier``),
    with the score, critique and hint an environment batch gives the same episode."""
    from tentalis_pipelines.envs.verdicts import VERIFIER, episode_review_fields

    fields = episode_review_fields(episode, check_kind)
    body = {"session_id": session_id, "score": fields["score"], "critique": fields["critique"], "hint": fields["hint"],
            "reviewer": VERIFIER, "rubric": f"{episode.environment}-final-state"}
    return client.post("/reviews", body=body, cast_to=dict)


def run_gateway_episode(client: Any, model: str, env: Environment, task: Any, *, session_id: str, max_tokens: int = 128,
                        temperature: float = 1.0, seed: int | None = None) -> Episode:
    """One episode of ``task`` in ``env`` with the gateway as the policy, its verdict posted as the
    session's review. ``client`` is an ``openai.OpenAI`` pointed at the gateway's ``/v1``."""
    policy = GatewayPolicy(client, model, session_id=session_id, max_tokens=max_tokens, temperature=temperature, seed=seed)
    episode = run_episode(env, task, policy)
    if not episode.turns:
        return episode  # nothing reached the gateway: no session to review
    check_kind = str((task.get("check") or {}).get("kind", "answer")) if isinstance(task, dict) else getattr(task, "kind", "answer")
    post_verdict(client, session_id, episode, check_kind=check_kind)
    return episode
