"""The `step_scores` stage: every step checked (calculator) or judged (LLM PRM)."""

from __future__ import annotations

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.process import check_steps
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.kinds import batch_kind

UNFORMATTED = "not judged: the completion has no <step> tags, so its steps are the parser's guess (its lines)"


def in_step_format(completion: str | None) -> bool:
    """Whether the policy wrote its steps as ``<step>`` blocks (what a model-based step scorer judges)."""
    return parse_completion(completion or "").has_step_tags


def judge_formatted(judge, requests, completions) -> list[list]:
    """A model's verdicts (``judge.score_steps``) on each request, asked only for the completions in the step
    format, in one call. A model scores only the steps the policy wrote as steps: without `<step>` tags the
    steps are the parser's guess (the completion's lines), and a model that likes the base model's prose paid
    more for them than the format reward paid for the format, so the policy never learned the format
    (experiments/prm_step_scorer, round 2). The others' steps get an unscored verdict saying so."""
    from tentalis_pipelines.rewards.judge import StepJudgement

    requests = list(requests)
    asked = [i for i, c in enumerate(completions) if in_step_format(c)]
    verdicts = dict(zip(asked, judge.score_steps([requests[i] for i in asked]) if asked else []))
    return [verdicts.get(i, [StepJudgement(None, [], UNFORMATTED)] * len(r.steps)) for i, r in enumerate(requests)]


def build_step_scores(lake: Lakehouse, batch_id: str, *, scorer: str = "calculator", judge=None) -> StageResult:
    """The batch's step scores, as its kind scores them (``stages/kinds.py``; every kind today:
    :func:`score_parsed_steps`)."""
    return batch_kind(lake, batch_id).step_scores(lake, batch_id, scorer=scorer, judge=judge)


def score_parsed_steps(lake: Lakehouse, batch_id: str, *, scorer: str = "calculator", judge=None) -> StageResult:
    """One row per parsed step. ``calculator`` checks the equations a step states (1/0, null when it
    states none); ``judge`` asks an LLM judge (``rewards.judge.JudgePRM``) with ``num_votes`` votes per
    step and stores every vote (1 correct, 0 unsure, -1 wrong; ties go to the more pessimistic verdict);
    ``prm_head`` asks the trained PRM head (``reviewers.prm_reviewer.PRMHeadScorer``, passed as ``judge``)
    for P(correct) in [0, 1]. Both models judge only completions in the step format (:func:`in_step_format`);
    the steps of the others are stored unscored (null), as the calculator stores a step without an equation."""
    rollouts = lake.read("rollouts", batch_id=batch_id, columns=["rollout_id", "task_id", "steps", "completion"]).to_pylist()
    rows = []
    if scorer == "calculator":
        prompts = {t["task_id"]: t["prompt"] for t in lake.read("tasks", batch_id=batch_id, columns=["task_id", "prompt"]).to_pylist()}
        for r in rollouts:
            steps = list(r["steps"] or [])
            for i, (step, chk) in enumerate(zip(steps, check_steps(prompts.get(r["task_id"], ""), steps))):
                rows.append({"batch_id": batch_id, "rollout_id": r["rollout_id"], "step_index": i, "step_text": step,
                             "scorer": "calculator", "score": chk.score, "votes": [] if chk.score is None else [chk.score],
                             "rationale": chk.rationale})
    elif scorer in ("judge", "prm_head"):
        if judge is None:
            raise ValueError("step scorer 'judge' needs a judge model (review resource: judge_model)" if scorer == "judge" else
                             "step scorer 'prm_head' needs a trained PRM head: train one with `tentalis prm train`")
        from tentalis_pipelines.rewards.judge import JudgeRequest

        tasks = {t["task_id"]: t["prompt"] for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
        judged = judge_formatted(judge, [JudgeRequest(tasks[r["task_id"]], list(r["steps"] or [])) for r in rollouts],
                                 [r["completion"] for r in rollouts])
        for r, verdicts in zip(rollouts, judged):
            for i, (step, v) in enumerate(zip(r["steps"] or [], verdicts)):
                rows.append({"batch_id": batch_id, "rollout_id": r["rollout_id"], "step_index": i, "step_text": step,
                             "scorer": scorer, "score": v.score, "votes": v.votes, "rationale": v.rationale})
    else:
        raise ValueError(f"unknown step scorer {scorer!r}; choose calculator, judge or prm_head")
    n = lake.write_batch("step_scores", batch_id, rows)
    checked = [r["score"] for r in rows if r["score"] is not None]
    return StageResult(
        n,
        {
            "num_steps": n,
            "scorer": scorer,
            "scored_steps": len(checked),
            "mean_step_score": round(sum(checked) / len(checked), 3) if checked else None,
        },
    )


def step_reward(score: float | None, scorer: str) -> float | None:
    """Step scores on one scale for rewards: calculator 0/1 and prm_head P(correct) as they are, judge
    -1/0/1 mapped to 0/0.5/1."""
    if score is None:
        return None
    return (score + 1.0) / 2.0 if scorer == "judge" else score
