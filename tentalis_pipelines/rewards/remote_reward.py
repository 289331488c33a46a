"""OpenRLHF's remote reward contract, scored with Tentalis's own verifiers (``tentalis reward-server``).

OpenRLHF (pinned: v0.11.0, ``openrlhf/utils/agent.py``'s ``SingleTurnAgentExecutor``) calls the URL
given as ``--reward.remote_url`` with one POST per generated sample::

    {"query": ["<prompt + response, decoded with special tokens>"], "prompts": ["<prompt>"], "labels": ["<label>"]}

and reads ``rewards`` (the reward the advantage is computed from), ``scores`` (in [0, 1]: dynamic
filtering keeps groups whose scores differ) and ``extra_logs`` (each key logged as a metric) from the
JSON answer; its own ``serve_rm`` answers lists aligned with ``query``, and so does this server::

    {"rewards": [r, ...], "scores": [s, ...], "extra_logs": {"outcome": [...], "format": [...], ...}}

Each query is scored as the learning loop scores a rollout of a ``math`` task (``stages/reviews.py``,
``stages/trajectories.py``): the response is parsed into steps and an answer (``rewards/steps.py``),
the answer checked against the label (``rewards/math_answers.py``: numbers as rationals, GSM8K
``#### 42`` references, ``\\boxed{}``), every step's equations checked by the calculator
(``rewards/process.py``), the verifier manager's review score taken, and the four combined with the
``math`` reward weights. ``scores`` is the outcome alone (1 correct, 0 not). OpenRLHF does not say
whether the response was cut at its token limit, so every response counts as finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from tentalis_pipelines.rewards.managers import ReviewInput, VerifierManager
from tentalis_pipelines.rewards.math_answers import answers_match, reference_answer
from tentalis_pipelines.rewards.process import check_steps
from tentalis_pipelines.rewards.scoring import (
    DEFAULT_WEIGHTS,
    combine,
    final_answer,
    format_score,
    process_credit,
)
from tentalis_pipelines.rewards.steps import parse_completion

# The most queries one request may carry (OpenRLHF sends one; a bigger batch is somebody else's client).
MAX_QUERIES = 4096
# Labels longer than this are no answer key (a whole solution pasted as a label is still fine).
MAX_LABEL_CHARS = 20_000
# A query (prompt and response) longer than this is not read: reward 0 with the reason. A response of
# 32k tokens is about 130,000 characters; the cap keeps every sample's scoring well under a second.
MAX_QUERY_CHARS = 200_000
# Steps checked by the calculator per sample: later steps are not scored (no process credit, no blame).
MAX_CHECKED_STEPS = 256
EXTRA_LOG_KEYS = ("outcome", "format", "process", "manager", "checked_steps")


class RewardRequestError(ValueError):
    """A request that does not follow the contract; the message names the field and the fix."""


@dataclass(frozen=True)
class QueryScore:
    """One query's reward and its parts (``process`` is None when no step had a checkable equation)."""

    reward: float
    outcome: float
    format: float
    process: float | None
    manager: float
    checked_steps: int
    answer: str | None
    reason: str | None = None  # why a sample was not scored (reward 0), None when it was


def response_of(query: str, prompt: str) -> str:
    """The response in ``query`` (OpenRLHF sends the prompt and the response decoded together): what
    follows the prompt, else the whole query when the prompt is not in it."""
    if query.startswith(prompt):
        return query[len(prompt):]
    at = query.find(prompt) if prompt else -1
    return query[at + len(prompt):] if at >= 0 else query


def score_query(query: str, prompt: str, label: str) -> QueryScore:
    """Score one sample against its label with the learning loop's verifiers (see the module docstring).
    A query or prompt longer than ``MAX_QUERY_CHARS`` gets reward 0 with its ``reason``; only the first
    ``MAX_CHECKED_STEPS`` steps are checked. Every part is linear in the sample's length."""
    if max(len(query), len(prompt)) > MAX_QUERY_CHARS:
        return QueryScore(0.0, 0.0, 0.0, None, 0.0, 0, None,
                          reason=f"query or prompt of {max(len(query), len(prompt))} characters; at most {MAX_QUERY_CHARS} are read")
    response = response_of(query, prompt)
    parsed = parse_completion(response)
    if len(parsed.steps) > MAX_CHECKED_STEPS:
        parsed = replace(parsed, steps=parsed.steps[:MAX_CHECKED_STEPS])
    answer = final_answer(parsed, "stop")
    correct = answers_match(answer, label)
    fmt = format_score(parsed, "stop")
    checks = check_steps(prompt, parsed.steps)
    step_scores = [c.score for c in checks]
    process = process_credit(step_scores, answer)
    review = VerifierManager().review(ReviewInput(
        reference=reference_answer(label), answer=answer, correct=correct, answer_tagged=parsed.has_answer_tag,
        format_score=fmt, steps=parsed.steps, step_scores=step_scores, step_rationales=[c.rationale for c in checks],
        finish_reason="stop"))
    outcome = 1.0 if correct else 0.0
    reward = combine(DEFAULT_WEIGHTS["math"], outcome=outcome, format=fmt, process=process, manager=review.score)
    return QueryScore(reward, outcome, fmt, process, review.score, sum(s is not None for s in step_scores), answer)


