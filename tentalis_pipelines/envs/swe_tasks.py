"""Mini-SWE tasks: bugs injected procedurally into the shipped repositories (``swe_repos.py``).

**How bugs are made** (SWE-smith's procedural method): the module's AST is walked and every site of
these kinds inside a function body becomes one candidate bug (module-level data tables are left alone:
a changed constant in a table is a typo, not a bug to reason about):

* ``binary_operator``: ``+``/``-`` swapped, ``*``/``//`` swapped, ``%`` and ``/`` -> ``//`` / ``*``
  (also in ``+=`` and the like);
* ``comparison``: ``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``in``/``not in``, ``is``/``is not``;
* ``boolean_operator``: ``and``/``or`` (two operands);
* ``off_by_one``: an integer constant ``n`` becomes ``n + 1``;
* ``negated_condition``: the test of an ``if``, ``elif``, ``while`` or conditional expression becomes
  ``not (test)``;
* ``removed_return``: a ``return`` inside a block (a guard or an early exit) becomes ``pass``;
* ``swapped_arguments``: the first two positional arguments of a call are swapped.

Each mutation is a text edit of the smallest span (the operator between its operands, the constant,
the condition, the statement, the two arguments), so the buggy file differs from the pristine one in
that span only and keeps its layout; the edit is checked against the same mutation applied to the AST
(the two must parse to the same tree), and a candidate whose edit does not reproduce it is dropped. The
enumeration is exhaustive and ordered by position: the same sources always give the same candidates.

**Which bugs count** is decided by running the tests in the sandbox (``swe.build_catalogue``): a
candidate is kept when at least one test fails; its FAIL_TO_PASS are the tests that fail with the bug
(all pass on the pristine module) and its PASS_TO_PASS the ones that still pass, as in SWE-bench.
Running every candidate takes minutes and needs the sandbox, so the validated bugs are a committed
catalogue (``swe_catalogue.json``, rebuilt by ``tools/swe_catalogue.py``); loading it regenerates each
bug's source from the engine and checks its hash, so the catalogue cannot drift from the sources
unnoticed, and a test re-runs a sample of bugs in the sandbox.

**Levels** are the repository's (by size, ``swe_repos.REPOS``). **The held-out split**: per level, the
first :data:`TEST_PER_LEVEL` bugs of a seeded shuffle (seed :data:`SPLIT_SEED`) are the ``test`` split
(the ``swe`` benchmark), the rest train. The split is by bug, not by repository: a training episode may
fix another bug of a held-out bug's module (the modules are few), never the same one.
"""

from __future__ import annotations

import ast
import base64
import difflib
import functools
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import resources

from tentalis_pipelines.envs.swe_repos import REPOS, repo_tree

ENVIRONMENT = "swe"
LEVELS = (1, 2, 3)
TEST_PER_LEVEL = 10
SPLIT_SEED = 0
CATALOGUE_FILE = "swe_catalogue.json"

BINARY_SWAPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
                                  ast.Mod: ast.FloorDiv, ast.Div: ast.Mult}
COMPARE_SWAPS: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                                   ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BOOL_SWAPS: dict[type, type] = {ast.And: ast.Or, ast.Or: ast.And}
SYMBOLS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%", ast.Div: "/",
                            ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
                            ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.And: "and",
                            ast.Or: "or"}
KINDS = ("binary_operator", "comparison", "boolean_operator", "off_by_one", "negated_condition", "removed_return",
         "swapped_arguments")


@dataclass(frozen=True)
class Mutation:
    """One candidate bug: ``kind``, where (``line``, ``col`` of the first edited character, 1-based line,
    0-based column) and the text edits ``(start offset, end offset, replacement)``."""

    kind: str
    line: int
    col: int
    edits: tuple[tuple[int, int, str], ...]
    description: str

    @property
    def site(self) -> str:
        return f"{self.kind}:{self.line}:{self.col}"


