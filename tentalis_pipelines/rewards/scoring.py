"""Outcome, format and combined rewards."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from tentalis_pipelines.rewards.steps import ParsedCompletion


def format_score(parsed: ParsedCompletion, finish_reason: str) -> float:
    """1.0 for steps in ``<step>`` tags and an ``<answer>`` tag, partial credit for either alone."""
    score = 0.0
    if parsed.has_answer_tag:
        score += 0.6
    if parsed.has_step_tags:
        score += 0.4
    if finish_reason == "length":
        score *= 0.5
    return round(score, 4)


def final_answer(parsed: ParsedCompletion, finish_reason: str) -> str | None:
    """The answer that is graded: the tagged one; else the last number of a completion that *ended*.
    A truncated untagged completion (``finish_reason == 'length'``) has no answer: its last number is
    wherever the token limit cut it, not a conclusion."""
    if parsed.has_answer_tag:
        return parsed.answer
    if parsed.parse_mode == "fallback" and finish_reason != "length":
        return parsed.answer
    return None


def process_credit(step_scores: list[float | None], answer: str | None) -> float | None:
    """The process reward: the mean of the scored steps, and only for a solution that reaches an answer,
    so steps without a conclusion never outscore an honest wrong attempt. None: nothing to credit."""
    checked = [s for s in step_scores if s is not None]
    if answer is None or not checked:
        return None
    return sum(checked) / len(checked)


@dataclass(frozen=True)
class RewardWeights:
    """How the components add up to the reward: outcome (verifier), format, process (mean step
    score) and manager (review score). The weights used are stored on every trajectory."""

    outcome: float = 1.0
    format: float = 0.2
    process: float = 0.2
    manager: float = 0.5

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def parse_weights(text: str | None) -> RewardWeights | None:
    """The ``review.reward_weights`` setting: a JSON object with any of outcome, format, process and
    manager (the others keep their math defaults), applied to every environment; empty means the
    per-environment defaults (None). Raises ValueError naming the setting and the fix."""
    if text is None or not str(text).strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"review.reward_weights is not JSON ({exc.msg}): write e.g. "
                         '\'{"outcome": 0, "format": 0, "process": 0, "manager": 1}\'') from None
    if not isinstance(raw, dict):
        raise ValueError("review.reward_weights must be a JSON object with outcome, format, process, manager")
    allowed = set(RewardWeights.__dataclass_fields__)
    if unknown := sorted(set(raw) - allowed):
        raise ValueError(f"review.reward_weights: unknown component(s) {unknown}; use {sorted(allowed)}")
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"review.reward_weights[{k!r}] must be a finite number, got {v!r}")
    return RewardWeights(**{k: float(v) for k, v in raw.items()})


DEFAULT_WEIGHTS = {"math": RewardWeights(), "code": RewardWeights(format=0.0, process=0.0), "chat": RewardWeights(outcome=0.0, format=0.0, process=0.0, manager=1.0)}


def combine(weights: RewardWeights, *, outcome: float, format: float, process: float | None, manager: float) -> float:
    """Weighted sum; a missing process score (no checkable step) contributes nothing."""
    total = weights.outcome * outcome + weights.format * format + weights.manager * manager
    if process is not None:
        total += weights.process * process
    return float(total)


def overlong_penalty(completion_tokens: int, max_completion_length: int, buffer: int) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max - buffer`` tokens, then falling linearly to −1 at
    ``max`` (and −1 beyond), so truncated rambling is discouraged without a cliff."""
    if buffer <= 0:
        return 0.0
    start = max_completion_length - buffer
    if completion_tokens <= start:
        return 0.0
    if completion_tokens >= max_completion_length:
        return -1.0
    return (start - completion_tokens) / buffer
