"""Mutation testing by a maintained tool: mutmut's generated operators, module by module.

    make mutants                                           # every target below, then the hand catalogues
    .venv/bin/python -m tools.mutants.generated --only guide multiturn
    .venv/bin/python -m tools.mutants.generated --list

Why mutmut (3.x) and not cosmic-ray: mutmut rewrites each function into a trampoline and forks one
worker per mutant from a process that has already imported the tests' modules, so a mutant costs
milliseconds instead of a fresh interpreter importing torch, transformers and Dagster (cosmic-ray's
default runs the test command once per mutant: seconds each here). It also maps every test to the
functions it calls, so a mutant runs only the tests that reach it.

Each target names the module(s) it mutates and the tests a developer runs for them (the unit tier:
mutmut's forked workers import the mutated copy from ``mutants/``; a subprocess would import the
unmutated package, so integration tests that spawn one cannot kill anything and are not listed).
The runner copies the working tree's tracked files into a temporary folder, writes a ``[tool.mutmut]``
section for the target into the copy's ``pyproject.toml``, runs ``mutmut run``, reads ``mutmut results``
and writes ``tools/mutants/reports/<target>.md`` (and the raw results beside it, so ``--from-results``
re-renders a report after ``survivors.json`` changes without running mutmut again): the counts, the score and every survivor with its diff
and either its equivalence argument or the case it shows (from ``tools/mutants/survivors.json``, keyed
by mutant name and checked against the stored diff, so a reason never outlives the code it explains).

Score = killed (or timed out) / (mutants - equivalent - skipped). The exit code is 1 when any target
scores under ``--min-score`` (90 %).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPORTS = HERE / "reports"
SURVIVORS = HERE / "survivors.json"


@dataclass(frozen=True)
class Target:
    """One mutation target: the files mutmut mutates and the test files that guard them."""

    name: str
    files: tuple[str, ...]
    tests: tuple[str, ...]
    area: str
    # mutmut's process_isolation: "fork" forks each mutant's worker from the process that ran the clean
    # tests; "forkserver" from a server that only collected them. Tests that start multiprocessing's
    # forkserver (the reward server's ScoringPool) need the latter: a worker forked after the clean run
    # inherits a forkserver that is not its child, every test fails with ChildProcessError and every
    # mutant reads as killed.
    isolation: str = "fork"
    # Top-level classes or functions of ``files`` left unmutated (the parts a unit test cannot reach): the
    # copy's header line of each gets mutmut's ``# pragma: no mutate block``; the working tree is untouched.
    skip: tuple[str, ...] = ()


# The learning path, the gym, the gateway, the imports and the reviewers (issue 73's list).
TARGETS: tuple[Target, ...] = (
    Target("policy_lag", ("tentalis_pipelines/training/policy_lag.py",), ("tests/unit/test_policy_lag.py",), "learning"),
    Target("guide", ("tentalis_pipelines/training/guide.py",), ("tests/unit/test_guide.py", "tests/unit/test_episode_guide.py"), "learning"),
    Target("multiturn", ("tentalis_pipelines/training/multiturn.py",),
           ("tests/unit/test_sessions.py", "tests/unit/test_env_batches.py", "tests/unit/test_opd_segments.py",
            "tests/unit/test_episode_guide.py", "tests/unit/test_envs_runner.py", "tests/unit/test_atif.py",
            "tests/unit/test_multiturn_contracts.py"), "learning"),
    Target("advantages", ("tentalis_pipelines/rewards/advantages.py",), ("tests/unit/test_rewards.py",), "learning"),
    # issue 72: the guided episodes' ratio, mask and prefix annealing, and the curriculum's choice of levels
    Target("episode_guide", ("tentalis_pipelines/training/episode_guide.py",), ("tests/unit/test_episode_guide.py",), "learning"),
    Target("curriculum", ("tentalis_pipelines/tasks/curriculum.py",), ("tests/unit/test_curriculum.py",), "learning"),
    Target("losses", ("tentalis_pipelines/training/losses.py",), ("tests/unit/test_losses.py", "tests/unit/test_guide.py"), "learning"),
    Target("terminal", ("tentalis_pipelines/envs/terminal.py",), ("tests/unit/test_envs_terminal.py", "tests/unit/test_envs_level0.py"), "gym"),
    Target("env_runner", ("tentalis_pipelines/envs/runner.py",), ("tests/unit/test_envs_runner.py",), "gym"),
    Target("bfcl", ("tentalis_pipelines/envs/bfcl.py",), ("tests/unit/test_envs_bfcl.py",), "gym"),
    Target("gateway_landing", ("tentalis_pipelines/gateway/landing.py",),
           ("tests/unit/test_gateway_landing.py", "tests/unit/test_gateway_hostile.py"), "gateway"),
    Target("gateway_quarantine", ("tentalis_pipelines/gateway/quarantine.py",),
           ("tests/unit/test_gateway_hostile.py", "tests/unit/test_gateway_quarantine.py"), "gateway"),
    # gateway/policy.py (the PolicyHolder); tests/unit/test_gateway_policy.py tests envs/gateway_policy.py instead.
    Target("gateway_policy", ("tentalis_pipelines/gateway/policy.py",), ("tests/unit/test_gateway_policy_holder.py",), "gateway"),
    Target("atif", ("tentalis_pipelines/envs/atif.py",), ("tests/unit/test_atif.py", "tests/unit/test_atif_import.py",
                                                      "tests/unit/test_atif_validate.py", "tests/unit/test_atif_files.py"), "imports"),
    Target("tasks_jsonl", ("tentalis_pipelines/tasks/jsonl.py",), ("tests/unit/test_tasks.py", "tests/unit/test_tasks_jsonl.py"), "imports"),
    Target("grounding", ("tentalis_pipelines/reviewers/grounding.py",), ("tests/unit/test_grounding.py",), "reviewers"),
    Target("prm_labels", ("tentalis_pipelines/reviewers/prm_labels.py",),
           ("tests/unit/test_prm_labels.py", "tests/unit/test_prm_recipe.py", "tests/unit/test_prm_labels_contracts.py"),
           "reviewers"),
    Target("reward_server", ("tentalis_pipelines/rewards/reward_server.py",), ("tests/unit/test_reward_server.py", "tests/unit/test_reward_server_contracts.py"), "rewards",
           isolation="forkserver"),
    # The gateway's side of idle windows: the activity file the idle_window sensor and a window's training read.
    Target("idle_activity", ("tentalis_pipelines/activity.py",),
           ("tests/unit/test_idle_window.py", "tests/unit/test_activity_contracts.py"), "gateway"),
    # The gateway's batcher over a stand-in decoder (a unit test builds no model; the decoder has its own tests).
    Target("gateway_sampler", ("tentalis_pipelines/gateway/sampler.py",), ("tests/unit/test_gateway_sampler.py",), "gateway"),
    Target("prm_head", ("tentalis_pipelines/reviewers/prm_head.py",),
           ("tests/unit/test_prm_labels.py", "tests/unit/test_prm_recipe.py", "tests/unit/test_prm_head_contracts.py"),
           "reviewers"),
    # The batched decoder's pure parts (the KV slab, the prefix cache, the KV store, common_prefix,
    # kv_position_bytes, the request check); BatchDecoder itself needs a model (its tests are in tests/).
    Target("batch_decoder_parts", ("tentalis_pipelines/inference/batch_decoder.py",),
           ("tests/unit/test_episode_decoder_parts.py", "tests/unit/test_slab_cache.py", "tests/unit/test_batch_decoder_contracts.py"),
           "inference", skip=("BatchDecoder", "_to_host")),
    Target("decode_attention", ("tentalis_pipelines/inference/decode_attention.py",),
           ("tests/unit/test_decode_attention.py",), "inference"),
    Target("packed_linear", ("tentalis_pipelines/inference/packed_linear.py",),
           ("tests/unit/test_packed_linear.py",), "inference"),
)

_RESULT = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>[a-z ]+?)\s*$")
KILLED = {"killed", "timeout"}
NOT_SCORED = {"skipped", "not checked"}


def tracked_files(root: Path = ROOT) -> list[str]:
    """The repository's tracked files as they are in the working tree (uncommitted edits included)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p and (root / p).is_file()]


