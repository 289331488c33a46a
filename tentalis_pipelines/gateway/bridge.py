"""The seeds' Bridge contract, landed in the lakehouse: tasks handed to workers, their results, the manager's reviews.

Manager agents (OpenClaw-style) call the Bridge HTTP API (``POST /tasks/assign``, ``POST /tasks/result``,
``POST /feedback``, ``GET /status``) or publish the same events on NATS. The HTTP gateway and the NATS
ingester (:mod:`tentalis_pipelines.gateway.nats_ingest`) both call the functions here:

* :func:`land_task_assign` -> one ``tasks`` row;
* :func:`land_task_result` -> one ``rollouts`` row (a worker's answer to a task);
* :func:`land_feedback` -> one ``reviews`` row (the manager's score, critique and hint of that answer);
* :func:`bridge_status` -> what a tenant's manager has assigned, what came back, what is reviewed.

Payloads are the seeds' event shapes (``TaskEvent``, ``ResultEvent``, ``FeedbackEvent``: ``task_id``,
``manager_id``, ``worker_id``, ``prompt``, ``result``, ``steps``, ``score``, ``textual_feedback``), with
a few clearer aliases (``expected``, ``answer``, ``critique``, ``hint``, ``manager``); the README's
"Bridge API and NATS" section lists them.

Where rows go: the batch partition ``bridge-<tenant>-<YYYYMMDD>`` (UTC day of the task's first
assignment; :func:`bridge_batch_id`). A result and its review land in their task's partition, so a
batch holds whole tasks even when a review comes days later.

Landing is incremental and idempotent: rows are merged by key (``Lakehouse.upsert``), never by
replacing a partition. Ids are stable: a task without ``task_id`` gets a hash of its content; a rollout
is ``(task_id, worker_id)``; a review is per rollout. Re-sending an event changes nothing (no commit at
all); sending a changed event for the same key updates that row (the latest wins).

Bad input raises :class:`BridgeInputError` (a ``ValueError``) whose message names the field and the
fix; the raw payload, with secrets redacted, is kept in ``quarantine`` (``source='bridge:<kind>'``,
``stage='bridge'``) before the error is raised, so nothing a client sent is lost silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import pyarrow.compute as pc

from tentalis_pipelines.lakehouse import Lakehouse, now_utc, validate_batch_id
from tentalis_pipelines.redact import redact
from tentalis_pipelines.rewards.steps import parse_completion

SOURCE = "bridge"
BACKEND = "bridge"
QUARANTINE_STAGE = "bridge"
ENVIRONMENTS = ("math", "code", "chat")
# The seeds' task_type values (tasks.<task_type> subjects) that name one of our environments.
_TASK_TYPE_ENVIRONMENT = {"math": "math", "code": "code", "coding": "code", "chat": "chat"}
SCALES = (1, 10, 100)
_MAX_ID = 256
_MAX_RAW = 10_000

# Landing is read-then-merge; one lock per process keeps a gateway's concurrent requests from racing on
# the same key (Delta's optimistic concurrency and Lakehouse._commit retries cover other processes).
_lock = threading.RLock()


class BridgeInputError(ValueError):
    """A Bridge payload that cannot land; the message names the field and how to fix it."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


# --------------------------------------------------------------------------- ids and partitions
def tenant_slug(tenant: str) -> str:
    """The tenant as it appears in batch ids: letters, digits and ``_`` only (never ``-``, which
    separates the parts of ``bridge-<tenant>-<day>``). A tenant name that had to be changed gets a
    short hash of the original, so two tenants never share a slug."""
    if not isinstance(tenant, str) or not tenant.strip():
        raise BridgeInputError("tenant is empty: every Bridge call needs the tenant of its API key", field="tenant")
    slug = re.sub(r"[^A-Za-z0-9]", "_", tenant)[:40]
    if slug != tenant:
        slug = f"{slug}_{hashlib.sha256(tenant.encode()).hexdigest()[:8]}"
    return slug


def bridge_batch_id(tenant: str, when: datetime | None = None) -> str:
    """``bridge-<tenant slug>-<YYYYMMDD>`` (UTC) for rows landed at ``when`` (default now)."""
    day = (when or now_utc()).astimezone(timezone.utc).strftime("%Y%m%d")
    return validate_batch_id(f"bridge-{tenant_slug(tenant)}-{day}")


def _prefix(tenant: str) -> str:
    return f"bridge-{tenant_slug(tenant)}-"


