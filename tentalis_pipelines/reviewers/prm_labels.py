"""Step labels for the PRM head, from the project's own labellers, consensus-filtered.

Qwen's "Lessons of developing PRMs" (Zhang et al., 2025) found that Monte-Carlo labels alone confuse a
step's *value* with its *correctness*, and that keeping only the samples on which two label sources agree
("consensus filtering") matches far larger label sets. Here every source states where it thinks a
solution's **first wrong step** is, in one vocabulary (:class:`Verdict`):

* **provenance**: a GSM8K *train* reference solution is correct (``-1``); a procedurally corrupted copy
  of it (:func:`corrupt_solution`: one number or operator changed in one step, the change carried through
  the later steps) is first wrong at the changed step.
* **calculator** (``rewards.process.check_steps``): the first step whose equation is false. A calculator
  that finds nothing wrong *abstains* (arithmetic that holds does not make a step right).
* **verifier** (``rewards.math_answers.answers_match``): the final answer is right (``-1``: no step is
  wrong, as far as the answer can tell) or wrong ("some step is wrong", no position).
* **mc**: Math-Shepherd Monte-Carlo labels (``step_labels`` rows): the first step prefix from which no
  continuation reached the answer, else ``-1``. Where present.

:func:`consensus` keeps a solution only when at least two sources give a verdict and none contradicts
another; the kept solution's steps are labelled 1 before the agreed first error, 0 at it, and 0 after it
(a step that builds on a wrong value is not a correct step, ProcessBench's convention). A corruption that
did not change the final answer, a reference whose own arithmetic is off, a rollout with a right answer
but a false equation: all are dropped, not guessed.

GSM8K *test* problems are ProcessBench's GSM8K items: :func:`screen_problems` runs the project's
contamination guard over every problem before it can be labelled, and returns the matches for the
``quarantine`` table.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.process import check_steps, evaluate

CORRECT = -1  # a first-error index meaning "no step is wrong" (ProcessBench's label)
SOME_STEP = -2  # a verdict meaning "some step is wrong, position unknown" (the verifier on a wrong answer)
CORRUPTIONS = ("result", "operand", "operator")
_ANNOTATION = re.compile(r"<<([^=<>]*)=([^<>]*)>>")
_NUMBER = re.compile(r"(?<![\d.])\d(?:[\d,]*\d)?(?:\.\d+)?(?![\d])")  # a comma after a number is punctuation
_OPERATORS = {"+": "-", "-": "+", "*": "/", "/": "*"}
_VISIBLE_OP = {"*": ("*", "x", "×"), "/": ("/", "÷"), "+": ("+",), "-": ("-",)}


# ------------------------------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class Verdict:
    """One label source's view of a solution: ``first_error`` is a step index, ``CORRECT`` (-1),
    ``SOME_STEP`` (wrong somewhere, position unknown) or ``None`` (the source abstains)."""

    source: str
    first_error: int | None


def agree(a: int, b: int) -> bool:
    """Two non-abstaining verdicts are consistent: equal, or one says "some step" and the other names a
    step (not ``CORRECT``)."""
    if a == SOME_STEP or b == SOME_STEP:
        return a != CORRECT and b != CORRECT
    return a == b


def consensus(verdicts: Sequence[Verdict], num_steps: int) -> int | None:
    """The agreed first-error index (``CORRECT`` = -1 for an all-correct solution), or ``None`` when the
    solution must be dropped: fewer than two sources gave a verdict, two verdicts contradict each other,
    or nobody located the error (only "some step" verdicts)."""
    given = [v.first_error for v in verdicts if v.first_error is not None]
    bad = [g for g in given if g < SOME_STEP or g >= num_steps]
    if bad:
        raise ValueError(f"first-error verdict {bad[0]} is outside the solution's {num_steps} steps")
    if len(given) < 2:
        return None
    if any(not agree(a, b) for i, a in enumerate(given) for b in given[i + 1:]):
        return None
    located = [g for g in given if g != SOME_STEP]
    return located[0] if located else None


def step_labels_from(first_error: int, num_steps: int) -> tuple[int, ...]:
    """Per-step labels of a solution whose first wrong step is ``first_error`` (-1: none): 1 before it,
    0 at it and after it."""
    if first_error == CORRECT:
        return (1,) * num_steps
    if not 0 <= first_error < num_steps:
        raise ValueError(f"first error {first_error} is outside the solution's {num_steps} steps")
    return (1,) * first_error + (0,) * (num_steps - first_error)


def calculator_verdict(problem: str, steps: Sequence[str], *, vouch: bool = False) -> Verdict:
    """The calculator's first false equation, else abstention: true arithmetic does not make a step right
    (a GSM8K corruption of an operand or an operator keeps it true). With ``vouch`` (the policy's rollouts),
    a solution with at least one checked equation and none false is ``CORRECT``: beside a verifier that
    accepts the answer, that is two sources for a right rollout, which otherwise only Monte-Carlo rows
    could label (and `tentalis run` writes none), so the head never saw one (prm_step_scorer, round 8)."""
    checks = check_steps(problem, list(steps))
    first = next((i for i, c in enumerate(checks) if c.score == 0.0), None)
    if first is None and vouch and any(c.score == 1.0 for c in checks):
        return Verdict("calculator", CORRECT)
    return Verdict("calculator", first)


def verifier_verdict(final_answer: str | None, reference: str) -> Verdict:
    """The answer key: ``CORRECT`` when the final answer matches, else "some step is wrong"."""
    return Verdict("verifier", CORRECT if answers_match(final_answer, reference) else SOME_STEP)


def mc_verdict(mc_labels: Sequence[float] | None) -> Verdict:
    """Math-Shepherd Monte-Carlo labels (the share of continuations from each step prefix that reached
    the answer): the first prefix with none is the first error; all positive means ``CORRECT``. No labels
    (or labels for only some steps): abstain."""
    if not mc_labels or any(x is None for x in mc_labels):
        return Verdict("mc", None)
    first = next((i for i, x in enumerate(mc_labels) if x <= 0.0), None)
    return Verdict("mc", CORRECT if first is None else first)


# ------------------------------------------------------------------------------------------ solutions
@dataclass(frozen=True)
class LabelledSolution:
    """A problem, its solution's steps, the agreed first error and the per-step labels (1 correct, 0 wrong)."""

    problem_id: str
    problem: str
    steps: tuple[str, ...]
    first_error: int
    labels: tuple[int, ...]
    kind: str  # reference | corrupted:<result|operand|operator> | rollout
    verdicts: tuple[Verdict, ...] = ()

    def as_row(self) -> dict[str, Any]:
        return {"problem_id": self.problem_id, "kind": self.kind, "first_error": self.first_error,
                "steps": list(self.steps), "labels": list(self.labels),
                "verdicts": {v.source: v.first_error for v in self.verdicts}}


def label_solution(problem_id: str, problem: str, steps: Sequence[str], verdicts: Sequence[Verdict], kind: str
                   ) -> LabelledSolution | None:
    """A :class:`LabelledSolution` when the verdicts agree (:func:`consensus`), else ``None``."""
    agreed = consensus(verdicts, len(steps))
    if agreed is None:
        return None
    return LabelledSolution(problem_id, problem, tuple(steps), agreed, step_labels_from(agreed, len(steps)), kind,
                            tuple(verdicts))


# ------------------------------------------------------------------------------------------ GSM8K references
def format_value(value: Fraction) -> str | None:
    """A value as a solution would write it (``24``, ``2.5``, ``0.25``); None when it is not a whole
    number or a decimal of at most two places (a corruption that makes such a value is not used)."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = value * 100
    if scaled.denominator != 1:
        return None
    # exact digits (a float keeps about 16: 10**17 + 1/2 would be written 100000000000000000)
    whole, cents = divmod(abs(scaled.numerator), 100)
    return f"{'-' if value < 0 else ''}{whole}.{cents:02d}".rstrip("0")


def parse_value(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").replace("$", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def answer_sentence(answer: str) -> str:
    return f"The answer is \\boxed{{{answer}}}."


def reference_steps(answer: str) -> tuple[list[str], str]:
    """A GSM8K reference solution as (annotated step lines, final answer): one step per line, the
    ``#### X`` line dropped (its answer is returned). The ``<<a*b=c>>`` annotations are kept here; see
    :func:`render_step`."""
    if "####" not in answer:
        raise ValueError("not a GSM8K reference solution: no '#### answer' line")
    body, final = answer.rsplit("####", 1)
    lines = [ln.strip() for ln in body.strip().split("\n") if ln.strip()]
    if not lines:
        raise ValueError("GSM8K reference solution without steps")
    return lines, final.strip().replace(",", "")


def render_step(line: str) -> str:
    """A step as a reader sees it: the calculator annotations removed."""
    return " ".join(_ANNOTATION.sub("", line).split())


def render_solution(lines: Sequence[str], final: str) -> list[str]:
    """The visible steps, the final answer sentence appended to the last step (as ProcessBench's do)."""
    steps = [render_step(ln) for ln in lines]
    steps[-1] = f"{steps[-1]} {answer_sentence(final)}"
    return steps


@dataclass(frozen=True)
class Corruption:
    """A corrupted copy of a reference: its annotated lines, final answer and first wrong step."""

    lines: tuple[str, ...]
    final: str
    first_wrong: int
    kind: str


def substitute_values(text: str, subst: Mapping[Fraction, Fraction]) -> str | None:
    """Every number in ``text`` whose value was changed, rewritten; None when a new value has no plain
    writing."""
    failed = False

    def repl(m: re.Match[str]) -> str:
        nonlocal failed
        v = parse_value(m.group(0))
        if v is None or v not in subst:
            return m.group(0)
        out = format_value(subst[v])
        if out is None:
            failed = True
            return m.group(0)
        return out

    out = _NUMBER.sub(repl, text)
    return None if failed else out


def perturb_value(value: Fraction, rng: random.Random) -> Fraction:
    """A slip a solver could make in ``value``: ``value + d`` for a ``d`` drawn from (-3, -2, -1, 1, 2, 3, 4,
    5, 10) among those that keep it positive (``value + 1`` when none does); a whole value of at least 10
    instead slips by a magnitude with probability 0.3 (``rng.random() < 0.3``): ten times it, or ten more or
    ten less, at even odds (``rng.random() < 0.5``: ten times)."""
    deltas = [d for d in (-3, -2, -1, 1, 2, 3, 4, 5, 10) if value + d > 0] or [1]
    if value.denominator == 1 and value >= 10 and rng.random() < 0.3:
        return value * 10 if rng.random() < 0.5 else value + 10 * rng.choice((-1, 1))
    return value + rng.choice(deltas)


def corrupt_expression(expr: str, kind: str, rng: random.Random) -> tuple[str, Fraction, tuple[str, str]] | None:
    """The expression with one operand or operator changed, its value, and (old, new) of the change."""
    clean = expr.replace(",", "").replace(" ", "")
    if kind == "operand":
        nums = list(_NUMBER.finditer(clean))
        if not nums:
            return None
        m = rng.choice(nums)
        new = format_value(perturb_value(Fraction(m.group(0)), rng))
        if new is None:
            return None
        out = clean[: m.start()] + new + clean[m.end():]
        change = (m.group(0), new)
    else:
        ops = [i for i, ch in enumerate(clean) if ch in _OPERATORS and i > 0]
        if not ops:
            return None
        i = rng.choice(ops)
        out = clean[:i] + _OPERATORS[clean[i]] + clean[i + 1:]
        change = (clean[i], _OPERATORS[clean[i]])
    try:
        return out, evaluate(out), change
    except (ValueError, ZeroDivisionError, SyntaxError):
        return None


def edit_visible_operator(segment: str, kind: str, change: tuple[str, str]) -> str:
    """Make the same change in the written expression before an annotation (its last occurrence)."""
    old, new = change
    if kind == "operand":
        hits = [m for m in _NUMBER.finditer(segment) if parse_value(m.group(0)) == parse_value(old)]
        if hits:
            m = hits[-1]
            return segment[: m.start()] + new + segment[m.end():]
        return segment
    for sym in _VISIBLE_OP[old]:  # the letter x is an operator only between spaces
        k = segment.rfind(f" {sym} ") if sym == "x" else segment.rfind(sym)
        if k >= 0:
            at = k + 1 if sym == "x" else k
            return segment[:at] + new + segment[at + len(sym):]
    return segment


def corrupt_solution(lines: Sequence[str], final: str, rng: random.Random, kind: str | None = None) -> Corruption | None:
    """One corrupted copy of an annotated GSM8K solution, or None when this draw cannot make one.

    One calculation of one step (chosen at random among the annotated ones) is changed: ``result`` states
    a wrong result (the step's arithmetic is false), ``operand`` uses a wrong number and ``operator`` a
    wrong operation (the arithmetic holds, the reasoning does not). The changed value is then carried
    through every later calculation and sentence, so the solution stays consistent after its first wrong
    step (which is known: the changed one) and reaches a different final answer."""
    kind = kind or rng.choice(CORRUPTIONS)
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}: choose one of {', '.join(CORRUPTIONS)}")
    spots = [(i, m) for i, ln in enumerate(lines) for m in _ANNOTATION.finditer(ln)]
    if not spots:
        return None
    k, target = rng.choice(spots)
    old_value = parse_value(target.group(2))
    if old_value is None:
        return None
    if kind == "result":
        new_value, new_expr, change = perturb_value(old_value, rng), target.group(1), None
    else:
        made = corrupt_expression(target.group(1), kind, rng)
        if made is None:
            return None
        new_expr, new_value, change = made
    new_text = format_value(new_value)
    if new_text is None or new_value == old_value or new_value < 0:
        return None
    subst: dict[Fraction, Fraction] = {old_value: new_value}
    line = lines[k]
    seg_start = max([m.end() for m in _ANNOTATION.finditer(line) if m.end() <= target.start()], default=0)
    before = line[:seg_start] + (edit_visible_operator(line[seg_start: target.start()], kind, change) if change else line[seg_start: target.start()])
    rest = carry_substitution(line[target.end():], subst)  # the written result and later calculations of the step
    if rest is None:
        return None
    out = list(lines[:k]) + [f"{before}<<{new_expr}={new_text}>>{rest}"]
    for ln in lines[k + 1:]:
        carried = carry_substitution(ln, subst)
        if carried is None:
            return None
        out.append(carried)
    fv = parse_value(final)
    if fv is None or fv not in subst:
        return None  # the change never reached the answer: not a corruption the verifier can confirm
    new_final = format_value(subst[fv])
    if new_final is None:
        return None
    return Corruption(tuple(out), new_final, k, kind)


def carry_substitution(line: str, subst: dict[Fraction, Fraction]) -> str | None:
    """A later line with the changed values carried through: each annotated calculation recomputed from
    its (substituted) operands, its new result added to ``subst``, then the visible numbers rewritten."""
    pieces, pos = [], 0
    for m in _ANNOTATION.finditer(line):
        seg = substitute_values(line[pos: m.start()], subst)
        expr = substitute_values(m.group(1), subst)
        if seg is None or expr is None:
            return None
        old = parse_value(m.group(2))
        try:
            new = evaluate(expr.replace(" ", ""))
        except (ValueError, ZeroDivisionError, SyntaxError):
            return None
        if old is not None and new != old:
            if format_value(new) is None or new < 0:
                return None
            subst[old] = new
        res = format_value(new) if old is not None and new != old else m.group(2)
        pieces.append(f"{seg}<<{expr}={res}>>")
        pos = m.end()
    tail = substitute_values(line[pos:], subst)
    if tail is None:
        return None
    pieces.append(tail)
    return "".join(pieces)


def label_gsm8k_problem(problem_id: str, question: str, answer: str, rng: random.Random, *, corruptions: int = 2,
                        tries: int = 8) -> list[LabelledSolution]:
    """The reference solution and up to ``corruptions`` corrupted copies of one GSM8K train problem, each
    kept only where the label sources agree (provenance, calculator, verifier)."""
    lines, final = reference_steps(answer)
    out = []
    steps = render_solution(lines, final)
    ref = label_solution(problem_id, question, steps, [
        Verdict("provenance", CORRECT), calculator_verdict(question, steps), verifier_verdict(final, final)], "reference")
    if ref is None:
        return []  # the reference itself fails the calculator: its corruptions would inherit the doubt
    out.append(ref)
    made: set[tuple[str, ...]] = set()
    for _ in range(tries):
        if len(made) >= corruptions:
            break
        c = corrupt_solution(lines, final, rng)
        if c is None:
            continue
        steps_c = render_solution(c.lines, c.final)
        if tuple(steps_c) in made or tuple(steps_c) == tuple(steps):
            continue
        made.add(tuple(steps_c))
        kept = label_solution(problem_id, question, steps_c, [
            Verdict("provenance", c.first_wrong), calculator_verdict(question, steps_c), verifier_verdict(c.final, final)],
            f"corrupted:{c.kind}")
        if kept is not None:
            out.append(kept)
    return out


# ------------------------------------------------------------------------------------------ rollouts
def label_rollout(problem_id: str, problem: str, steps: Sequence[str], answer: str | None, reference: str,
                  mc_labels: Sequence[float] | None = None) -> LabelledSolution | None:
    """A policy's own solution labelled by calculator, verifier and (where present) Monte-Carlo labels:
    kept when two of them agree (a right answer whose checked equations are all true; a wrong answer whose
    first false equation, or whose first hopeless prefix, the other sources do not contradict)."""
    if not steps:
        return None
    return label_solution(problem_id, problem, steps, [
        calculator_verdict(problem, steps, vouch=True), verifier_verdict(answer, reference), mc_verdict(mc_labels)], "rollout")


# ------------------------------------------------------------------------------------------ data + guard
@dataclass(frozen=True)
class Problem:
    problem_id: str
    question: str
    answer: str


def load_gsm8k_train(path: str | Path, *, limit: int | None = None, seed: int = 0) -> list[Problem]:
    """GSM8K *train* problems (``question``/``answer`` rows), a seeded sample of ``limit`` in file order.
    A malformed line is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K train file {path} not found: set TENTALIS_DATA_DIR to the folder holding "
                                "gsm8k/train.jsonl (tentalis data fetch --only gsm8k)")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                rows.append(Problem(f"gsm8k-train-{no:05d}", str(row["question"]), str(row["answer"])))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{no}: not a GSM8K row with 'question' and 'answer' ({exc})") from None
    if limit is not None and limit < len(rows):
        keep = sorted(random.Random(seed).sample(range(len(rows)), limit))
        rows = [rows[i] for i in keep]
    return rows


@dataclass
class Screened:
    """Problems the contamination guard let through, and those it refused with the benchmark item matched."""

    clean: list[Problem]
    refused: list[tuple[Problem, Any]] = field(default_factory=list)  # (problem, contamination.Match)

    def quarantine_rows(self, batch_id: str) -> list[dict[str, Any]]:
        from tentalis_pipelines.contamination import quarantine_row

        return [quarantine_row({"task_id": p.problem_id, "prompt": p.question, "source": "prm_labels"}, m, batch_id,
                               what=f"PRM label problem {p.problem_id}") for p, m in self.refused]


def processbench_items(data_root: Path | None, splits: Iterable[str]) -> list[Any]:
    """ProcessBench problems as contamination-index items (benchmark ``processbench-<split>``)."""
    from tentalis_pipelines.contamination import ReferenceItem
    from tentalis_pipelines.evaluation.processbench import load_processbench

    out = []
    for split in splits:
        out += [ReferenceItem(f"processbench-{split}", s.id, s.problem) for s in load_processbench(split, data_dir=data_root)]
    return out


def screen_problems(problems: Sequence[Problem], index: Any, *, use_embeddings: bool = True) -> Screened:
    """Run the contamination guard (``contamination.ContaminationIndex``) over the problems' questions:
    any that matches a benchmark item (GSM8K test, hence ProcessBench's GSM8K split, and whatever else the
    index holds) is refused and never labelled."""
    matches = index.match([p.question for p in problems], use_embeddings=use_embeddings)
    return Screened([p for p, m in zip(problems, matches) if m is None],
                    [(p, m) for p, m in zip(problems, matches) if m is not None])


def build_label_set(problems: Sequence[Problem], *, seed: int = 0, corruptions: int = 2) -> list[LabelledSolution]:
    """Consensus-labelled solutions of already screened GSM8K train problems (seeded, deterministic)."""
    rng = random.Random(seed)
    out: list[LabelledSolution] = []
    for p in problems:
        try:
            out += label_gsm8k_problem(p.problem_id, p.question, p.answer, rng, corruptions=corruptions)
        except ValueError:
            continue  # a row that is not a GSM8K reference solution: nothing to label
    return out


# ------------------------------------------------------------------------------------------ ProcessBench's shape
_NUM = r"\$?\d[\d,]*(?:\.\d+)?"
_EQUATION = re.compile(rf"{_NUM}(?:\s*[-+*/x×÷]\s*{_NUM})+\s*=\s*{_NUM}")
_LATEX_OP = {"*": r"\times", "x": r"\times", "×": r"\times", "÷": r"\div", "+": "+", "-": "-"}


def latex_equation(text: str) -> str:
    """An equation written as LaTeX, the way ProcessBench's solutions write them: ``5*3 = 15`` ->
    ``\\( 5 \\times 3 = 15 \\)``, ``12/4 = 3`` -> ``\\( \\frac{12}{4} = 3 \\)`` (a lone division); dollar
    signs become ``\\$``."""
    def one(m: re.Match) -> str:
        eq = m.group(0).replace("$", r"\$")
        lhs, rhs = eq.split("=", 1)
        parts = re.split(r"\s*([-+*/x×÷])\s*", lhs.strip())
        if len(parts) == 3 and parts[1] == "/":
            lhs_tex = rf"\frac{{{parts[0]}}}{{{parts[2]}}}"
        else:
            lhs_tex = " ".join(_LATEX_OP.get(p, r"\div" if p == "/" else p) for p in parts)
        return rf"\( {lhs_tex} = {rhs.strip()} \)"

    return _EQUATION.sub(one, text)


def processbench_style(solution: LabelledSolution, rng: random.Random, *, max_merge: int = 3) -> LabelledSolution:
    """The same solution in ProcessBench's shape: runs of 1..``max_merge`` consecutive steps (seeded) merged
    into one multi-sentence step, equations in LaTeX. The labels follow the merge: a merged step is wrong
    when any step in it is (labels are 1s then 0s, so its label is their minimum) and the first error is
    the merged step holding the original one. The content, hence the consensus, is unchanged."""
    groups, i = [], 0
    n = len(solution.steps)
    while i < n:
        k = rng.randint(1, max_merge)
        groups.append(range(i, min(n, i + k)))
        i += k
    steps = tuple(" ".join(latex_equation(solution.steps[j]) for j in g) for g in groups)
    labels = tuple(min(solution.labels[j] for j in g) for g in groups)
    first = CORRECT if solution.first_error == CORRECT else next(gi for gi, g in enumerate(groups) if solution.first_error in g)
    return LabelledSolution(solution.problem_id, solution.problem, steps, first, labels, f"{solution.kind}+pbstyle",
                            solution.verdicts)
