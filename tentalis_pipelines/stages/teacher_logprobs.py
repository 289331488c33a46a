"""The `teacher_logprobs` stage: hinted on-policy distillation's teacher, per reviewed rollout.

For every rollout of the batch the hint filter decides whether its review's hint becomes an OPD term
(one row per rollout, whatever the decision, so SQL can count what was kept and why). For the kept ones
the teacher (the policy that sampled, given the hint; or a configured teacher model) and the student
score the student's own completion token by token, in batches; the clipped difference is the signal
the `trajectories` stage adds to the RL advantage (``training/opd.py``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from tentalis_pipelines import sessions
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.common import StageResult, markdown_table, text_length
from tentalis_pipelines.stages.kinds import batch_kind
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.opd import hint_id
from tentalis_pipelines.training.trainer import GRPOConfig


def _load(model_dir: Path, adapter: str | None, dtype: str, device: str):
    """A frozen model for scoring: the base, with the sampling checkpoint's adapter when there is one."""
    from transformers import AutoModelForCausalLM

    from tentalis_pipelines.hardware import resolve_device, resolve_dtype

    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=resolve_dtype(dtype, dev)).to(dev)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter, is_trainable=False)
    model.eval()
    return model


def sampling_adapter(lake: Lakehouse, version: str) -> str | None:
    """The adapter folder of the checkpoint that sampled a batch (None for the base model), verified."""
    if version == "base":
        return None
    row = ckpt.checkpoint_row(lake, version)
    if row is None:
        raise ValueError(f"rollouts were sampled by checkpoint {version!r}, which the checkpoints table does not know")
    return str(ckpt.verify_adapter(row["adapter_uri"]))


def build_teacher_logprobs(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, config: GRPOConfig) -> StageResult:
    """One row per rollout of ``batch_id``: the hint filter's decision and, for used hints, the teacher's
    and student's log-probs and the clipped OPD signal, as the batch's kind places the hint
    (``stages/kinds.py``: :func:`task_teacher_logprobs`, :func:`session_teacher_logprobs`). With
    ``w_opd == 0`` nothing is computed."""
    if config.w_opd == 0:
        lake.write_batch("teacher_logprobs", batch_id, [])
        return StageResult(0, {"opd": "off (trainer.w_opd = 0): no teacher pass"})
    return batch_kind(lake, batch_id).teacher_logprobs(lake, paths, batch_id, policy, config)


def task_teacher_logprobs(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, config: GRPOConfig) -> StageResult:
    """A task batch: one row per rollout, its review's hint screened against the task's reference; the
    teacher sees the rendered prompt with the hint after the task (``opd.hinted_prompt``)."""
    from transformers import AutoTokenizer

    tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    rollouts = lake.read("rollouts", batch_id=batch_id,
                         columns=["rollout_id", "task_id", "policy_version", "prompt_text", "completion_token_ids", "temperature"]).to_pylist()
    model_dir = resolve_model(policy.model, paths.models)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    created = now_utc()
    rows, todo = [], []
    for ro in rollouts:
        review = reviews.get(ro["rollout_id"])
        if review is None:
            raise ValueError(f"rollout {ro['rollout_id']} has no review: materialise reviews for batch {batch_id!r} first")
        task = tasks[ro["task_id"]]
        hint = (review.get("hint") or "").strip()
        decision, reason = opd.screen_hint(hint, task["reference"])
        if decision == opd.USED and not ro["completion_token_ids"]:
            decision, reason = opd.NO_EFFECT, "empty completion: no tokens to distil"
        version = ro["policy_version"]
        teacher = teacher_identity(config, version)
        row = _decision_row(batch_id, ro, review["manager"], hint, teacher, config, decision, reason, created)
        rows.append(row)
        if decision == opd.USED:
            teacher_text = opd.hinted_prompt(ro["prompt_text"], task["prompt"], hint)
            todo.append((row, opd.OPDItem(
                tokenizer(ro["prompt_text"], add_special_tokens=False)["input_ids"],
                tokenizer(teacher_text, add_special_tokens=False)["input_ids"],
                list(ro["completion_token_ids"]), row["temperature"])))
    _score(todo, lake, model_dir, tokenizer, config)
    return _result(lake, batch_id, rows, config)


