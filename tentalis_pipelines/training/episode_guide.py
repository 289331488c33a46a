"""Rescuing all-fail groups of agent episodes: the manager's hint, an expert prefix, or both.

The pure decisions of ``--method guide`` on environment batches (terminal, BFCL, mini-SWE); the stage
that runs the episodes is ``env_batches.build_environment_guided_rollouts``, the environment wrapper
``envs/guided.py``, the ratio the trainer's (``training/guide.py`` explains the method on arithmetic).

**Where the hint goes.** In ONE place: appended to the task's instruction (the last user message of
the environment's first observation) as ``"\\n\\nManager's hint: <hint>"``, as arithmetic's hint goes
after the task (``opd.hinted_prompt``). Why there and not in a later observation: the hint then lives
only in the **prompt** of the episode's training segment (the tokens before the policy's first turn).
Everything after it (the policy's turns, the observations, the template tokens, the turn spans and
the sampled log-probs) is untouched, so the student's sample is the un-hinted prompt (the same
messages rendered again without the hint) + the hinted episode's completion tokens, with the span
offsets unchanged and no re-tokenisation of anything the loss sees. Not the system prompt: BFCL's is
4-8k tokens of function docs that every episode over the same tools shares (the policy's KV cache
shares it across episodes), and the instruction is what the hint talks about.

**Expert prefixes (BREAD).** The first ``k`` turns of a demonstration (the task's scripted oracle:
``envs/guided.demonstration``) are played in the environment before the policy's first turn and stand
in the conversation as assistant messages of kind ``prefix``; they too are part of the first prompt, so
they are never trained on (the assistant-only mask covers the policy's own turns only), and the
environment's state is the one they left. ``k`` anneals with the level's success (:func:`prefix_turns`).

**The training sample.** :func:`guided_sample`: the un-hinted prompt ids, the episode's completion
ids, the assistant mask from the turn spans, and per assistant token the log-prob the hinted sampler
gave it (the behaviour policy pi_b(a_t | s + hint), ``None`` on every context token): the trainer's
truncated ratio ``pi_theta(a_t|s) / pi_b(a_t|s+hint)`` is then taken per assistant token under the mask
(``guide_importance``: clip or shaping, as on arithmetic).

Held-out tasks (``split = 'test'``) never get a hint or a prefix (:func:`check_trainable`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

HINT_LABEL = "Manager's hint: "
PREFIX_KIND = "prefix"  # the ``kind`` of a demonstrated assistant message given as an expert prefix
HELD_OUT_SPLIT = "test"


class HeldOutTask(ValueError):
    """A held-out (``split = 'test'``) task was about to get a hint or a prefix."""


def check_trainable(task: Any) -> None:
    """Raise :class:`HeldOutTask` for a held-out task: evaluation is always hint- and demonstration-free,
    and a training episode of a test task with help in its context would leak the benchmark."""
    split = task.get("split") if isinstance(task, Mapping) else getattr(task, "split", None)
    if split == HELD_OUT_SPLIT:
        tid = task.get("task_id") if isinstance(task, Mapping) else getattr(task, "task_id", "?")
        raise HeldOutTask(f"task {tid!r} is held out (split 'test'): it never gets a hint or an expert prefix")


def task_split(task_row: Mapping[str, Any]) -> str:
    """A ``tasks`` row's split (its metadata's ``split``; ``train`` when none is recorded)."""
    try:
        meta = json.loads(task_row.get("metadata") or "{}")
    except (TypeError, ValueError):
        meta = {}
    return str(meta.get("split") or "train")


def hinted_messages(messages: Sequence[Mapping[str, Any]], hint: str, *, within: int | None = None) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``hint`` appended to the last user message among the first ``within``
    (the environment's first observation: its last user message is the task's instruction)."""
    out = [dict(m) for m in messages]
    head = out[: len(out) if within is None else within]
    idx = next((i for i in range(len(head) - 1, -1, -1) if head[i].get("role") == "user"), None)
    if idx is None:
        raise ValueError("the episode's first observation has no user message to put the manager's hint after")
    out[idx]["content"] = f"{out[idx]['content']}\n\n{HINT_LABEL}{hint}"
    return out


def hint_references(task_row: Mapping[str, Any]) -> list[str]:
    """What a hint for this task must not contain (checked by ``opd.screen_hint``'s leak test, one
    reference at a time): a terminal answer task's expected output, a tree task's expected file
    contents. Other checks (BFCL's calls, mini-SWE's tests) name no answer text."""
    try:
        check = json.loads(task_row.get("reference") or "{}")
    except (TypeError, ValueError):
        return []
    if not isinstance(check, dict):
        return []
    if check.get("kind") == "answer":
        expected = str(check.get("expected") or "").strip()
        return [expected] if expected else []
    if check.get("kind") == "tree":
        return [str(r["file"]).strip() for r in check.get("rules") or [] if isinstance(r, dict) and str(r.get("file") or "").strip()]
    return []


