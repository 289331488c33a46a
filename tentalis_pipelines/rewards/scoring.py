"""Outcome, format and combined rewards."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

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


DEFAULT_WEIGHTS = {"math": RewardWeights(), "code": RewardWeights(format=0.0, process=0.0), "chat": RewardWeights(outcome=0.0, format=0.0, process=0.0, manager=1.0)}
WEIGHT_COMPONENTS = tuple(RewardWeights.__dataclass_fields__)  # outcome, format, process, manager
ENVIRONMENTS = tuple(DEFAULT_WEIGHTS)  # the environments a weight override may name (math, code, chat)


def _weights_error(source: str, problem: str, per_environment: bool) -> ValueError:
    example = '{"manager": 1.0}' + (' or, per environment, {"math": {"format": 0.0}}' if per_environment else "")
    return ValueError(f"{source}: {problem}. Fix: give a JSON object of weights for {', '.join(WEIGHT_COMPONENTS)}, "
                      f"each a number >= 0, e.g. {example}")


def parse_weight_overrides(spec: str | Mapping[str, Any] | None, *, source: str = "weights",
                           per_environment: bool = True) -> dict[str, dict[str, float]]:
    """The one parser of reward-weight JSON (the ``review.reward_weights`` setting, ``tentalis rescore
    --weights``, the ``reward_versions`` config): ``{scope: {component: weight}}``, scope ``*`` (every
    environment) or an environment. ``spec`` is JSON text or a mapping, either flat (``{"manager": 1.0}``:
    every environment) or, with ``per_environment``, per environment (``{"math": {"manager": 1.0}}``,
    ``*`` naming every environment); components not named keep their weights from elsewhere. Empty,
    blank or ``{}``: no override (``{}``).

    Rules: a JSON object; components among outcome, format, process, manager; each weight a finite
    number of 0 or more (a bool, a string, NaN, an infinity or a negative weight is refused: a negative
    weight would pay for failing). A bad input raises ValueError "<source>: <what is wrong>. Fix: ...",
    naming ``source`` (the setting or option the text came from) and showing a valid example."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return {}
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise _weights_error(source, f"not valid JSON ({exc.msg})", per_environment) from None
    if not isinstance(spec, Mapping):
        raise _weights_error(source, f"must be a JSON object, not {type(spec).__name__}", per_environment)

    def components(scope: str, obj: Any) -> dict[str, float]:
        where = "" if scope == "*" else f" for {scope!r}"
        if not isinstance(obj, Mapping):
            raise _weights_error(source, f"the weights{where} must be an object, not {type(obj).__name__}", per_environment)
        out = {}
        for k, v in obj.items():
            if k not in WEIGHT_COMPONENTS:
                raise _weights_error(source, f"unknown reward component {k!r}{where}", per_environment)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise _weights_error(source, f"weight {k!r}{where} must be a finite number of 0 or more, not {v!r}",
                                     per_environment)
            out[k] = float(v)
        return out

    scopes = set(spec) & (set(ENVIRONMENTS) | {"*"})
    if not scopes:  # flat: components for every environment (a misspelt component is named by components())
        return {"*": components("*", spec)} if spec else {}
    if not per_environment:
        raise _weights_error(source, f"applies to every environment: name components, not environments {sorted(scopes)}",
                             per_environment)
    if scopes == set(spec):
        return {scope: components(scope, obj) for scope, obj in spec.items()}
    raise _weights_error(source, f"mixes environments {sorted(scopes)} with other keys {sorted(set(spec) - scopes)}: "
                         "give either components or environments mapping to components", per_environment)


def parse_weights(text: str | None, *, source: str = "review.reward_weights") -> RewardWeights | None:
    """The ``review.reward_weights`` setting (:func:`parse_weight_overrides`, flat only): the named
    components' weights for every environment, the others keeping their math defaults; empty (or
    ``{}``) means the per-environment defaults (None)."""
    overrides = parse_weight_overrides(text, source=source, per_environment=False)
    return RewardWeights(**overrides["*"]) if overrides else None


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
