"""Math answer verification: integers, decimals, fractions, GSM8K ``####`` references, ``\\boxed{}``."""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_FRAC = re.compile(r"\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}")
_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def reference_answer(reference: str) -> str:
    """The final answer of a reference: after ``####`` (GSM8K) or inside ``\\boxed{}``, else as is."""
    if "####" in reference:
        reference = reference.rsplit("####", 1)[1]
    m = _BOXED.findall(reference)
    if m:
        reference = m[-1]
    return reference.strip()


def to_number(text: str | None) -> Fraction | None:
    """Parse the number an answer states (``$1,200.50``, ``3/4``, ``\\frac{3}{4}``, ``42 apples``)."""
    if text is None:
        return None
    s = reference_answer(str(text))
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s)
    s = s.replace(",", "").replace("$", "").replace("\\%", "").replace("%", "").replace("\\!", "")
    nums = _NUM.findall(s)
    if not nums:
        return None
    token = nums[-1] if len(nums) > 1 and "=" in s else nums[0]
    try:
        if "/" in token:
            num, den = token.split("/")
            return Fraction(Fraction(num), Fraction(den)) if Fraction(den) != 0 else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _normalise_text(s: str) -> str:
    s = reference_answer(s)
    s = re.sub(r"\\(?:text|mathrm|mbox)\{([^}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "").replace(" ", "").rstrip(".")
    return s.lower()


def _plain_number(s: str) -> str | None:
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s).replace(",", "").replace("$", "").replace(" ", "")
    return s if re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", s) else None


def answers_match(predicted: str | None, reference: str) -> bool:
    """True when the predicted answer equals the reference: exactly as rationals when the reference is a
    plain number (``42``, ``-3.5``, ``1,200``, ``\\frac{3}{4}``), else textually after LaTeX
    normalisation. Symbolic equivalence for MATH-style answers comes with the verifiers issue."""
    if predicted is None or not str(predicted).strip():
        return False
    ref = reference_answer(reference)
    if _plain_number(ref) is not None:
        pred_num = to_number(predicted)
        return pred_num is not None and pred_num == to_number(ref)
    if _normalise_text(predicted) == _normalise_text(ref):
        return True
    return symbolic_match(str(predicted), ref)


def symbolic_match(predicted: str, reference: str) -> bool:
    """Symbolic equivalence of two LaTeX answers with math-verify (sympy underneath): ``\\frac{\\pi}{2}``
    equals ``\\pi/2``, ``(3, \\frac{\\pi}{2})`` equals ``\\left(3, \\frac{\\pi}{2}\\right)``."""
    try:
        from math_verify import parse, verify
    except ImportError:  # optional at import time; the dependency is declared in pyproject
        return False
    try:
        # Timeouts off: math-verify's timeouts use SIGALRM, which only works in the main thread.
        gold = parse(f"${reference_answer(reference)}$", parsing_timeout=None)
        pred = parse(f"${reference_answer(predicted)}$", parsing_timeout=None)
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
    except Exception:  # a parser failure on model output is a wrong answer, not a crash
        return False
