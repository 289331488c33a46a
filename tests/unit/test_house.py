"""The house rules, checked over the source: the product apart from the lab, the library apart from its
CLI, no private name used across modules, no test that reaches a script through ``sys.path``.

Plain AST walks over the repository's files: no import is executed.
"""

from __future__ import annotations

import ast
import functools
import gc
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("tentalis_pipelines", "assets", "jobs")
LAB = ("bench", "experiments", "tools", "tests", "scripts")
PROJECT = PRODUCT + LAB


def _files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Each file parsed once for all the checks."""
    return ast.parse(path.read_text(), str(path))


# Parsing the repository's ~500 files is most of what these checks cost: it is done once, by this fixture,
# which the unit tier's CPU budget counts as a fixed cost of the tier, not a test's (tests/unit/conftest.py);
# make test-fast sends a file's tests to one worker (--dist loadfile), so the parse is paid once per run,
# not once per worker. The garbage collector is off while it runs: the parse allocates about 700,000 nodes
# that all stay alive, and each full collection on the way walked every one of them again (3.2 s of CPU
# with it on, 0.9 s off, on this machine); nothing is freed by it, so leaving it off loses nothing. Then the
# trees are frozen (like what the tier had collected, tests/unit/conftest.py): later collections skip them.
@pytest.fixture(scope="module", autouse=True)
def repository_parsed() -> None:
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path in _files(*PROJECT):
            _nodes(path)
        gc.freeze()
    finally:
        if collecting:
            gc.enable()


_WALKED: dict[int, tuple[ast.AST, tuple[ast.AST, ...]]] = {}  # id(tree) -> (the tree, kept alive; its nodes)


def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a file's tree, walked once for all the checks."""
    return _walk(_tree(path))