# --------------------------------------------------------------------------- the engine
class _Text:
    """Offsets of AST positions in an ASCII source."""

    def __init__(self, source: str):
        if not source.isascii():
            raise ValueError("the mutation engine edits by the AST's byte columns: the source must be ASCII")
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def position(self, offset: int) -> tuple[int, int]:
        line = max(i for i, s in enumerate(self.starts) if s <= offset) + 1
        return min(line, len(self.starts) - 1), offset - self.starts[min(line, len(self.starts) - 1) - 1]


_BETWEEN = re.compile(r"^([\s()]*)(.*?)([\s()]*)$", re.S)


def _operator_edit(text: _Text, left: ast.AST, right: ast.AST, old: str, new: str) -> tuple[int, int, str] | None:
    """The edit that turns the operator ``old`` between ``left`` and ``right`` into ``new`` (None when the
    text between them is not just the operator with brackets and spaces, e.g. a comment)."""
    a, b = text.end(left), text.start(right)
    m = _BETWEEN.match(text.source[a:b])
    if m is None or " ".join(m.group(2).split()) != old:
        return None
    return (a + len(m.group(1)), a + len(m.group(1)) + len(m.group(2)), new)


# Each finder yields (kind, edits, mutate): ``mutate`` applies the same mutation to a copy of the node.
Finder = Callable[[ast.AST, _Text], Iterator[tuple[str, list[tuple[int, int, str]], Callable[[ast.AST], None]]]]


def _binary(node, text):
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_SWAPS:
        new = BINARY_SWAPS[type(node.op)]
        edit = _operator_edit(text, node.left, node.right, SYMBOLS[type(node.op)], SYMBOLS[new])
        if edit:
            yield "binary_operator", [edit], lambda n, new=new: setattr(n, "op", new())
    if isinstance(node, ast.AugAssign) and type(node.op) in BINARY_SWAPS:
        new = BINARY_SWAPS[type(node.op)]
        edit = _operator_edit(text, node.target, node.value, SYMBOLS[type(node.op)] + "=", SYMBOLS[new] + "=")
        if edit:
            yield "binary_operator", [edit], lambda n, new=new: setattr(n, "op", new())


def _comparison(node, text):
    if not isinstance(node, ast.Compare):
        return
    for i, op in enumerate(node.ops):
        if type(op) not in COMPARE_SWAPS:
            continue
        new = COMPARE_SWAPS[type(op)]
        left = node.left if i == 0 else node.comparators[i - 1]
        edit = _operator_edit(text, left, node.comparators[i], SYMBOLS[type(op)], SYMBOLS[new])
        if edit:
            def mutate(n, i=i, new=new):
                n.ops[i] = new()
            yield "comparison", [edit], mutate


def _boolean(node, text):
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        new = BOOL_SWAPS[type(node.op)]
        edit = _operator_edit(text, node.values[0], node.values[1], SYMBOLS[type(node.op)], SYMBOLS[new])
        if edit:
            yield "boolean_operator", [edit], lambda n, new=new: setattr(n, "op", new())


def _off_by_one(node, text):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        yield "off_by_one", [(text.start(node), text.end(node), str(node.value + 1))], \
            lambda n: setattr(n, "value", n.value + 1)


def _negated(node, text):
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        a, b = text.start(node.test), text.end(node.test)
        yield "negated_condition", [(a, b, f"not ({text.source[a:b]})")], \
            lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test))


def _removed_return(node, text):
    if isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
        for field_name in ("body", "orelse"):
            for k, stmt in enumerate(getattr(node, field_name, [])):
                if isinstance(stmt, ast.Return):
                    def mutate(n, field_name=field_name, k=k):
                        getattr(n, field_name)[k] = ast.Pass()
                    yield "removed_return", [(text.start(stmt), text.end(stmt), "pass")], mutate


