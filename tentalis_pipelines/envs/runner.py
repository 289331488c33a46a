"""Running episodes: any policy in an environment, recorded as an :class:`~tentalis_pipelines.envs.base.Episode`.

A policy is a callable ``generate(messages) -> output`` where ``messages`` is the conversation so far
(``role`` and ``content``) and ``output`` is ``(text, token_ids, logprobs)``, optionally with the prompt's
token ids as a fourth item, or any object with those attributes (``text``, ``token_ids``, ``logprobs``,
``prompt_token_ids``, ``finish_reason``): the transformers policy (``policies.py``), a client of the
gateway, or a scripted agent (``agents.py``). Per assistant turn the runner keeps the token ids and
sampling log-probs the policy gave back, so an episode becomes a multi-turn rollout without
re-tokenising: :func:`episode_to_turns` gives rows shaped like the gateway's ``turns`` (the sessions
machinery's input: ``training/multiturn.py`` builds the segments, the assistant-only loss mask and the
turn spans from them) and :func:`episode_review` the verifier's outcome as a session-level review.

:func:`run_episodes` runs many episodes in lock step so that a batched policy (``generate_batch(list of
conversations) -> list of outputs``) generates every live episode's next turn in one call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tentalis_pipelines.envs.base import (
    TURN_LIMIT,
    AssistantTurn,
    Environment,
    EnvironmentUnavailable,
    Episode,
    Verdict,
    end_kind,
    error,
)

Generate = Callable[[list[dict[str, str]]], Any]
GenerateBatch = Callable[[list[list[dict[str, str]]]], Sequence[Any]]


@dataclass
class PolicyOutput:
    """One assistant turn from a policy (see the module doc for the accepted shapes)."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str = "stop"
    info: dict[str, Any] = field(default_factory=dict)


def as_policy_output(out: Any) -> PolicyOutput:
    if isinstance(out, PolicyOutput):
        return out
    if isinstance(out, str):
        return PolicyOutput(out)
    if isinstance(out, tuple | list):
        if not 1 <= len(out) <= 4:
            raise ValueError("a policy returns (text, token_ids, logprobs[, prompt_token_ids])")
        text, ids, lps, prompt = (list(out) + [None, None, None])[:4]
        return PolicyOutput(str(text), _ints(ids), _floats(lps), _ints(prompt))
    return PolicyOutput(str(out.text), _ints(getattr(out, "token_ids", None)), _floats(getattr(out, "logprobs", None)),
                        _ints(getattr(out, "prompt_token_ids", None)), str(getattr(out, "finish_reason", None) or "stop"))


def _ints(x: Any) -> list[int] | None:
    return None if x is None else [int(v) for v in x]


def _floats(x: Any) -> list[float] | None:
    return None if x is None else [float(v) for v in x]


