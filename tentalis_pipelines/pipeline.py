"""The stages of the learning loop as plain functions over the lakehouse.

Each stage reads its input tables, calls the library and replaces its own output for one batch. The
Dagster assets (``assets/``) call these, so the logic is tested without Dagster and runs the same way
from the UI, the CLI and CI. The promotion gate lives in ``promotion.py``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tentalis_pipelines import quality, sessions
from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.inference.prompts import render_prompt
from tentalis_pipelines.lakehouse import Lakehouse, now_utc, to_table
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.advantages import (
    group_advantages,
    process_advantages,
    token_advantages,
    token_step_index,
)
from tentalis_pipelines.rewards.managers import ReviewInput, get_manager
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.process import check_steps
from tentalis_pipelines.rewards.scoring import (
    DEFAULT_WEIGHTS,
    combine,
    final_answer,
    format_score,
    overlong_penalty,
    process_credit,
)
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks.batches import batch_manifest, load_batch
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.trainer import (
    GRPOConfig,
    TrainSample,
    build_policy,
    load_trainer_state,
    save_trainer_state,
    train_grpo,
)


@dataclass
class StageResult:
    rows: int
    metadata: dict[str, Any] = field(default_factory=dict)


def markdown_table(rows: list[dict[str, Any]], limit: int = 10) -> str:
    if not rows:
        return "_no rows_"
    cols = list(dict.fromkeys(c for r in rows for c in r))  # union, first-seen order
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit]:
        out.append("| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |")
    if len(rows) > limit:
        out.append(f"\n_{len(rows) - limit} more rows_")
    return "\n".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    s = str(v).replace("\n", " ").replace("|", "\\|")
    return s if len(s) <= 80 else s[:77] + "..."


# --------------------------------------------------------------------------- tasks
class NoValidTasks(ValueError):
    """A batch's file held no line that could become a task."""


