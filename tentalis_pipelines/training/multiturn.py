"""Multi-turn trajectories: an agent session's turns -> training samples with a loss mask.

Plain functions over turn rows (dicts shaped like ``schemas.SCHEMAS["turns"]``) and review rows; no Dagster,
deltalake or DuckDB, so the trainer side runs on a bare GPU machine.

**Tokens.** A turn stores the exact templated prompt the model saw (``prompt_token_ids``) and what it
sampled (``completion_token_ids``). While each turn's prompt begins with the previous turn's prompt +
completion (chat templates that re-render history verbatim, as ChatML does), the session is **one**
sample: the first turn's prompt is the sample's prompt, and the completion is everything after it up to
the end of the last turn: assistant turns and, between them, the user, tool-output and template tokens
that the next prompt added. That sequence is exactly the last turn's full context, so every assistant
turn is trained on in the context it was sampled in. When a prompt does *not* extend the previous
context (a template that drops or re-tokenises history, a sub-agent with another system prompt, a
change of policy version or temperature mid-session), a new **segment** starts there: one sample per
segment, each reproducing exactly what the model saw. Usually a session is one segment.

**Mask.** ``assistant_mask`` is 1 exactly on the tokens the model generated (every turn's
``completion_token_ids``, located at their offset inside the final context) and 0 on system, user,
tool-output and template tokens. The trainer's ``loss_mask`` is that mask restricted to turns that have
a reward.

**Reward per assistant turn.** A turn-level review (``rollout_id`` = the turn id) if there is one,
else the session-level review (``rollout_id`` = the session id); several reviews of one target: each
reviewer's latest, averaged over reviewers. A turn with neither is not trained on (mask 0), and a
session none of whose turns has a reward is skipped and reported.

**Normalisation.** GRPO compares samples of the same prompt. Sessions of the same *family* (same
first-turn messages: the same task handed to the agent again) form a group when the family has more
than one session in the batch; every other session's turns are pooled into one batch group (a batch-mean
baseline, as REINFORCE++ and TRL's ``scale_rewards='batch'`` do), because a lone session has no peers
and its raw reward would push every one of its turns the same way. In both cases the unit is the
assistant turn: advantage = (turn reward - group mean) / (group std + eps) (``scale_rewards='group'``;
``'none'`` only centres). A turn rewarded over its siblings in the same session gains probability
relative to them, which is what per-turn reviews are for.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.training.trainer import TrainSample


@dataclass
class AssistantSpan:
    """One assistant turn inside a segment's completion: tokens [start, end)."""

    turn_id: str
    turn_index: int
    start: int
    end: int


@dataclass
class SessionSegment:
    session_id: str
    segment: int
    policy_version: str
    temperature: float  # the training temperature: the sampling temperature, 1.0 for greedy turns
    prompt_ids: list[int]
    completion_ids: list[int]
    spans: list[AssistantSpan] = field(default_factory=list)
    old_logps: list[float | None] | None = None  # per completion token; None on context tokens

    @property
    def assistant_mask(self) -> list[int]:
        mask = [0] * len(self.completion_ids)
        for s in self.spans:
            mask[s.start:s.end] = [1] * (s.end - s.start)
        return mask

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def training_temperature(sampling_temperature: float | None) -> float:
    """The temperature a turn is trained at: its sampling temperature, or 1.0 for greedy (T <= 0) turns,
    which have no sampling distribution to match (their stored log-probs are then not used)."""
    if sampling_temperature is None or sampling_temperature <= 0:
        return 1.0
    return float(sampling_temperature)


def choose_turns(turns: Iterable[dict]) -> list[dict]:
    """One row per turn index, in order. Of a call's ``n`` choices, the one that the next call's prompt
    continues (the choice the agent kept), else the first."""
    by_index: dict[int, list[dict]] = defaultdict(list)
    for t in turns:
        by_index[int(t["turn_index"])].append(t)
    order = sorted(by_index)
    out = []
    for i, idx in enumerate(order):
        choices = sorted(by_index[idx], key=lambda t: int(t.get("choice_index") or 0))
        chosen = choices[0]
        if len(choices) > 1 and i + 1 < len(order):
            nxt = list(by_index[order[i + 1]][0]["prompt_token_ids"] or [])
            for c in choices:
                seq = list(c["prompt_token_ids"] or []) + list(c["completion_token_ids"] or [])
                if nxt[: len(seq)] == seq:
                    chosen = c
                    break
        out.append(chosen)
    return out


def _usable_logps(t: dict) -> list[float] | None:
    lp = t.get("sampling_logprobs")
    c = t.get("completion_token_ids") or []
    if lp is None or len(lp) != len(c) or (t.get("temperature") or 0) <= 0:
        return None
    if not all(x is not None and math.isfinite(x) for x in lp):
        return None
    return [float(x) for x in lp]