def model_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The conversation as a chat template takes it: role and content only."""
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


class EpisodeRun:
    """The state of one episode while it runs (used by :func:`run_episode` and :func:`run_episodes`)."""

    def __init__(self, env: Environment, task: Any):
        self.env = env
        self.task = task
        self.task_id = str(task["task_id"] if isinstance(task, dict) else task.task_id)
        self.messages: list[dict[str, str]] = []
        self.turns: list[AssistantTurn] = []
        self.done = False
        self.end_reason = ""
        self.reward = 0.0
        self.failed = ""
        self.started = time.perf_counter()

    def start(self) -> None:
        try:
            obs = self.env.reset(self.task)
        except EnvironmentUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - the batch goes on; the episode records why
            self._fail(f"reset failed: {type(exc).__name__}: {exc}")
            return
        self.messages.extend(dict(m) for m in obs.messages)

    def prompt(self) -> list[dict[str, str]]:
        return model_messages(self.messages)

    def advance(self, output: Any) -> None:
        """Apply the policy's output (or the exception it raised) as the next assistant turn."""
        if isinstance(output, BaseException):
            self._fail(f"policy failed: {type(output).__name__}: {output}")
            return
        try:
            out = as_policy_output(output)
        except Exception as exc:  # noqa: BLE001
            self._fail(f"policy returned {type(output).__name__}: {exc}")
            return
        turn = AssistantTurn(index=len(self.turns), text=out.text, token_ids=out.token_ids, logprobs=out.logprobs,
                             prompt_token_ids=out.prompt_token_ids, finish_reason=out.finish_reason,
                             seconds_policy=float(out.info.get("seconds", 0.0)))
        self.messages.append({"role": "assistant", "content": out.text, "kind": "assistant"})
        self.turns.append(turn)
        t0 = time.perf_counter()
        try:
            res = self.env.step(out.text)
        except Exception as exc:  # noqa: BLE001
            self._fail(f"step failed: {type(exc).__name__}: {exc}")
            return
        turn.seconds_env = time.perf_counter() - t0
        turn.action = res.info.get("command")
        turn.observation = "\n".join(m["content"] for m in res.observation.messages)
        turn.info = {k: v for k, v in res.info.items() if k != "command"}
        if res.done:
            self.done = True
            self.reward = float(res.reward)
            self.end_reason = str(res.info.get("end_reason") or TURN_LIMIT)
        else:
            self.messages.extend(dict(m) for m in res.observation.messages)
            if len(self.turns) >= self.env.max_turns + 1:  # an environment that forgot its own limit
                self._fail("the environment did not end the episode at its turn limit")

    def _fail(self, why: str) -> None:
        self.done = True
        self.failed = why
        self.end_reason = error(why)
        self.reward = 0.0

    def episode(self) -> Episode:
        """Close the environment and return the record."""
        if self.failed:
            verdict = Verdict(False, 0.0, self.end_reason)
        else:
            try:
                verdict = self.env.verify()
            except Exception as exc:  # noqa: BLE001
                verdict = Verdict(False, 0.0, error(f"verify failed: {exc}"))
        with contextlib.suppress(Exception):  # best effort: the sandbox kills by uid anyway
            self.env.close()
        if end_kind(self.end_reason) in ("hostile", "error"):
            verdict = Verdict(False, 0.0, verdict.detail or self.end_reason)
        task_level = getattr(self.task, "level", None) if not isinstance(self.task, dict) else self.task.get("level")
        return Episode(environment=self.env.name, task_id=self.task_id, messages=self.messages, turns=self.turns,
                       verdict=verdict, end_reason=self.end_reason, reward=float(verdict.reward),
                       max_turns=self.env.max_turns,
                       info={"level": task_level, "seconds": time.perf_counter() - self.started})


def run_episode(env: Environment, task: Any, generate: Generate) -> Episode:
    """One episode of ``task`` in ``env`` driven by ``generate``; never raises for what the policy or the
    agent does (the episode's ``end_reason`` says ``error: ...``)."""
    run = EpisodeRun(env, task)
    run.start()
    while not run.done:
        try:
            output = generate(run.prompt())
        except Exception as exc:  # noqa: BLE001
            output = exc
        run.advance(output)
    return run.episode()


def run_episodes(make_env: Callable[[], Environment], tasks: Sequence[Any], generate_batch: GenerateBatch, *,
                 on_episode: Callable[[Episode], None] | None = None) -> list[Episode]:
    """Many episodes in lock step (one environment each, from ``make_env``): each round, one batched
    policy call for every live episode, then one step each. Episodes come back in the order of ``tasks``."""
    runs = [EpisodeRun(make_env(), t) for t in tasks]
    for r in runs:
        r.start()
    episodes: list[Episode | None] = [None] * len(runs)

    def finish_done() -> None:
        for i, r in enumerate(runs):
            if r.done and episodes[i] is None:
                episodes[i] = r.episode()
                if on_episode is not None:
                    on_episode(episodes[i])

    finish_done()
    while True:
        live = [r for r in runs if not r.done]
        if not live:
            break
        try:
            outputs: Sequence[Any] = generate_batch([r.prompt() for r in live])
            if len(outputs) != len(live):
                raise ValueError(f"the policy returned {len(outputs)} outputs for {len(live)} conversations")
        except Exception as exc:  # noqa: BLE001
            outputs = [exc] * len(live)
        for r, out in zip(live, outputs):
            r.advance(out)
        finish_done()
    return [e for e in episodes if e is not None]


