"""Outcome, format and combined rewards."""

from __future__ import annotations

import json
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