# --------------------------------------------------------------------------- prefix annealing
def prefix_fraction(success_rate: float, *, max_fraction: float, threshold: float) -> float:
    """The share of the demonstration given as a prefix: ``max_fraction`` at 0% success, falling linearly
    to 0 at ``threshold`` and 0 above it: ``max_fraction * (1 - success / threshold)``."""
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success_rate must be in [0, 1], got {success_rate}")
    if not 0.0 <= max_fraction <= 1.0:
        raise ValueError(f"guide_prefix_max_fraction must be in [0, 1], got {max_fraction}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"guide_prefix_threshold must be in (0, 1], got {threshold}")
    if success_rate >= threshold:
        return 0.0
    return max_fraction * (1.0 - success_rate / threshold)


def prefix_turns(demo_len: int, success_rate: float, *, max_fraction: float = 0.5, threshold: float = 0.5) -> int:
    """BREAD's annealed prefix length: ``k = min(ceil(fraction * demo_len), demo_len - 1)`` with
    :func:`prefix_fraction`. At least one demonstrated turn is always left to the policy (the last one
    is the submission: a prefix of the whole demonstration would train nothing), so a demonstration of
    0 or 1 turns gives no prefix. (The product is rounded to 9 places before the ceiling so that, e.g.,
    0.25 * 4 is 1, not 2 by a floating-point hair.)"""
    if demo_len <= 1:
        return 0
    frac = prefix_fraction(success_rate, max_fraction=max_fraction, threshold=threshold)
    return min(math.ceil(round(frac * demo_len, 9)), demo_len - 1)


# --------------------------------------------------------------------------- rows and samples
def format_share(turns: int, format_errors: int) -> float:
    """The episode's format reward: the share of its assistant turns that held a well-formed action or
    tool call (0 for an episode without a turn)."""
    if turns <= 0:
        return 0.0
    return max(0, turns - format_errors) / turns


def rescue_id(task_id: str, policy_version: str, rescue: str, hint_id: str | None, demo_source: str, k: int) -> str:
    """What produced a guided episode, as an id (``trajectories.guide_hint_id`` of its row): the hint's id
    for a hint rescue; ``prefix-`` and a hash of the task, demonstration and ``k`` for a prefix alone."""
    if rescue == "hint":
        if not hint_id:
            raise ValueError("a hint rescue needs the hint's id")
        return hint_id
    key = f"{task_id}\x1f{policy_version}\x1f{rescue}\x1f{hint_id or ''}\x1f{demo_source}\x1f{k}"
    return f"{rescue}-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def behaviour_logps(completion_len: int, spans: Sequence[Mapping[str, Any]], turn_logps: Mapping[str, Sequence[float] | None]) -> list[float | None]:
    """Per completion token, the log-prob the (hinted) sampler gave it: each assistant turn's own at its
    span ``[start, end)``, ``None`` on every context token (observations, template, hint-free gaps).
    ``turn_logps``: turn id -> that turn's sampled log-probs (one per token of its span)."""
    out: list[float | None] = [None] * completion_len
    for s in spans:
        lps = turn_logps.get(s["turn_id"])
        n = int(s["end"]) - int(s["start"])
        if lps is None or len(lps) != n:
            raise ValueError(f"turn {s['turn_id']!r} has {0 if lps is None else len(lps)} sampled log-probs for its {n} tokens: "
                             "a guided episode needs the sampler's log-prob of every assistant token")
        out[int(s["start"]):int(s["end"])] = [float(x) for x in lps]
    return out


def guided_sample(plain_prompt_ids: Sequence[int], completion_ids: Sequence[int], spans: Sequence[Mapping[str, Any]],
                  turn_logps: Mapping[str, Sequence[float] | None]) -> dict[str, Any]:
    """The student's view of a guided episode (one segment): ``prompt_token_ids`` = the un-hinted prompt
    (prefix turns included: context), ``completion_token_ids`` = the episode's, ``assistant_mask`` = 1 on
    the policy's own turns only, ``behaviour_logprobs`` = :func:`behaviour_logps`."""
    mask = [0] * len(completion_ids)
    for s in spans:
        if not 0 <= int(s["start"]) < int(s["end"]) <= len(completion_ids):
            raise ValueError(f"turn span {s['start']}:{s['end']} lies outside the {len(completion_ids)} completion tokens")
        mask[int(s["start"]):int(s["end"])] = [1] * (int(s["end"]) - int(s["start"]))
    return {"prompt_token_ids": list(plain_prompt_ids), "completion_token_ids": list(completion_ids), "assistant_mask": mask,
            "behaviour_logprobs": behaviour_logps(len(completion_ids), spans, turn_logps)}


def render_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """A conversation's prompt for the next assistant turn, as ``ChatPolicy`` renders a new one (the chat
    template with the generation prompt, tokenised without special tokens added)."""
    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
