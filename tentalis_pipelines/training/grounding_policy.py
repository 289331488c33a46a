"""Grounding flags in training: from a claim's characters to its tokens, and the policy that uses them.

``trainer.grounding_policy``:

* ``off``: flags are recorded (``grounding_flags``) and change nothing;
* ``penalize``: every completion token of a flagged claim gets the advantage ``-grounding_penalty``
  (replacing the one it had: a hallucinated number is pushed down even inside a turn the reviewer
  liked); every other token keeps its advantage, and the loss mask is not touched (a flag inside an
  untrained turn stays untrained);
* ``block``: the loss mask is 0 on every token of a turn that holds a flag (a single-turn rollout: its
  whole completion); the run's metrics count the blocked turns.

Token positions index the rollout's ``completion_token_ids`` (for a multi-turn segment, the whole
segment's completion; a turn's tokens are its span there). Plain functions: no Dagster, no Delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tentalis_pipelines.training.trainer import GROUNDING_POLICIES as POLICIES
from tentalis_pipelines.training.trainer import TrainSample


class GroundingFlagError(ValueError):
    """A flag row that cannot apply to its sample (the message names the rollout, the span and the fix)."""


def token_char_offsets(tokenizer, token_ids: Sequence[int]) -> tuple[str, list[int]]:
    """(the decoded text, where each token starts in it, plus its end): token ``i`` covers characters
    ``[offsets[i], offsets[i + 1])``. From cumulative decoding, so multi-byte characters split over
    tokens land on the token that completes them."""
    ids = list(token_ids)
    offsets = [0]
    for i in range(1, len(ids) + 1):
        offsets.append(len(tokenizer.decode(ids[:i], skip_special_tokens=False)))
    text = tokenizer.decode(ids, skip_special_tokens=False)
    # Decoding may shrink (a partial character then complete): keep the offsets non-decreasing.
    for i in range(1, len(offsets)):
        offsets[i] = max(offsets[i], offsets[i - 1])
    return text, offsets


def chars_to_tokens(offsets: Sequence[int], start: int, end: int) -> tuple[int, int]:
    """The tokens [first, last + 1) whose characters overlap ``[start, end)`` (``offsets`` from
    :func:`token_char_offsets`)."""
    n = len(offsets) - 1
    if not (0 <= start < end <= offsets[-1]):
        raise GroundingFlagError(f"characters [{start}, {end}) are outside the {offsets[-1]}-character decoded turn")
    first = max(i for i in range(n) if offsets[i] <= start)
    last = min(i for i in range(1, n + 1) if offsets[i] >= end)
    return first, last


def apply_flags(sample: TrainSample, flags: Sequence[dict], policy: str, penalty: float, *,
                rollout_id: str = "?") -> tuple[TrainSample, dict[str, int]]:
    """``sample`` with ``flags`` (grounding_flags rows of its rollout) applied under ``policy``, and
    counts: ``penalized_tokens``, ``blocked_turns``. The sample passed in is not changed."""
    if policy not in POLICIES:
        raise ValueError(f"grounding_policy must be one of {POLICIES}, got {policy!r}")
    counts = {"penalized_tokens": 0, "blocked_turns": 0}
    if policy == "off" or not flags:
        return sample, counts
    n = len(sample.completion_ids)
    for f in flags:
        ts, te, us, ue = (int(f["token_start"]), int(f["token_end"]), int(f["turn_token_start"]), int(f["turn_token_end"]))
        if not (0 <= us <= ts < te <= ue <= n):
            raise GroundingFlagError(
                f"grounding flag of rollout {rollout_id} names tokens [{ts}, {te}) in turn [{us}, {ue}), outside its "
                f"{n}-token completion or its turn: the flags were computed on other rollouts; re-materialise grounding_flags")
    if policy == "penalize":
        if penalty < 0:
            raise ValueError(f"grounding_penalty is the size of the negative advantage and must be >= 0, got {penalty}")
        adv = list(sample.token_advantages) if sample.token_advantages is not None else [float(sample.advantage)] * n
        hit: set[int] = set()
        for f in flags:
            hit.update(range(int(f["token_start"]), int(f["token_end"])))
        for i in hit:
            adv[i] = -float(penalty)
        counts["penalized_tokens"] = len(hit)
        return replace(sample, token_advantages=adv), counts
    mask = list(sample.loss_mask) if sample.loss_mask is not None else [1] * n
    turns = sorted({(int(f["turn_token_start"]), int(f["turn_token_end"])) for f in flags})
    for s, e in turns:
        mask[s:e] = [0] * (e - s)
    counts["blocked_turns"] = len(turns)
    return replace(sample, loss_mask=mask), counts
