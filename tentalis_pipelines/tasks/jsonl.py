"""Task files in JSON Lines: GSM8K rows, MATH rows, and generic ``prompt``/``reference`` rows.

Every line is parsed on its own. A malformed line becomes a quarantine row (file, line number, the raw
text and the error) and the good lines of the same file still become tasks.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


class TaskRowError(ValueError):
    pass


# Limits a line must meet to become a task: every value must fit its column in the ``tasks`` table (so a
# line that passes validation always casts), and a prompt must fit the policy's context with room to answer.
INT32_MAX = 2**31 - 1
MAX_ID_CHARS = 256
MAX_REFERENCE_CHARS = 100_000
DEFAULT_MAX_PROMPT_TOKENS = 2048


def utf8_bytes_as_tokens(text: str) -> int:
    """Token count without a tokenizer: the UTF-8 byte count, an upper bound for byte-level BPE."""
    return len(text.encode("utf-8", "surrogateescape"))


def _has_bad_utf8(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


def check_unicode(record: Any) -> None:
    """Raise TaskRowError when a decoded JSON value holds a lone surrogate (an unpaired ``\\ud800``-``\\udfff``
    escape is valid JSON syntax but not Unicode text: no UTF-8 column can store it)."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise TaskRowError("holds an unpaired surrogate escape (\\ud800-\\udfff): not valid Unicode text") from None
    except RecursionError:
        raise TaskRowError("invalid JSON: nested too deeply") from None


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
    if isinstance(reference, bool):
        raise TaskRowError(f"the reference/answer must be text or a number, got {reference!r}")
    if isinstance(reference, float) and not math.isfinite(reference):
        raise TaskRowError(f"the reference/answer must be a finite number, got {reference!r}")
    if isinstance(reference, (int, float)):
        reference = str(reference)
    if not isinstance(reference, str) or not reference.strip():
        raise TaskRowError("the reference/answer is empty or not a string")
    if len(reference) > MAX_REFERENCE_CHARS:
        raise TaskRowError(f"the reference/answer is {len(reference):,} characters (limit {MAX_REFERENCE_CHARS:,})")
    difficulty = record.get("difficulty", record.get("level"))
    # bool is an int in Python, and 10**30 is one too: neither fits the int32 column.
    if difficulty is not None and (isinstance(difficulty, bool) or not isinstance(difficulty, int)):
        raise TaskRowError(f"'difficulty' must be an integer, got {difficulty!r}")
    if difficulty is not None and not 0 <= difficulty <= INT32_MAX:
        raise TaskRowError(f"'difficulty' must be between 0 and {INT32_MAX}, got {difficulty}")
    environment = record.get("environment", "math")
    if environment not in ("math", "code", "chat"):
        raise TaskRowError(f"'environment' must be math, code or chat, got {environment!r}")
    task_id = record.get("id", record.get("task_id", record.get("unique_id")))
    if task_id is not None:
        if isinstance(task_id, bool) or not isinstance(task_id, (str, int)):
            raise TaskRowError(f"'id' must be text or an integer, got {task_id!r}")
        task_id = str(task_id)
        if not task_id.strip() or len(task_id) > MAX_ID_CHARS:
            raise TaskRowError(f"'id' must be 1 to {MAX_ID_CHARS} characters")
    meta["shape"] = shape
    return {
        "id": task_id,
        "prompt": prompt.strip(),
        "reference": reference.strip(),
        "environment": environment,
        "difficulty": difficulty,
        "metadata": meta,
    }


def load_jsonl_tasks(
    path: str | Path,
    batch_id: str,
    created_at: datetime,
    source: str | None = None,
    *,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
) -> LoadedTasks:
    """Read a task file line by line into task rows and quarantine rows.

    A line that is not valid UTF-8, not valid JSON, not a task, has values that do not fit the
    ``tasks`` table, or a prompt longer than ``max_prompt_tokens`` (counted with ``count_tokens``, the
    policy's tokenizer; without one, UTF-8 bytes, which never undercount) is quarantined with its line
    number and reason; the other lines still become tasks.
    """
    path = Path(path)
    source = source or str(path)
    count_tokens = count_tokens or utf8_bytes_as_tokens
    out = LoadedTasks()
    seen: set[str] = set()
    # Undecodable bytes become lone surrogates (not U+FFFD), so the line can be recognised and refused.
    # Lines end at "\n" only (a lone "\r" is JSON whitespace, not a line break), so line numbers are an editor's.
    with path.open("r", encoding="utf-8", errors="surrogateescape", newline="\n") as fh:
        for lineno, raw in enumerate(fh, start=1):
            text = raw.rstrip("\n").removesuffix("\r")
            if not text.strip():
                continue
            try:
                if _has_bad_utf8(text):
                    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    raise TaskRowError("not valid UTF-8: save the file as UTF-8")
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TaskRowError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
                except RecursionError:
                    raise TaskRowError("invalid JSON: nested too deeply") from None
                except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
                    raise TaskRowError(f"invalid JSON: {exc}") from None
                check_unicode(record)
                task = parse_task_record(record)
                # Bytes bound tokens from above, so the tokenizer runs only on prompts that might be too long.
                n_tokens = utf8_bytes_as_tokens(task["prompt"])
                if n_tokens > max_prompt_tokens:
                    n_tokens = count_tokens(task["prompt"])
                if n_tokens > max_prompt_tokens:
                    raise TaskRowError(f"the prompt is {n_tokens:,} tokens; the limit is {max_prompt_tokens:,} "
                                       "(shorten it, or raise max_prompt_tokens)")
                try:
                    json.dumps(task["metadata"], allow_nan=False)
                except ValueError:
                    raise TaskRowError("'metadata' holds NaN or infinity, which JSON cannot store") from None
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
