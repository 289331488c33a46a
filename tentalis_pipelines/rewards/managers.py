"""Manager reviews: a score in [0, 1], a one-line critique and a hint for the worker.

The ``verifier`` manager reviews from the ground truth and the step checks: it is what a diligent
human manager with an answer key would write. Other managers (LLM rubric, imported human reviews)
implement the same ``review`` signature.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Review:
    score: float
    critique: str
    hint: str
    # True when an LLM manager's reply did not parse and this is the verifier's review in its place: the
    # stored row then names the verifier as its manager, so the verifier's score and hint are never credited
    # to the model that failed to write one.
    fallback: bool = False


@dataclass(frozen=True)
class ReviewInput:
    reference: str
    answer: str | None
    correct: bool
    answer_tagged: bool
    format_score: float
    steps: list[str]
    step_scores: list[float | None]
    step_rationales: list[str]
    finish_reason: str
    # The task's solution expression when the source knows it (the arithmetic generator's "12 + 7"):
    # lets the verifier's hint say what to compute instead, without the result.
    expression: str | None = None


class VerifierManager:
    name = "verifier"

    def review(self, x: ReviewInput) -> Review:
        first_bad = next((i for i, s in enumerate(x.step_scores) if s == 0.0), None)
        if x.correct:
            if x.answer_tagged and x.format_score >= 1.0:
                return Review(1.0, f"Correct: {x.answer}, shown in {len(x.steps)} step(s).", "")
            return Review(
                0.7,
                f"Right number ({x.answer}) but the work is not in the required <step>/<answer> format.",
                "Write each step in <step></step> and only the final number in <answer></answer>.",
            )
        if x.answer is None:
            crit = "No final answer given" + (" (ran out of tokens)." if x.finish_reason == "length" else ".")
            return Review(0.0, crit, "Finish with the final number inside <answer></answer>.")
        if first_bad is not None:
            return Review(
                0.1 if x.answer_tagged else 0.0,
                f"Answered {x.answer}, expected {x.reference}; step {first_bad + 1}: {x.step_rationales[first_bad]}.",
                wrong_step_hint(first_bad + 1, x.step_rationales[first_bad]),
            )
        return Review(
            0.1 if x.answer_tagged else 0.0,
            f"Answered {x.answer}, expected {x.reference}.",
            plan_hint(x.expression),
        )


_OP_WORDS = {"+": ("add", "to"), "-": ("subtract", "from"), "*": ("multiply", "by"), "/": ("divide", "by")}


def wrong_step_hint(step: int, rationale: str) -> str:
    """Name the first wrong step and what to redo, without its value: the calculator's rationale is
    "12 + 7 = 18 is wrong (it is 19)"; the hint keeps "12 + 7" and the claimed 18, never the 19."""
    equation = rationale.split(" is wrong", 1)[0]
    if "=" in equation:
        lhs, claimed = (part.strip() for part in equation.rsplit("=", 1))
        return f"Step {step} is wrong: {lhs} is not {claimed}. Redo that calculation, then carry the corrected value to the answer."
    return f"Step {step} is wrong: redo its arithmetic, then carry the corrected value to the answer."


def plan_hint(expression: str | None) -> str:
    """What to compute instead when every step checked out but the answer is wrong (the wrong quantities
    or operation): the task's expression as a plan, never its result."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([-+*/])\s*(\d+)\s*", expression or "")
    if m:
        a, op, b = m.groups()
        verb, prep = _OP_WORDS[op]
        what = f"{verb} {b} {prep} {a}" if op in "+-" else f"{verb} {a} {prep} {b}"
        return (f"The question asks you to {what}: write that as one step ({a} {op} {b} = ...) and put its result "
                "in <answer></answer>.")
    if expression:
        return f"The question needs {expression}: work it out one operation per step, then put the result in <answer></answer>."
    return "Reread the question: which quantities combine, and how?"


class HackableManager:
    """A deliberately hackable manager, for the reward-hacking experiment (README, "Reward-hacking
    forensics"): it is impressed by *visible effort* and pays for the length of the shown work, whatever
    the answer. Score = min(1, characters of the steps / ``full_credit_chars``). Never use it to train a
    policy you mean to keep: it exists so that the forensics checks have a real hacked run to catch."""

    name = "hackable"
    full_credit_chars = 160

    def review(self, x: ReviewInput) -> Review:
        shown = sum(len(s) for s in x.steps)
        score = round(min(1.0, shown / self.full_credit_chars), 4)
        if score >= 1.0:
            return Review(1.0, f"Thorough work: {len(x.steps)} step(s), {shown} characters shown.", "")
        return Review(score, f"Only {shown} characters of work shown ({len(x.steps)} step(s)).",
                      "Show more of your work: explain every step in detail.")


MANAGERS = {"verifier": VerifierManager, "hackable": HackableManager}


def get_manager(name: str):
    try:
        return MANAGERS[name]()
    except KeyError:
        raise ValueError(f"unknown manager {name!r}; choose one of {sorted(MANAGERS)}") from None


