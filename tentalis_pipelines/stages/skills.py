"""The `skills` stage: distil a batch's failed reviews into skills, verify candidates, re-check verified ones.

Also the retrieval the rollouts and benchmark stages call when ``PolicySettings.skills_top_k > 0``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.skills import library
from tentalis_pipelines.stages.common import StageResult, markdown_table, text_length


def _embed(texts: list[str]):
    from tentalis_pipelines.skills.embedder import embed

    return embed(texts)


def read_skills(lake: Lakehouse) -> list[dict]:
    return lake.read("skills").to_pylist() if lake.exists("skills") else []


def verified_skills(lake: Lakehouse) -> list[dict]:
    """The skills that may be injected (status ``verified``)."""
    return [s for s in read_skills(lake) if s["status"] == "verified"]


def skill_retriever(lake: Lakehouse, top_k: int) -> Callable[[list[str]], list[list[dict]]] | None:
    """prompts -> the top-k verified skills for each (read once, now), or None when ``top_k`` is 0.
    With no verified skill yet every prompt gets none (and the embedder is not even loaded)."""
    if top_k <= 0:
        return None
    skills = verified_skills(lake)

    def retrieve(prompts: list[str]) -> list[list[dict]]:
        return library.retrieve(prompts, skills, _embed, top_k)

    return retrieve


def failures_of_batch(lake: Lakehouse, batch_id: str) -> list[library.Failure]:
    """Every review of the batch with its task prompt (the distiller keeps those below the threshold)."""
    reviews = lake.read("reviews", batch_id=batch_id).to_pylist() if lake.exists("reviews") else []
    if not reviews:
        raise ValueError(f"batch {batch_id!r} has no reviews: materialise the reviews asset for it first")
    rollouts = {r["rollout_id"]: r["task_id"] for r in lake.read("rollouts", batch_id=batch_id, columns=["rollout_id", "task_id"]).to_pylist()}
    tasks = {t["task_id"]: t["prompt"] for t in lake.read("tasks", batch_id=batch_id, columns=["task_id", "prompt"]).to_pylist()}
    return [library.Failure(review_id=r.get("review_id") or r["rollout_id"], score=float(r["score"]), critique=r["critique"] or "",
                            hint=r["hint"] or "", manager=r["manager"], task_prompt=tasks.get(rollouts.get(r["rollout_id"], ""), ""))
            for r in reviews]


def validation_items(settings: library.SkillSettings):
    """The skills' validation set, distinct from training and from the gate's held-out set: seeded
    arithmetic items, or (``validation_source`` a dataset) the first ``validation_items`` questions of
    the dataset's reserved training tail (read from ``$TENTALIS_DATA_DIR``; no training batch takes them)."""
    from tentalis_pipelines.evaluation.benchmarks import BenchItem

    if settings.validation_source == "arithmetic":
        from tentalis_pipelines.tasks.arithmetic import generate_arithmetic

        tasks = generate_arithmetic(settings.validation_items, seed=settings.validation_seed, levels=(1, 2), prefix="skillval")
        return [BenchItem(t.task_id, t.prompt, str(t.answer)) for t in tasks]
    import json

    from tentalis_pipelines.settings import data_dir
    from tentalis_pipelines.tasks.batches import dataset_validation_lines
    from tentalis_pipelines.tasks.jsonl import parse_task_record

    root = data_dir()
    if root is None:
        raise ValueError(f"validation_source {settings.validation_source!r} reads its training split from TENTALIS_DATA_DIR, "
                         "which is not set: point it at the data folder (or use validation_source arithmetic)")
    items = []
    for k, line in enumerate(dataset_validation_lines(root, settings.validation_source, settings.validation_items)):
        t = parse_task_record(json.loads(line))
        items.append(BenchItem(f"skillval-{settings.validation_source}-{k:03d}", t["prompt"], t["reference"], t["environment"]))
    return items


def validation_label(settings: library.SkillSettings, n: int) -> str:
    """How a decision's validation set is named in ``skill_decisions.validation``."""
    if settings.validation_source == "arithmetic":
        return f"arithmetic seed={settings.validation_seed} n={n} levels=1,2 greedy"
    return f"{settings.validation_source} train reserved tail n={n} greedy"


def _pick(skills: list[dict], settings: library.SkillSettings, policy_version: str) -> list[tuple[str, dict]]:
    """What to measure this run: the most-supported candidates not yet measured on this policy, and the
    verified skills measured longest ago (on another policy)."""
    candidates = sorted((s for s in skills if s["status"] == "candidate" and s["measured_on"] != policy_version),
                        key=lambda s: (-s["support"], s["created_at"], s["skill_id"]))[: settings.verify_per_cycle]
    verified = sorted((s for s in skills if s["status"] == "verified" and s["measured_on"] != policy_version),
                      key=lambda s: (s["measured_at"] is not None, s["measured_at"] or s["created_at"], s["skill_id"]))[: settings.recheck_per_cycle]
    return [("verify", s) for s in candidates] + [("recheck", s) for s in verified]


