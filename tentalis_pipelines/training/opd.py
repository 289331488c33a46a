"""Hinted on-policy distillation (OPD), as OpenClaw-RL's "combine" method.

A manager's hint is turned into a teacher: the same policy (or a configured teacher model) given the
same context **plus the hint**. On the student's own sampled tokens ``a_t`` the per-token signal is

    opd_t = clip(log pi_teacher(a_t | s + hint) - log pi_student(a_t | s), -opd_clip, +opd_clip)

positive where the hint makes the token more likely, negative where the hint argues against it. It is
added to the RL advantage token by token, ``A_t = w_rl * A_rl,t + w_opd * opd_t`` (OPD-only and RL-only
are the same code with a zero weight), and trained by the usual clipped surrogate.

Both log-probs are computed here, by the same model and the same batched forward code as the trainer
(``trainer.completion_logps``), at the temperature the completion was sampled at: with an empty hint the
two contexts are identical and the signal is exactly zero, not a numerical difference between a sampler
and a trainer. This module imports only torch and transformers (it runs on a bare GPU machine).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tentalis_pipelines.hardware import autocast, resolve_dtype
from tentalis_pipelines.training.trainer import TrainSample, completion_logps, micro_batches, pack


def hint_id(rollout_id: str, manager: str, hint: str) -> str:
    """The id of one hint a manager gave one rollout: a ``teacher_logprobs`` row's ``hint_id``, and a guided rollout's."""
    return "h-" + hashlib.sha1(f"{rollout_id}\x1f{manager}\x1f{hint}".encode()).hexdigest()[:16]


HINT_PREFIX = "Hint from your manager: "
# Hints that carry no direction: OpenClaw-RL keeps only non-trivial hints. Compared lower-cased, without
# punctuation.
GENERIC_HINTS = frozenset({
    "try again", "be careful", "check your work", "think harder", "do better", "wrong", "incorrect",
    "no", "redo it", "please fix", "fix it", "good", "ok", "okay", "none", "n/a",
    # The llm manager's rubrics' own placeholders: the trained manager learned to copy the rubric's
    # "<one sentence the worker can act on>" (168 of 256 hints, experiments/manager_rl): it says nothing.
    "one sentence the worker can act on", "one sentence the assistant can act on",
})
MIN_HINT_CHARS = 12
NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

# The decisions of the hint filter, one per reviewed rollout (stored in `teacher_logprobs.decision`).
USED, NO_HINT, TRIVIAL, LEAKS_ANSWER, NO_EFFECT = "used", "no_hint", "trivial", "leaks_answer", "no_effect"


def hinted_prompt(prompt_text: str, task_prompt: str, hint: str) -> str:
    """The teacher's context: the student's exact prompt text with the hint appended to the task's user
    message (its last occurrence in the rendered prompt), so the system prompt, worked example, injected
    skills and chat template stay exactly as the student saw them. An empty hint returns the prompt."""
    hint = (hint or "").strip()
    if not hint:
        return prompt_text
    at = prompt_text.rfind(task_prompt)
    if not task_prompt or at < 0:
        raise ValueError("the task's prompt does not occur in the rollout's prompt text: cannot place the hint "
                         "(was the rollout rendered from another task?)")
    end = at + len(task_prompt)
    return prompt_text[:end] + "\n\n" + HINT_PREFIX + hint + prompt_text[end:]


def hinted_prompt_ids(tokenizer, prompt_ids: Sequence[int], user_text: str, hint: str) -> list[int]:
    """A live session's teacher context, in tokens: the student's exact prompt ids with the hint's tokens
    inserted right after ``user_text`` (the prompt's last user message), the same place
    :func:`hinted_prompt` puts it for a task. The prompt ids are kept as the gateway recorded them (not
    re-tokenised), so an empty hint returns them unchanged and the OPD signal is exactly zero."""
    ids = list(prompt_ids)
    hint = (hint or "").strip()
    if not hint:
        return ids
    def decode(k: int) -> str:
        return tokenizer.decode(ids[:k], clean_up_tokenization_spaces=False)

    text = decode(len(ids))
    at = text.rfind(user_text) if user_text else -1
    if at < 0:
        raise ValueError("the session's last user message does not occur in its prompt tokens: cannot place the hint")
    end = at + len(user_text)
    # The first token boundary at or after the end of the user's text (decoded prefixes only grow).
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(mid)) >= end:
            hi = mid
        else:
            lo = mid + 1
    cut = lo
    inserted = tokenizer("\n\n" + HINT_PREFIX + hint, add_special_tokens=False)["input_ids"]
    return ids[:cut] + list(inserted) + ids[cut:]


def screen_hint(hint: str | None, reference: str | None = None) -> tuple[str, str]:
    """The text-only part of the hint filter: (decision, reason). ``used`` means the hint goes on to the
    teacher (where :func:`has_effect` may still drop it).

    * empty -> ``no_hint``;
    * shorter than :data:`MIN_HINT_CHARS` or a generic phrase ("try again") -> ``trivial``;
    * contains the reference answer as a number -> ``leaks_answer`` (a hint must say what to do, not
      what to write: distilling the answer teaches copying, not the skill).
    """
    text = (hint or "").strip()
    if not text:
        return NO_HINT, "the review has no hint"
    bare = re.sub(r"[^\w\s]", "", text.lower()).strip()
    if len(text) < MIN_HINT_CHARS or bare in GENERIC_HINTS:
        return TRIVIAL, f"hint {text!r} carries no direction (shorter than {MIN_HINT_CHARS} characters or generic)"
    if reference is not None and _leaks(text, reference):
        return LEAKS_ANSWER, f"hint names the reference answer {reference!r}"
    return USED, ""


def _leaks(hint: str, reference: str) -> bool:
    ref = reference.strip().replace(",", "")
    try:
        value = float(ref)
    except ValueError:
        return bool(ref) and ref in hint
    return any(_as_float(n) == value for n in NUMBER_RE.findall(hint))


def _as_float(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def opd_signal(teacher_logps: Sequence[float], student_logps: Sequence[float], *, clip: float | None = 1.0,
               mask: Sequence[int] | None = None) -> list[float]:
    """Per token ``log pi_teacher - log pi_student``, clipped to ``[-clip, clip]`` (OpenClaw-RL's
    ``adv_diff_clip``; None: unclipped); 0 where ``mask`` is 0 (context tokens of a multi-turn sample)."""
    if len(teacher_logps) != len(student_logps):
        raise ValueError(f"teacher has {len(teacher_logps)} log-probs for {len(student_logps)} student tokens")
    out = []
    for i, (t, s) in enumerate(zip(teacher_logps, student_logps)):
        if mask is not None and not mask[i]:
            out.append(0.0)
            continue
        d = float(t) - float(s)
        if not math.isfinite(d):
            raise ValueError(f"token {i}: non-finite log-prob (teacher {t}, student {s})")
        if clip is not None:
            d = max(-clip, min(clip, d))
        out.append(d)
    return out


def has_effect(signal: Sequence[float], min_effect: float) -> bool:
    """Whether the hint moved the teacher at all on these tokens: mean |signal| >= ``min_effect``. A hint
    that changes nothing gives the sample no OPD term (OpenClaw-RL drops samples no hint helps)."""
    if not signal:
        return False
    return sum(abs(x) for x in signal) / len(signal) >= min_effect


def combine_advantages(rl_advantages: Sequence[float], signal: Sequence[float] | None, *, w_rl: float, w_opd: float) -> list[float]:
    """``w_rl * A_rl,t + w_opd * opd_t`` per token (``signal`` None: the OPD term is 0 for this row)."""
    if signal is None:
        return [w_rl * a for a in rl_advantages]
    if len(signal) != len(rl_advantages):
        raise ValueError(f"OPD signal has {len(signal)} entries for {len(rl_advantages)} completion tokens")
    return [w_rl * a + w_opd * s for a, s in zip(rl_advantages, signal)]


def keeps(rl_signal: bool, opd_signal: Sequence[float] | None, *, w_rl: float, w_opd: float) -> bool:
    """Whether a trajectory is trained on: it carries a signal of a kind that has a weight. A group whose
    rewards are all equal (no RL signal) still teaches through its used hints; with ``w_rl = 0`` a row
    without a used hint has nothing to learn from (kept, it would only dilute the token mean)."""
    return bool((w_rl > 0 and rl_signal) or (w_opd > 0 and opd_signal is not None))


@dataclass(frozen=True)
class OPDItem:
    """One student completion to score: its own prompt ids, the hinted prompt ids, the completion ids
    and the temperature it was sampled at."""

    student_prompt_ids: list[int]
    teacher_prompt_ids: list[int]
    completion_ids: list[int]
    temperature: float = 1.0
    # A multi-turn segment's assistant mask: context tokens (tool results, later user messages) get no
    # signal. None: every completion token is the student's.
    completion_mask: list[int] | None = None


def teacher_student_logprobs(model, tokenizer, items: Sequence[OPDItem], *, micro_batch_tokens: int = 4096,
                             dtype: str = "auto") -> list[tuple[list[float], list[float]]]:
    """(teacher, student) per-token log-probs of every item's completion, in batches (no gradient).

    ``model`` is the teacher and the student at once when the teacher is the policy itself; a separate
    teacher model must share the student's tokenizer (checked by the caller) and is scored with
    :func:`side_logprobs`. Rows are grouped into micro-batches of at most ``micro_batch_tokens`` padded
    tokens, each side by the trainer's own packing and log-prob code."""
    kw = {"micro_batch_tokens": micro_batch_tokens, "dtype": dtype}
    teacher = side_logprobs(model, tokenizer, items, "teacher", **kw)
    student = side_logprobs(model, tokenizer, items, "student", **kw)
    return list(zip(teacher, student))


def side_logprobs(model, tokenizer, items: Sequence[OPDItem], side: str, *, micro_batch_tokens: int = 4096,
                  dtype: str = "auto") -> list[list[float]]:
    """One side's per-token log-probs of every item's completion: ``teacher`` (after the hinted prompt)
    or ``student`` (after the student's own prompt), at each item's temperature."""
    if side not in ("teacher", "student"):
        raise ValueError(f"side must be 'teacher' or 'student', got {side!r}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    torch_dtype = resolve_dtype(dtype, device)
    rows = [TrainSample((it.teacher_prompt_ids if side == "teacher" else it.student_prompt_ids), list(it.completion_ids),
                        0.0, temperature=it.temperature) for it in items]
    index = {id(r): i for i, r in enumerate(rows)}
    out: list[list[float] | None] = [None] * len(rows)
    was_training = model.training
    model.eval()
    with torch.inference_mode(), autocast(device, torch_dtype):
        for mb in micro_batches([r for r in rows if r.completion_ids], micro_batch_tokens):
            # One layout for both sides (no shared-prefix branch): the two passes differ only by the hint.
            batch = pack(mb, pad_id, device, shared=False)
            logps = completion_logps(model, batch).float().cpu()
            for row, lp in zip(mb, logps):
                out[index[id(row)]] = lp[: len(row.completion_ids)].tolist()
    if was_training:
        model.train()
    return [o if o is not None else [] for o in out]