def mutmut_section(target: Target) -> str:
    """The ``[tool.mutmut]`` TOML section that restricts mutmut to one target."""
    def arr(xs):
        return "[" + ", ".join(json.dumps(x) for x in xs) + "]"
    return ("\n[tool.mutmut]\n"
            'source_paths = ["tentalis_pipelines/"]\n'
            f"only_mutate = {arr(target.files)}\n"
            f"pytest_add_cli_args_test_selection = {arr(target.tests)}\n"
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-p", "no:xdist"]\n'
            f"process_isolation = {json.dumps(target.isolation)}\n")


def skip_blocks(source: str, names: tuple[str, ...]) -> str:
    """``source`` with mutmut's ``# pragma: no mutate block`` on the (one-line) header of each top-level
    class or function in ``names``; a name without such a header is an error, not a silent full run."""
    for name in names:
        pattern = re.compile(rf"^((?:class|def|async def) {re.escape(name)}\b[^\n#]*:)[ \t]*$", re.M)
        source, n = pattern.subn(r"\1  # pragma: no mutate block", source)
        if n != 1:
            raise SystemExit(f"skip: no one-line top-level header for {name!r} ({n} found)")
    return source


def parse_results(text: str) -> dict[str, str]:
    """``mutmut results --all true`` lines -> {mutant name: status}."""
    out = {}
    for line in text.splitlines():
        m = _RESULT.match(line)
        if m:
            out[m["name"]] = m["status"].strip()
    return out