def verify_skills(lake: Lakehouse, batch_id: str, settings: library.SkillSettings, backend, policy_version: str,
                  *, now=None) -> tuple[list[dict], list[dict], dict]:
    """Measure the picked skills on the validation set (greedy; the skill alone in the prompt vs none)
    and decide. Returns (changed skill rows, decision rows, timings)."""
    from tentalis_pipelines.evaluation.benchmarks import evaluate_items

    now = now or now_utc()
    todo = _pick(read_skills(lake), settings, policy_version)
    timings = {"verify_baseline_seconds": 0.0, "verify_skill_seconds": 0.0, "measured": len(todo)}
    if not todo:
        return [], [], timings
    items = validation_items(settings)
    validation = validation_label(settings, len(items))
    t0 = time.perf_counter()
    without = {r.item.item_id: r.correct for r in evaluate_items(backend, items, max_new_tokens=settings.max_new_tokens)}
    timings["verify_baseline_seconds"] = round(time.perf_counter() - t0, 1)
    changed, decisions = [], []
    for kind, skill in todo:
        t1 = time.perf_counter()
        res = evaluate_items(backend, items, max_new_tokens=settings.max_new_tokens, skills=[[skill]] * len(items))
        seconds = time.perf_counter() - t1
        timings["verify_skill_seconds"] += round(seconds, 1)
        effect = library.skill_effect({r.item.item_id: r.correct for r in res}, without)
        status, rule = library.decide(skill["status"], effect, min_ci_low=settings.min_ci_low,
                                     min_net_wins=settings.min_net_wins)
        row = {**skill, "status": status, "gain": effect.gain, "ci_low": effect.ci_low, "ci_high": effect.ci_high, "n": effect.n,
               "measured_on": policy_version, "measured_at": now, "updated_at": now}
        if status == "verified" and skill["status"] != "verified":
            row["verified_at"] = now
        changed.append(row)
        key = f"{batch_id}\x1f{skill['skill_id']}\x1f{policy_version}\x1f{now.isoformat()}"
        decisions.append({"decision_id": "sd-" + hashlib.sha1(key.encode()).hexdigest()[:16], "skill_id": skill["skill_id"],
                          "text": skill["text"], "batch_id": batch_id, "kind": kind, "from_status": skill["status"], "to_status": status,
                          "gain": effect.gain, "ci_low": effect.ci_low, "ci_high": effect.ci_high, "n": effect.n, "wins": effect.wins,
                          "losses": effect.losses, "with_accuracy": effect.with_accuracy, "without_accuracy": effect.without_accuracy,
                          "checkpoint_id": policy_version, "validation": validation, "rule": rule, "seconds": round(seconds, 2),
                          "decided_at": now})
    return changed, decisions, timings


def build_skills(lake: Lakehouse, batch_id: str, settings: library.SkillSettings | None = None, *,
                 policy_version: str | None = None, make_backend: Callable[[], object] | None = None,
                 llm: Callable[[list[library.Failure]], list[str | None]] | None = None) -> StageResult:
    """Distil the batch's low-scored reviews into ``skills`` (merging duplicates), then, when
    ``policy_version`` (the serving policy) and ``make_backend`` (its backend, built only when something
    is to be measured) are given, verify candidates and re-check verified skills on the validation set,
    one ``skill_decisions`` row per decision."""
    settings = settings or library.SkillSettings()
    now = now_utc()
    t0 = time.perf_counter()
    failures = failures_of_batch(lake, batch_id)
    lessons = library.distil(failures, threshold=settings.threshold, llm=llm)
    changed, counts = library.merge(read_skills(lake), lessons, _embed, merge_cosine=settings.merge_cosine, now=now)
    if changed:
        lake.replace_in("skills", "skill_id", [r["skill_id"] for r in changed], changed)
    distil_seconds = time.perf_counter() - t0
    decisions, timings = [], {}
    if make_backend is not None and policy_version and _pick(read_skills(lake), settings, policy_version):
        updated, decisions, timings = verify_skills(lake, batch_id, settings, make_backend(), policy_version, now=now)
        if updated:
            lake.replace_in("skills", "skill_id", [r["skill_id"] for r in updated], updated)
        if decisions:
            lake.append("skill_decisions", decisions)
    rows = read_skills(lake)
    by_status = {s: sum(r["status"] == s for r in rows) for s in library.STATUSES}
    return StageResult(
        len(changed),
        {
            "failures": sum(f.score < settings.threshold for f in failures),
            **counts,
            **{f"skills_{k}": v for k, v in by_status.items()},
            "decisions": len(decisions),
            "distil_seconds": round(distil_seconds, 2),
            **timings,
            "skills": markdown_table([{"skill_id": r["skill_id"], "status": r["status"], "support": r["support"], "gain": r["gain"],
                                       "source": r["source"], "text_chars": text_length(r["text"])} for r in sorted(rows, key=lambda r: -r["support"])]),
            "decisions_table": markdown_table([{"skill_id": d["skill_id"], "kind": d["kind"], "to": d["to_status"], "rule": d["rule"]}
                                               for d in decisions]),
        },
    )