def _swapped(node, text):
    if isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
        a0, a1 = node.args[0], node.args[1]
        s0, s1 = text.source[text.start(a0):text.end(a0)], text.source[text.start(a1):text.end(a1)]
        if s0 != s1:
            def mutate(n):
                n.args[0], n.args[1] = n.args[1], n.args[0]
            yield "swapped_arguments", [(text.start(a0), text.end(a0), s1), (text.start(a1), text.end(a1), s0)], mutate


FINDERS: tuple[Finder, ...] = (_binary, _comparison, _boolean, _off_by_one, _negated, _removed_return, _swapped)


def _in_functions(tree: ast.Module) -> list[ast.AST]:
    """Every node inside a function body (ast.walk order from each function), docstrings aside."""
    out: list[ast.AST] = []
    seen: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in fn.body:
                for node in ast.walk(stmt):
                    if id(node) not in seen:
                        seen.add(id(node))
                        out.append(node)
    return out


def apply_edits(source: str, edits: tuple[tuple[int, int, str], ...] | list[tuple[int, int, str]]) -> str:
    """``source`` with the (non-overlapping) edits applied."""
    out = source
    for a, b, new in sorted(edits, reverse=True):
        out = out[:a] + new + out[b:]
    return out


def find_mutations(source: str) -> list[Mutation]:
    """Every candidate bug of ``source`` (module doc), in order of position then kind. A candidate whose
    text edit does not parse to the AST mutation it stands for is left out."""
    return list(_find_mutations(source))


@functools.lru_cache(maxsize=32)
def _find_mutations(source: str) -> tuple[Mutation, ...]:
    text = _Text(source)
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    index = {id(n): i for i, n in enumerate(nodes)}
    out: dict[str, Mutation] = {}
    for node in _in_functions(tree):
        for finder in FINDERS:
            for kind, edits, mutate in finder(node, text):
                mutated = apply_edits(source, edits)
                expected = ast.parse(source)  # a fresh tree (cheaper than a deep copy), walked in the same order
                mutate(list(ast.walk(expected))[index[id(node)]])
                try:
                    same = ast.dump(ast.parse(mutated)) == ast.dump(expected)  # positions are not compared
                except SyntaxError:
                    same = False
                if not same or mutated == source:
                    continue
                first = min(a for a, _, _ in edits)
                line, col = text.position(first)
                before = source[first:max(b for _, b, _ in edits)]
                after = apply_edits(before, [(a - first, b - first, new) for a, b, new in edits])
                m = Mutation(kind, line, col, tuple(edits), f"line {line}: {' '.join(before.split())} -> {' '.join(after.split())}")
                out.setdefault(m.site, m)
    return tuple(sorted(out.values(), key=lambda m: (m.line, m.col, KINDS.index(m.kind))))


def mutation_at(source: str, site: str) -> Mutation:
    """The candidate at ``site`` (``kind:line:col``); ValueError naming the site when there is none."""
    for m in find_mutations(source):
        if m.site == site:
            return m
    raise ValueError(f"no candidate bug at {site!r} in this source: rebuild the catalogue (tools/swe_catalogue.py)")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def gold_patch(module: str, buggy: str, fixed: str) -> str:
    """The fix as a unified diff (SWE-bench's ``patch``): from the buggy file to the pristine one."""
    return "".join(difflib.unified_diff(buggy.splitlines(keepends=True), fixed.splitlines(keepends=True),
                                        f"a/{module}.py", f"b/{module}.py"))


def fix_command(module: str, buggy: str, fixed: str) -> str:
    """A shell command that applies the fix (the changed lines written back with ``python3 -c``)."""
    a, b = buggy.split("\n"), fixed.split("\n")
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    payload = [{"from": i1, "to": i2, "lines": b[j1:j2]} for _, i1, i2, j1, j2 in reversed(ops)]
    blob = base64.b64encode(json.dumps({"file": f"{module}.py", "edits": payload}).encode()).decode()
    return ("python3 -c \"import base64,json;d=json.loads(base64.b64decode('" + blob + "'));"
            "s=open(d['file']).read().split(chr(10))\n"
            "for e in d['edits']: s[e['from']:e['to']]=e['lines']\n"
            "open(d['file'],'w').write(chr(10).join(s))\"")


