"""A calculator process verifier: checks every arithmetic equation a step states.

For arithmetic and GSM8K-style work most steps contain equations such as ``4 * 6 = 24``. Each such
equation is evaluated exactly (rationals, no ``eval``); a step scores 1.0 when all its equations hold,
0.0 when any is wrong, and ``None`` when it states no checkable equation. The LLM-judge PRM
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


def check_step(step: str) -> StepCheck:
    checks = []
    for m in _EQ.finditer(step):
        lhs, rhs = m.group(1).strip(), m.group(2)
        try:
            value = evaluate(lhs)
            stated = Fraction(rhs.replace(",", ""))
        except (ValueError, ZeroDivisionError, SyntaxError):
            continue
        checks.append((f"{lhs} = {rhs}", value == stated, value))
    if not checks:
        return StepCheck(None, "no checkable equation")
    wrong = [(text, v) for text, ok, v in checks if not ok]
    if wrong:
        text, v = wrong[0]
        shown = int(v) if v.denominator == 1 else float(v)
        return StepCheck(0.0, f"{text} is wrong (it is {shown})")
    return StepCheck(1.0, "; ".join(f"{t} ✓" for t, _, _ in checks))