def _result(lake: Lakehouse, batch_id: str, rows: list[dict], config: GRPOConfig) -> StageResult:
    n = lake.write_batch("teacher_logprobs", batch_id, rows)
    decisions = Counter(r["decision"] for r in rows)
    used = [r for r in rows if r["decision"] == opd.USED]
    return StageResult(n, {
        "rollouts": n,
        "decisions": ", ".join(f"{k}: {v}" for k, v in sorted(decisions.items())),
        "opd_rows": len(used),
        "mean_signal": round(sum(r["signal_mean"] for r in used) / len(used), 4) if used else 0.0,
        "teacher": config.opd_teacher,
        "preview": markdown_table([{"rollout_id": r["rollout_id"], "decision": r["decision"], "hint_id": r["hint_id"],
                                    "hint_chars": text_length(r["hint"]),
                                    "signal_mean": r["signal_mean"]} for r in rows]),
    })


def _decision_row(batch_id: str, ro: dict, manager: str | None, hint: str, teacher: str, config: GRPOConfig,
                  decision: str, reason: str, created) -> dict:
    """One `teacher_logprobs` row before scoring (the log-probs and signal are filled for used hints)."""
    return {
        "batch_id": batch_id, "rollout_id": ro["rollout_id"],
        "hint_id": hint_id(ro["rollout_id"], manager, hint) if hint and manager is not None else None,
        "hint_source": manager, "hint": hint, "teacher": teacher, "policy_version": ro["policy_version"],
        "temperature": float(ro["temperature"] if ro["temperature"] is not None else config.temperature),
        "decision": decision, "reason": reason, "teacher_logprobs": None, "student_logprobs": None,
        "opd_signal": None, "signal_mean": None, "created_at": created,
    }


def is_server_teacher(teacher: str) -> bool:
    return teacher.startswith(("http://", "https://"))


def teacher_identity(config: GRPOConfig, version: str) -> str:
    """What the ``teacher`` column records: ``self:<version>``, the model folder, or ``<url>#<model>``
    (credentials stripped from the URL: a key never reaches a table)."""
    if config.opd_teacher == "self":
        return f"self:{version}"
    if is_server_teacher(config.opd_teacher):
        from tentalis_pipelines.redact import redact

        return f"{redact(config.opd_teacher)}#{config.opd_teacher_model}"
    return config.opd_teacher


def segment_hint(rollout: dict, session_reviews: list[dict]) -> tuple[str, str, dict | None]:
    """(decision, reason, review) of one segment rollout of a sessions batch: among the reviews of its
    turns (``turn_spans``) and of its whole session, the one with the longest usable hint (OpenClaw-RL
    keeps the longest non-trivial hint), else one with a trivial hint, else none. A review of another
    segment's turn never counts."""
    sid = rollout["session_id"] or rollout["task_id"]
    targets = {s["turn_id"] for s in rollout["turn_spans"] or []} | {sid}
    mine = [r for r in session_reviews if r["rollout_id"] in targets]
    screened = [(opd.screen_hint(r.get("hint")), r) for r in mine]
    usable = [(d, r) for d, r in screened if d[0] == opd.USED]
    (decision, reason), review = max(usable, key=lambda x: len((x[1].get("hint") or "").strip()), default=None) or next(
        ((d, r) for d, r in screened if d[0] == opd.TRIVIAL), None) or ((opd.NO_HINT, "no review of this segment has a hint"), None)
    return decision, reason, review


def fill_signal(row: dict, item: opd.OPDItem, teacher: list[float], student: list[float], config: GRPOConfig) -> None:
    """Put a scored row's log-probs and clipped signal (masked to the item's assistant tokens) in ``row``;
    a hint whose mean |signal| is under ``opd_min_effect`` becomes ``no_effect``."""
    signal = opd.opd_signal(teacher, student, clip=config.opd_clip, mask=item.completion_mask)
    row.update(teacher_logprobs=teacher, student_logprobs=student, opd_signal=signal,
               signal_mean=sum(signal) / len(signal) if signal else 0.0)
    if not opd.has_effect(signal, config.opd_min_effect):
        row.update(decision=opd.NO_EFFECT, reason=f"mean |signal| below opd_min_effect {config.opd_min_effect}: the hint changes nothing here")