# --------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class SweTask:
    """One mini-SWE task: fix the injected bug in ``module`` so that ``fail_to_pass`` and
    ``pass_to_pass`` (test ids ``test_m.py::test_x``) all pass. ``tree`` is the buggy repository;
    ``solution``: commands that fix it, the last one ``submit``; ``patch``: the gold fix as a diff."""

    task_id: str
    level: int
    module: str
    mutation: str
    instruction: str
    tree: dict[str, str]
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    solution: list[str]
    patch: str = ""
    split: str = "train"
    seed: int = SPLIT_SEED
    metadata: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """The check's kind (as ``TerminalTask.kind``): the tests decide."""
        return "tests"

    @property
    def source_file(self) -> str:
        return f"{self.module}.py"

    @property
    def test_files(self) -> dict[str, str]:
        """The pristine tests and runner: what the verifier runs, whatever the agent did to its copies."""
        return {p: t for p, t in repo_tree(self.module).items() if p != self.source_file}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SweTask:
        return cls(**d)

    def task_row(self) -> dict:
        """The task as the ``tasks`` table holds tasks: prompt = the instruction, reference = FAIL_TO_PASS
        and PASS_TO_PASS (JSON), metadata = level, module, mutation, split, tree, solution and patch (JSON)."""
        meta = {"level": self.level, "module": self.module, "mutation": self.mutation, "split": self.split,
                "seed": self.seed, "tree": self.tree, "solution": self.solution, "patch": self.patch, **self.metadata}
        reference = {"FAIL_TO_PASS": self.fail_to_pass, "PASS_TO_PASS": self.pass_to_pass}
        return {"task_id": self.task_id, "environment": ENVIRONMENT, "prompt": self.instruction,
                "reference": json.dumps(reference, sort_keys=True), "metadata": json.dumps(meta, sort_keys=True)}

    @classmethod
    def from_task_row(cls, row: dict) -> SweTask:
        meta = json.loads(row["metadata"])
        ref = json.loads(row["reference"])
        known = ("level", "module", "mutation", "split", "seed", "tree", "solution", "patch")
        return cls(task_id=row["task_id"], level=int(meta["level"]), module=meta["module"], mutation=meta["mutation"],
                   instruction=row["prompt"], tree=dict(meta["tree"]), fail_to_pass=list(ref["FAIL_TO_PASS"]),
                   pass_to_pass=list(ref["PASS_TO_PASS"]), solution=list(meta["solution"]), patch=meta.get("patch", ""),
                   split=meta.get("split", "train"), seed=int(meta.get("seed", SPLIT_SEED)),
                   metadata={k: v for k, v in meta.items() if k not in known})


def instruction(module: str, fail_to_pass: list[str]) -> str:
    """The issue: which tests fail (up to five named) and where the bug is; never the fix."""
    names = ", ".join(t.split("::")[-1] for t in fail_to_pass[:5]) + (", ..." if len(fail_to_pass) > 5 else "")
    n = len(fail_to_pass)
    return (f"A bug in {module}.py makes {n} test{'s' if n != 1 else ''} of test_{module}.py fail ({names}). "
            f"Fix the bug in {module}.py so that every test passes. Do not change the test files. "
            "Run the tests with: python3 run_tests.py\nWhen all tests pass, run submit.")


def bug_id(module: str, site: str) -> str:
    kind, line, col = site.split(":")
    return f"swe-{module}-{kind}-l{int(line):03d}c{int(col):02d}"


