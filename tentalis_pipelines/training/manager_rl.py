"""The manager learns (meta-RL): GRPO on the llm manager's reviews, rewarded by what its hints do.

The llm manager (``rewards/llm_manager.py``) writes a review (score, critique, hint) of a worker's
failed answer. Its hint is worth what it does for the worker: resample the worker ``rescue_samples``
times with the hint in the context (exactly as ``--method guide`` will, ``opd.hinted_prompt``) and
count the answers the verifier accepts. That **rescue rate** is the hint's value (``reward =
"rescue"``); RLT's dense reward, ``log p(answer | prompt + hint) − log p(answer | prompt)``
(``rewards/hint_reward.py``), is the cheaper alternative (``reward = "dense"``), measured in this
repository to predict the realised efficacy poorly (experiments/guided_resampling). A hint the OPD
screen refuses (empty, generic, or leaking the answer) is worth 0: a hint that gives the answer
teaches copying, and guidance would never use it.

Rewarding helpfulness alone makes critics helpful but not discriminating (Critique-RL), so the reward
also charges the score's distance from the verifier's score of the same answer:

    reward = hint_value − accuracy_weight · |score − verifier_score|

with an unparseable review charged the full distance (1). Each failed rollout is one GRPO group of
``num_generations`` sampled reviews; advantages are group-relative (``rewards.advantages``) and the
update is the worker's own trainer (``train_grpo``) on the manager's adapter.

Which tokens each part of the reward trains is ``credit``. With ``"review"`` the summed reward's one
advantage trains every token of the review, so a review with an accurate score and a useless hint
reinforces the hint as well: in this repository the score term dominated (the rescue rate is 0 for
most hints of a small worker) and the trained manager learned to score, not to advise
(experiments/manager_rl). With ``"fields"`` (the default) each part is normalised in its group on its
own (as GDPO normalises each reward of a multi-reward RL run separately) and trains only the tokens
that wrote it: the score's advantage the score's tokens, the hint value's advantage the critique and
the hint (the critique is the hint's context, written for it). This module holds the
pure parts (config, reward, split, ids, samples); the sampling and the checkpoint are the stage's
(``stages/manager_training.py``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass

from tentalis_pipelines.config_fields import config_field
from tentalis_pipelines.rewards.managers import ReviewInput, VerifierManager
from tentalis_pipelines.training import opd

REWARDS = ("rescue", "dense")
CREDITS = ("fields", "review")
UPDATES = ("grpo", "best_of_n")
SCORE_TARGETS = ("sampled", "verifier")
HINT_PROPOSERS = ("none", "verifier")
REVIEW_PART, SCORE_PART = "review", "score"
PARTS = (REVIEW_PART, SCORE_PART)
MAX_DEMO_SCORE_ERROR = 0.5  # a score demonstration must at least be on the verifier's side of the scale


@dataclass
class ManagerRLConfig:
    """How the manager is trained, evaluated and gated (one documented config for this concern)."""

    part: str = config_field("review", "review (one adapter writes the whole review: GRPO or best-of-n) | score (the "
                             "checkpoint's own score adapter, taught the verifier's scores; the review adapter kept as it is)")
    num_generations: int = config_field(4, "reviews sampled per failed rollout (the GRPO group)")
    rescue_samples: int = config_field(4, "worker samples drawn with each hint to measure its rescue rate")
    reward: str = config_field("rescue", "rescue (the worker's realised success with the hint) | dense (RLT's log-prob gain)")
    accuracy_weight: float = config_field(0.5, "weight of |score - verifier score| charged against the hint's value")
    credit: str = config_field("fields", "fields (the score's advantage trains the score's tokens, the hint value's the "
                               "critique and hint) | review (the summed reward trains every token)")
    update: str = config_field("grpo", "grpo (group-relative advantages) | best_of_n (rejection-sampling fine-tuning, RAFT/"
                               "ReST-EM: per failure the review whose hint is worth most, above best_min_value, is trained as a "
                               "demonstration; scores within 0.5 of the verifier's, as many of failures as of accepted answers, "
                               "train the score; CISPO's capped weight, so a sampled plan's tokens keep their gradient)")
    score_targets: str = config_field("sampled", "best_of_n: what teaches the score: sampled (the sampled score nearest the "
                                      "verifier's, within 0.5) | verifier (the verifier's own score written in the reply's "
                                      "format, as many failures as accepted answers: a manager whose sampled scores "
                                      "collapsed to one value has none to pick)")
    hint_proposals: str = config_field("none", "best_of_n: none | verifier (the verifier's hint for each failure, its plan "
                                       "or its first wrong step, is offered beside the sampled reviews, measured by the same "
                                       "reward, and trained as the demonstration when it is worth most: off-policy guidance "
                                       "for the manager, as LUFFY's for the worker; the manager's own hint wins ties)")
    best_min_value: float = config_field(0.5, "best_of_n: a hint is a demonstration only when its value exceeds this "
                                         "(0.5 = the dense gain is positive)")
    temperature: float = config_field(1.0, "sampling temperature of the manager's training reviews")
    max_new_tokens: int = config_field(64, "tokens of one review")
    hint_prefix: str = config_field("", "the words every hint starts with, pre-filled in the hint pass (review.hint_prefix; "
                                    "serve a manager with the prefix it was trained with)")
    max_failures: int = config_field(32, "failed rollouts per training run (newest batches first)")
    success_share: float = config_field(0.25, "accepted rollouts added per failure, reviewed for their score alone (keeps the "
                                        "score discriminating)")
    accepted_per_task: int = config_field(1, "accepted rollouts taken per task (lowest group index first), in training and on "
                                          "the held-out side: a worker that succeeds on a few tasks gives the score more "
                                          "accepted answers to learn and to be checked on")
    eval_accepted: int = config_field(60, "accepted rollouts reviewed on the held-out side (one greedy review each, for the "
                                      "score alone; no rescue is drawn)")
    gate_min_accepted: int = config_field(40, "the gate decides only with at least this many accepted answers reviewed by both "
                                          "managers: fewer cannot tell a discriminating score from a lucky one (0: decide "
                                          "anyway)")
    heldout_fraction: float = config_field(0.25, "share of failed tasks kept for the manager's gate, by task id hash")
    split_seed: int = config_field(0, "the held-out split's hash key, apart from the sampling seed: every update and "
                                      "evaluation of a home sees the same split, whatever seed it samples with")
    eval_rescue_samples: int = config_field(8, "worker samples per held-out failure when two managers are compared")
    gate_margin: float = config_field(0.0, "rejected when the rescue-rate difference's interval lies below -margin")
    score_tolerance: float = config_field(0.05, "rejected when its mean score error exceeds the incumbent's by more")
    learning_rate: float = config_field(1e-4, "AdamW learning rate of the manager's LoRA")
    num_iterations: int = config_field(1, "updates per batch of sampled reviews")
    per_step_rows: int = config_field(0, "trained rows per optimizer step (0: all of an update's rows in one step)")
    seed: int = config_field(0, "sampling and LoRA seed")

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"manager part {self.part!r} is unknown: choose one of {', '.join(PARTS)}")
        if self.reward not in REWARDS:
            raise ValueError(f"manager reward {self.reward!r} is unknown: choose one of {', '.join(REWARDS)}")
        if self.credit not in CREDITS:
            raise ValueError(f"manager credit {self.credit!r} is unknown: choose one of {', '.join(CREDITS)}")
        if self.update not in UPDATES:
            raise ValueError(f"manager update {self.update!r} is unknown: choose one of {', '.join(UPDATES)}")
        if self.score_targets not in SCORE_TARGETS:
            raise ValueError(f"manager score_targets {self.score_targets!r} is unknown: choose one of {', '.join(SCORE_TARGETS)}")
        if self.score_targets == "verifier" and self.update != "best_of_n":
            raise ValueError("score_targets = 'verifier' trains the verifier's scores as demonstrations: use it with "
                             "update = 'best_of_n'")
        if self.hint_proposals not in HINT_PROPOSERS:
            raise ValueError(f"manager hint_proposals {self.hint_proposals!r} is unknown: choose one of {', '.join(HINT_PROPOSERS)}")
        if self.hint_proposals != "none" and self.update != "best_of_n":
            raise ValueError(f"hint_proposals = {self.hint_proposals!r} trains a proposed hint as a demonstration: use it with "
                             "update = 'best_of_n'")
        if self.hint_proposals != "none" and self.hint_prefix:
            raise ValueError(f"hint_proposals = {self.hint_proposals!r} trains the proposer's hints as written, and a hint prefix "
                             f"({self.hint_prefix!r}) would make the manager start every hint with words they do not: set "
                             "hint_prefix to '' (and serve the trained manager without one)")
        if self.per_step_rows < 0 or self.num_iterations < 1:
            raise ValueError(f"per_step_rows = {self.per_step_rows}, num_iterations = {self.num_iterations}: "
                             "per_step_rows must be >= 0 (0: one step) and num_iterations >= 1")
        if self.num_generations < 2:
            raise ValueError(f"num_generations = {self.num_generations}: a GRPO group needs at least 2 reviews per failure")
        if self.accepted_per_task < 1 or self.eval_accepted < 0 or self.gate_min_accepted < 0:
            raise ValueError(f"accepted_per_task = {self.accepted_per_task}, eval_accepted = {self.eval_accepted}, "
                             f"gate_min_accepted = {self.gate_min_accepted}: accepted_per_task must be >= 1, the others >= 0")
        if self.rescue_samples < 1 or self.eval_rescue_samples < 1:
            raise ValueError("rescue_samples and eval_rescue_samples must be at least 1")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction = {self.heldout_fraction}: choose a share strictly between 0 and 1")
        from tentalis_pipelines.rewards.llm_manager import check_hint_prefix

        check_hint_prefix(self.hint_prefix)
        if self.accuracy_weight < 0:
            raise ValueError(f"accuracy_weight = {self.accuracy_weight}: it must be >= 0")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReviewOutcome:
    """One sampled review of a failed rollout and what its hint did."""

    score: float | None  # in [0, 1]; None when the reply could not be parsed
    hint: str
    hint_decision: str  # opd.screen_hint's decision
    rescued: int  # worker samples the verifier accepted (0 when the hint was not used)
    rescue_k: int  # worker samples drawn with the hint (0 when it was not used)
    verifier_score: float
    dense_reward: float | None = None


def hint_decision(hint: str, reference: str | None) -> str:
    """The OPD screen's decision for a hint (``opd.USED`` or why not): the same screen guidance uses."""
    decision, _ = opd.screen_hint((hint or "").strip(), reference)
    return decision