def build_segments(session_id: str, turns: Iterable[dict]) -> list[SessionSegment]:
    """A session's turns as training segments (usually one; see the module doc)."""
    segments: list[SessionSegment] = []
    cur: SessionSegment | None = None
    for t in choose_turns(turns):
        p = list(t.get("prompt_token_ids") or [])
        c = list(t.get("completion_token_ids") or [])
        if not p:
            continue  # nothing to condition on (a backend that returned no token ids)
        temp = training_temperature(t.get("temperature"))
        lp = _usable_logps(t)
        version = t.get("policy_version") or "base"
        if cur is not None and cur.policy_version == version and cur.temperature == temp and p[: len(cur.context)] == cur.context:
            gap = p[len(cur.context):]
            start = len(cur.completion_ids) + len(gap)
            if cur.old_logps is not None and lp is not None:
                cur.old_logps = cur.old_logps + [None] * len(gap) + lp
            else:
                cur.old_logps = None
            cur.completion_ids = cur.completion_ids + gap + c
        else:
            cur = SessionSegment(session_id, len(segments), version, temp, p, list(c), old_logps=lp)
            segments.append(cur)
            start = 0
        if c:
            cur.spans.append(AssistantSpan(t["turn_id"], int(t["turn_index"]), start, start + len(c)))
    return [s for s in segments if s.spans]


# --------------------------------------------------------------------------- rewards
JUDGE_MANAGER = "judge"  # the ``manager`` of a review the LLM judge wrote for a session no person reviewed
def review_score(reviews: Sequence[dict]) -> float | None:
    """Several reviews of one target: each reviewer's latest, averaged over reviewers."""
    latest: dict[str, dict] = {}
    for r in sorted(reviews, key=lambda r: (r.get("created_at") is None, r.get("created_at") or 0)):
        if r.get("score") is None:
            continue
        latest[r.get("reviewer") or r.get("manager") or ""] = r
    if not latest:
        return None
    return sum(float(r["score"]) for r in latest.values()) / len(latest)


def turn_rewards(session_id: str, turn_ids: Sequence[str], reviews: Sequence[dict]) -> dict[str, tuple[float, str]]:
    """turn id -> (reward, source) for the turns that have one: their turn-level review, else the
    session-level review (``rollout_id`` = the session id). Turns without either are left out.

    A judge's review (``manager = 'judge'``) is a session-level review like any other, used only when no
    person reviewed the session at all: a person's review of any turn or of the session wins."""
    people = [r for r in reviews if r.get("manager") != JUDGE_MANAGER]
    judged = not people and bool(reviews)
    by_target: dict[str, list[dict]] = defaultdict(list)
    for r in people or reviews:
        by_target[r["rollout_id"]].append(r)
    session_score = review_score(by_target.get(session_id, []))
    out = {}
    for tid in turn_ids:
        score = review_score(by_target.get(tid, []))
        if score is not None:
            out[tid] = (score, "turn_review")
        elif session_score is not None:
            out[tid] = (session_score, "judge" if judged else "session_review")
    return out


def session_family(first_turn_messages: str | list | None) -> str:
    """The task a session was given: a hash of its first call's messages (system prompt and first user
    message), so the same task handed to the agent again lands in the same GRPO group."""
    msgs = json.loads(first_turn_messages) if isinstance(first_turn_messages, str) else (first_turn_messages or [])
    canonical = json.dumps([{"role": m.get("role"), "content": m.get("content")} for m in msgs if isinstance(m, dict)], sort_keys=True)
    return "chat-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


@dataclass
class TurnAdvantage:
    reward: float
    advantage: float
    source: str
    group: str
    signal: bool


def turn_advantages(
    items: Sequence[tuple[str, str, str, float, str]], *, scale_rewards: str = "group"
) -> dict[str, TurnAdvantage]:
    """``items``: (family, session_id, turn_id, reward, source) per rewarded assistant turn. Families with
    more than one session are their own group; the other sessions' turns share one batch group."""
    sessions_per_family: dict[str, set[str]] = defaultdict(set)
    for family, session, *_ in items:
        sessions_per_family[family].add(session)
    keys = [family if len(sessions_per_family[family]) > 1 else "batch" for family, *_ in items]
    adv, signal = group_advantages(keys, [r for *_, r, _ in items], scale_rewards=scale_rewards)
    return {tid: TurnAdvantage(reward, a, source, k, s)
            for (_, _, tid, reward, source), k, a, s in zip(items, keys, adv, signal)}


def segment_token_arrays(segment_len: int, spans: Sequence[dict | AssistantSpan], advantages: dict[str, float]) -> tuple[list[int], list[float]]:
    """(loss_mask, token_advantages) over a segment's completion: each rewarded turn's tokens carry its
    advantage and are trained on; context tokens and unrewarded turns get 0 and mask 0."""
    mask, adv = [0] * segment_len, [0.0] * segment_len
    for s in spans:
        tid, start, end = (s["turn_id"], s["start"], s["end"]) if isinstance(s, dict) else (s.turn_id, s.start, s.end)
        if tid in advantages:
            mask[start:end] = [1] * (end - start)
            adv[start:end] = [float(advantages[tid])] * (end - start)
    return mask, adv


def train_sample(prompt_ids: Sequence[int], completion_ids: Sequence[int], loss_mask: Sequence[int],
                 token_advantages: Sequence[float], *, advantage: float, old_logps: Sequence[float | None] | None,
                 temperature: float | None) -> TrainSample:
    """The trainer's sample for one multi-turn segment (as stored in rollouts + trajectories)."""
    if len(loss_mask) != len(completion_ids) or len(token_advantages) != len(completion_ids):
        raise ValueError("a multi-turn row's loss_mask and token_advantages must have one entry per completion token")
    return TrainSample(list(prompt_ids), list(completion_ids), float(advantage), token_advantages=list(token_advantages),
                       old_logps=list(old_logps) if old_logps is not None else None, temperature=temperature,
                       loss_mask=[int(m) for m in loss_mask])
