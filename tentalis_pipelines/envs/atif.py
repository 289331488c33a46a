"""Episodes as Harbor's ATIF trajectories (Agent Trajectory Interchange Format, v1.4), both ways.

ATIF (Harbor's RFC 0001, ``docs/rfcs/0001-trajectory-format.md``) is a JSON object: ``schema_version``
(``"ATIF-v1.4"``), ``session_id``, ``agent`` (``name``, ``version``, optional ``model_name``), ``steps``
and optional ``notes``, ``final_metrics`` and ``extra``. Each step has ``step_id`` (1, 2, ... in order),
``source`` (``system``, ``user`` or ``agent``), ``message`` and optionally ``timestamp`` (ISO 8601),
``extra``; an agent step also ``model_name``, ``reasoning_effort``, ``reasoning_content``, ``tool_calls``
(``tool_call_id``, ``function_name``, ``arguments`` object) and ``metrics`` (``prompt_tokens``,
``completion_tokens``, ``cached_tokens``, ``cost_usd``, and, the reason this format suits RL,
``prompt_token_ids`` (v1.4), ``completion_token_ids`` (v1.3) and ``logprobs``: the exact tokens, so a
trainer never re-tokenises). ``observation`` (``results``: ``source_call_id``, ``content``,
``subagent_trajectory_ref``) holds what the environment said back. Like Harbor's pydantic models, the
validator here refuses unknown keys (a typo such as ``logprob`` must not drop data silently), checks that
step ids run 1, 2, ..., that agent-only fields sit on agent steps, that every ``source_call_id`` names a
tool call of its step, and that token ids and log-probs line up.

An :class:`~tentalis_pipelines.envs.base.Episode` maps so:

* the messages before the first policy turn (system prompt, demonstration, instruction) are ``system``,
  ``user`` or ``agent`` steps (a demonstration's assistant message is an ``agent`` step marked as such in
  its ``extra``, so it is never taken for a policy turn);
* each policy turn is an ``agent`` step: ``message`` = what the model wrote, ``tool_calls`` = the command
  the environment ran from it (``bash`` with ``{"command": ...}``; none for a turn without a command),
  ``observation`` = the environment's reply (one result per observation message), ``metrics`` = its
  prompt and completion token ids and sampling log-probs;
* the verdict, the end reason, the environment and task, the turn limit and anything else Tentalis needs
  to land the episode exactly as it ran go into ``extra.tentalis`` (root and steps): other tools ignore
  them, and :func:`atif_to_episode` of :func:`episode_to_atif` gives the same episode back.

A trajectory written by another tool (no ``extra.tentalis``) imports too: system and user steps become
the prompt, every agent step a policy turn (its first ``bash`` call, if any, as the command), its
observation results the observations that follow; it has no verdict (``passed`` false, reward 0, and
:func:`has_verdict` false, so no review is made up for it).

Standard library only, like the rest of ``envs``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tentalis_pipelines.envs.base import AssistantTurn, Episode, Verdict

SCHEMA_VERSION = "ATIF-v1.4"
ACCEPTED_VERSIONS = ("ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4")
AGENT_NAME = "tentalis"
TOOL = "bash"  # the function name a terminal action is exported as: {"command": "..."}
KEY = "tentalis"  # our key inside ATIF's ``extra`` objects
NO_VERDICT = "no verdict: the trajectory came from a tool that does not record one"

ROOT_KEYS = {"schema_version", "session_id", "agent", "steps", "notes", "final_metrics", "extra"}
AGENT_KEYS = {"name", "version", "model_name", "extra"}
STEP_KEYS = {"step_id", "timestamp", "source", "model_name", "reasoning_effort", "message", "reasoning_content",
             "tool_calls", "observation", "metrics", "extra"}
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
TOOL_CALL_KEYS = {"tool_call_id", "function_name", "arguments"}
METRICS_KEYS = {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "prompt_token_ids",
                "completion_token_ids", "logprobs", "extra"}
FINAL_METRICS_KEYS = {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd",
                      "total_steps", "extra"}
RESULT_KEYS = {"source_call_id", "content", "subagent_trajectory_ref"}
SUBAGENT_KEYS = {"session_id", "trajectory_path", "extra"}
SOURCES = {"system": "system", "user": "user", "assistant": "agent"}  # message role -> step source
ROLES = {v: k for k, v in SOURCES.items()}


class ATIFError(ValueError):
    """An ATIF document that cannot be read: the message names every bad field by its path
    (``steps[3].metrics.logprobs``) and says what would be valid."""


# --------------------------------------------------------------------------- validation
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, int | float) and not isinstance(x, bool)) and math.isfinite(x)


def _check_keys(obj: dict, allowed: set[str], path: str, problems: list[str]) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        problems.append(f"{path}: unknown field(s) {', '.join(unknown)} (ATIF v1.4 allows {', '.join(sorted(allowed))}; "
                        "put anything else under 'extra')")


def _check_obj(obj: Any, path: str, problems: list[str]) -> bool:
    if not isinstance(obj, dict):
        problems.append(f"{path}: must be a JSON object, not {type(obj).__name__}")
        return False
    return True


def _check_str(obj: dict, key: str, path: str, problems: list[str], *, required: bool, nonempty: bool = False) -> None:
    if key not in obj or obj[key] is None:
        if required:
            problems.append(f"{path}.{key}: required (a string)")
        return
    if not isinstance(obj[key], str):
        problems.append(f"{path}.{key}: must be a string, not {type(obj[key]).__name__}")
    elif nonempty and not obj[key].strip():
        problems.append(f"{path}.{key}: must not be empty")


def _check_count(obj: dict, key: str, path: str, problems: list[str]) -> None:
    if obj.get(key) is not None and not (_is_int(obj[key]) and obj[key] >= 0):
        problems.append(f"{path}.{key}: must be a non-negative integer, not {obj[key]!r}")


def _check_ids(obj: dict, key: str, path: str, problems: list[str], vocab_size: int | None) -> list[int] | None:
    ids = obj.get(key)
    if ids is None:
        return None
    if not isinstance(ids, list):
        problems.append(f"{path}.{key}: must be an array of integer token ids, not {type(ids).__name__}")
        return None
    bad = [i for i, t in enumerate(ids) if not (_is_int(t) and 0 <= t < 2**31)]
    if bad:
        problems.append(f"{path}.{key}[{bad[0]}]: token ids must be integers in [0, 2^31), not {ids[bad[0]]!r}"
                        f"{f' ({len(bad)} bad in all)' if len(bad) > 1 else ''}")
        return None
    if vocab_size is not None:
        # An id the policy's tokenizer does not have cannot be trained on (its embedding row does not
        # exist, or is padding): refuse it here rather than fail, or train on garbage, later.
        out = [i for i, t in enumerate(ids) if t >= vocab_size]
        if out:
            problems.append(f"{path}.{key}[{out[0]}]: token id {ids[out[0]]} is outside the policy's vocabulary of "
                            f"{vocab_size} ids ([0, {vocab_size})){f' ({len(out)} outside in all)' if len(out) > 1 else ''}; "
                            "these ids come from another tokenizer: import trajectories sampled from this policy, "
                            "or give the vocabulary of the tokenizer that made them")
            return None
    return ids


def _check_metrics(m: dict, path: str, problems: list[str], vocab_size: int | None) -> None:
    _check_keys(m, METRICS_KEYS, path, problems)
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        _check_count(m, key, path, problems)
    if m.get("cost_usd") is not None and not _is_number(m["cost_usd"]):
        problems.append(f"{path}.cost_usd: must be a number, not {m['cost_usd']!r}")
    prompt = _check_ids(m, "prompt_token_ids", path, problems, vocab_size)
    completion = _check_ids(m, "completion_token_ids", path, problems, vocab_size)
    lps = m.get("logprobs")
    if lps is not None:
        if not isinstance(lps, list):
            problems.append(f"{path}.logprobs: must be an array of numbers (one per completion token), not {type(lps).__name__}")
            lps = None
        else:
            bad = [i for i, x in enumerate(lps) if not (_is_number(x) and x <= 0)]
            if bad:
                problems.append(f"{path}.logprobs[{bad[0]}]: a log-probability is a finite number <= 0, not {lps[bad[0]]!r}")
    if completion is not None and isinstance(lps, list) and len(lps) != len(completion):
        problems.append(f"{path}.logprobs: {len(lps)} values for {len(completion)} completion_token_ids; give one "
                        "log-prob per completion token (or leave logprobs out)")
    for ids, count in ((prompt, "prompt_tokens"), (completion, "completion_tokens")):
        if ids is not None and _is_int(m.get(count)) and m[count] != len(ids):
            problems.append(f"{path}.{count}: {m[count]} but {count[:-7]}_token_ids holds {len(ids)} ids; they must agree")
    if "extra" in m and m["extra"] is not None:
        _check_obj(m["extra"], f"{path}.extra", problems)


def _check_tentalis_root(t: Any, path: str, problems: list[str]) -> None:
    if not _check_obj(t, path, problems):
        return
    for key in ("environment", "task_id", "end_reason"):
        _check_str(t, key, path, problems, required=True, nonempty=key != "end_reason")
    if not (_is_int(t.get("max_turns")) and t["max_turns"] >= 1):
        problems.append(f"{path}.max_turns: required, a positive integer (not {t.get('max_turns')!r})")
    v = t.get("verdict")
    if not isinstance(v, dict):
        problems.append(f"{path}.verdict: required, an object with passed (bool), reward (number in [0, 1]) and detail (string)")
    else:
        if not isinstance(v.get("passed"), bool):
            problems.append(f"{path}.verdict.passed: must be true or false, not {v.get('passed')!r}")
        if not (_is_number(v.get("reward")) and 0.0 <= v["reward"] <= 1.0):
            problems.append(f"{path}.verdict.reward: must be a number in [0, 1], not {v.get('reward')!r}")
        _check_str(v, "detail", f"{path}.verdict", problems, required=False)
    if t.get("temperature") is not None and not (_is_number(t["temperature"]) and t["temperature"] >= 0):
        problems.append(f"{path}.temperature: must be a number >= 0, not {t['temperature']!r}")
    for key in ("policy_version", "backend", "check_kind"):
        _check_str(t, key, path, problems, required=False, nonempty=True)
    tools = t.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(x, str) and x.strip() for x in tools)):
        problems.append(f"{path}.tools: must be a list of program names (non-empty strings), not {tools!r}")
    if t.get("max_tokens") is not None and not (_is_int(t["max_tokens"]) and 1 <= t["max_tokens"] < 2**31):
        problems.append(f"{path}.max_tokens: must be a positive integer below 2^31, not {t['max_tokens']!r}")
    if t.get("reward") is not None and not _is_number(t["reward"]):
        problems.append(f"{path}.reward: must be a number, not {t['reward']!r}")
    if t.get("info") is not None:
        _check_obj(t["info"], f"{path}.info", problems)


def _unencodable(obj: Any, path: str, problems: list[str]) -> None:
    """Name every string (key or value) of ``obj`` that UTF-8 cannot encode: a lone surrogate, which
    JSON's ``\\udXXX`` escapes can spell but no Unicode text holds (every table stores UTF-8)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as exc:
            problems.append(f"{path}: holds a lone surrogate {obj[exc.start]!r} at character {exc.start}, which is not "
                            "Unicode text (UTF-8 cannot encode it); fix the tool that wrote it, or replace the "
                            "character (e.g. with U+FFFD) before importing")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _unencodable(k, f"{path or 'trajectory'} (a key)", problems)
            name = ascii(k)[1:-1] if isinstance(k, str) else str(k)
            _unencodable(v, f"{path}.{name}" if path else name, problems)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _unencodable(v, f"{path}[{i}]", problems)