def hint_value(outcome: ReviewOutcome, reward: str = "rescue") -> float:
    """What the hint is worth, in [0, 1]: 0 unless the screen would use it; else its rescue rate, or its
    dense reward squashed by the logistic function (``reward = "dense"``; a missing dense reward counts 0).

    The squash keeps a refused hint below every usable one. The raw dense reward of a usable hint is
    mostly negative (a hint usually lowers the answer's log-probability a little: −0.66 nats on average
    for the untrained manager's, experiments/manager_rl round 5), so a refused hint's 0 would beat it, and
    GRPO would teach the manager to leak the answer or write nothing."""
    if outcome.hint_decision != opd.USED:
        return 0.0
    if reward == "dense":
        return 0.0 if outcome.dense_reward is None else 1.0 / (1.0 + math.exp(-float(outcome.dense_reward)))
    return outcome.rescued / outcome.rescue_k if outcome.rescue_k else 0.0


def score_error(score: float | None, verifier_score: float) -> float:
    """|score − verifier score|, or 1 (the most a [0, 1] score can miss by) when there is no score."""
    return 1.0 if score is None else abs(float(score) - float(verifier_score))


def manager_reward(outcome: ReviewOutcome, *, reward: str = "rescue", accuracy_weight: float = 0.5) -> float:
    """The manager's reward for one review: hint value − accuracy_weight · score error."""
    return hint_value(outcome, reward) - accuracy_weight * score_error(outcome.score, outcome.verifier_score)


