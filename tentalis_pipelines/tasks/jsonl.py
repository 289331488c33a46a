"""Task files in JSON Lines: GSM8K rows, MATH rows, and generic ``prompt``/``reference`` rows.

Every line is parsed on its own. A malformed line becomes a quarantine row (file, line number, the raw
text and the error) and the good lines of the same file still become tasks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


class TaskRowError(ValueError):
    pass


@dataclass
class LoadedTasks:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)


def parse_task_record(record: Any) -> dict[str, Any]:
    """Normalise one JSON record to task fields, or raise TaskRowError saying what is wrong.

    Recognised shapes:
      * GSM8K: ``question`` + ``answer`` whose last line is ``#### <final answer>``
      * MATH: ``problem`` + ``answer`` (``solution`` kept as metadata)
      * generic: ``prompt`` + ``reference`` (+ optional ``id``, ``environment``, ``difficulty``, ``metadata``)
    """
    if not isinstance(record, dict):
        raise TaskRowError(f"expected a JSON object, got {type(record).__name__}")
    meta: dict[str, Any] = {}
    if "prompt" in record:
        prompt, reference = record.get("prompt"), record.get("reference")
        if reference is None:
            raise TaskRowError("generic row has 'prompt' but no 'reference' (the answer or tests)")
        if isinstance(record.get("metadata"), dict):
            meta.update(record["metadata"])
        shape = "generic"
    elif "question" in record:
        prompt, solution = record.get("question"), record.get("answer")
        if not isinstance(solution, str):
            raise TaskRowError("GSM8K row has 'question' but no string 'answer'")
        m = _GSM8K_FINAL.search(solution)
        if not m:
            raise TaskRowError("GSM8K 'answer' must end with '#### <final answer>'")
        reference = m.group(1).replace(",", "").strip()
        meta["solution"] = solution
        shape = "gsm8k"
    elif "problem" in record:
        prompt, reference = record.get("problem"), record.get("answer")
        if reference is None:
            raise TaskRowError("MATH row has 'problem' but no 'answer'")
        for k in ("solution", "subject", "level", "unique_id"):
            if k in record:
                meta[k] = record[k]
        shape = "math"
    else:
        raise TaskRowError("row needs 'prompt'+'reference', 'question'+'answer' (GSM8K) or 'problem'+'answer' (MATH)")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskRowError("the prompt/question/problem is empty or not a string")
    if isinstance(reference, (int, float)):
        reference = str(reference)
    if not isinstance(reference, str) or not reference.strip():
        raise TaskRowError("the reference/answer is empty or not a string")
    difficulty = record.get("difficulty", record.get("level"))
    if difficulty is not None and not isinstance(difficulty, int):
        raise TaskRowError(f"'difficulty' must be an integer, got {difficulty!r}")
    environment = record.get("environment", "math")
    if environment not in ("math", "code", "chat"):
        raise TaskRowError(f"'environment' must be math, code or chat, got {environment!r}")
    meta["shape"] = shape
    return {
        "id": record.get("id", record.get("task_id", record.get("unique_id"))),
        "prompt": prompt.strip(),
        "reference": reference.strip(),
        "environment": environment,
        "difficulty": difficulty,
        "metadata": meta,
    }


def load_jsonl_tasks(path: str | Path, batch_id: str, created_at: datetime, source: str | None = None) -> LoadedTasks:
    """Read a task file line by line into task rows and quarantine rows."""
    path = Path(path)
    source = source or str(path)
    out = LoadedTasks()
    seen: set[str] = set()
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = raw.rstrip("\n")
            if not text.strip():
                continue
            try:
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TaskRowError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
                task = parse_task_record(record)
                task_id = str(task["id"]) if task["id"] is not None else f"{batch_id}-L{lineno:05d}"
                if task_id in seen:
                    raise TaskRowError(f"duplicate task id {task_id!r} in this file")
                seen.add(task_id)
            except TaskRowError as exc:
                out.rejects.append(
                    {"source": source, "line": lineno, "raw": text[:10000], "error": str(exc), "batch_id": batch_id, "stage": "tasks"}
                )
                continue
            out.tasks.append(
                {
                    "batch_id": batch_id,
                    "task_id": task_id,
                    "source": source,
                    "environment": task["environment"],
                    "prompt": task["prompt"],
                    "reference": task["reference"],
                    "difficulty": task["difficulty"],
                    "metadata": json.dumps(task["metadata"], default=str),
                    "created_at": created_at,
                }
            )
    return out