def _check_tentalis_step(t: dict, path: str, problems: list[str]) -> None:
    """The fields of a step's ``extra.tentalis`` that :func:`atif_to_episode` reads (another tool may
    write the key too: what it holds must still be what this module expects)."""
    _check_str(t, "finish_reason", path, problems, required=False)
    _check_str(t, "action", path, problems, required=False)
    for key in ("seconds_policy", "seconds_env"):
        if t.get(key) is not None and not (_is_number(t[key]) and t[key] >= 0):
            problems.append(f"{path}.{key}: must be a number of seconds >= 0, not {t[key]!r}")
    for key in ("info", "message"):
        if t.get(key) is not None:
            _check_obj(t[key], f"{path}.{key}", problems)
    kinds = t.get("observation_messages")
    if kinds is not None:
        if not isinstance(kinds, list):
            problems.append(f"{path}.observation_messages: must be an array of objects, not {type(kinds).__name__}")
        else:
            for j, k in enumerate(kinds):
                _check_obj(k, f"{path}.observation_messages[{j}]", problems)
    if t.get("observation_in_context") is not None and not isinstance(t["observation_in_context"], bool):
        problems.append(f"{path}.observation_in_context: must be true or false, not {t['observation_in_context']!r}")


def validate_atif(doc: Any, *, vocab_size: int | None = None) -> None:
    """Raise :class:`ATIFError` naming every field of ``doc`` that is not valid ATIF v1.4 (and, where
    ``extra.tentalis`` is present, every field of it this module relies on): types, required fields,
    text that is not Unicode (a lone surrogate) and, with ``vocab_size``, token ids outside
    ``[0, vocab_size)``."""
    problems: list[str] = []
    if not _check_obj(doc, "trajectory", problems):
        raise ATIFError(problems[0])
    try:  # the fast path: one encode of the whole document; the walk only runs to name what failed
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        _unencodable(doc, "", problems)
    except (TypeError, ValueError):
        pass  # not JSON-ready (NaN is fine for dumps): the field checks below name it
    _check_keys(doc, ROOT_KEYS, "trajectory", problems)
    version = doc.get("schema_version")
    if version not in ACCEPTED_VERSIONS:
        problems.append(f"schema_version: {version!r} is not one this reader knows; use one of {', '.join(ACCEPTED_VERSIONS)}")
    _check_str(doc, "session_id", "trajectory", problems, required=True, nonempty=True)
    _check_str(doc, "notes", "trajectory", problems, required=False)
    agent = doc.get("agent")
    if agent is None:
        problems.append("agent: required (an object with name and version)")
    elif _check_obj(agent, "agent", problems):
        _check_keys(agent, AGENT_KEYS, "agent", problems)
        _check_str(agent, "name", "agent", problems, required=True, nonempty=True)
        _check_str(agent, "version", "agent", problems, required=True, nonempty=True)
        _check_str(agent, "model_name", "agent", problems, required=False)
    fm = doc.get("final_metrics")
    if fm is not None and _check_obj(fm, "final_metrics", problems):
        _check_keys(fm, FINAL_METRICS_KEYS, "final_metrics", problems)
        for key in ("total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_steps"):
            _check_count(fm, key, "final_metrics", problems)
        if fm.get("total_cost_usd") is not None and not _is_number(fm["total_cost_usd"]):
            problems.append(f"final_metrics.total_cost_usd: must be a number, not {fm['total_cost_usd']!r}")
    extra = doc.get("extra")
    if extra is not None and _check_obj(extra, "extra", problems) and KEY in extra:
        _check_tentalis_root(extra[KEY], f"extra.{KEY}", problems)
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        problems.append("steps: required, a non-empty array of step objects")
        steps = []
    for i, step in enumerate(steps):
        path = f"steps[{i}]"
        if not _check_obj(step, path, problems):
            continue
        _check_keys(step, STEP_KEYS, path, problems)
        if step.get("step_id") != i + 1 or not _is_int(step.get("step_id")):
            problems.append(f"{path}.step_id: {step.get('step_id')!r}, but step ids run 1, 2, 3, ... in order (expected {i + 1})")
        source = step.get("source")
        if source not in ROLES:
            problems.append(f"{path}.source: {source!r}; must be one of system, user, agent")
        if not isinstance(step.get("message"), str):
            problems.append(f"{path}.message: required, a string (it may be empty), not {type(step.get('message')).__name__}")
        ts = step.get("timestamp")
        if ts is not None:
            try:
                datetime.fromisoformat(ts)
            except (TypeError, ValueError):
                problems.append(f"{path}.timestamp: {ts!r} is not an ISO 8601 timestamp (e.g. 2025-10-16T14:30:00Z)")
        if source != "agent":
            wrong = [k for k in AGENT_ONLY if step.get(k) is not None]
            if wrong:
                problems.append(f"{path}: {', '.join(wrong)} only apply to agent steps, and this step's source is {source!r}")
        _check_str(step, "model_name", path, problems, required=False)
        _check_str(step, "reasoning_content", path, problems, required=False)
        call_ids: set[str] = set()
        calls = step.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                problems.append(f"{path}.tool_calls: must be an array, not {type(calls).__name__}")
                calls = []
            for j, call in enumerate(calls):
                cpath = f"{path}.tool_calls[{j}]"
                if not _check_obj(call, cpath, problems):
                    continue
                _check_keys(call, TOOL_CALL_KEYS, cpath, problems)
                _check_str(call, "tool_call_id", cpath, problems, required=True, nonempty=True)
                _check_str(call, "function_name", cpath, problems, required=True, nonempty=True)
                if not isinstance(call.get("arguments"), dict):
                    problems.append(f"{cpath}.arguments: required, a JSON object (may be {{}}), not {type(call.get('arguments')).__name__}")
                if isinstance(call.get("tool_call_id"), str):
                    call_ids.add(call["tool_call_id"])
        obs = step.get("observation")
        if obs is not None and _check_obj(obs, f"{path}.observation", problems):
            _check_keys(obs, {"results"}, f"{path}.observation", problems)
            results = obs.get("results")
            if not isinstance(results, list):
                problems.append(f"{path}.observation.results: required, an array of result objects")
                results = []
            for j, res in enumerate(results):
                rpath = f"{path}.observation.results[{j}]"
                if not _check_obj(res, rpath, problems):
                    continue
                _check_keys(res, RESULT_KEYS, rpath, problems)
                _check_str(res, "content", rpath, problems, required=False)
                sid = res.get("source_call_id")
                if sid is not None and sid not in call_ids:
                    problems.append(f"{rpath}.source_call_id: {sid!r} names no tool call of this step "
                                    f"(its tool_call_ids: {', '.join(sorted(call_ids)) or 'none'})")
                refs = res.get("subagent_trajectory_ref")
                if refs is not None:
                    if not isinstance(refs, list):
                        problems.append(f"{rpath}.subagent_trajectory_ref: must be an array")
                    else:
                        for k, ref in enumerate(refs):
                            if _check_obj(ref, f"{rpath}.subagent_trajectory_ref[{k}]", problems):
                                _check_keys(ref, SUBAGENT_KEYS, f"{rpath}.subagent_trajectory_ref[{k}]", problems)
                                _check_str(ref, "session_id", f"{rpath}.subagent_trajectory_ref[{k}]", problems, required=True)
        metrics = step.get("metrics")
        if metrics is not None and _check_obj(metrics, f"{path}.metrics", problems):
            _check_metrics(metrics, f"{path}.metrics", problems, vocab_size)
        if step.get("extra") is not None and _check_obj(step["extra"], f"{path}.extra", problems):
            t = step["extra"].get(KEY)
            if t is not None and _check_obj(t, f"{path}.extra.{KEY}", problems):
                _check_tentalis_step(t, f"{path}.extra.{KEY}", problems)
    if problems:
        shown = problems[:12]
        more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        sid = doc.get("session_id") if isinstance(doc.get("session_id"), str) else "?"
        raise ATIFError(f"not a valid ATIF v1.4 trajectory (session_id {sid!r}):\n  " + "\n  ".join(shown) + more)