def reward_parts(outcome: ReviewOutcome, *, reward: str = "rescue", accuracy_weight: float = 0.5) -> tuple[float, float]:
    """(score part, hint part) of :func:`manager_reward`: − accuracy_weight · score error, and the hint's
    value. They sum to the reward; ``credit = "fields"`` normalises and trains each on its own tokens."""
    return -accuracy_weight * score_error(outcome.score, outcome.verifier_score), hint_value(outcome, reward)


_NUMBER = re.compile(r"-?\d*(?:\.\d*)?")  # a number, or the start of one ('-', '7.')


def score_token_count(decode: Callable[[Sequence[int]], str], token_ids: Sequence[int]) -> int:
    """How many leading tokens of a reply (pre-filled up to the score, ``llm_manager.PREFILL``) write the
    score: through the first token after which the decoded text holds more than a number (the comma or
    brace that ends the field, or anything that is not a number at all). A reply that is all number is
    all score."""
    for k in range(1, len(token_ids) + 1):
        text = decode(token_ids[:k]).lstrip()
        if text and _NUMBER.match(text).end() < len(text):
            return k
    return len(token_ids)


def field_token_advantages(n_tokens: int, n_score_tokens: int, score_advantage: float, hint_advantage: float) -> list[float]:
    """One advantage per token of a reply: the score's for its first ``n_score_tokens``, the hint's after."""
    n_score = max(0, min(n_score_tokens, n_tokens))
    return [score_advantage] * n_score + [hint_advantage] * (n_tokens - n_score)