def stable_id(kind: str, *parts: Any) -> str:
    """A short id that depends only on ``parts`` (the same event always gets the same id)."""
    digest = hashlib.sha256(json.dumps([kind, *parts], sort_keys=True, default=str).encode()).hexdigest()
    return f"{kind}-{digest[:20]}"


# --------------------------------------------------------------------------- payload fields
def _get(payload: Mapping[str, Any], *names: str) -> tuple[str | None, Any]:
    """The first of ``names`` present (not None) in the payload, and its value."""
    for name in names:
        if payload.get(name) is not None:
            return name, payload[name]
    return None, None


def _text(payload: Mapping[str, Any], *names: str, required: bool = False, allow_empty: bool = True,
          max_len: int | None = None, hint: str = "") -> str | None:
    """A string field (numbers are accepted and written as text)."""
    name, value = _get(payload, *names)
    shown = " / ".join(repr(n) for n in names)
    if name is None:
        if required:
            raise BridgeInputError(f"field {names[0]!r} is missing{(': ' + hint) if hint else ''}", field=names[0])
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BridgeInputError(f"field {name!r} must be a string, not {type(value).__name__} (send {shown} as text)", field=name)
    text = str(value)
    if not allow_empty and not text.strip():
        raise BridgeInputError(f"field {name!r} is empty{(': ' + hint) if hint else ''}", field=name)
    if max_len is not None and len(text) > max_len:
        raise BridgeInputError(f"field {name!r} is {len(text)} characters long: ids may have at most {max_len}", field=name)
    return text


def _id(payload: Mapping[str, Any], *names: str, required: bool = False, hint: str = "") -> str | None:
    value = _text(payload, *names, required=required, allow_empty=False, max_len=_MAX_ID, hint=hint)
    if value is not None and any(ord(c) < 32 for c in value):
        raise BridgeInputError(f"field {names[0]!r} holds control characters: ids must be printable text", field=names[0])
    return value.strip() if value is not None else None


def _number(payload: Mapping[str, Any], *names: str, default: float | None = None, minimum: float | None = 0.0) -> float | None:
    name, value = _get(payload, *names)
    if name is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BridgeInputError(f"field {name!r} must be a finite number, not {value!r}", field=name)
    if minimum is not None and value < minimum:
        raise BridgeInputError(f"field {name!r} must be at least {minimum:g}, not {value!r}", field=name)
    return float(value)


def _steps(payload: Mapping[str, Any]) -> list[str] | None:
    name, value = _get(payload, "steps")
    if name is None:
        return None
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BridgeInputError("field 'steps' must be a list of strings (one per reasoning step), or left out "
                               "to parse the steps from the result text", field="steps")
    return [s for s in value if s.strip()]


def _metadata(payload: Mapping[str, Any]) -> dict[str, Any]:
    value = payload.get("metadata")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BridgeInputError(f"field 'metadata' must be a JSON object, not {type(value).__name__}", field="metadata")
    return value


def _payload(payload: Any) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise BridgeInputError(f"the payload must be a JSON object, not {type(payload).__name__}", field="payload")
    return payload


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


# --------------------------------------------------------------------------- lookups
def _rows(lake: Lakehouse, table: str, tenant: str, columns: list[str] | None = None, **equal: str) -> list[dict[str, Any]]:
    """The tenant's Bridge rows of ``table`` whose columns equal ``equal`` (only bridge partitions).

    Files are chosen from the Delta log first: the tenant's partitions (a range of ``batch_id``) and the
    per-file min/max statistics of the id columns, so a lookup by id opens about one file however many
    events have landed (each landing adds a file until ``tentalis maintain`` compacts them)."""
    dt = lake.table(table)
    if dt is None:
        return []
    prefix = _prefix(tenant)
    # Every batch id that starts with "bridge-<slug>-" lies in ["bridge-<slug>-", "bridge-<slug>.") ('.' follows '-').
    prune = [("batch_id", ">=", prefix), ("batch_id", "<", prefix[:-1] + "."), *((c, "=", v) for c, v in equal.items())]
    flt = pc.starts_with(pc.field("batch_id"), pattern=prefix)
    for col, value in equal.items():
        flt = flt & (pc.field(col) == value)
    return dt.to_pyarrow_dataset(file_pruning_predicate=prune).to_table(columns=columns, filter=flt).to_pylist()