def prompt_token_counter(policy: PolicySettings, paths: Paths):
    """Count prompt tokens with the policy's own tokenizer (loads the tokenizer only, not the model)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(policy.model, paths.models))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_tasks(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings | None = None) -> StageResult:
    """The batch's task rows from its snapshot; bad lines go to ``quarantine`` and the rest still run.

    With ``policy``, prompts are capped at ``policy.max_prompt_tokens`` of its tokenizer (without it,
    UTF-8 bytes stand in for tokens: never fewer). A file with no valid line fails here, naming why.
    """
    if sessions.is_sessions_manifest(paths.batches, batch_id):  # live sessions: one chat task per session
        return StageResult(*sessions.build_session_tasks(lake, paths.batches, batch_id))
    options = {}
    if policy is not None:
        options = {"max_prompt_tokens": policy.max_prompt_tokens, "count_tokens": prompt_token_counter(policy, paths)}
    loaded = load_batch(paths.batches, batch_id, now_utc(), **options)
    # Fail closed on contamination: a task that is a held-out gate item or an evaluated benchmark item
    # (after case/space/punctuation folding) is quarantined, never trained on. Seeded arithmetic batches
    # do collide now and then (2 of 4,784 level-1 prompts of seeds 1-299 are held-out items).
    held = quality.held_out_prompts(lake)
    kept = []
    for task in loaded.tasks:
        match = held.get(quality.normalize_prompt(task["prompt"]))
        if match is None:
            kept.append(task)
        else:
            loaded.rejects.append({"source": task["source"], "line": None, "raw": json.dumps(task, default=str)[:10000],
                                   "error": f"task {task['task_id']} is the held-out/benchmark item {match}: "
                                            "training on it would contaminate the evaluation",
                                   "batch_id": batch_id, "stage": "tasks"})
    loaded.tasks = kept
    rows = loaded.tasks
    try:
        to_table("tasks", rows)
    except Exception:  # noqa: BLE001 - validation missed a case: find the rows that do not fit, keep the rest
        rows, misfits = [], []
        for row in loaded.tasks:
            try:
                to_table("tasks", [row])
                rows.append(row)
            except Exception as exc:  # noqa: BLE001
                misfits.append({"source": row.get("source"), "line": None, "raw": json.dumps(row, default=str)[:10000],
                                "error": f"does not fit the tasks table: {exc}", "batch_id": batch_id, "stage": "tasks"})
        loaded.rejects.extend(misfits)
    # Quarantine first: if the task write fails, the rejected lines are still on record.
    n_bad = lake.quarantine(loaded.rejects, batch_id=batch_id, stage="tasks")
    if not rows:
        manifest = batch_manifest(paths.batches, batch_id)
        reasons = sorted({r["error"] for r in loaded.rejects})[:3]
        why = f"{n_bad} line(s) quarantined, e.g. {'; '.join(reasons)}" if n_bad else "it has no non-blank line"
        raise NoValidTasks(f"batch {batch_id!r} ({manifest.get('source', manifest.get('kind'))}) has no valid task: {why}. "
                           "See `tentalis sql \"select line, error from quarantine where stage = 'tasks'\"`")
    n = lake.write_batch("tasks", batch_id, rows)
    return StageResult(
        n,
        {
            "num_tasks": n,
            "quarantined_lines": n_bad,
            "preview": markdown_table([{"task_id": t["task_id"], "prompt": t["prompt"], "reference": t["reference"]} for t in rows]),
        },
    )


# --------------------------------------------------------------------------- rollouts
def current_policy(lake: Lakehouse, paths: Paths) -> tuple[str, str | None]:
    """(policy_version, adapter_dir) of the serving checkpoint (the serving pointer), or ('base', None).
    Raises ``serving.ServingError`` when its adapter files are missing: never falls back to another."""
    return serving.serving_policy(lake)


def rollout_id(batch_id: str, task_id: str, policy_version: str, group_index: int) -> str:
    import hashlib

    key = f"{batch_id}\x1f{task_id}\x1f{policy_version}\x1f{group_index}"
    return "r-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def build_rollouts(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, backend=None) -> StageResult:
    if sessions.is_sessions_batch(lake, batch_id):  # built from the sessions' turns, never sampled again
        return StageResult(*sessions.build_session_rollouts(lake, batch_id))
    tasks = lake.read("tasks", batch_id=batch_id).to_pylist()
    if not tasks:
        raise ValueError(f"batch {batch_id!r} has no tasks: materialise the tasks asset for it first")
    version, adapter = current_policy(lake, paths)
    if backend is None:
        model_dir = resolve_model(policy.model, paths.models)
        backend = policy.make_backend(model_dir, adapter)
    prompts = [render_prompt(backend.tokenizer, t["prompt"], worked_example=policy.worked_example) for t in tasks]
    params = SamplingParams(
        num_generations=policy.num_generations,
        max_new_tokens=policy.max_new_tokens,
        temperature=policy.temperature,
        top_p=policy.top_p,
        seed=policy.seed,
    )
    t0 = time.perf_counter()
    generations = backend.generate(prompts, params)
    wall = time.perf_counter() - t0
    created = now_utc()
    rows = []
    for task, prompt, gens in zip(tasks, prompts, generations):
        for g_idx, g in enumerate(gens):
            parsed = parse_completion(g.text)
            rows.append(
                {
                    "batch_id": batch_id,
                    "rollout_id": rollout_id(batch_id, task["task_id"], version, g_idx),
                    "task_id": task["task_id"],
                    "group_index": g_idx,
                    "policy_version": version,
                    "backend": backend.name,
                    "model": backend.model_name,
                    "prompt_text": prompt,
                    "completion": g.text,
                    "steps": parsed.steps,
                    "answer": parsed.answer,
                    "parse_mode": parsed.parse_mode,
                    "prompt_tokens": g.prompt_tokens,
                    "completion_tokens": g.completion_tokens,
                    "completion_token_ids": g.token_ids,
                    "sampling_logprobs": g.logprobs,
                    "finish_reason": g.finish_reason,
                    "temperature": policy.temperature,
                    "seconds": g.seconds,
                    "created_at": created,
                }
            )
    n = lake.write_batch("rollouts", batch_id, rows)
    tokens = sum(r["completion_tokens"] for r in rows)
    return StageResult(
        n,
        {
            "num_rollouts": n,
            "policy_version": version,
            "completion_tokens": tokens,
            "tokens_per_second": round(tokens / wall, 1) if wall else 0.0,
            "tagged_answer_rate": round(sum(r["parse_mode"] == "tagged" for r in rows) / max(n, 1), 3),
            "preview": markdown_table([{"task_id": r["task_id"], "completion": r["completion"], "answer": r["answer"]} for r in rows]),
        },
    )


# --------------------------------------------------------------------------- step scores
def build_step_scores(lake: Lakehouse, batch_id: str, *, scorer: str = "calculator", judge=None) -> StageResult:
    """One row per parsed step. ``calculator`` checks the equations a step states (1/0, null when it
    states none); ``judge`` asks an LLM judge (``rewards.judge.JudgePRM``) with ``num_votes`` votes per
    step and stores every vote (1 correct, 0 unsure, -1 wrong; ties go to the more pessimistic verdict)."""
    rollouts = lake.read("rollouts", batch_id=batch_id, columns=["rollout_id", "task_id", "steps"]).to_pylist()
    rows = []
    if scorer == "calculator":
        prompts = {t["task_id"]: t["prompt"] for t in lake.read("tasks", batch_id=batch_id, columns=["task_id", "prompt"]).to_pylist()}
        for r in rollouts:
            steps = list(r["steps"] or [])
            for i, (step, chk) in enumerate(zip(steps, check_steps(prompts.get(r["task_id"], ""), steps))):
                rows.append({"batch_id": batch_id, "rollout_id": r["rollout_id"], "step_index": i, "step_text": step,
                             "scorer": "calculator", "score": chk.score, "votes": [] if chk.score is None else [chk.score],
                             "rationale": chk.rationale})
    elif scorer == "judge":
        if judge is None:
            raise ValueError("step scorer 'judge' needs a judge model (review resource: judge_model)")
        from tentalis_pipelines.rewards.judge import JudgeRequest

        tasks = {t["task_id"]: t["prompt"] for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
        judged = judge.score_steps([JudgeRequest(tasks[r["task_id"]], list(r["steps"] or [])) for r in rollouts])
        for r, verdicts in zip(rollouts, judged):
            for i, (step, v) in enumerate(zip(r["steps"] or [], verdicts)):
                rows.append({"batch_id": batch_id, "rollout_id": r["rollout_id"], "step_index": i, "step_text": step,
                             "scorer": "judge", "score": v.score, "votes": v.votes, "rationale": v.rationale})
    else:
        raise ValueError(f"unknown step scorer {scorer!r}; choose calculator or judge")
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
    """Step scores on one scale for rewards: calculator 0/1 as is, judge -1/0/1 mapped to 0/0.5/1."""
    if score is None:
        return None
    return (score + 1.0) / 2.0 if scorer == "judge" else score


# --------------------------------------------------------------------------- reviews
def _by_rollout(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["rollout_id"]].append(r)
    for v in out.values():
        v.sort(key=lambda r: r["step_index"])
    return out


def _review_inputs(lake: Lakehouse, batch_id: str) -> list[tuple[dict, ReviewInput]]:
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
                ),
            )
        )
    return out


def build_reviews(lake: Lakehouse, batch_id: str, manager: str = "verifier", llm_manager=None) -> StageResult:
    """One review per rollout by the batch's manager: ``verifier`` (ground truth and step checks),
    ``llm`` (a rubric-prompted model, see ``rewards.llm_manager``) or ``human`` (imported reviews;
    rollouts without one fall back to the verifier, and the ``manager`` column says which wrote it)."""
    if manager not in ("verifier", "llm", "human"):
        raise ValueError(f"unknown manager {manager!r}; choose verifier, llm or human")
    if sessions.is_sessions_batch(lake, batch_id):  # the live reviews of its sessions
        return StageResult(*sessions.build_session_reviews(lake, batch_id))
    verifier = get_manager("verifier")
    created = now_utc()
    inputs = _review_inputs(lake, batch_id)
    human = {}
    if manager == "human":
        human = {r["rollout_id"]: r for r in lake.read("human_reviews").to_pylist() if r["batch_id"] == batch_id}
    llm_reviews = {}
    if manager == "llm":
        if llm_manager is None:
            raise ValueError("manager 'llm' needs a judge model: set the review resource's judge settings")
        tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
        llm_reviews = dict(zip([r["rollout_id"] for r, _ in inputs],
                               llm_manager.review_many([(tasks[r["task_id"]]["prompt"], r["completion"], x) for r, x in inputs])))
    rows = []
    for r, x in inputs:
        rid = r["rollout_id"]
        if rid in human:
            h = human[rid]
            row = {"manager": "human", "score": h["score"], "critique": h["critique"], "hint": h["hint"]}
        elif rid in llm_reviews:
            rev = llm_reviews[rid]
            row = {"manager": "llm", "score": rev.score, "critique": rev.critique, "hint": rev.hint}
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
            "mean_score": round(sum(r["score"] for r in rows) / max(n, 1), 3),
            "preview": markdown_table([{"rollout_id": r["rollout_id"], "manager": r["manager"], "score": r["score"],
                                        "critique": r["critique"]} for r in rows]),
        },
    )


# --------------------------------------------------------------------------- trajectories
def build_trajectories(
    lake: Lakehouse, batch_id: str, *, scale_rewards: str = "group", dynamic_sampling: bool = False,
    overlong_buffer: int = 0, max_completion_length: int = 128, advantage_mode: str = "outcome",
) -> StageResult:
    """Rewards (outcome, format, process, manager, optional overlong penalty), their weighted sum and
    the group-relative advantage. With ``dynamic_sampling`` groups whose rewards are all equal are
    marked ``kept = False`` (DAPO) and the trainer skips them. A sessions batch gets multi-turn rows."""
    if sessions.is_sessions_batch(lake, batch_id):
        return StageResult(*sessions.build_session_trajectories(lake, batch_id, scale_rewards=scale_rewards,
                                                                dynamic_sampling=dynamic_sampling))
    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    created = now_utc()
    rows = []
    for r, x in _review_inputs(lake, batch_id):
        if r["rollout_id"] not in reviews:
            raise ValueError(f"rollout {r['rollout_id']} has no review: materialise reviews for batch {batch_id!r}")
        env = tasks[r["task_id"]]["environment"]
        weights = DEFAULT_WEIGHTS.get(env, DEFAULT_WEIGHTS["math"])
        process = process_credit(x.step_scores, x.answer)
        outcome = 1.0 if x.correct else 0.0
        manager = reviews[r["rollout_id"]]["score"]
        penalty = overlong_penalty(r["completion_tokens"], max_completion_length, overlong_buffer)
        rows.append(
            {
                "batch_id": batch_id,
                "rollout_id": r["rollout_id"],
                "task_id": r["task_id"],
                "group_index": r["group_index"],
                "policy_version": r["policy_version"],
                "outcome_reward": outcome,
                "format_reward": x.format_score,
                "process_reward": process,
                "step_rewards": x.step_scores,
                "manager_score": manager,
                "overlong_penalty": penalty,
                "reward": combine(weights, outcome=outcome, format=x.format_score, process=process, manager=manager) + penalty,
                "reward_weights": weights.to_json(),
                "created_at": created,
            }
        )
    if advantage_mode not in ("outcome", "process"):
        raise ValueError(f"advantage_mode must be 'outcome' or 'process', got {advantage_mode!r}")
    keys = [f"{r['task_id']}|{r['policy_version']}" for r in rows]
    adv, signal = group_advantages(keys, [r["reward"] for r in rows], scale_rewards=scale_rewards)
    step_adv = process_advantages(keys, [r["step_rewards"] for r in rows])
    for row, a, s, sa in zip(rows, adv, signal, step_adv):
        row["advantage"] = a
        row["step_advantages"] = sa
        row["advantage_mode"] = advantage_mode
        row["kept"] = bool(s) if dynamic_sampling else True
        row["kind"] = "single"
    n = lake.write_batch("trajectories", batch_id, rows)
    return StageResult(
        n,
        {
            "num_trajectories": n,
            "reward_mean": round(sum(r["reward"] for r in rows) / max(n, 1), 4),
            "accuracy": round(sum(r["outcome_reward"] for r in rows) / max(n, 1), 4),
            "groups": len({r["task_id"] for r in rows}),
            "groups_with_signal": len({r["task_id"] for r, s in zip(rows, signal) if s}),
        },
    )


# --------------------------------------------------------------------------- training
FRESH_SQL = """
select t.* from trajectories t
where t.kept and t.policy_version = $policy
  and t.rollout_id not in (""" + ckpt.CONSUMED_SQL + """)
