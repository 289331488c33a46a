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
                f"Recheck the arithmetic in step {first_bad + 1}.",
            )
        return Review(
            0.1 if x.answer_tagged else 0.0,
            f"Answered {x.answer}, expected {x.reference}.",
            "Reread the question: which quantities combine, and how?",
        )


MANAGERS = {"verifier": VerifierManager}


def get_manager(name: str):
    try:
        return MANAGERS[name]()
    except KeyError:
        raise ValueError(f"unknown manager {name!r}; choose one of {sorted(MANAGERS)}") from None


# --------------------------------------------------------------------------- human reviews
def read_review_file(path) -> list[tuple[int, str, dict | None, str | None]]:
    """(line, raw, record or None, error or None) for every row of a JSONL or CSV review file."""
    import csv
    import json
    from pathlib import Path

    path = Path(path)
    out = []
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            for i, rec in enumerate(csv.DictReader(fh), start=2):  # line 1 is the header
                out.append((i, ",".join(f"{k}={v}" for k, v in rec.items()), dict(rec), None))
        return out
    with path.open(encoding="utf-8") as fh:
        for i, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
                out.append((i, raw.rstrip("\n"), rec if isinstance(rec, dict) else None, None if isinstance(rec, dict) else "expected a JSON object"))
            except json.JSONDecodeError as exc:
                out.append((i, raw.rstrip("\n"), None, f"invalid JSON: {exc.msg}"))
    return out


def validate_human_review(rec: dict) -> dict:
    """Normalise one human review (rollout_id, score in [0, 1], critique, hint, reviewer) or raise ValueError."""
    rid = str(rec.get("rollout_id") or "").strip()
    if not rid:
        raise ValueError("missing 'rollout_id'")
    try:
        score = float(rec.get("score"))
    except (TypeError, ValueError):
        raise ValueError(f"'score' must be a number in [0, 1], got {rec.get('score')!r}") from None
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"'score' must be in [0, 1], got {score}")
    return {"rollout_id": rid, "score": score, "critique": str(rec.get("critique") or ""), "hint": str(rec.get("hint") or ""),
            "reviewer": str(rec.get("reviewer") or "human")}