# --------------------------------------------------------------------------- to the sessions machinery
def episode_session_id(episode: Episode, salt: str = "") -> str:
    """A stable id for an episode: its environment, task and the whole conversation (and ``salt``)."""
    body = json.dumps([episode.task_id, episode.messages, [t.token_ids for t in episode.turns], salt], sort_keys=True)
    return f"{episode.environment}-{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def is_policy_turn(message: dict[str, Any]) -> bool:
    """An assistant message the policy wrote (not one of a demonstration in the prompt)."""
    return message["role"] == "assistant" and message.get("kind", "assistant") == "assistant"


def prompt_messages_per_turn(episode: Episode) -> list[list[dict[str, str]]]:
    """For each assistant turn, the messages the model saw when it wrote it."""
    out, seen = [], []
    for m in episode.messages:
        if is_policy_turn(m):
            out.append(model_messages(seen))
        seen.append(m)
    return out


def episode_to_turns(episode: Episode, *, session_id: str | None = None, tenant: str = "envs",
                     model: str = "", policy_version: str = "base", backend: str = "envs",
                     temperature: float = 0.0, max_tokens: int | None = None, tokenizer: Any = None,
                     created_at: datetime | None = None) -> list[dict[str, Any]]:
    """The episode's assistant turns as rows shaped like ``schemas.TurnRow`` (what the gateway lands and
    ``training/multiturn.py`` turns into a multi-turn sample).

    Token ids come from the policy (``prompt_token_ids``, ``token_ids``, ``logprobs`` per turn); a turn
    without them is tokenised with ``tokenizer`` (its chat template for the prompt), which can differ
    from what the model saw: a policy that keeps the exact ids (``policies.ChatPolicy``) makes each
    prompt extend the last turn's context, so the episode is one training segment with its assistant
    mask. Without ids or a tokenizer the token columns are empty (the sessions machinery skips them)."""
    sid = session_id or episode_session_id(episode)
    created = created_at or datetime.now(timezone.utc)
    prompts = prompt_messages_per_turn(episode)
    rows = []
    for turn, msgs in zip(episode.turns, prompts):
        prompt_ids = list(turn.prompt_token_ids or [])
        if not prompt_ids and tokenizer is not None:
            prompt_ids = list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False))
        completion = list(turn.token_ids or [])
        if not completion and tokenizer is not None and turn.text:
            completion = list(tokenizer(turn.text, add_special_tokens=False)["input_ids"])
        logps = list(turn.logprobs) if turn.logprobs is not None and len(turn.logprobs) == len(completion) else None
        rows.append({
            "turn_id": f"{sid}-{turn.index}",
            "session_id": sid,
            "tenant": tenant,
            "turn_index": turn.index,
            "choice_index": 0,
            "endpoint": "chat.completions",
            "model": model,
            "policy_version": policy_version,
            "backend": backend,
            "messages": json.dumps(msgs),
            "tools": "[]",
            "response": json.dumps({"role": "assistant", "content": turn.text}),
            "prompt_token_ids": prompt_ids,
            "completion_token_ids": completion,
            "sampling_logprobs": logps,
            "finish_reason": turn.finish_reason,
            "temperature": float(temperature),
            "max_tokens": max_tokens,
            "stream": False,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion),
            "latency_ms": 1000.0 * turn.seconds_policy,
            "created_at": created,
        })
    return rows


def episode_review(episode: Episode, *, session_id: str | None = None, batch_id: str = "live",
                   manager: str = "verifier", created_at: datetime | None = None) -> dict[str, Any]:
    """The verifier's verdict as a session-level review (``schemas.ReviewRow``: ``rollout_id`` = the
    session id), the reward every assistant turn of the episode gets in ``multiturn.turn_rewards``."""
    sid = session_id or episode_session_id(episode)
    return {"batch_id": batch_id, "rollout_id": sid, "manager": manager, "score": float(episode.reward),
            "critique": f"{episode.end_reason}: {episode.verdict.detail}", "hint": "",
            "created_at": created_at or datetime.now(timezone.utc), "session_id": sid, "reviewer": manager,
            "rubric": f"{episode.environment}-final-state"}