# --------------------------------------------------------------------------- Episode -> ATIF
def _agent_version() -> str:
    try:
        from importlib.metadata import version

        return version("tentalis")
    except Exception:  # noqa: BLE001 - not installed (a source checkout): the format needs a string
        return "0"


def _rest(message: dict[str, Any]) -> dict[str, Any]:
    """A message's keys other than its content (role, kind, ...): kept so the message comes back whole."""
    return {k: v for k, v in message.items() if k != "content"}


def _is_policy_turn(message: dict[str, Any]) -> bool:
    return message.get("role") == "assistant" and message.get("kind", "assistant") == "assistant"


def episode_to_atif(episode: Episode, *, session_id: str, model: str | None = None,
                    timestamps: list[str | None] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The episode as an ATIF v1.4 trajectory (a JSON-ready dict).

    ``timestamps`` (ISO 8601, one per policy turn) stamp the agent steps; ``extra`` goes into the root's
    ``extra.tentalis`` beside the verdict (the landing details: policy version, temperature, backend, ...)."""
    written = sum(_is_policy_turn(m) for m in episode.messages)
    if written != len(episode.turns):
        raise ValueError(f"episode of {episode.task_id}: {len(episode.turns)} turns but {written} policy messages")
    steps: list[dict[str, Any]] = []
    turns = iter(episode.turns)
    msgs = episode.messages
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if not _is_policy_turn(m):  # before the first policy turn: system prompt, demonstration, instruction
            steps.append({"step_id": len(steps) + 1, "source": SOURCES.get(m.get("role"), "user"), "message": str(m["content"]),
                          "extra": {KEY: {"message": _rest(m)}}})
            i += 1
            continue
        turn = next(turns)
        j = i + 1
        while j < len(msgs) and not _is_policy_turn(msgs[j]):
            j += 1
        observed = msgs[i + 1:j]  # the observations the next turn saw
        steps.append(_agent_step(len(steps) + 1, turn, observed, m, model,
                                 timestamps[turn.index] if timestamps and turn.index < len(timestamps) else None))
        i = j
    total_prompt = sum(len(t.prompt_token_ids or []) for t in episode.turns)
    total_completion = sum(len(t.token_ids or []) for t in episode.turns)
    agent: dict[str, Any] = {"name": AGENT_NAME, "version": _agent_version()}
    if model:
        agent["model_name"] = model
    root_extra = {"environment": episode.environment, "task_id": episode.task_id, "end_reason": episode.end_reason,
                  "reward": episode.reward, "max_turns": episode.max_turns,
                  "verdict": {"passed": episode.verdict.passed, "reward": episode.verdict.reward, "detail": episode.verdict.detail},
                  "info": episode.info, **(extra or {})}
    return {"schema_version": SCHEMA_VERSION, "session_id": session_id, "agent": agent, "steps": steps,
            "final_metrics": {"total_prompt_tokens": total_prompt, "total_completion_tokens": total_completion,
                              "total_steps": len(steps)},
            "extra": {KEY: root_extra}}


def _agent_step(step_id: int, turn: AssistantTurn, observed: list[dict[str, Any]], message: dict[str, Any],
                model: str | None, timestamp: str | None) -> dict[str, Any]:
    step: dict[str, Any] = {"step_id": step_id}
    if timestamp:
        step["timestamp"] = timestamp
    step["source"] = "agent"
    if model:
        step["model_name"] = model
    step["message"] = turn.text
    call_id = None
    if turn.action is not None:
        call_id = f"call_{turn.index}"
        step["tool_calls"] = [{"tool_call_id": call_id, "function_name": TOOL, "arguments": {"command": turn.action}}]
    in_context = bool(observed)
    contents = [str(o["content"]) for o in observed] if in_context else ([turn.observation] if turn.observation else [])
    if contents:
        step["observation"] = {"results": [{"source_call_id": call_id, "content": c} if call_id else {"content": c}
                                           for c in contents]}
    metrics: dict[str, Any] = {}
    if turn.prompt_token_ids is not None:
        metrics["prompt_tokens"] = len(turn.prompt_token_ids)
    if turn.token_ids is not None:
        metrics["completion_tokens"] = len(turn.token_ids)
    if turn.prompt_token_ids is not None:
        metrics["prompt_token_ids"] = list(turn.prompt_token_ids)
    if turn.token_ids is not None:
        metrics["completion_token_ids"] = list(turn.token_ids)
    if turn.logprobs is not None:
        metrics["logprobs"] = list(turn.logprobs)
    if metrics:
        step["metrics"] = metrics
    ours: dict[str, Any] = {"finish_reason": turn.finish_reason, "action": turn.action, "info": turn.info,
                            "seconds_policy": turn.seconds_policy, "seconds_env": turn.seconds_env}
    if _rest(message) != {"role": "assistant", "kind": "assistant"}:
        ours["message"] = _rest(message)
    if in_context:
        ours["observation_messages"] = [_rest(o) for o in observed]
    elif turn.observation:
        ours["observation_in_context"] = False  # the episode ended: nothing after this turn reached the model
    step["extra"] = {KEY: ours}
    return step


# --------------------------------------------------------------------------- ATIF -> Episode
def tentalis_extra(doc: dict[str, Any]) -> dict[str, Any]:
    """The root's ``extra.tentalis`` ({} for a trajectory another tool wrote)."""
    return dict((doc.get("extra") or {}).get(KEY) or {})


def has_verdict(doc: dict[str, Any]) -> bool:
    """Whether the trajectory carries a verifier's verdict (Tentalis's ``extra.tentalis.verdict``)."""
    return isinstance(tentalis_extra(doc).get("verdict"), dict)


def step_timestamps(doc: dict[str, Any]) -> list[str | None]:
    """The timestamp of each policy turn (agent step that is not a demonstration), in order."""
    return [s.get("timestamp") for s in doc["steps"] if _is_turn_step(s)]


def _step_ours(step: dict[str, Any]) -> dict[str, Any]:
    return dict((step.get("extra") or {}).get(KEY) or {})


def _is_turn_step(step: dict[str, Any]) -> bool:
    if step.get("source") != "agent":
        return False
    kind = (_step_ours(step).get("message") or {}).get("kind", "assistant")
    return kind == "assistant"


def _action(step: dict[str, Any], ours: dict[str, Any]) -> str | None:
    if "action" in ours:
        return ours["action"]
    for call in step.get("tool_calls") or []:
        if call.get("function_name") == TOOL and isinstance(call.get("arguments", {}).get("command"), str):
            return call["arguments"]["command"]
    return None


def atif_to_episode(doc: dict[str, Any], *, vocab_size: int | None = None) -> Episode:
    """The episode an ATIF trajectory records (validated first, token ids against ``vocab_size`` when
    given: :class:`ATIFError` names what is wrong)."""
    validate_atif(doc, vocab_size=vocab_size)
    root = tentalis_extra(doc)
    messages: list[dict[str, Any]] = []
    turns: list[AssistantTurn] = []
    for step in doc["steps"]:
        ours = _step_ours(step)
        if not _is_turn_step(step):
            messages.append({**(ours.get("message") or {"role": ROLES[step["source"]]}), "content": step["message"]})
            continue
        metrics = step.get("metrics") or {}
        results = (step.get("observation") or {}).get("results") or []
        contents = [str(r.get("content") or "") for r in results]
        turn = AssistantTurn(index=len(turns), text=step["message"],
                             token_ids=_opt(metrics.get("completion_token_ids"), int),
                             logprobs=_opt(metrics.get("logprobs"), float),
                             prompt_token_ids=_opt(metrics.get("prompt_token_ids"), int),
                             finish_reason=str(ours.get("finish_reason") or "stop"), action=_action(step, ours),
                             observation="\n".join(contents), info=dict(ours.get("info") or {}),
                             seconds_policy=float(ours.get("seconds_policy") or 0.0),
                             seconds_env=float(ours.get("seconds_env") or 0.0))
        turns.append(turn)
        messages.append({**(ours.get("message") or {"role": "assistant", "kind": "assistant"}), "content": step["message"]})
        if ours.get("observation_in_context", True):
            kinds = ours.get("observation_messages") or [{"role": "user", "kind": "observation"}] * len(contents)
            if len(kinds) != len(contents):
                raise ATIFError(f"steps[{step['step_id'] - 1}].extra.{KEY}.observation_messages: {len(kinds)} entries for "
                                f"{len(contents)} observation results; they must pair up")
            messages.extend({**k, "content": c} for k, c in zip(kinds, contents))
    if root:
        v = root["verdict"]
        verdict = Verdict(bool(v["passed"]), float(v["reward"]), str(v.get("detail") or ""))
        return Episode(environment=root["environment"], task_id=root["task_id"], messages=messages, turns=turns,
                       verdict=verdict, end_reason=root["end_reason"], reward=float(root.get("reward", verdict.reward)),
                       max_turns=int(root["max_turns"]), info=dict(root.get("info") or {}))
    return Episode(environment="atif", task_id=doc["session_id"], messages=messages, turns=turns,
                   verdict=Verdict(False, 0.0, NO_VERDICT), end_reason="", reward=0.0, max_turns=max(len(turns), 1),
                   info={"agent": doc["agent"]["name"], "schema_version": doc["schema_version"]})


def _opt(values: list | None, cast) -> list | None:
    return None if values is None else [cast(v) for v in values]


# --------------------------------------------------------------------------- files
def write_atif(docs: Iterable[dict[str, Any]], path: Path | str) -> int:
    """Write trajectories: ``.jsonl`` one per line; ``.json`` one object (a single trajectory, as Harbor
    writes ``trajectory.json``) or an array of them. Returns how many."""
    path = Path(path)
    docs = list(docs)
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    elif path.suffix == ".json":
        text = json.dumps(docs[0] if len(docs) == 1 else docs, ensure_ascii=False, indent=2) + "\n"
    else:
        raise ValueError(f"{path}: name the file .json or .jsonl (one trajectory per line)")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return len(docs)


@dataclass
class Entry:
    """One trajectory of a file as read, parsed or not: ``index`` counts the file's trajectories from 0,
    ``where`` names it for a person (``t.jsonl line 3``, ``t.json item 2``), ``line`` is its line in a
    ``.jsonl`` file (None in a ``.json`` one), ``raw`` the text as it came, and ``doc`` the parsed JSON
    or ``error`` why it is not JSON."""

    index: int
    where: str
    line: int | None
    raw: str
    doc: Any = None
    error: str | None = None


def _decode(data: bytes, name: str) -> tuple[str | None, str | None]:
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, (f"{name}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                      "save the file as UTF-8 and import it again")


def read_entries(path: Path | str) -> list[Entry]:
    """Every trajectory of a ``.jsonl`` file (one per non-blank line) or a ``.json`` file (one object or
    an array), each parsed on its own so that every bad one can be named (and quarantined), not only
    the first. Lines split on ``\\n`` alone: a message may hold U+2028 or U+0085, which JSON allows
    raw and :func:`write_atif` writes raw, and which ``str.splitlines`` would take for line ends."""
    path = Path(path)
    data = path.read_bytes()
    entries: list[Entry] = []
    if path.suffix == ".jsonl":
        for n, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            where = f"{path.name} line {n}"
            text, error = _decode(line, where)
            entry = Entry(len(entries), where, n, text if text is not None else line.decode("utf-8", "replace"))
            if error is None:
                try:
                    entry.doc = json.loads(text)
                except json.JSONDecodeError as exc:
                    error = f"{where}: not JSON ({exc.msg} at column {exc.colno})"
            entry.error = error
            entries.append(entry)
        return entries
    text, error = _decode(data, path.name)
    if error is not None:
        return [Entry(0, path.name, None, data.decode("utf-8", "replace"), error=error)]
    if not text.strip():
        return []
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return [Entry(0, path.name, None, text, error=f"{path.name}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")]
    if not isinstance(obj, list):
        return [Entry(0, path.name, None, text, doc=obj)]
    # ensure_ascii: an item may hold a lone surrogate, which only an escape can carry
    return [Entry(k, f"{path.name} item {k}", None, json.dumps(d), doc=d) for k, d in enumerate(obj)]


def read_atif(path: Path | str, *, vocab_size: int | None = None) -> list[dict[str, Any]]:
    """Trajectories from a ``.json`` file (one object or an array) or a ``.jsonl`` file (one per line),
    each validated; :class:`ATIFError` names the file, the line or item and the bad field of every bad
    trajectory (the first 10)."""
    path = Path(path)
    entries = read_entries(path)
    if not entries:
        raise ATIFError(f"{path.name}: holds no trajectory")
    problems = []
    for e in entries:
        if e.error is not None:
            problems.append(e.error)
            continue
        try:
            validate_atif(e.doc, vocab_size=vocab_size)
        except ATIFError as exc:
            problems.append(f"{e.where}: {exc}")
    if problems:
        more = f"\n... and {len(problems) - 10} more bad trajectories" if len(problems) > 10 else ""
        raise ATIFError("\n".join(problems[:10]) + more)
    return [e.doc for e in entries]
