"""The `reviews` stage: one manager review per rollout (verifier, llm, human, or the deliberately
hackable manager of the reward-hacking experiment)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable

from tentalis_pipelines import sessions
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.rewards.llm_manager import LLMManager
from tentalis_pipelines.rewards.managers import ReviewInput, get_manager
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.scoring import (
    final_answer,
    format_score,
)
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.stages.common import StageResult, markdown_table, text_length
from tentalis_pipelines.stages.kinds import batch_kind
from tentalis_pipelines.stages.step_scores import step_reward


def _by_rollout(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["rollout_id"]].append(r)
    for v in out.values():
        v.sort(key=lambda r: r["step_index"])
    return out


def task_expression(task: dict) -> str | None:
    """The solution expression a generated task records in its metadata ("12 + 7"), else None."""
    try:
        meta = json.loads(task.get("metadata") or "{}")
    except json.JSONDecodeError:
        return None
    expr = meta.get("expression") if isinstance(meta, dict) else None
    return expr if isinstance(expr, str) else None


def review_inputs(lake: Lakehouse, batch_id: str) -> list[tuple[dict, ReviewInput]]:
    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    steps = _by_rollout(lake.read("step_scores", batch_id=batch_id).to_pylist())
    out = []
    for r in lake.read("rollouts", batch_id=batch_id).to_pylist():
        parsed = parse_completion(r["completion"])
        ref = tasks[r["task_id"]]["reference"]
        s = steps.get(r["rollout_id"], [])
        answer = final_answer(parsed, r["finish_reason"])
        out.append(
            (
                r,
                ReviewInput(
                    reference=ref,
                    answer=answer,
                    correct=answers_match(answer, ref),
                    answer_tagged=parsed.has_answer_tag,
                    format_score=format_score(parsed, r["finish_reason"]),
                    steps=list(r["steps"] or []),
                    step_scores=[step_reward(x["score"], x["scorer"]) for x in s],
                    step_rationales=[x["rationale"] for x in s],
                    finish_reason=r["finish_reason"],
                    expression=task_expression(tasks[r["task_id"]]),
                ),
            )
        )
    return out


def build_reviews(lake: Lakehouse, batch_id: str, manager: str = "verifier",
                  llm_manager: LLMManager | Callable[[], LLMManager] | None = None) -> StageResult:
    """The batch's reviews, as its kind gathers them (``stages/kinds.py``). A task batch: one review per
    rollout by the batch's manager (:func:`manager_reviews`): ``verifier`` (ground truth and step checks),
    ``llm`` (a rubric-prompted model, see ``rewards.llm_manager``; a reply that does not parse gets the
    verifier's review, stored under manager ``verifier``), ``human`` (imported reviews;
    rollouts without one fall back to the verifier, and the ``manager`` column says which wrote it) or
    ``hackable`` (pays for the length of the shown work: the reward-hacking experiment's scorer).

    ``llm_manager`` may be a function that builds it, so the model loads only when it is used. A
    sessions batch copies its live reviews; with ``manager = 'llm'`` the llm manager is also the judge of
    the sessions that no person reviewed (:func:`session_reviews`)."""
    if manager not in ("verifier", "llm", "human", "hackable"):
        raise ValueError(f"unknown manager {manager!r}; choose verifier, llm, human or hackable")
    return batch_kind(lake, batch_id).reviews(lake, batch_id, manager, llm_manager)


def session_reviews(lake: Lakehouse, batch_id: str, manager: str,
                    llm_manager: LLMManager | Callable[[], LLMManager] | None = None) -> StageResult:
    """A sessions batch's reviews: the live reviews of its sessions, and with ``manager = 'llm'`` the llm
    manager's as the judge of the sessions that no person reviewed (``sessions.build_session_reviews``)."""
    if manager == "llm" and llm_manager is None:
        raise ValueError("manager 'llm' needs a judge model: set the review resource's judge settings")
    judge = llm_manager if manager == "llm" else None
    why = (f"review.manager = {manager!r}; set review.manager = 'llm' (the judge model is review.judge_model) "
           "for the judge to review the sessions that no person reviewed")
    return StageResult(*sessions.build_session_reviews(lake, batch_id, judge=judge, no_judge_reason=why))


def manager_reviews(lake: Lakehouse, batch_id: str, manager: str = "verifier",
                    llm_manager: LLMManager | Callable[[], LLMManager] | None = None) -> StageResult:
    """A task batch's reviews: one per rollout by ``manager`` (see :func:`build_reviews`); a rollout with an
    imported human review gets that one whatever the manager."""
    if callable(llm_manager):
        llm_manager = llm_manager()
    verifier, hackable = get_manager("verifier"), get_manager("hackable")
    created = now_utc()
    inputs = review_inputs(lake, batch_id)
    human = {}
    if manager == "human":
        human = {r["rollout_id"]: r for r in lake.read("human_reviews").to_pylist() if r["batch_id"] == batch_id}
    llm_reviews, llm_name = {}, None
    if manager == "llm":
        if llm_manager is None:
            raise ValueError("manager 'llm' needs a judge model: set the review resource's judge settings")
        llm_name = f"llm-manager:{getattr(llm_manager, 'version', 'base')}"  # the checkpoint that writes the reviews
        tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
        llm_reviews = dict(zip([r["rollout_id"] for r, _ in inputs],
                               llm_manager.review_many([(tasks[r["task_id"]]["prompt"], r["completion"], x) for r, x in inputs])))
    rows = []
    for r, x in inputs:
        rid = r["rollout_id"]
        if rid in human:
            h = human[rid]
            row = {"manager": "human", "score": h["score"], "critique": h["critique"], "hint": h["hint"]}
        elif rid in llm_reviews and llm_reviews[rid].fallback:  # the reply did not parse: the verifier's review, named so
            rev = llm_reviews[rid]
            row = {"manager": "verifier", "score": rev.score, "critique": rev.critique, "hint": rev.hint}
        elif rid in llm_reviews:
            rev = llm_reviews[rid]
            row = {"manager": "llm", "score": rev.score, "critique": rev.critique, "hint": rev.hint, "reviewer": llm_name}
        elif manager == "hackable":
            rev = hackable.review(x)
            row = {"manager": "hackable", "score": rev.score, "critique": rev.critique, "hint": rev.hint}
        else:
            rev = verifier.review(x)
            row = {"manager": "verifier", "score": rev.score, "critique": rev.critique, "hint": rev.hint}
        rows.append({"batch_id": batch_id, "rollout_id": rid, **row, "created_at": created})
    n = lake.write_batch("reviews", batch_id, rows)
    by_manager: dict[str, int] = defaultdict(int)
    for row in rows:
        by_manager[row["manager"]] += 1
    return StageResult(
        n,
        {
            "num_reviews": n,
            "by_manager": json.dumps(by_manager),
            # the llm manager asked, and its replies that did not parse (their rows are the verifier's, under its name)
            "llm_manager": llm_name or "none",
            "llm_unparseable": sum(rev.fallback for rev in llm_reviews.values()),
            "mean_score": round(sum(r["score"] for r in rows) / max(n, 1), 3),
            "preview": markdown_table([{"rollout_id": r["rollout_id"], "manager": r["manager"], "score": r["score"],
                                        "critique_chars": text_length(r["critique"]), "hint_chars": text_length(r.get("hint"))}
                                       for r in rows]),
        },
    )
