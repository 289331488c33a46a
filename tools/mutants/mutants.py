"""Mutation testing: plant one bug at a time and check that the tests notice.

    make mutants                      # every mutant in tools/mutants/catalog/*.py
    .venv/bin/python -m tools.mutants.mutants --only trainer --jobs 2

Each catalogue file defines ``MUTANTS``: a list of dicts with ``id``, ``file`` (repo-relative), ``find``
(text that must occur exactly once in that file), ``replace`` (the planted bug), ``tests`` (the test
files that guard it) and ``why``. An optional ``equivalent`` (a reason) marks a mutant that no test can
kill because it does not change behaviour; it is reported, not scored.

The runner copies the repository into a temporary folder, checks that the guarding tests pass there
unmutated, then for each mutant writes the mutated file, runs its tests (``pytest -x``, the copy first
on ``PYTHONPATH``) and restores the file. A mutant is *killed* when its tests fail (or time out). The
score is killed / scored mutants; the exit code is 1 when it is under ``--min-score``.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CATALOG = HERE / "catalog"
# The product and everything its tests import (the lab's benches and experiments are tested too).
COPIED = ("tentalis_pipelines", "assets", "jobs", "bench", "experiments", "tools", "tests", "pyproject.toml", "dagster.yaml",
          "workspace.yaml")


def load_catalog(only: list[str] | None = None) -> list[dict]:
    mutants = []
    for path in sorted(CATALOG.glob("[!_]*.py")):  # not __init__.py
        if only and path.stem not in only:
            continue
        for m in runpy.run_path(str(path))["MUTANTS"]:
            mutants.append({**m, "catalog": path.stem})
    ids = [m["id"] for m in mutants]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise SystemExit(f"duplicate mutant ids: {sorted(dupes)}")
    return mutants


def check_applicable(mutants: list[dict]) -> list[str]:
    """Catalogue errors: a ``find`` that is not in its file exactly once (the code moved on: update it)."""
    errors = []
    for m in mutants:
        text = (ROOT / m["file"]).read_text()
        n = text.count(m["find"])
        if n != 1:
            errors.append(f"{m['id']}: 'find' occurs {n} times in {m['file']} (must be exactly once)")
        if m["find"] == m["replace"]:
            errors.append(f"{m['id']}: 'replace' equals 'find'")
    return errors


def _copy_tree(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dest / name)


def _pytest(workdir: Path, tests: list[str], timeout: float) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(workdir), "PYTHONDONTWRITEBYTECODE": "1",
           "TENTALIS_TEST_CACHE": os.environ.get("TENTALIS_TEST_CACHE", str(ROOT / ".tentalis" / "test-cache"))}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, time.perf_counter() - t0, proc.stdout[-2000:] + proc.stderr[-1000:]
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - t0, "timeout"


def _run_one(workdir: Path, m: dict, timeout: float) -> dict:
    target = workdir / m["file"]
    original = target.read_text()
    target.write_text(original.replace(m["find"], m["replace"], 1))
    try:
        rc, seconds, tail = _pytest(workdir, m["tests"], timeout)
    finally:
        target.write_text(original)
    status = "killed" if rc != 0 else "survived"
    if rc == -1:
        status = "killed (timeout)"
    return {"id": m["id"], "catalog": m["catalog"], "file": m["file"], "why": m["why"], "status": status,
            "seconds": round(seconds, 1), "equivalent": m.get("equivalent"), "tail": tail if rc == 0 else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="catalogue name(s) (file stem), e.g. trainer")
    ap.add_argument("--id", action="append", help="run only these mutant ids")
    ap.add_argument("--jobs", type=int, default=2, help="mutants run at once (each in its own copy)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests")
    ap.add_argument("--min-score", type=float, default=0.9)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    mutants = load_catalog(args.only)
    if args.id:
        mutants = [m for m in mutants if m["id"] in set(args.id)]
    if not mutants:
        print("no mutants selected")
        return 2
    errors = check_applicable(mutants)
    if errors:
        print("mutant catalogue out of date:\n  " + "\n  ".join(errors))
        return 2
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tentalis-mutants-") as tmp:
        workdirs = []
        for j in range(max(1, args.jobs)):
            w = Path(tmp) / f"w{j}"
            w.mkdir()
            _copy_tree(w)
            workdirs.append(w)
        tests = sorted({t for m in mutants for t in m["tests"]})
        rc, seconds, tail = _pytest(workdirs[0], tests, args.timeout * 3)
        if rc != 0:
            print(f"the guarding tests fail without any mutant ({seconds:.0f} s): fix them first\n{tail}")
            return 2
        print(f"baseline: {len(tests)} test files pass unmutated ({seconds:.0f} s); {len(mutants)} mutants, {args.jobs} at a time")
        queue = list(mutants)
        results: list[dict] = []

        def worker(w: Path) -> None:
            while queue:
                m = queue.pop(0)
                r = _run_one(w, m, args.timeout)
                results.append(r)
                mark = "x" if r["status"].startswith("killed") else ("=" if r["equivalent"] else "!")
                print(f"  [{mark}] {r['id']:<40} {r['status']:<17} {r['seconds']:>6.1f}s  {r['why']}", flush=True)

        with ThreadPoolExecutor(len(workdirs)) as pool:
            list(pool.map(worker, workdirs))
    scored = [r for r in results if not (r["equivalent"] and r["status"] == "survived")]
    killed = [r for r in scored if r["status"].startswith("killed")]
    survivors = [r for r in scored if not r["status"].startswith("killed")]
    equivalent = [r for r in results if r["equivalent"] and r["status"] == "survived"]
    score = len(killed) / max(len(scored), 1)
    print(f"\nmutation score: {len(killed)}/{len(scored)} killed = {score:.1%} "
          f"({len(equivalent)} equivalent, not scored) in {time.perf_counter() - t0:.0f} s")
    for r in survivors:
        print(f"  SURVIVED {r['id']} ({r['file']}): {r['why']}")
    for r in equivalent:
        print(f"  equivalent {r['id']}: {r['equivalent']}")
    if args.out:
        args.out.write_text(json.dumps({"score": score, "results": results}, indent=2))
    return 0 if score >= args.min_score else 1


if __name__ == "__main__":
    raise SystemExit(main())
