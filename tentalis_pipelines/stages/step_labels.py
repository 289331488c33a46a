"""The `step_labels` stage: Math-Shepherd Monte-Carlo labels of each step prefix."""

from __future__ import annotations

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.rollouts import current_policy


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
