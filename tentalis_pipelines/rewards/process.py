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

_EQ = re.compile(r"((?:\(?\s*-?\d[\d,]*(?:\.\d+)?\s*\)?\s*[-+*/x×÷]\s*)+\(?\s*-?\d[\d,]*(?:\.\d+)?\s*\)?)\s*=\s*\$?(-?\d[\d,]*(?:\.\d+)?)")
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
    """Exact value of a + - * / expression (``x`` and ``×`` mean times, ``÷`` divide)."""
    expr = expression.replace(",", "").replace("×", "*").replace("x", "*").replace("÷", "/")
    return _eval(ast.parse(expr, mode="eval"))


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> set[Fraction]:
    """Every number written in ``text`` (commas as thousands separators), as exact values."""
    out = set()
    for raw in _NUMBER.findall(text or ""):
        try:
            out.add(Fraction(raw.replace(",", "")))
        except ValueError:
            continue
    return out


def check_step(step: str, known: set[Fraction] | None = None) -> StepCheck:
    """Check every equation ``step`` states. With ``known`` (the task's numbers and earlier results), a
    *correct* equation counts only when it uses one of them: ``1 + 1 = 2`` padded into a solution is
    true but is not evidence of work on this task. A wrong equation always counts."""
    checks = []
    for m in _EQ.finditer(step):
        lhs, rhs = m.group(1).strip(), m.group(2)
        try:
            value = evaluate(lhs)
            stated = Fraction(rhs.replace(",", ""))
        except (ValueError, ZeroDivisionError, SyntaxError):
            continue
        if value == stated and known is not None and not (numbers_in(lhs.replace("x", " ").replace("×", " ")) & known):
            continue
        checks.append((f"{lhs} = {rhs}", value == stated, value))
    if not checks:
        return StepCheck(None, "no checkable equation" if known is None else "no equation on the task's numbers or earlier results")
    wrong = [(text, v) for text, ok, v in checks if not ok]
    if wrong:
        text, v = wrong[0]
        shown = int(v) if v.denominator == 1 else float(v)
        return StepCheck(0.0, f"{text} is wrong (it is {shown})")
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
            known |= {Fraction(m.group(2).replace(",", "")) for m in _EQ.finditer(step)}
    return out
