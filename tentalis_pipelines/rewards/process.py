"""A calculator process verifier: checks every arithmetic equation a step states.

For arithmetic and GSM8K-style work most steps contain equations such as ``4 * 6 = 24``. Each such
equation is evaluated exactly (rationals, no ``eval``); a step scores 1.0 when all its equations hold,
0.0 when any is wrong, and ``None`` when it states no checkable equation. ``check_steps`` scores a
whole solution against its task: true equations that use none of the task's numbers or earlier
results, and verbatim repeats, earn nothing (padding cannot buy process credit). The LLM-judge PRM
(``scorer='judge'``) covers steps without equations.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from fractions import Fraction

# An equation: two or more operands joined by operators, then ``=`` and the stated result. Linear in
# the text: a chain of operands is matched possessively (``*+``, ``++``: never given back) and the
# ``= result`` after it is optional, so a chain that ends without ``=`` is consumed once instead of
# retried at every shorter length and every later start (the quadratic scan of the old pattern, which
# took 50 s on 16 KB of ``1+1+...``); a match never starts inside a number (the lookbehind) or on a
# blank, and no two quantifiers compete for the same blanks.
_OPERAND = r"(?:\(\s*+)?-?\d[\d,]*+(?:\.\d+)?\s*+(?:\)\s*+)?"
_EQ = re.compile(rf"(?<![\d,])({_OPERAND}(?:[-+*/x×÷]\s*+{_OPERAND})++)(?:=\s*+\$?(-?\d[\d,]*+(?:\.\d+)?))?")
# Equations past these are not checked (no step of a real solution comes near): a number of more
# digits, or more operands, makes the exact arithmetic (and the result's digits) unbounded.
MAX_OPERAND_DIGITS = 32
MAX_EQUATION_TERMS = 64
# Equations checked per step: a step states one or two; the rest of a longer one is not checked.
MAX_STEP_EQUATIONS = 16
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@dataclass(frozen=True)
class StepCheck:
    score: float | None
    rationale: str


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("not arithmetic")


def evaluate(expression: str) -> Fraction:
    """Exact value of a + - * / expression (``x`` and ``×`` mean times, ``÷`` divide). ValueError for an
    expression that is not arithmetic, has more than ``MAX_EQUATION_TERMS`` numbers or a number of more
    than ``MAX_OPERAND_DIGITS`` digits (its value would be unbounded)."""
    expr = expression.replace(",", "").replace("×", "*").replace("x", "*").replace("÷", "/")
    numbers = _DIGITS.findall(expr)
    if len(numbers) > MAX_EQUATION_TERMS:
        raise ValueError(f"more than {MAX_EQUATION_TERMS} numbers")
    if any(len(n) > MAX_OPERAND_DIGITS for n in numbers):
        raise ValueError(f"a number of more than {MAX_OPERAND_DIGITS} digits")
    return _eval(ast.parse(expr, mode="eval"))


_DIGITS = re.compile(r"\d+")
_NUMBER = re.compile(r"-?\d[\d,]*+(?:\.\d+)?")


def exact(raw: str) -> Fraction | None:
    """``raw`` (commas as thousands separators) as an exact value; None past ``MAX_OPERAND_DIGITS``
    digits or when it is not a number."""
    raw = raw.replace(",", "")
    if sum(c.isdigit() for c in raw) > MAX_OPERAND_DIGITS:
        return None
    try:
        return Fraction(raw)
    except ValueError:
        return None


def equations(text: str, limit: int = MAX_STEP_EQUATIONS) -> list[tuple[str, str]]:
    """The first ``limit`` equations ``text`` states, as (left-hand side, stated result) in order:
    ``4 * 6 = 24`` gives ``("4 * 6", "24")``. Linear in ``len(text)`` (see ``_EQ``)."""
    out: list[tuple[str, str]] = []
    for m in _EQ.finditer(text):
        if len(out) == limit:
            break
        if m.group(2) is not None:
            out.append((m.group(1).strip(), m.group(2)))
    return out


def _shown(value: Fraction) -> str:
    try:
        return str(int(value)) if value.denominator == 1 else str(float(value))
    except (OverflowError, ValueError):  # past a float's range or Python's int-to-text limit
        return "a number too large to show"


def numbers_in(text: str) -> set[Fraction]:
    """Every number written in ``text`` (commas as thousands separators), as exact values; numbers of
    more than ``MAX_OPERAND_DIGITS`` digits are left out."""
    return {v for raw in _NUMBER.findall(text or "") if (v := exact(raw)) is not None}


def check_step(step: str, known: set[Fraction] | None = None) -> StepCheck:
    """Check the equations ``step`` states (the first ``MAX_STEP_EQUATIONS``). With ``known`` (the task's numbers and earlier results), a
    *correct* equation counts only when it uses one of them: ``1 + 1 = 2`` padded into a solution is
    true but is not evidence of work on this task. A wrong equation always counts."""
    checks = []
    for lhs, rhs in equations(step):
        stated = exact(rhs)
        try:
            value = evaluate(lhs)
        except (ValueError, ZeroDivisionError, SyntaxError, RecursionError):
            continue
        if stated is None:
            continue
        if value == stated and known is not None and not (numbers_in(lhs.replace("x", " ").replace("×", " ")) & known):
            continue
        checks.append((f"{lhs} = {rhs}", value == stated, value))
    if not checks:
        return StepCheck(None, "no checkable equation" if known is None else "no equation on the task's numbers or earlier results")
    wrong = [(text, v) for text, ok, v in checks if not ok]
    if wrong:
        text, v = wrong[0]
        return StepCheck(0.0, f"{text} is wrong (it is {_shown(v)})")
    return StepCheck(1.0, "; ".join(f"{t} ✓" for t, _, _ in checks))


def check_steps(task_prompt: str, steps: list[str]) -> list[StepCheck]:
    """Score a solution's steps in order: equations must build on the task's numbers or on results of
    earlier steps (see ``check_step``), and a step that repeats an earlier one verbatim is not scored
    again, so padding a solution with true or repeated equations earns no process credit."""
    known = numbers_in(task_prompt)
    seen: dict[str, int] = {}
    out = []
    for i, step in enumerate(steps):
        key = " ".join(step.split()).lower()
        if key in seen:
            out.append(StepCheck(None, f"repeats step {seen[key] + 1}"))
            continue
        seen[key] = i
        chk = check_step(step, known)
        out.append(chk)
        if chk.score is not None:
            known |= {v for _, rhs in equations(step) if (v := exact(rhs)) is not None}
    return out