def best_of_n_selection(groups: Sequence[Sequence[ReviewOutcome]], correct: Sequence[bool], *, reward: str = "rescue",
                        min_value: float = 0.5) -> list[list[tuple[float, float]]]:
    """Which sampled reviews rejection-sampling fine-tuning trains on (``update = "best_of_n"``): per review
    a (score weight, hint weight) pair, each 0 or 1, used as the advantages of the score's tokens and of the
    critique's and hint's (as under ``credit = "fields"``).

    * Hint: in each failure's group, the first review with the highest :func:`hint_value`, when that value
      exceeds ``min_value``. An accepted answer's group trains no hint.
    * Score: in each group, the first review with the smallest :func:`score_error`, when it is at most
      ``MAX_DEMO_SCORE_ERROR``; then as many failures' as accepted answers' (the first of each), so the score
      is taught both ends of the scale alike. With no accepted answer scored well, no score is trained: a
      small manager's scores collapse to 0 when only failures teach them (experiments/manager_rl, rounds 4-5).
    """
    if len(groups) != len(correct):
        raise ValueError(f"{len(groups)} groups of reviews for {len(correct)} correctness flags")
    hint_pick: list[int | None] = []
    score_pick: list[int | None] = []
    for group, ok in zip(groups, correct):
        values = [hint_value(o, reward) for o in group]
        best = max(range(len(group)), key=lambda j: (values[j], -j), default=None)
        hint_pick.append(best if best is not None and not ok and values[best] > min_value else None)
        errors = [score_error(o.score, o.verifier_score) for o in group]
        nearest = min(range(len(group)), key=lambda j: (errors[j], j), default=None)
        score_pick.append(nearest if nearest is not None and errors[nearest] <= MAX_DEMO_SCORE_ERROR else None)
    picked = [i for i, p in enumerate(score_pick) if p is not None]
    keep = {picked[j] for j in balanced_indices([correct[i] for i in picked])}
    score_pick = [p if i in keep else None for i, p in enumerate(score_pick)]
    return [[(1.0 if j == score_pick[i] else 0.0, 1.0 if j == hint_pick[i] else 0.0) for j in range(len(group))]
            for i, group in enumerate(groups)]


def proposed_hint(x: ReviewInput, proposer: str) -> str:
    """The hint ``proposer`` offers for a reviewed rollout (``hint_proposals``): the verifier's (its plan or
    its first wrong step, never the answer); "" for an accepted rollout or ``proposer = "none"``."""
    if proposer not in HINT_PROPOSERS:
        raise ValueError(f"hint proposer {proposer!r} is unknown: choose one of {', '.join(HINT_PROPOSERS)}")
    if proposer == "none" or x.correct:
        return ""
    return VerifierManager().review(x).hint


def score_target_text(verifier_score: float) -> str:
    """The verifier's score as the manager writes it after the pre-filled ``{"score": ``: an integer out of
    10 (``llm_manager.parse_review`` divides by 10) and the comma that ends the field."""
    v = float(verifier_score)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"verifier score {v} is outside [0, 1]")
    return f"{round(10 * v)},"


def balanced_indices(correct: Sequence[bool], strata: Sequence[Hashable] | None = None) -> list[int]:
    """The rollouts whose verifier scores are taught (``score_targets = "verifier"``, the score update): the
    first k failures and the first k accepted answers, k the smaller class's count, in their order. One class
    alone: none (taught only failures, a small manager's score collapses to 0; experiments/manager_rl, rounds
    4-5).

    ``strata`` (one key per rollout, e.g. whether its answer is in the tags): balance within each stratum
    instead (k per stratum), so the stratum says nothing about the class and the score must be learned from
    the work. Balanced over all rollouts alone, a form that the topped-up accepted answers happen to share
    becomes a proxy for "accepted": round 22's score adapter scored untagged failures 0.45 and tagged ones 0.2
    (the verifier: 0.0 and 0.1), and the worker it rewarded dropped the tags (experiments/manager_rl)."""
    keys = [None] * len(correct) if strata is None else list(strata)
    if len(keys) != len(correct):
        raise ValueError(f"balanced_indices: {len(correct)} classes but {len(keys)} strata; give one stratum per rollout")
    counts = Counter((k, bool(c)) for k, c in zip(keys, correct))
    quota = {k: min(counts[(k, True)], counts[(k, False)]) for k, _ in counts}
    taken: Counter = Counter()
    out = []
    for i, (k, c) in enumerate(zip(keys, correct)):
        if taken[(k, bool(c))] < quota[k]:
            taken[(k, bool(c))] += 1
            out.append(i)
    return out


