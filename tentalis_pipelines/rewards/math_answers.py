"""Math answer verification: integers, decimals, fractions, GSM8K ``####`` references, ``\\boxed{}``.

Everything here reads model output, so every pattern is linear in its input (no nested or overlapping
quantifiers; ``\\boxed{}`` braces are paired in one pass) and what reaches exact arithmetic or sympy is
capped: numbers of more than ``MAX_NUMBER_DIGITS`` digits are no number, and answers longer than
``MAX_SYMBOLIC_CHARS`` (or with towers of exponents or big factorials, which sympy would evaluate for
minutes) are not compared symbolically. The reward server scores under a deadline on top of this.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED_OPEN = "\\boxed{"
_FRAC = re.compile(r"\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}")
_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
# `\text{...}` and its kin: the content stops at any brace, so an unclosed one is given up at the next
# brace rather than scanned to the end of the text from every opening (quadratic on ``\text{`` x 1000).
_TEXT_CMD = re.compile(r"\\(?:text|mathrm|mbox)\{([^{}]*)\}")
# A number with more digits than this is not an answer to compare (Python refuses int() past 4,300).
MAX_NUMBER_DIGITS = 1000
# Answers longer than this are compared exactly and textually, never handed to sympy.
MAX_SYMBOLIC_CHARS = 400
# What sympy would evaluate eagerly for minutes: a power whose exponent holds another power or five
# digits or more (``9^{9^{9^9}}``, ``2^{99999999}``), a factorial of a number of four digits or more.
_COSTLY = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\{?\s*\d{5}|\d{4}\s*!")
# A predicted answer longer than this is wrong without being read (an answer is a value, not an essay).
MAX_ANSWER_CHARS = 10_000


def boxed_contents(text: str) -> list[str]:
    """The contents of every outermost ``\\boxed{...}`` in ``text``, left to right (braces nest to any
    depth; an unclosed one is skipped). One pass pairs all braces, so many unclosed boxes stay linear."""
    if _BOXED_OPEN not in text:
        return []
    close_of: dict[int, int] = {}
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            opened.append(i)
        elif ch == "}" and opened:
            close_of[opened.pop()] = i
    out, pos = [], 0
    while (at := text.find(_BOXED_OPEN, pos)) >= 0:
        brace = at + len(_BOXED_OPEN) - 1
        end = close_of.get(brace)
        if end is None:
            pos = brace + 1
            continue
        out.append(text[brace + 1:end])
        pos = end + 1
    return out


def reference_answer(reference: str) -> str:
    """The final answer of a reference: after ``####`` (GSM8K) or inside ``\\boxed{}``, else as is."""
    if "####" in reference:
        reference = reference.rsplit("####", 1)[1]
    m = boxed_contents(reference)
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
    if sum(c.isdigit() for c in token) > MAX_NUMBER_DIGITS:
        return None
    try:
        if "/" in token:
            num, den = token.split("/")
            return Fraction(Fraction(num), Fraction(den)) if Fraction(den) != 0 else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _normalise_text(s: str) -> str:
    s = reference_answer(s)
    s = _TEXT_CMD.sub(r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "").replace(" ", "").rstrip(".")
    return s.lower()


def _plain_number(s: str) -> str | None:
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s).replace(",", "").replace("$", "").replace(" ", "")
    return s if re.fullmatch(r"-?\d+(?:\.\d+)?(?:/\d+)?", s) else None


def answers_match(predicted: str | None, reference: str) -> bool:
    """True when the predicted answer equals the reference: exactly as rationals when the reference is a
    plain number (``42``, ``-3.5``, ``1,200``, ``\\frac{3}{4}``), else textually after LaTeX
    normalisation, else symbolically (:func:`symbolic_match`). A predicted answer longer than
    ``MAX_ANSWER_CHARS`` is wrong unread."""
    if predicted is None or not str(predicted).strip() or len(str(predicted)) > MAX_ANSWER_CHARS:
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
    equals ``\\pi/2``, ``(3, \\frac{\\pi}{2})`` equals ``\\left(3, \\frac{\\pi}{2}\\right)``. False, untried, for an
    answer sympy could spend minutes on (longer than ``MAX_SYMBOLIC_CHARS``, or see ``_COSTLY``)."""
    if any(len(a) > MAX_SYMBOLIC_CHARS or _COSTLY.search(a) for a in (predicted, reference)):
        return False
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