def _walk(tree: ast.AST) -> tuple[ast.AST, ...]:
    if id(tree) not in _WALKED:
        _WALKED[id(tree)] = (tree, tuple(ast.walk(tree)))
    return _WALKED[id(tree)][1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) for every import statement, relative ones resolved."""
    out = []
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: -node.level] if node.level else []
                base = ".".join([*pkg, base] if base else pkg)
            out.append((node.lineno, base, [a.name for a in node.names]))
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


def private_imports(path: Path, source: str | None = None) -> list[str]:
    """Every use of another project module's private (``_name``) attribute: ``from m import _x`` and
    ``m._x`` where ``m`` is an imported project module. Dunder names are not private."""
    module = _module_name(path)
    tree = _tree(path) if source is None else ast.parse(source, str(path))
    found = []
    aliases: dict[str, str] = {}
    nodes = _walk(tree)
    for line, imported, names in _imports(tree, module):
        if _top(imported) not in PROJECT:
            continue
        for name in names:
            if name.startswith("_") and not name.startswith("__"):
                found.append(f"{path.relative_to(ROOT)}:{line}: from {imported} import {name}")
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if _top(a.name) in PROJECT:
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and _top(node.module) in PROJECT:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in nodes:
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_name():
    found = [hit for path in _files(*PROJECT) for hit in private_imports(path)]
    assert not found, "private names used across modules (make them public or keep them home):\n" + "\n".join(found)


def test_the_product_never_imports_the_lab():
    found = []
    for path in _files(*PRODUCT):
        for line, imported, _ in _imports(_tree(path), _module_name(path)):
            if _top(imported) in LAB:
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}")
    assert not found, "\n".join(found)


def test_the_library_never_imports_its_cli():
    found = []
    for path in _files("tentalis_pipelines", "assets", "jobs"):
        module = _module_name(path)
        if module.startswith("tentalis_pipelines.cli"):
            continue
        for line, imported, _ in _imports(_tree(path), module):
            if imported == "tentalis_pipelines.cli" or imported.startswith("tentalis_pipelines.cli."):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}")
    assert not found, "\n".join(found)


def test_no_test_or_experiment_edits_sys_path():
    found = []
    for path in _files(*PROJECT):
        for node in _nodes(path):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys" and path != Path(__file__).resolve()):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "sys.path edited (import the lab as packages from the repository root instead):\n" + "\n".join(found)


def test_only_the_product_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(include) == sorted(f"{p}*" for p in PRODUCT)


@pytest.mark.parametrize("source, expected", [
    ("from tentalis_pipelines.cli.common import _paths\n", 1),
    ("from tentalis_pipelines.cli import common\ncommon._fail('x')\n", 1),
    ("import tentalis_pipelines.sessions as s\ns._cut()\n", 1),
    ("from tentalis_pipelines.cli.common import paths\nimport os\nos._exit(0)\n", 0),
    ("from tentalis_pipelines import __version__\n", 0),
])
def test_the_private_name_check_finds_what_it_should(source, expected):
    """The checker itself: each planted use is found, public and foreign names are not."""
    assert len(private_imports(ROOT / "tentalis_pipelines" / "house_probe.py", source)) == expected


# --------------------------------------------------------------------------- no branch on a family's name
FAMILY_NAMES = frozenset({"arithmetic", "gsm8k", "jsonl", "terminal", "bfcl", "swe"})
FAMILIES_HOME = "tentalis_pipelines/tasks/families/"
# The ratchet: each file's count of branches on a family name today (issue 71). A count may only go down:
# a new branch fails the test, and a file whose count went down must lower its number here (so the
# allowance never hides a new branch). A new family must not need any: it goes through the registry.
FAMILY_BRANCHES_ALLOWED = {
    "jobs/runner.py": 7,
    "jobs/warm_start.py": 1,
    "tentalis_pipelines/cli/cycle.py": 6,
    "tentalis_pipelines/cli/demos.py": 1,
    "tentalis_pipelines/contamination.py": 3,
    "tentalis_pipelines/envs/verdicts.py": 2,  # BFCL's hints (moved from env_batches.py with the verdict's review)
    "tentalis_pipelines/evaluation/benchmarks.py": 7,
    "tentalis_pipelines/skills/library.py": 1,
    "tentalis_pipelines/stages/skills.py": 2,
    "tentalis_pipelines/tasks/batches.py": 9,
}


def _family_literals(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in FAMILY_NAMES]


def family_branches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every comparison with a family's name: ``x == "terminal"``, ``x != "bfcl"``,
    ``x in ("terminal", "swe")``, ``x not in [...]``, either side."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            names = [n for side in (node.left, *node.comparators) for n in _family_literals(side)]
            if names:
                found.append((node.lineno, names[0]))
    return found


def test_no_branch_on_a_family_name_outside_the_families_package():
    """Adding a family touches only its own module(s) (issue 71, must-hold 2): outside
    ``tentalis_pipelines/tasks/families/`` the product never compares a value with a family's name
    (arithmetic, gsm8k, jsonl, terminal, bfcl, swe). Today's code still has such branches for the built-in
    families, so this is a ratchet: :data:`FAMILY_BRANCHES_ALLOWED` holds each file's count today, a count may
    only shrink, and a file that sheds one must lower its allowance in the same change."""
    over, under = [], []
    counted = {}
    for path in _files(*PRODUCT):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(FAMILIES_HOME):
            continue
        hits = family_branches(_tree(path))
        if hits:
            counted[rel] = len(hits)
        allowed = FAMILY_BRANCHES_ALLOWED.get(rel, 0)
        if len(hits) > allowed:
            over.append(f"{rel}: {len(hits)} branches on a family name, {allowed} allowed: "
                        + ", ".join(f"line {line} ({name!r})" for line, name in hits))
    for rel, allowed in FAMILY_BRANCHES_ALLOWED.items():
        if counted.get(rel, 0) < allowed:
            under.append(f"{rel}: {counted.get(rel, 0)} left of {allowed}: lower its FAMILY_BRANCHES_ALLOWED entry")
    assert not over, ("a branch on a family's name outside tasks/families (ask the registry, tasks.families, instead):\n"
                      + "\n".join(over))
    assert not under, "the ratchet moves with the code:\n" + "\n".join(under)


@pytest.mark.parametrize("source, expected", [
    ("if kind == 'terminal':\n    pass\n", 1),
    ("ok = 'bfcl' != name\n", 1),
    ("ok = tasks in ('arithmetic', 'gsm8k')\n", 1),
    ("ok = tasks not in ['swe']\n", 1),
    ("ok = name == 'terminal-l0' or name in ('math', 'code')\n", 0),
    ("x = {'terminal': 1}['terminal']\n", 0),
])
def test_the_family_branch_check_finds_what_it_should(source, expected):
    assert len(family_branches(ast.parse(source))) == expected


# --------------------------------------------------------------------------- the import structure
# The library: tentalis_pipelines without its front end (the CLI) and without the Dagster composition root
# (definitions.py). docs/architecture.md, "The import structure", says why and draws the layers.
LIBRARY = "tentalis_pipelines"
NOT_LIBRARY = ("tentalis_pipelines.cli", "tentalis_pipelines.definitions")
# Dagster, and the Dagster side of the product (assets/, jobs/ import Dagster at their top).
DAGSTER = ("dagster", "dagster_pipes", "dagster_ray", "assets", "jobs")
# The one exception, and it must stay needed: the child process of a Pipes launch speaks the Pipes protocol
# with `dagster_pipes` (a package with no dependencies that never imports Dagster).
DAGSTER_ALLOWED = {"tentalis_pipelines/stages/pipes_entry.py": {"dagster_pipes"}}

# The library's packages bottom to top: an import from a package to one listed after it runs up. A new
# package must be placed here (the test says so).
LAYERS = [
    # foundations: settings, the data contract, small helpers
    "settings", "schemas", "config_fields", "files", "redact", "statistics", "hardware", "datasets", "activity", "previews",
    # model-written code and shell commands, run isolated (the sandbox imports the standard library only)
    "sandbox",
    # the store, and what reads it and nothing else
    "lakehouse", "audit", "efficacy", "forensics",
    # models
    "inference", "policy",
    # scoring and training
    "rewards", "training", "lineage",
    # what the policy is taught on, then measured on (benchmarks are drawn from the task families)
    "envs", "tasks", "evaluation",
    # the guards and services around a batch
    "contamination", "quality", "sessions", "promotion", "reviewers", "skills", "gateway",
    # batches of episodes, demonstrations, withdrawals: built from all of the above
    "env_batches", "demonstrations", "retraction",
    # the stage bodies the Dagster assets call
    "stages",
    # a batch's episodes exported (ATIF): asks the stages' batch kinds; only the CLI imports it
    "episodes",
]
# The ratchet (issue 71): every import cycle between the library's packages today, function-local imports
# counted, each explained in docs/architecture.md. A new cycle fails, and so does one that is gone (take it
# off the list, and off the docs).
IMPORT_CYCLES_ALLOWED = {
    ("contamination", "evaluation", "promotion", "tasks"),
    ("envs", "lineage", "rewards", "training"),
}
# The ratchet: arrows (package to package, however many imports make one) that run up :data:`LAYERS` today.
# More fails; fewer fails too until this number is lowered to match.
UP_ARROWS_ALLOWED = 5


def library_package(module: str) -> str | None:
    """The library package ``module`` belongs to: ``envs`` for ``tentalis_pipelines.envs.terminal``,
    ``lineage`` for ``tentalis_pipelines.lineage``; None outside the library (and for its root package)."""
    parts = module.split(".")
    if parts[0] != LIBRARY or len(parts) < 2 or any(module == n or module.startswith(n + ".") for n in NOT_LIBRARY):
        return None
    return parts[1]


def import_graph(sources: dict[str, str] | None = None) -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> the import sites, over the library's modules (``sources``: module
    name -> source, instead of the repository's files). Every import statement counts, the ones inside a
    function too: they are lazy, not absent."""
    if sources is None:
        modules = [(_module_name(p), _tree(p), p.relative_to(ROOT).as_posix()) for p in _files(LIBRARY)]
    else:
        modules = [(m, ast.parse(src), m) for m, src in sources.items()]
    packages = {library_package(m) for m, _, _ in modules} - {None}
    arrows: dict[tuple[str, str], list[str]] = {}
    for module, tree, where in modules:
        home = library_package(module)
        if home is None:
            continue
        for line, imported, names in _imports(tree, module):
            # `from tentalis_pipelines import lineage, sessions` imports packages by name
            targets = [library_package(f"{LIBRARY}.{n}") for n in names] if imported == LIBRARY else [library_package(imported)]
            for target in targets:
                if target in packages and target != home:
                    arrows.setdefault((home, target), []).append(f"{where}:{line}")
    return arrows