def separation_difference(pairs: Sequence[tuple[float | None, float | None, bool]], *, n_boot: int = 2000,
                          seed: int = 0) -> tuple[float, float, float] | None:
    """How much more a candidate's scores separate accepted answers from failures than an incumbent's, on
    the rollouts both reviewed: ``pairs`` holds (candidate score, incumbent score, accepted) per rollout.
    Returns (difference of :func:`score_separation`, 2.5th and 97.5th percentile of a paired bootstrap) or
    None when a class is empty. The bootstrap resamples rollouts within each class (their counts stay
    fixed, as the gap is a difference of class means); a resample in which a manager has no parseable
    score in a class is left out."""
    import numpy as np

    def gap(rows, who):
        return score_separation([(r[who], 0.0, r[2]) for r in rows])

    acc = [p for p in pairs if p[2]]
    fail = [p for p in pairs if not p[2]]
    c, i = gap(pairs, 0), gap(pairs, 1)
    if not acc or not fail or c is None or i is None:
        return None
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n_boot):
        rows = [acc[j] for j in rng.integers(0, len(acc), len(acc))] + [fail[j] for j in rng.integers(0, len(fail), len(fail))]
        bc, bi = gap(rows, 0), gap(rows, 1)
        if bc is not None and bi is not None:
            diffs.append(bc - bi)
    lo, hi = (float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))) if diffs else (c - i, c - i)
    return c - i, lo, hi


def is_heldout(task_id: str, fraction: float, seed: int = 0) -> bool:
    """Whether a failed task belongs to the manager's held-out split (a stable hash of the task id and
    ``seed``, the split's key: a task's failures are all on one side, and the split never moves between
    runs that share the key)."""
    h = int(hashlib.sha1(f"{seed}\x1f{task_id}".encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def manager_checkpoint_id(parent: str | None, failures: Sequence[str], seed: int, nonce: str = "") -> str:
    """``m-`` and a hash of the parent, the failures trained on, the seed and a nonce (the stage passes a
    fresh one, so training twice on the same failures never writes one id twice)."""
    key = "\x1f".join([parent or "base", str(seed), nonce, *sorted(failures)])
    return "m-" + hashlib.sha1(key.encode()).hexdigest()[:12]


def sample_id(checkpoint_id: str, rollout_id: str, index: int) -> str:
    return "ms-" + hashlib.sha1(f"{checkpoint_id}\x1f{rollout_id}\x1f{index}".encode()).hexdigest()[:16]


def mean_score_error(outcomes: Sequence[ReviewOutcome]) -> float | None:
    """Mean |score − verifier score| (unparseable reviews count 1); None for no outcomes."""
    return sum(score_error(o.score, o.verifier_score) for o in outcomes) / len(outcomes) if outcomes else None


def balanced_score_error(rows: Sequence[tuple[float | None, float, bool]]) -> float:
    """The mean of the per-class mean score errors over (score, verifier score, accepted) rows: failures
    and accepted answers weigh alike, so scoring everything low (right on the many failures, wrong on
    the few accepted answers) does not look accurate. A class with no rows is left out; no rows: 0."""
    classes = [[score_error(s, v) for s, v, ok in rows if ok == flag] for flag in (False, True)]
    means = [sum(c) / len(c) for c in classes if c]
    return sum(means) / len(means) if means else 0.0


def score_separation(rows: Sequence[tuple[float | None, float, bool]]) -> float | None:
    """How much higher the manager scores accepted answers than failures: mean score on accepted rows
    minus mean score on failed ones (unparseable scores left out). None without both classes. A manager
    that gives every rollout one score separates nothing (0), however small its error."""
    acc = [s for s, _, ok in rows if ok and s is not None]
    fail = [s for s, _, ok in rows if not ok and s is not None]
    return (sum(acc) / len(acc) - sum(fail) / len(fail)) if acc and fail else None