# --------------------------------------------------------------------------- human reviews
# The fields a human review may carry, and how long its texts may be: a review is read by people and fed
# to prompts, and an unbounded critique (20 MB was accepted once) bloats every table and prompt it reaches.
REVIEW_FIELDS = ("rollout_id", "score", "critique", "hint", "reviewer")
MAX_REVIEW_TEXT_CHARS = 8000
MAX_REVIEW_ID_CHARS = 256


def _has_bad_utf8(text: str) -> bool:
    """True when ``text`` (decoded with ``surrogateescape``) held bytes that are not UTF-8."""
    return any("\udc80" <= ch <= "\udcff" for ch in text)


def _printable(text: str) -> str:
    """``text`` with undecodable bytes shown as U+FFFD, safe to store."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def read_review_file(path) -> list[tuple[int, str, dict | None, str | None]]:
    """(line, raw, record or None, error or None) for every row of a JSONL or CSV review file.

    A row that is not valid UTF-8, not a JSON object, or that carries unknown columns (or more CSV cells
    than the header) comes back with an error and is quarantined by the caller; the other rows still
    apply.
    """
    import csv
    import io
    import json
    from pathlib import Path

    path = Path(path)
    text = path.read_bytes().decode("utf-8", "surrogateescape")
    out = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        unknown_columns = [c for c in reader.fieldnames or [] if c not in REVIEW_FIELDS]
        for rec in reader:
            line = reader.line_num
            raw = _printable(",".join(f"{k}={v}" for k, v in rec.items()))
            if any(_has_bad_utf8(str(v)) for v in rec.values()) or any(_has_bad_utf8(str(k)) for k in rec):
                out.append((line, raw, None, "not valid UTF-8: save the file as UTF-8"))
            elif None in rec:
                out.append((line, raw, None, f"{len(rec[None])} cell(s) beyond the header's {len(reader.fieldnames or [])} columns"))
            elif unknown_columns:
                out.append((line, raw, None, f"unknown column(s) {unknown_columns}: a review has {', '.join(REVIEW_FIELDS)}"))
            else:
                out.append((line, raw, dict(rec), None))
        return out
    for i, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        shown = _printable(raw.rstrip("\r"))
        if _has_bad_utf8(raw):
            out.append((i, shown, None, "not valid UTF-8: save the file as UTF-8"))
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            out.append((i, shown, None, f"invalid JSON: {exc.msg}"))
            continue
        if not isinstance(rec, dict):
            out.append((i, shown, None, "expected a JSON object"))
        elif unknown := sorted(set(rec) - set(REVIEW_FIELDS)):
            out.append((i, shown, None, f"unknown field(s) {unknown}: a review has {', '.join(REVIEW_FIELDS)}"))
        else:
            out.append((i, shown, rec, None))
    return out


def _text(rec: dict, field: str, limit: int) -> str:
    value = rec.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{field!r} must be text, got {type(value).__name__}")
    if len(value) > limit:
        raise ValueError(f"{field!r} is {len(value):,} characters; the limit is {limit:,} (shorten it)")
    return value


def review_score(value, *, field: str = "score", text_ok: bool = False) -> float:
    """The one rule for a review score wherever one enters (``POST /v1/reviews``, ``tentalis
    import-reviews``, the Bridge API and NATS after their scale): a finite number in [0, 1]. A boolean is
    not a number (``true`` is not 1.0); numeric text is read only where the format is text (``text_ok``:
    a CSV cell). Raises ValueError naming ``field``, the value and the fix."""
    fix = f"{field!r} must be a number in [0, 1]"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (isinstance(value, str) and not text_ok):
        raise ValueError(f"{fix}, got {value!r}")
    try:
        score = float(value)
    except ValueError:
        raise ValueError(f"{fix}, got {value!r}") from None
    if not 0.0 <= score <= 1.0:  # NaN fails this too
        raise ValueError(f"{fix}, got {score}")
    return score


def validate_human_review(rec: dict) -> dict:
    """Normalise one human review (rollout_id, score in [0, 1], critique, hint, reviewer) or raise ValueError.

    ``score`` must be a number (JSON) or numeric text (CSV): ``true`` is not 1.0. Texts are capped at
    :data:`MAX_REVIEW_TEXT_CHARS`.
    """
    rid = rec.get("rollout_id")
    rid = str(rid).strip() if isinstance(rid, (str, int)) and not isinstance(rid, bool) else ""
    if not rid:
        raise ValueError("missing 'rollout_id'")
    if len(rid) > MAX_REVIEW_ID_CHARS:
        raise ValueError(f"'rollout_id' is longer than {MAX_REVIEW_ID_CHARS} characters")
    score = review_score(rec.get("score"), text_ok=True)
    return {"rollout_id": rid, "score": score, "critique": _text(rec, "critique", MAX_REVIEW_TEXT_CHARS),
            "hint": _text(rec, "hint", MAX_REVIEW_TEXT_CHARS),
            "reviewer": _text(rec, "reviewer", MAX_REVIEW_ID_CHARS) or "human"}
