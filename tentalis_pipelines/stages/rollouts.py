"""The `rollouts` stage: G samples per task from the serving policy."""

from __future__ import annotations

import time

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.inference.prompts import render_prompt
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table, text_length
from tentalis_pipelines.stages.kinds import batch_kind
from tentalis_pipelines.stages.skills import skill_retriever
from tentalis_pipelines.tasks.families import batch_policy
from tentalis_pipelines.training import serving


def current_policy(lake: Lakehouse, paths: Paths) -> tuple[str, str | None]:
    """(policy_version, adapter_dir) of the serving checkpoint (the serving pointer), or ('base', None).
    Raises ``serving.ServingError`` when its adapter files are missing: never falls back to another."""
    return serving.serving_policy(lake)


def rollout_id(batch_id: str, task_id: str, policy_version: str, group_index: int) -> str:
    import hashlib

    key = f"{batch_id}\x1f{task_id}\x1f{policy_version}\x1f{group_index}"
    return "r-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def build_rollouts(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, backend=None) -> StageResult:
    """The batch's rollouts, as its kind makes them (``stages/kinds.py``): G samples per task
    (:func:`sample_rollouts`), or a sessions batch's segments built from its turns, never sampled again.
    Sampled with the batch manifest's recipe (temperature, token budget, G) over ``policy``'s
    (``tasks/families.batch_policy``), whoever launched the run."""
    policy = batch_policy(paths.batches, batch_id, policy) if paths is not None else policy
    return batch_kind(lake, batch_id).rollouts(lake, paths, batch_id, policy, backend)


def sample_rollouts(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, backend=None) -> StageResult:
    """``policy.num_generations`` samples per task of the batch from the serving policy (``backend``: the
    policy's own unless given), each parsed into steps and an answer."""
    tasks = lake.read("tasks", batch_id=batch_id).to_pylist()
    if not tasks:
        raise ValueError(f"batch {batch_id!r} has no tasks: materialise the tasks asset for it first")
    version, adapter = current_policy(lake, paths)
    if backend is None:
        model_dir = resolve_model(policy.model, paths.models)
        backend = policy.make_backend(model_dir, adapter)
    # Verified skills most similar to each task join its system message (policy.skills_top_k; 0 = none).
    retrieve = skill_retriever(lake, policy.skills_top_k)
    skills = retrieve([t["prompt"] for t in tasks]) if retrieve else [[] for _ in tasks]
    prompts = [render_prompt(backend.tokenizer, t["prompt"], worked_example=policy.worked_example, skills=[s["text"] for s in sk])
               for t, sk in zip(tasks, skills)]
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
    for task, prompt, gens, sk in zip(tasks, prompts, generations, skills):
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
                    "skill_ids": [s["skill_id"] for s in sk],
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
            "skills_injected": len({s["skill_id"] for sk in skills for s in sk}),
            "tagged_answer_rate": round(sum(r["parse_mode"] == "tagged" for r in rows) / max(n, 1), 3),
            "preview": markdown_table([{"task_id": r["task_id"], "rollout_id": r["rollout_id"], "completion_tokens": r["completion_tokens"],
                                        "parse_mode": r["parse_mode"], "answer_chars": text_length(r["answer"])} for r in rows]),
        },
    )