def task_from_entry(entry: dict) -> SweTask:
    """The task of one catalogue entry: the bug regenerated by the engine (its hash checked)."""
    module = entry["module"]
    if module not in REPOS:
        raise ValueError(f"catalogue entry {entry.get('bug_id')!r} names an unknown repository {module!r}")
    level, pristine, _ = REPOS[module]
    m = mutation_at(pristine, entry["site"])
    buggy = apply_edits(pristine, m.edits)
    if sha256(buggy) != entry["buggy_sha256"]:
        raise ValueError(f"catalogue entry {entry['bug_id']!r} no longer matches {module}.py: rebuild the catalogue "
                         "(python tools/swe_catalogue.py)")
    f2p, p2p = list(entry["FAIL_TO_PASS"]), list(entry["PASS_TO_PASS"])
    return SweTask(task_id=entry["bug_id"], level=level, module=module, mutation=m.kind, instruction=instruction(module, f2p),
                   tree=repo_tree(module, buggy), fail_to_pass=f2p, pass_to_pass=p2p,
                   solution=[fix_command(module, buggy, pristine), "python3 run_tests.py", "submit"],
                   patch=gold_patch(module, buggy, pristine), split=entry["split"],
                   metadata={"site": m.site, "description": m.description})


def candidate_bugs() -> list[tuple[str, Mutation, str]]:
    """(module, mutation, buggy source) of every candidate of every repository, in a fixed order."""
    out = []
    for module, (_, pristine, _) in REPOS.items():
        seen = {sha256(pristine)}
        for m in find_mutations(pristine):
            buggy = apply_edits(pristine, m.edits)
            if sha256(buggy) not in seen:  # two sites giving the same file are one bug
                seen.add(sha256(buggy))
                out.append((module, m, buggy))
    return out


def assign_splits(entries: list[dict], *, test_per_level: int = TEST_PER_LEVEL, seed: int = SPLIT_SEED) -> list[dict]:
    """``split`` on every entry: per level, the first ``test_per_level`` of a seeded shuffle are ``test``."""
    out = [dict(e) for e in entries]
    for level in sorted({e["level"] for e in out}):
        ids = sorted(e["bug_id"] for e in out if e["level"] == level)
        random.Random(f"tentalis-swe-split:{seed}:{level}").shuffle(ids)
        held = set(ids[:test_per_level])
        for e in out:
            if e["level"] == level:
                e["split"] = "test" if e["bug_id"] in held else "train"
    return out


def load_catalogue(text: str | None = None) -> list[SweTask]:
    """Every validated bug as a task (the committed catalogue unless ``text`` is given)."""
    if text is None:
        return list(_committed_catalogue())
    return [task_from_entry(e) for e in json.loads(text)["bugs"]]


@functools.cache
def _committed_catalogue() -> tuple[SweTask, ...]:
    text = resources.files("tentalis_pipelines.envs").joinpath(CATALOGUE_FILE).read_text(encoding="utf-8")
    return tuple(task_from_entry(e) for e in json.loads(text)["bugs"])


def held_out_tasks(levels: tuple[int, ...] = LEVELS) -> list[SweTask]:
    """The ``swe`` benchmark's items: the ``test`` split, by level then id."""
    return sorted((t for t in load_catalogue() if t.split == "test" and t.level in levels), key=lambda t: (t.level, t.task_id))


def training_tasks(seed: int, num_tasks: int, levels: tuple[int, ...] = LEVELS) -> list[SweTask]:
    """``num_tasks`` training-split tasks, levels in turn, each level's in a ``seed``-shuffled order
    (cycling when a batch asks for more than a level holds)."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    if not levels or any(lv not in LEVELS for lv in levels):
        raise ValueError(f"swe levels must be a non-empty subset of {list(LEVELS)}, got {list(levels)}")
    pools = {}
    for level in levels:
        pool = sorted((t for t in load_catalogue() if t.split == "train" and t.level == level), key=lambda t: t.task_id)
        random.Random(f"tentalis-swe-train:{seed}:{level}").shuffle(pool)
        pools[level] = pool
    return [pools[levels[i % len(levels)]][(i // len(levels)) % len(pools[levels[i % len(levels)]])] for i in range(num_tasks)]