def score(statuses: dict[str, str], equivalent: set[str]) -> tuple[int, int, float | None]:
    """(killed, scored, fraction): equivalent and skipped mutants are not scored."""
    scored = [n for n, s in statuses.items() if s not in NOT_SCORED and n not in equivalent]
    killed = sum(1 for n in scored if statuses[n] in KILLED)
    return killed, len(scored), (killed / len(scored) if scored else None)


def load_survivors() -> dict[str, dict]:
    return json.loads(SURVIVORS.read_text()) if SURVIVORS.exists() else {}


def host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_target(target: Target, jobs: int, keep: bool = False) -> dict:
    """Run mutmut over one target in a fresh copy; return its statuses and survivor diffs."""
    tmp = Path(tempfile.mkdtemp(prefix=f"mutmut-{target.name}-"))
    commit, dirty = provenance(target)  # the tree as copied, not as it is when the run ends
    try:
        for rel in tracked_files():
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst)
        with (tmp / "pyproject.toml").open("a") as f:
            f.write(mutmut_section(target))
        for rel in target.files:
            if target.skip:
                (tmp / rel).write_text(skip_blocks((tmp / rel).read_text(), target.skip))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        mutmut = [sys.executable, "-m", "mutmut"]
        t0 = time.monotonic()
        run = subprocess.run([*mutmut, "run", "--max-children", str(jobs)], cwd=tmp, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - t0
        res = subprocess.run([*mutmut, "results", "--all", "true"], cwd=tmp, env=env, capture_output=True, text=True)
        statuses = parse_results(res.stdout)
        if not statuses:
            tail = (run.stdout + run.stderr)[-3000:]
            raise SystemExit(f"mutmut produced no results for {target.name} (exit {run.returncode}):\n{tail}")
        diffs = {}
        for name, status in statuses.items():
            if status not in KILLED and status not in NOT_SCORED:
                show = subprocess.run([*mutmut, "show", name], cwd=tmp, env=env, capture_output=True, text=True)
                diffs[name] = diff_body(show.stdout)
        return {"statuses": statuses, "diffs": diffs, "seconds": seconds, "commit": commit, "dirty": dirty}
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def diff_body(show: str) -> str:
    """The changed lines of ``mutmut show`` (the +/- lines without file headers)."""
    lines = [ln for ln in show.splitlines()
             if (ln.startswith("+") or ln.startswith("-")) and not ln.startswith(("+++", "---"))]
    return "\n".join(lines)


def provenance(target: Target) -> tuple[str, bool]:
    """The commit the report was made at, and whether the target's files had uncommitted edits."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *target.files, *target.tests], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return commit, bool(dirty)


def write_report(target: Target, result: dict, survivors: dict[str, dict], jobs: int) -> tuple[int, int, float | None]:
    statuses, diffs = result["statuses"], result["diffs"]
    equivalent, explained, stale = set(), {}, []
    for name, diff in diffs.items():
        entry = survivors.get(name)
        if entry is None:
            continue
        if entry.get("diff", "").strip() != diff.strip():
            stale.append(name)
            continue
        explained[name] = entry
        if entry.get("kind") == "equivalent":
            equivalent.add(name)
    killed, scored, frac = score(statuses, equivalent)
    counts: dict[str, int] = {}
    for s in statuses.values():
        counts[s] = counts.get(s, 0) + 1
    commit, dirty = (result["commit"], result["dirty"]) if "commit" in result else provenance(target)
    lines = [f"# Mutation report: `{target.name}` ({target.area})", "",
             f"Generated by `python -m tools.mutants.generated --only {target.name} --jobs {jobs}` (mutmut) on "
             f"{dt.date.today().isoformat()}, commit `{commit}`{' + uncommitted edits' if dirty else ''}, host {host_cpu()}, "
             f"{result['seconds']:.0f} s.", "",
             "Mutated: " + ", ".join(f"`{f}`" for f in target.files) + ". Tests: " + ", ".join(f"`{t}`" for t in target.tests) + ".", "",
             f"**Score: {killed} of {scored} scored mutants killed"
             + (f" ({frac:.1%})" if frac is not None else "") + f"**; {len(equivalent)} equivalent (not scored).", "",
             "| status | mutants |", "|---|---|"]
    lines += [f"| {s} | {n} |" for s, n in sorted(counts.items())]
    lines += ["", "## Survivors", ""]
    if not diffs:
        lines.append("None.")
    for name in sorted(diffs):
        entry = explained.get(name)
        if entry is None:
            label = "STALE reason (the code changed): re-examine" if name in stale else "UNEXPLAINED: write a test or an argument"
            reason = ""
        else:
            label = "equivalent" if entry.get("kind") == "equivalent" else "survives: the case it shows"
            reason = entry.get("reason", "")
        lines += [f"### `{name}` ({statuses[name]}; {label})", "", "```diff", diffs[name], "```", ""]
        if reason:
            lines += [reason, ""]
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"{target.name}.md").write_text("\n".join(lines) + "\n")
    return killed, scored, frac


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", help="target names (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="mutmut --max-children")
    p.add_argument("--min-score", type=float, default=0.90)
    p.add_argument("--list", action="store_true", help="print the targets and exit")
    p.add_argument("--keep", action="store_true", help="keep the temporary copy (debugging)")
    p.add_argument("--from-results", action="store_true",
                   help="rewrite the reports from the last run's saved results (after editing survivors.json), without running mutmut")
    args = p.parse_args(argv)
    known = {t.name: t for t in TARGETS}
    if args.list:
        for t in TARGETS:
            print(f"{t.name:18} {t.area:10} {', '.join(t.files)}  <- {', '.join(t.tests)}")
        return 0
    unknown = sorted(set(args.only or []) - set(known))
    if unknown:
        p.error(f"unknown target(s) {unknown}; --list shows the targets")
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    targets = [known[n] for n in args.only] if args.only else list(TARGETS)
    survivors = load_survivors()
    failed = []
    for t in targets:
        saved = REPORTS / f"{t.name}.results.json"
        if args.from_results:
            if not saved.exists():
                p.error(f"no saved results for {t.name} ({saved.relative_to(ROOT)}): run it without --from-results first")
            result = json.loads(saved.read_text())
        else:
            result = run_target(t, args.jobs, keep=args.keep)
            REPORTS.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        killed, scored, frac = write_report(t, result, survivors, args.jobs)
        shown = f"{frac:.1%}" if frac is not None else "n/a"
        print(f"{t.name:18} {killed:4d} / {scored:4d} killed  {shown:>6}  {result['seconds']:.0f} s  "
              f"-> {(REPORTS / (t.name + '.md')).relative_to(ROOT)}", flush=True)
        if frac is not None and frac < args.min_score:
            failed.append(t.name)
    if failed:
        print(f"under {args.min_score:.0%}: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