def _score(todo: list, lake: Lakehouse, model_dir: Path, tokenizer, config: GRPOConfig) -> None:
    """Fill the used rows: teacher and student log-probs, per sampling policy version (each version's
    own adapter is the student, and the teacher too when ``opd_teacher == 'self'``). A server teacher
    returns raw log-probs (temperature 1), so the student side is computed at temperature 1 too."""
    by_version: dict[str, list] = {}
    for row, item in todo:
        by_version.setdefault(row["policy_version"], []).append((row, item))
    kw = {"micro_batch_tokens": config.micro_batch_tokens, "dtype": config.dtype}
    separate = server = None
    if is_server_teacher(config.opd_teacher):
        import os

        from tentalis_pipelines.inference.openai_backend import OpenAIBackend

        server = OpenAIBackend(base_url=config.opd_teacher, served_model=config.opd_teacher_model, tokenizer=tokenizer,
                               api_key=os.environ.get("TENTALIS_OPD_TEACHER_API_KEY"))
    elif config.opd_teacher != "self":
        from transformers import AutoTokenizer

        teacher_dir = Path(config.opd_teacher)
        if not teacher_dir.is_dir():
            raise ValueError(f"opd_teacher {config.opd_teacher!r} is not a model folder or a server URL: use 'self', "
                             "a local model folder or http(s)://host:port/v1")
        if AutoTokenizer.from_pretrained(teacher_dir).get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"opd_teacher {config.opd_teacher!r} has another tokenizer than the policy: "
                             "OPD compares log-probs of the same tokens, so the teacher must share the vocabulary")
        separate = _load(teacher_dir, None, config.dtype, config.device)
    for version, pairs in by_version.items():
        student = _load(model_dir, sampling_adapter(lake, version), config.dtype, config.device)
        items = [it for _, it in pairs]
        if server is not None:
            items = [replace(it, temperature=1.0) for it in items]
            for row, _ in pairs:
                row["temperature"] = 1.0
            full = server.prompt_logprobs([it.teacher_prompt_ids + it.completion_ids for it in items])
            teacher_side = [lp[len(it.teacher_prompt_ids) - 1:] for lp, it in zip(full, items)]
            scored = list(zip(teacher_side, opd.side_logprobs(student, tokenizer, items, "student", **kw)))
        elif separate is not None:
            scored = list(zip(opd.side_logprobs(separate, tokenizer, items, "teacher", **kw),
                              opd.side_logprobs(student, tokenizer, items, "student", **kw)))
        else:
            scored = opd.teacher_student_logprobs(student, tokenizer, items, **kw)
        for (row, item), (t, s) in zip(pairs, scored):
            fill_signal(row, item, t, s, config)


def session_teacher_logprobs(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, config: GRPOConfig) -> StageResult:
    """A live-session batch: one row per segment rollout. Its hint is the longest usable one among the
    reviews of the segment's turns and of its session (people's and the judge's, as written: a session
    has no reference answer to leak). The teacher sees the segment's exact prompt tokens with the hint
    after the last user message; only the assistant's tokens get a signal."""
    from transformers import AutoTokenizer

    reviews: dict[str, list[dict]] = {}
    for r in lake.read("reviews", batch_id=batch_id).to_pylist():
        reviews.setdefault(r["session_id"], []).append(r)
    rollouts = lake.read("rollouts", batch_id=batch_id, columns=[
        "rollout_id", "task_id", "session_id", "policy_version", "prompt_token_ids", "completion_token_ids", "assistant_mask",
        "turn_spans", "temperature"]).to_pylist()
    user_texts = sessions.segment_user_texts(lake, rollouts)
    model_dir = resolve_model(policy.model, paths.models)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    created = now_utc()
    rows, todo = [], []
    for ro in rollouts:
        decision, reason, review = segment_hint(ro, reviews.get(ro["session_id"] or ro["task_id"], []))
        hint = ((review or {}).get("hint") or "").strip()
        version = ro["policy_version"]
        row = _decision_row(batch_id, ro, review["manager"] if review else None, hint, teacher_identity(config, version), config,
                            decision, reason, created)
        rows.append(row)
        if decision != opd.USED:
            continue
        mask = list(ro["assistant_mask"] or [])
        if not ro["completion_token_ids"] or not any(mask):
            row.update(decision=opd.NO_EFFECT, reason="the segment has no assistant tokens to distil")
            continue
        try:
            teacher_ids = opd.hinted_prompt_ids(tokenizer, ro["prompt_token_ids"], user_texts[ro["rollout_id"]], hint)
        except ValueError as exc:
            row.update(decision=opd.NO_EFFECT, reason=str(exc))
            continue
        todo.append((row, opd.OPDItem(list(ro["prompt_token_ids"]), teacher_ids, list(ro["completion_token_ids"]),
                                      row["temperature"], completion_mask=mask)))
    _score(todo, lake, model_dir, tokenizer, config)
    return _result(lake, batch_id, rows, config)