def warm_up() -> None:
    """Score a few samples whose answers reach math-verify's parser and each of its comparisons, so the
    imports and grammar they build on first use are not charged to the first real sample's deadline."""
    for answer, label in (("\\frac{x}{2}", "x/2"), ("59998", "x+1"), ("(1, 2)", "(1,2)"), ("0.5", "\\frac{1}{2}"),
                          ("x^2", "x \\cdot x"), ("\\{1, 2\\}", "\\{2, 1\\}"), ("x = 1", "1")):
        score_query(f"<step>1 + 1 = 2</step><answer>{answer}</answer>", "", label)


def _strings(body: dict[str, Any], key: str, *, numbers_ok: bool = False) -> list[str]:
    value = body.get(key)
    if not isinstance(value, list):
        raise RewardRequestError(f"'{key}' must be a list of strings (OpenRLHF sends {{\"query\": [...], \"prompts\": [...], "
                                 f"\"labels\": [...]}}), not {type(value).__name__}")
    out = []
    for i, v in enumerate(value):
        # (an int is never NaN, and math.isfinite would overflow on one past a float's range)
        if numbers_ok and not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))):
            v = str(v)  # a JSONL label key holding a number (GSM8K answers often do)
        if not isinstance(v, str):
            raise RewardRequestError(f"'{key}[{i}]' must be a string{' or a number' if numbers_ok else ''}, not "
                                     f"{type(v).__name__}" + (": export labels with `tentalis openrlhf export` "
                                                              "(--label_key label)" if key == "labels" else ""))
        out.append(v)
    return out


def parse_request(body: Any) -> tuple[list[str], list[str], list[str]]:
    """The (queries, prompts, labels) of a request body, or ``RewardRequestError`` naming what is wrong."""
    if not isinstance(body, dict):
        raise RewardRequestError(f"the body must be a JSON object with 'query', 'prompts' and 'labels', not {type(body).__name__}")
    unknown = set(body) - {"query", "prompts", "labels"}
    if unknown:
        raise RewardRequestError(f"unknown fields {sorted(unknown)}: the contract has 'query', 'prompts' and 'labels'")
    queries, prompts = _strings(body, "query"), _strings(body, "prompts")
    if body.get("labels") is None:
        raise RewardRequestError("'labels' is missing: the verifier needs each prompt's answer; train with "
                                 "--data.label_key label on a `tentalis openrlhf export` file")
    labels = _strings(body, "labels", numbers_ok=True)
    if not queries:
        raise RewardRequestError("'query' is empty: send at least one sample")
    if not len(queries) == len(prompts) == len(labels):
        raise RewardRequestError(f"'query', 'prompts' and 'labels' must have one entry per sample: got {len(queries)}, "
                                 f"{len(prompts)} and {len(labels)}")
    if len(queries) > MAX_QUERIES:
        raise RewardRequestError(f"{len(queries)} queries in one request; at most {MAX_QUERIES}: split the batch")
    for i, lab in enumerate(labels):
        if not lab.strip() or len(lab) > MAX_LABEL_CHARS:
            raise RewardRequestError(f"'labels[{i}]' must be a non-empty answer of at most {MAX_LABEL_CHARS} characters")
    return queries, prompts, labels


def contract_answer(scored: list[QueryScore]) -> dict[str, Any]:
    """The contract's answer for scored samples: ``{"rewards", "scores", "extra_logs"}``, aligned with them."""
    extra = {"outcome": [s.outcome for s in scored], "format": [s.format for s in scored],
             # A response with no checkable step earns no process credit: logged as 0 next to checked_steps 0.
             "process": [0.0 if s.process is None else s.process for s in scored],
             "manager": [s.manager for s in scored], "checked_steps": [float(s.checked_steps) for s in scored]}
    return {"rewards": [s.reward for s in scored], "scores": [s.outcome for s in scored], "extra_logs": extra}


def score_request(body: Any) -> tuple[dict[str, Any], list[QueryScore]]:
    """The contract's answer to ``body`` (``{"rewards", "scores", "extra_logs"}``) and the scores behind it,
    scored here (the reward server scores in worker processes instead: ``rewards/score_pool.py``)."""
    queries, prompts, labels = parse_request(body)
    scored = [score_query(q, p, lab) for q, p, lab in zip(queries, prompts, labels)]
    return contract_answer(scored), scored