def _find_task(lake: Lakehouse, tenant: str, task_id: str) -> dict[str, Any] | None:
    rows = _rows(lake, "tasks", tenant, task_id=task_id)
    # A task lands in one partition; should a race have put it in two, the first assignment is it.
    return min(rows, key=lambda r: (r["created_at"], r["batch_id"])) if rows else None


def _unknown_task(task_id: str) -> BridgeInputError:
    return BridgeInputError(
        f"unknown task_id {task_id!r}: no task with that id was assigned for this tenant; POST /tasks/assign "
        "(or publish tentalis.tasks.assign) first, or fix the task_id", field="task_id")


def _outcome(existing: Mapping[str, Any] | None, row: Mapping[str, Any], compare: tuple[str, ...]) -> str:
    if existing is None:
        return "created"
    return "unchanged" if all(existing.get(c) == row.get(c) for c in compare) else "updated"


# --------------------------------------------------------------------------- quarantine
def quarantine_payload(lake: Lakehouse, kind: str, raw: Any, error: str, tenant: str | None, *,
                       source: str | None = None, line: int | None = None, gate: Any = None) -> None:
    """Keep a rejected Bridge payload in ``quarantine`` with every secret redacted (raw text and error).

    ``source`` defaults to ``bridge:<kind>`` (the NATS ingester passes ``nats:<subject>`` and the stream
    sequence as ``line``). ``gate`` (the gateway's ``QuarantineGate``) bounds what one tenant can have
    kept: over its rate the payload is not kept; its raw text is clipped to the gate's size."""
    if gate is not None and not gate.admit(tenant):
        return
    if isinstance(raw, (bytes, bytearray)):
        text = bytes(raw).decode("utf-8", "replace")
    elif isinstance(raw, str):
        text = raw
    else:
        try:
            text = json.dumps(raw, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(raw)
    try:
        batch_id = bridge_batch_id(tenant) if tenant is not None else None
    except BridgeInputError:
        batch_id = None
    kept = gate.clip(redact(text)) if gate is not None else redact(text)[:_MAX_RAW]
    lake.quarantine([{"source": source or f"bridge:{kind}", "line": line, "raw": kept, "error": redact(error),
                      "batch_id": batch_id, "stage": QUARANTINE_STAGE}])


def _landing(kind: str, build: Callable[[Lakehouse, Mapping[str, Any], str], dict[str, Any]]):
    """Wrap a landing function: serialise it in the process; quarantine the payload of a BridgeInputError."""

    def land(lake: Lakehouse, payload: dict, tenant: str, *, source: str | None = None, line: int | None = None,
             gate: Any = None) -> dict[str, Any]:
        try:
            with _lock:
                return build(lake, _payload(payload), tenant)
        except BridgeInputError as exc:
            quarantine_payload(lake, kind, payload, str(exc), tenant, source=source, line=line, gate=gate)
            raise

    land.__name__ = build.__name__.lstrip("_")
    land.__qualname__ = land.__name__
    land.__doc__ = build.__doc__
    return land


# --------------------------------------------------------------------------- landing
_TASK_COMPARE = ("source", "environment", "prompt", "reference", "difficulty", "metadata")
_ROLLOUT_COMPARE = ("task_id", "group_index", "policy_version", "backend", "model", "prompt_text", "completion", "steps",
                    "answer", "parse_mode", "finish_reason", "temperature", "seconds")
_REVIEW_COMPARE = ("manager", "score", "critique", "hint")


def _land_task_assign(lake: Lakehouse, payload: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """A task handed to a worker -> one ``tasks`` row in the tenant's Bridge partition.

    Fields: ``prompt`` (required); ``task_id`` (default: a hash of tenant, worker, manager, prompt and
    reference); ``expected`` / ``reference`` / ``answer`` (the ground truth, optional); ``environment``
    (math | code | chat; default from the seeds' ``task_type`` when it names one, else chat); ``worker_id``,
    ``manager_id``, ``task_type``, ``difficulty`` and ``metadata`` (an object) go to the row's metadata with
    the tenant. Returns ``task_id``, ``batch_id`` and ``status`` (created | updated | unchanged).
    """
    slug = tenant_slug(tenant)
    prompt = _text(payload, "prompt", required=True, allow_empty=False, hint="send the task's text as 'prompt'")
    reference = _text(payload, "expected", "reference", "answer") or ""
    worker = _id(payload, "worker_id", "worker")
    manager = _id(payload, "manager_id", "manager")
    task_type = _id(payload, "task_type")
    environment = _text(payload, "environment")
    if environment is None:
        environment = _TASK_TYPE_ENVIRONMENT.get((task_type or "").lower(), "chat")
    elif environment not in ENVIRONMENTS:
        raise BridgeInputError(f"field 'environment' is {environment!r}: use one of {', '.join(ENVIRONMENTS)}", field="environment")
    difficulty = _number(payload, "difficulty", minimum=None)
    if difficulty is not None and difficulty != int(difficulty):
        raise BridgeInputError(f"field 'difficulty' must be a whole number, not {difficulty!r}", field="difficulty")
    extra = _metadata(payload)
    task_id = _id(payload, "task_id") or stable_id("bt", tenant, worker, manager, prompt, reference)
    meta = {**extra, "tenant": tenant, "worker_id": worker, "manager_id": manager, "task_type": task_type}
    if payload.get("created_at") is not None:
        meta["sent_at"] = str(payload["created_at"])
    existing = _find_task(lake, tenant, task_id)
    row = {
        "batch_id": existing["batch_id"] if existing else bridge_batch_id(tenant),
        "task_id": task_id, "source": SOURCE, "environment": environment, "prompt": prompt, "reference": reference,
        "difficulty": int(difficulty) if difficulty is not None else None,
        # Metadata is the client's free-form object: secrets in it never reach the table.
        "metadata": redact(_dumps({k: v for k, v in meta.items() if v is not None})),
        "created_at": existing["created_at"] if existing else now_utc(),
    }
    status = _outcome(existing, row, _TASK_COMPARE)
    if status != "unchanged":
        lake.upsert("tasks", ["batch_id", "task_id"], [row], compare=_TASK_COMPARE)
    return {"task_id": task_id, "batch_id": row["batch_id"], "tenant": tenant, "tenant_slug": slug, "status": status}


def _land_task_result(lake: Lakehouse, payload: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """A worker's result for an assigned task -> one ``rollouts`` row in the task's partition.

    Fields: ``task_id`` and ``worker_id`` (required; one rollout per worker and task, ``rollout_id`` a hash
    of tenant, task and worker); ``result`` (the completion text; ``completion`` / ``response`` accepted);
    ``steps`` (list of strings; default: parsed from the text with the project's step parser);
    ``answer`` (default: parsed); ``status`` (success | failed; failed lands with finish_reason 'error');
    ``elapsed_seconds``; ``model_version`` / ``policy_version`` (default ``external:<worker_id>``);
    ``model``; ``temperature`` (default 1.0). Returns ``task_id``, ``rollout_id``, ``batch_id``,
    ``group_index`` and ``status`` (created | updated | unchanged).
    """
    tenant_slug(tenant)
    task_id = _id(payload, "task_id", required=True, hint="name the task this result answers")
    worker = _id(payload, "worker_id", "worker", required=True, hint="name the worker that produced the result")
    completion = _text(payload, "result", "completion", "response", required=True,
                       hint="send the worker's answer text as 'result'")
    given_steps = _steps(payload)
    given_answer = _text(payload, "answer")
    outcome = (_text(payload, "status") or "success").lower()
    if outcome not in ("success", "failed"):
        raise BridgeInputError(f"field 'status' is {outcome!r}: use 'success' or 'failed'", field="status")
    seconds = _number(payload, "elapsed_seconds", "seconds", default=0.0)
    temperature = _number(payload, "temperature", default=1.0)
    policy = _id(payload, "policy_version", "model_version") or f"external:{worker}"
    model = _id(payload, "model") or policy
    task = _find_task(lake, tenant, task_id)
    if task is None:
        raise _unknown_task(task_id)
    rollout_id = stable_id("br", tenant, task_id, worker)
    batch_id = task["batch_id"]
    existing_rows = _rows(lake, "rollouts", tenant, batch_id=batch_id, task_id=task_id)
    existing = next((r for r in existing_rows if r["rollout_id"] == rollout_id), None)
    parsed = parse_completion(completion)
    row = {
        "batch_id": batch_id, "rollout_id": rollout_id, "task_id": task_id,
        "group_index": existing["group_index"] if existing else len(existing_rows),
        "policy_version": policy, "backend": BACKEND, "model": model, "prompt_text": task["prompt"],
        "completion": completion, "steps": given_steps if given_steps else parsed.steps,
        "answer": given_answer.strip() if given_answer is not None else parsed.answer, "parse_mode": parsed.parse_mode,
        # External workers report text, not tokens: the trainer tokenizes prompt_text + completion itself.
        "prompt_tokens": 0, "completion_tokens": 0, "completion_token_ids": [], "sampling_logprobs": None,
        "finish_reason": "stop" if outcome == "success" else "error", "temperature": temperature, "seconds": seconds,
        "created_at": existing["created_at"] if existing else now_utc(),
    }
    status = _outcome(existing, row, _ROLLOUT_COMPARE)
    if status != "unchanged":
        lake.upsert("rollouts", ["batch_id", "rollout_id"], [row], compare=_ROLLOUT_COMPARE)
    return {"task_id": task_id, "rollout_id": rollout_id, "batch_id": batch_id, "group_index": row["group_index"],
            "worker_id": worker, "status": status}


def normalize_score(payload: Mapping[str, Any]) -> float:
    """The review score in [0, 1]. Scores on 0-10 or 0-100 are accepted only when the payload says so
    (``"scale": 10`` or ``100``); anything else outside [0, 1] is refused."""
    name, value = _get(payload, "score")
    if name is None:
        raise BridgeInputError("field 'score' is missing: send the manager's score in [0, 1] (or with \"scale\": 10 or 100)",
                               field="score")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BridgeInputError(f"field 'score' must be a finite number, not {value!r}", field="score")
    scale = payload.get("scale", 1)
    if isinstance(scale, bool) or scale not in SCALES:
        raise BridgeInputError(f"field 'scale' is {scale!r}: use 1 (score in [0, 1], the default), 10 or 100", field="scale")
    if not 0 <= value <= scale:
        fix = ("send a score in [0, 1], or say its scale with \"scale\": 10 or \"scale\": 100" if scale == 1
               else f"a score on scale {scale} must lie in [0, {scale}]")
        raise BridgeInputError(f"field 'score' is {value!r}, outside [0, {scale}]: {fix}", field="score")
    return float(value) / scale


def _land_feedback(lake: Lakehouse, payload: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """The manager's review of a worker's result -> one ``reviews`` row in the task's partition.

    Fields: ``task_id`` (required); ``worker_id`` (which worker's result; may be left out when the task has
    exactly one result) or ``rollout_id``; ``score`` in [0, 1] (or on 0-10 / 0-100 with ``scale``: 10 / 100);
    ``textual_feedback`` / ``critique`` / ``feedback``; ``hint``; ``manager_id`` / ``manager`` / ``reviewer``
    (default 'manager'). One review per rollout: a new review of the same result replaces the old one.
    Returns ``task_id``, ``rollout_id``, ``batch_id``, ``score`` (in [0, 1]) and ``status``.
    """
    tenant_slug(tenant)
    task_id = _id(payload, "task_id", required=True, hint="name the task whose result is reviewed")
    worker = _id(payload, "worker_id", "worker")
    rollout_id = _id(payload, "rollout_id")
    score = normalize_score(payload)
    critique = _text(payload, "textual_feedback", "critique", "feedback") or ""
    hint = _text(payload, "hint") or ""
    manager = _id(payload, "manager_id", "manager", "reviewer") or "manager"
    task = _find_task(lake, tenant, task_id)
    if task is None:
        raise _unknown_task(task_id)
    batch_id = task["batch_id"]
    rollouts = _rows(lake, "rollouts", tenant, columns=["rollout_id"], batch_id=batch_id, task_id=task_id)
    known = {r["rollout_id"] for r in rollouts}
    if rollout_id is None and worker is not None:
        rollout_id = stable_id("br", tenant, task_id, worker)
        if rollout_id not in known:
            raise BridgeInputError(f"worker_id {worker!r} has sent no result for task_id {task_id!r}: POST /tasks/result "
                                   "first, or fix the worker_id", field="worker_id")
    elif rollout_id is None:
        if len(known) != 1:
            what = "no result yet" if not known else f"{len(known)} results"
            raise BridgeInputError(f"task_id {task_id!r} has {what}: name the reviewed result with 'worker_id'"
                                   + ("" if known else " after its POST /tasks/result"), field="worker_id")
        rollout_id = next(iter(known))
    elif rollout_id not in known:
        raise BridgeInputError(f"rollout_id {rollout_id!r} is not a result of task_id {task_id!r}: use the rollout_id "
                               "that POST /tasks/result returned", field="rollout_id")
    existing = next(iter(_rows(lake, "reviews", tenant, batch_id=batch_id, rollout_id=rollout_id)), None)
    row = {"batch_id": batch_id, "rollout_id": rollout_id, "manager": manager, "score": score,
           "critique": critique, "hint": hint, "created_at": existing["created_at"] if existing else now_utc(),
           "reviewer": manager, "tenant": tenant}
    status = _outcome(existing, row, _REVIEW_COMPARE)
    if status != "unchanged":
        lake.upsert("reviews", ["batch_id", "rollout_id"], [row], compare=_REVIEW_COMPARE)
    return {"task_id": task_id, "rollout_id": rollout_id, "batch_id": batch_id, "score": score, "status": status}


land_task_assign = _landing("assign", _land_task_assign)
land_task_result = _landing("result", _land_task_result)
land_feedback = _landing("feedback", _land_feedback)

# What each kind of Bridge event lands with (the NATS ingester maps subjects to these kinds).
LANDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "assign": land_task_assign, "result": land_task_result, "feedback": land_feedback,
}


# --------------------------------------------------------------------------- status
def bridge_status(lake: Lakehouse, tenant: str, *, task_id: str | None = None) -> dict[str, Any]:
    """Counts of the tenant's Bridge tasks: ``assigned``, ``resulted`` (tasks with at least one result),
    ``reviewed`` (tasks with at least one reviewed result), ``pending_results`` (assigned, no result yet),
    ``pending_reviews`` (results not reviewed yet), ``pending`` (tasks with either), plus ``rollouts``,
    ``reviews`` and ``batches``. With ``task_id``: that task's state instead (``state``: pending | resulted |
    reviewed, its results and reviews); an unknown id is a BridgeInputError naming it (not quarantined)."""
    tenant_slug(tenant)
    with _lock:
        if task_id is not None:
            return _task_status(lake, tenant, task_id)
        tasks = _rows(lake, "tasks", tenant, columns=["batch_id", "task_id"])
        rollouts = _rows(lake, "rollouts", tenant, columns=["batch_id", "rollout_id", "task_id"])
        reviews = _rows(lake, "reviews", tenant, columns=["batch_id", "rollout_id"])
    assigned = {(r["batch_id"], r["task_id"]) for r in tasks}
    reviewed_rollouts = {(r["batch_id"], r["rollout_id"]) for r in reviews}
    resulted = {(r["batch_id"], r["task_id"]) for r in rollouts} & assigned
    reviewed = {(r["batch_id"], r["task_id"]) for r in rollouts if (r["batch_id"], r["rollout_id"]) in reviewed_rollouts} & assigned
    unreviewed = [r for r in rollouts if (r["batch_id"], r["rollout_id"]) not in reviewed_rollouts]
    pending_tasks = (assigned - resulted) | {(r["batch_id"], r["task_id"]) for r in unreviewed}
    return {
        "tenant": tenant, "assigned": len(assigned), "resulted": len(resulted), "reviewed": len(reviewed),
        "pending_results": len(assigned - resulted), "pending_reviews": len(unreviewed), "pending": len(pending_tasks),
        "rollouts": len(rollouts), "reviews": len(reviewed_rollouts),
        "batches": sorted({b for b, _ in assigned}),
    }


def _task_status(lake: Lakehouse, tenant: str, task_id: str) -> dict[str, Any]:
    task = _find_task(lake, tenant, task_id)
    if task is None:
        raise _unknown_task(task_id)
    batch_id = task["batch_id"]
    rollouts = _rows(lake, "rollouts", tenant, batch_id=batch_id, task_id=task_id)
    reviews = {r["rollout_id"]: r for r in _rows(lake, "reviews", tenant, batch_id=batch_id)}
    results = []
    for r in sorted(rollouts, key=lambda r: r["group_index"]):
        review = reviews.get(r["rollout_id"])
        results.append({"rollout_id": r["rollout_id"], "policy_version": r["policy_version"], "result": r["completion"],
                        "answer": r["answer"], "finish_reason": r["finish_reason"],
                        "review": None if review is None else {k: review[k] for k in ("manager", "score", "critique", "hint")}})
    state = "reviewed" if any(x["review"] for x in results) else "resulted" if results else "pending"
    return {"tenant": tenant, "task_id": task_id, "batch_id": batch_id, "state": state, "prompt": task["prompt"],
            "results": results}