def import_cycles(arrows) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one package: each a set of packages that all reach
    each other by imports (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for a, b in arrows:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def up_arrows(arrows) -> list[tuple[str, str]]:
    """The arrows that run up :data:`LAYERS`: from a package to one listed after it."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted((a, b) for a, b in arrows if rank[b] > rank[a])


def test_the_library_never_imports_dagster():
    """The library runs without Dagster: Dagster and the Dagster side (assets/, jobs/: the resources, the Pipes
    and Ray launchers) import the library, never the other way round (issue 71, must-hold 5). Function-local
    imports count. The one exception, :data:`DAGSTER_ALLOWED`, must stay needed."""
    found, used = [], set()
    for path in _files(LIBRARY):
        module, rel = _module_name(path), path.relative_to(ROOT).as_posix()
        if library_package(module) is None:
            continue
        for line, imported, _ in _imports(_tree(path), module):
            if _top(imported) in DAGSTER:
                if _top(imported) in DAGSTER_ALLOWED.get(rel, set()):
                    used.add((rel, _top(imported)))
                else:
                    found.append(f"{rel}:{line}: imports {imported}")
    assert not found, "the library imports Dagster (move the code to assets/ or jobs/):\n" + "\n".join(found)
    allowed = {(rel, top) for rel, tops in DAGSTER_ALLOWED.items() for top in tops}
    assert used == allowed, f"DAGSTER_ALLOWED names an exception no longer needed: {sorted(allowed - used)}"


def test_every_library_package_has_a_layer():
    packages = {library_package(_module_name(p)) for p in _files(LIBRARY)} - {None}
    assert sorted(packages - set(LAYERS)) == [], "place the new package in LAYERS (and in docs/architecture.md)"
    assert sorted(set(LAYERS) - packages) == [], "take the package that is gone off LAYERS"
    assert len(LAYERS) == len(set(LAYERS))


def test_no_import_cycle_between_library_packages_but_the_explained_ones():
    """No import cycle between the library's packages, function-local imports counted, except the ones
    :data:`IMPORT_CYCLES_ALLOWED` lists (each explained in docs/architecture.md, "The import structure").
    The list must match exactly: a new cycle fails, and a cycle that is gone must leave the list."""
    arrows = import_graph()
    cycles = import_cycles(arrows)
    new = [c for c in cycles if c not in IMPORT_CYCLES_ALLOWED]
    details = []
    for cycle in new:
        inside = sorted((a, b) for a, b in arrows if a in cycle and b in cycle)
        details.append(f"{' <-> '.join(cycle)}:\n" + "\n".join(f"  {a} -> {b}: {', '.join(arrows[a, b][:3])}" for a, b in inside))
    assert not new, "an import cycle between library packages (move the code to the package it belongs to):\n" + "\n".join(details)
    gone = IMPORT_CYCLES_ALLOWED - cycles
    assert not gone, f"these cycles are gone (or changed): take them off IMPORT_CYCLES_ALLOWED and the docs: {sorted(gone)}"


def test_arrows_running_up_the_layers_only_get_fewer():
    """The arrows that run up :data:`LAYERS` are :data:`UP_ARROWS_ALLOWED` at most, and the number is lowered
    as soon as one goes (the same ratchet as :data:`FAMILY_BRANCHES_ALLOWED`)."""
    arrows = import_graph()
    up = up_arrows(arrows)
    listing = "\n".join(f"  {a} -> {b}: {', '.join(arrows[a, b][:3])}" for a, b in up)
    assert len(up) <= UP_ARROWS_ALLOWED, (f"{len(up)} arrows run up the layers, {UP_ARROWS_ALLOWED} allowed (move the "
                                          f"code down, or the import up):\n{listing}")
    assert len(up) == UP_ARROWS_ALLOWED, f"{len(up)} arrows run up now: lower UP_ARROWS_ALLOWED to {len(up)}\n{listing}"


@pytest.mark.parametrize("sources, cycles", [
    # a function-local import closes the cycle
    ({"tentalis_pipelines.a.x": "from tentalis_pipelines.b import y\n",
      "tentalis_pipelines.b.y": "def f():\n    from tentalis_pipelines.a.x import g\n"}, {("a", "b")}),
    # `from tentalis_pipelines import c` and a relative import are arrows too; three packages, one cycle
    ({"tentalis_pipelines.a.x": "from tentalis_pipelines import c\n",
      "tentalis_pipelines.c": "from .b import y\n",
      "tentalis_pipelines.b": "import tentalis_pipelines.a.x\n"}, {("a", "b", "c")}),
    # one way only: no cycle; imports inside a package are not arrows
    ({"tentalis_pipelines.a.x": "from tentalis_pipelines.b import y\nfrom tentalis_pipelines.a import z\n",
      "tentalis_pipelines.a.z": "from tentalis_pipelines.a.x import q\n",
      "tentalis_pipelines.b.y": "import os\n"}, set()),
    # the CLI is not the library: its imports close no cycle
    ({"tentalis_pipelines.a.x": "from tentalis_pipelines.cli import main\n",
      "tentalis_pipelines.cli.main": "from tentalis_pipelines.a.x import f\n"}, set()),
])
def test_the_import_cycle_check_finds_what_it_should(sources, cycles):
    assert import_cycles(import_graph(sources)) == cycles