"""


def fresh_trajectories(lake: Lakehouse, policy_version: str):
    """Trajectories sampled by the serving policy that no checkpoint has trained on yet."""
    con = lake.duckdb()
    try:
        return con.execute(FRESH_SQL, {"policy": policy_version}).fetch_arrow_table()
    finally:
        con.close()


def fresh_trajectory_count(lake: Lakehouse, paths: Paths) -> int:
    version, _ = current_policy(lake, paths)
    return fresh_trajectories(lake, version).num_rows


@ckpt.abandons_claims_on_error
def train_checkpoint(
    lake: Lakehouse, paths: Paths, policy: PolicySettings, config: GRPOConfig, *, promote: bool = True, on_step=None
) -> StageResult:
    from transformers import AutoTokenizer

    ckpt.reconcile(lake, paths)  # settle what earlier crashed runs left (see training/checkpoints.py)
    version, adapter = current_policy(lake, paths)
    fresh = fresh_trajectories(lake, version).to_pylist()
    if not fresh:
        raise ValueError(
            f"no fresh trajectories for policy {version!r}: run rollouts for a new batch first "
            "(every trajectory sampled by this policy has been trained on)"
        )
    ids = {r["rollout_id"] for r in fresh}
    claim = ckpt.claim_training(lake, paths, version, ids, promote=promote)  # a second trainer fails fast here
    batches = sorted({r["batch_id"] for r in fresh})
    rollouts = {}
    columns = ["rollout_id", "prompt_text", "completion", "steps", "completion_token_ids", "sampling_logprobs", "temperature"]
    columns += [c for c in ("prompt_token_ids",) if c in lake.dataset("rollouts").schema.names]  # multi-turn rows' exact prompt
    for b in batches:
        for r in lake.read("rollouts", batch_id=b, columns=columns).to_pylist():
            if r["rollout_id"] in ids:
                rollouts[r["rollout_id"]] = r
    model_dir = resolve_model(policy.model, paths.models)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompt_cache: dict[str, list[int]] = {}
    samples = []
    for t in fresh:
        ro = rollouts[t["rollout_id"]]
        if not ro["completion_token_ids"]:
            continue
        if t.get("kind") == "multi_turn":  # a live session: exact tokens, loss mask, per-turn advantages
            samples.append(sessions.session_sample(ro, t))
            continue
        p = prompt_cache.setdefault(ro["prompt_text"], tokenizer(ro["prompt_text"], add_special_tokens=False)["input_ids"])
        token_adv = None
        if t.get("advantage_mode") == "process":
            # Outcome advantage on every token, plus the process advantage of the token's step.
            owner = token_step_index(tokenizer, ro["completion_token_ids"], ro["completion"], ro["steps"] or [])
            token_adv = token_advantages(owner, float(t["advantage"]), t["step_advantages"] or [])
        samples.append(TrainSample(p, list(ro["completion_token_ids"]), float(t["advantage"]), token_advantages=token_adv,
                                   old_logps=ro["sampling_logprobs"], temperature=ro["temperature"]))
    if not any(abs(s.advantage) > 1e-8 or any(abs(a) > 1e-8 for a in (s.token_advantages or [])) for s in samples):
        raise ValueError(
            f"the {len(samples)} fresh trajectories carry no learning signal (every group's rewards are equal): "
            "sample more generations per task, raise the temperature, or add easier tasks"
        )
    # Each sample carries the temperature it was sampled at; the config's is only a fallback.
    config = GRPOConfig(**{**config.to_dict(), "max_completion_length": policy.max_new_tokens})
    model = build_policy(model_dir, adapter, config)
    # The chain continues: AdamW's moments and the schedule's step come from the parent checkpoint.
    state = load_trainer_state(adapter, next(model.parameters()).device)
    result = train_grpo(model, tokenizer, samples, config, state=state, on_step=on_step)
    checkpoint_id = claim.checkpoint_id
    path = ckpt.save_adapter(model, paths.checkpoints, checkpoint_id, extra=lambda folder: save_trainer_state(folder, result.state))
    metrics = {**result.metrics, "reward_mean": sum(t["reward"] for t in fresh) / len(fresh),
               "accuracy_mean": sum(t["outcome_reward"] for t in fresh) / len(fresh)}
    ckpt.record_checkpoint(
        lake,
        {
            "checkpoint_id": checkpoint_id,
            "parent_id": None if version == "base" else version,
            "base_model": policy.model_name,
            "adapter_uri": str(path),
            "algorithm": config.loss_type,
            "config": config.to_dict(),
            "trained_on": batches,
            "trajectory_ids": sorted(ids),
            "trajectory_count": len(fresh),
            "metrics": metrics,
            "promoted": False,
        },
    )
    if promote:  # only over the policy it trained from: a promotion or rollback made meanwhile wins
        serving.promote(lake, checkpoint_id, actor="trainer", reason=f"trained on {len(fresh)} fresh trajectories of {version} "
                        "(trainer.promotion = always)", expect_from=version)
    ckpt.finish_claim(lake, claim)
    return StageResult(
        1,
        {
            "checkpoint_id": checkpoint_id,
            "parent_id": version,
            "promoted": promote,
            "trained_on": ", ".join(batches),
            "history": markdown_table(result.history, limit=50),
            **{k: round(v, 5) if isinstance(v, float) else v for k, v in metrics.items()},
        },
    )


def summarize(lake: Lakehouse) -> dict[str, Any]:
    """Numbers for `tentalis status`."""
    con = lake.duckdb()
    try:
        q = lambda s: con.execute(s).fetchall()  # noqa: E731
        out = {
            "batches": q("select count(distinct batch_id) from tasks")[0][0],
            "tasks": q("select count(*) from tasks")[0][0],
            "rollouts": q("select count(*) from rollouts")[0][0],
            "trajectories": q("select count(*) from trajectories")[0][0],
            "quarantined": q("select count(*) from quarantine")[0][0],
            "checkpoints": q("select checkpoint_id, parent_id, promoted, trajectory_count, metrics, created_at from checkpoints order by created_at")
        }
        last = q("select batch_id, avg(reward), avg(outcome_reward) from trajectories group by batch_id order by max(created_at) desc limit 1")
        out["last_batch"] = last[0] if last else None
        return out
    finally:
        con.close()


# --------------------------------------------------------------------------- benchmarks and the gate
def resolve_checkpoint(lake: Lakehouse, ref: str) -> tuple[str, str | None]:
    """``base``, ``promoted`` or a checkpoint id -> (checkpoint_id, adapter_dir or None)."""
    if ref == "base":
        return "base", None
    if ref == "promoted":  # what serves now (the serving pointer)
        return serving.serving_policy(lake)
    rows = [r for r in lake.read("checkpoints").to_pylist() if r["checkpoint_id"] == ref]
    if not rows:
        known = [r["checkpoint_id"] for r in lake.read("checkpoints", columns=["checkpoint_id"]).to_pylist()]
        raise ValueError(f"unknown checkpoint {ref!r}: use 'base', 'promoted' or one of {known[-5:]}")
    return ref, ckpt.verify_adapter(rows[0]["adapter_uri"]).as_posix()


def benchmark_checkpoint(
    lake: Lakehouse, paths: Paths, policy: PolicySettings, checkpoint_ref: str, benchmark: str, *,
    limit: int | None = None, seed: int = 0, record: bool = True, backend=None, max_new_tokens: int | None = None,
) -> tuple[StageResult, Any]:
    """Evaluate a checkpoint on a benchmark; with ``record`` replace its rows in ``benchmark_results``
    and ``benchmark_items`` (keyed by checkpoint and benchmark: a re-run never duplicates)."""
    from tentalis_pipelines.evaluation.benchmarks import run_benchmark

    checkpoint_id, adapter = resolve_checkpoint(lake, checkpoint_ref)
    if backend is None:
        model_dir = resolve_model(policy.model, paths.models)
        backend = policy.make_backend(model_dir, adapter)
    summary, results = run_benchmark(backend, benchmark, limit=limit, seed=seed, max_new_tokens=max_new_tokens)
    created = now_utc()
    config = {"limit": limit, "seed": seed, "decoding": "greedy", "model": policy.model_name, "max_new_tokens": max_new_tokens}
    result_row = {**summary.__dict__, "checkpoint_id": checkpoint_id, "backend": backend.name, "model": backend.model_name,
                  "config": json.dumps(config), "created_at": created}
    item_rows = [
        {"checkpoint_id": checkpoint_id, "benchmark": summary.benchmark, "item_id": r.item.item_id, "prompt": r.item.prompt,
         "completion": r.completion, "extracted_answer": r.extracted_answer,
         "reference": r.item.reference if r.item.environment != "code" else r.item.extra["entry_point"],
         "correct": r.correct, "lenient_correct": r.lenient_correct, "formatted": r.formatted, "created_at": created}
        for r in results
    ]
    if record:
        keys = {"checkpoint_id": checkpoint_id, "benchmark": summary.benchmark}
        lake.replace_where("benchmark_items", keys, item_rows)
        lake.replace_where("benchmark_results", keys, [result_row])
    meta = {
        "checkpoint_id": checkpoint_id,
        "benchmark": summary.benchmark,
        "n": summary.n,
        "accuracy": round(summary.accuracy, 4),
        "lenient_accuracy": round(summary.lenient_accuracy, 4),
        "format_rate": round(summary.format_rate, 4),
        "ci_low": round(summary.ci_low, 4),
        "ci_high": round(summary.ci_high, 4),
        "seconds": round(summary.seconds, 1),
        "items": markdown_table([{"item_id": r["item_id"], "answer": r["extracted_answer"], "reference": r["reference"],
                                  "correct": r["correct"]} for r in item_rows]),
    }
    return StageResult(len(item_rows), meta), summary


# --------------------------------------------------------------------------- human reviews
def import_human_reviews(lake: Lakehouse, path) -> dict[str, int]:
    """Import a JSONL or CSV file of human reviews keyed by rollout id. Lines naming an unknown rollout
    or carrying a bad score go to ``quarantine``; the rest are merged into ``human_reviews`` (the same
    file imported again changes nothing). The ``human`` manager then uses them for their batches."""

    from tentalis_pipelines.rewards.managers import read_review_file, validate_human_review

    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"review file {path} does not exist")
    known = {r["rollout_id"]: r["batch_id"] for r in lake.read("rollouts", columns=["rollout_id", "batch_id"]).to_pylist()}
    good, bad, seen = [], [], set()
    now = now_utc()
    for line, raw, rec, error in read_review_file(path):
        try:
            if error:
                raise ValueError(error)
            review = validate_human_review(rec)
            if review["rollout_id"] not in known:
                raise ValueError(f"unknown rollout_id {review['rollout_id']!r} (not in rollouts)")
            if review["rollout_id"] in seen:
                raise ValueError(f"rollout_id {review['rollout_id']!r} reviewed twice in this file")
        except ValueError as exc:
            bad.append({"source": str(path), "line": line, "raw": raw[:10000], "error": str(exc), "batch_id": None, "stage": "human_reviews"})
            continue
        seen.add(review["rollout_id"])
        good.append({**review, "batch_id": known[review["rollout_id"]], "source": str(path), "line": line, "imported_at": now})
    lake.replace_where("quarantine", {"source": str(path), "stage": "human_reviews"}, [{"seen_at": now, **b} for b in bad])
    lake.upsert("human_reviews", "rollout_id", good, compare=("score", "critique", "hint", "reviewer"))
    return {"applied": len(good), "quarantined": len(bad)}


# --------------------------------------------------------------------------- Monte-Carlo step labels
def build_step_labels(
    lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, *, k: int = 4, max_new_tokens: int = 96,
    max_rollouts: int | None = 16, backend=None,
) -> StageResult:
    """Math-Shepherd labels: for each step prefix of a rollout, sample ``k`` continuations with the
    serving policy; the step's label is the fraction that reach the reference answer. These labels are
    the training data of a learned PRM. ``max_rollouts`` caps the cost (steps x k generations each)."""
    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    rollouts = [r for r in lake.read("rollouts", batch_id=batch_id).to_pylist() if r["steps"]]
    rollouts.sort(key=lambda r: r["rollout_id"])
    if max_rollouts is not None:
        rollouts = rollouts[:max_rollouts]
    if backend is None:
        _, adapter = current_policy(lake, paths)
        backend = policy.make_backend(resolve_model(policy.model, paths.models), adapter)
    prompts, keys = [], []
    for r in rollouts:
        for i in range(len(r["steps"])):
            prefix = "".join(f"<step>{s}</step>\n" for s in r["steps"][: i + 1])
            prompts.append(r["prompt_text"] + prefix)
            keys.append((r, i))
    params = SamplingParams(num_generations=k, max_new_tokens=max_new_tokens, temperature=policy.temperature, seed=policy.seed)
    gens = backend.generate(prompts, params) if prompts else []
    created = now_utc()
    rows = []
    for (r, i), samples in zip(keys, gens):
        ref = tasks[r["task_id"]]["reference"]
        correct = sum(answers_match(parse_completion(g.text).answer, ref) for g in samples)
        rows.append({"batch_id": batch_id, "rollout_id": r["rollout_id"], "step_index": i, "num_samples": len(samples),
                     "num_correct": int(correct), "label": correct / max(len(samples), 1), "created_at": created})
    n = lake.write_batch("step_labels", batch_id, rows)
    return StageResult(n, {"num_labels": n, "rollouts": len(rollouts), "k": k,
                           "mean_label": round(sum(r["label"] for r in rows) / n, 3) if n else None})
