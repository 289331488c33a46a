"""The `tasks` stage: a batch's snapshot (or a sessions cut) into task rows; contamination and oversize prompts quarantined."""

from __future__ import annotations

import json

from tentalis_pipelines import contamination, sessions
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc, to_table
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table, text_length
from tentalis_pipelines.tasks.batches import batch_manifest, load_batch

# The metadata key of which benchmarks the batch was screened against and which were skipped, and why:
# ``{"screened": [...], "skipped": {benchmark: why}}`` (see :class:`tentalis_pipelines.contamination.Coverage`).
SCREEN_KEY = "contamination_screen"


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
    # Fail closed on contamination: a task that is a held-out gate item or a benchmark item (exact after
    # normalisation, a near duplicate by 13-gram containment, or by embedding similarity) is quarantined,
    # never trained on. The index covers every benchmark whose data is installed, and the batch's metadata
    # says which were screened and which skipped, and why. If a source is there but unusable, this raises
    # and nothing lands. Seeded arithmetic batches do collide now and then (2 of 4,784 level-1 prompts of
    # seeds 1-299 are held-out items).
    index = contamination.build_index(lake, cache_dir=contamination.default_cache_dir(paths.home))
    screen = {SCREEN_KEY: index.coverage.as_dict()}
    if sessions.is_sessions_manifest(paths.batches, batch_id):  # live sessions: one chat task per session
        n, meta = sessions.build_session_tasks(lake, paths.batches, batch_id)
        return StageResult(n, {**meta, **screen})
    options = {}
    if policy is not None:
        options = {"max_prompt_tokens": policy.max_prompt_tokens, "count_tokens": prompt_token_counter(policy, paths)}
    loaded = load_batch(paths.batches, batch_id, now_utc(), **options)
    loaded.tasks, dirty = contamination.screen_tasks(index, loaded.tasks)
    loaded.rejects.extend(contamination.quarantine_row(task, match, batch_id) for task, match in dirty)
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
            "contaminated_tasks": len(dirty),
            "contamination": contamination.matches_markdown([(t["task_id"], m) for t, m in dirty]) if dirty else None,
            **screen,
            "preview": markdown_table([{"task_id": t["task_id"], "prompt_chars": text_length(t["prompt"]),
                                        "reference_chars": text_length(t["reference"])} for t in rows]),
            **curriculum_metadata(batch_manifest(paths.batches, batch_id)),
        },
    )


def curriculum_metadata(manifest: dict) -> dict:
    """The curriculum's choice of a batch's levels (``tasks/curriculum.py``) as the tasks asset shows it:
    a table of each level's recent success, weight and tasks, and the record itself; nothing without one."""
    from tentalis_pipelines.tasks.curriculum import curriculum_table

    record = manifest.get("curriculum")
    if not record:
        return {}
    return {"curriculum": curriculum_table(record), "curriculum_record": json.dumps(record, sort_keys=True)}
