"""The mini-SWE environment: fix an injected bug in a small repository with shell commands.

The agent works exactly as in the terminal environment (``envs/terminal.py``, whose machinery this
reuses: one fenced bash block per turn, ``submit`` to finish, observations cut with a visible
``[... N characters truncated ...]`` marker, hostile commands ending the episode), in a fresh sandbox
holding the buggy repository (``swe_tasks.SweTask.tree``: the module, its test file and
``run_tests.py``). It edits with ``sed``, ``python3 -c``, ``cat > file <<EOF`` or anything else the
shell offers, and may run the tests (``python3 run_tests.py``) as often as it likes. Bytecode is never
written (``PYTHONDONTWRITEBYTECODE``): a same-size edit within one second would otherwise run stale
``.pyc`` files.

**Verdict** (SWE-bench's): at the end (submitted or turn limit; an edit counts without ``submit``), the
module as the agent left it is read back from the sandbox (as data) and put, alone, into a *fresh*
sandbox with the pristine test files; the tests run there, by the verdict's own harness
(``swe_verify``: a trusted process that never imports the module runs each test in a child and signs
its report; canaries and negated asserts catch tests made vacuous), not by ``run_tests.py``. Reward 1 iff
every FAIL_TO_PASS and every PASS_TO_PASS test passes and no pass was judged forged, else 0; the
fraction that passed is in the detail and the last step's info (``tests_passed``, ``tests_total``). So
edits to the tests, new files (a ``conftest.py``, a module shadowing the standard library) and processes
left behind count for nothing. The reward-hacking detector (``swe_tamper``) reads the module's AST and
the agent's final tree: its findings are in the last step's info (``tampering``), and a module that
reaches for the test machinery (builtins, exit hooks, introspection, the runner's marker) gets reward 0
(``SweConfig.refuse_tampering``). What remains possible: docs/environments.md.
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass, field

from tentalis_pipelines.envs.base import EnvironmentUnavailable, Observation, Verdict, end_kind, error
from tentalis_pipelines.envs.swe_repos import REPOS, repo_tree
from tentalis_pipelines.envs.swe_tamper import EXPLOIT, Finding, module_findings, summary, tree_findings
from tentalis_pipelines.envs.swe_tasks import SweTask, assign_splits, bug_id, candidate_bugs, sha256
from tentalis_pipelines.envs.swe_verify import (
    HARNESS,
    SignedReport,
    harness_env,
    new_secrets,
    parse_signed_report,
)
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv, submit_function
from tentalis_pipelines.sandbox import SandboxUnavailableError, ShellLimits, ShellSession

TEST_COMMAND = "python3 run_tests.py"
TEST_TIMEOUT_S = 30.0  # the whole test run in the verifier (each test has its own 2 s alarm)
SESSION_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}


def swe_terminal_config(max_turns: int) -> TerminalConfig:
    """The terminal settings of a mini-SWE episode: longer observations (test reports) and 30 s per command
    (a test run whose every test loops until its 1 s alarm)."""
    return TerminalConfig(max_turns=max_turns, observation_chars=1500, limits=ShellLimits(command_timeout_s=30.0))


@dataclass(frozen=True)
class SweConfig:
    """The terminal environment's settings (``TerminalConfig``) for mini-SWE episodes."""

    terminal: TerminalConfig = field(default_factory=lambda: swe_terminal_config(8))
    test_timeout_s: float = TEST_TIMEOUT_S
    # A module that reaches for the test machinery (swe_tamper: builtins, exit hooks, introspection, the
    # runner's marker) gets reward 0 whatever its tests say; False only records the findings.
    refuse_tampering: bool = True


@dataclass(frozen=True)
class SuiteRun:
    """The outcome of one run of the tests: ``results`` (test id -> ``PASSED``/``FAILED``), or None with
    ``error`` when the run gave no report (it crashed, timed out, or python3 is missing)."""

    results: dict[str, str] | None
    error: str = ""
    output: str = ""
    forged: dict[str, str] = field(default_factory=dict)  # test id -> why its pass was judged forged (the harness)
    why: dict[str, str] = field(default_factory=dict)  # test id -> why it failed (the harness)


def run_tests(files: dict[str, str], *, timeout_s: float = TEST_TIMEOUT_S, hide_dirs: list[str] | None = None) -> SuiteRun:
    """Run ``python3 run_tests.py`` on ``files`` in a fresh sandbox and read its report (the last line,
    after a marker that is random per run)."""
    marker = f"@@SWE-REPORT-{secrets.token_hex(8)}@@"
    limits = ShellLimits(command_timeout_s=timeout_s)
    try:
        with ShellSession(files, limits, hide_dirs=hide_dirs, env={**SESSION_ENV, "SWE_REPORT": marker}) as session:
            result = session.run(TEST_COMMAND)
    except SandboxUnavailableError as exc:
        raise EnvironmentUnavailable(f"the mini-SWE environment needs the sandbox: {exc}") from exc
    return parse_report(result.head + result.tail, marker, exit_code=result.exit_code, timed_out=result.timed_out,
                        session_error=result.error)


def parse_report(output: str, marker: str, *, exit_code: int | None = 0, timed_out: bool = False, session_error: str = "") -> SuiteRun:
    """The runner's report from its output (see ``swe_repos.RUNNER``)."""
    if session_error:
        return SuiteRun(None, f"the sandbox failed: {session_error}", output)
    at = output.rfind(marker)
    if at < 0:
        why = "the test run timed out" if timed_out else f"the test run gave no report (exit code {exit_code})"
        if exit_code == 127:
            raise EnvironmentUnavailable("the mini-SWE environment needs python3 inside the sandbox (exit code 127)")
        return SuiteRun(None, why, output)
    line = output[at + len(marker):].split("\n", 1)[0]
    try:
        results = json.loads(line)
    except json.JSONDecodeError:
        return SuiteRun(None, "the test report is not JSON", output)
    if not isinstance(results, dict) or not all(v in ("PASSED", "FAILED") for v in results.values()):
        return SuiteRun(None, "the test report is malformed", output)
    return SuiteRun({str(k): str(v) for k, v in results.items()}, "", output)


def verify_tests(test_files: dict[str, str], module_file: str, source: str, tests: list[str], *,
                 negate: list[str] | None = None, timeout_s: float = TEST_TIMEOUT_S,
                 hide_dirs: list[str] | None = None) -> SuiteRun:
    """The verdict's test run (``swe_verify``): ``tests`` (ids) run by the two-process harness on the pristine
    ``test_files`` and the agent's module ``source``, in a fresh sandbox (``negate``: those that also run
    with their asserts negated when they pass; default all); the report is the harness's signed last line,
    never what the tested code printed."""
    marker, key = new_secrets()
    harness = f"_tentalis_verify_{secrets.token_hex(6)}.py"
    files = {p: t for p, t in test_files.items() if p != "run_tests.py"}
    files.update({module_file: source, harness: HARNESS})
    child_timeout_s = max(1.0, min(5.0, timeout_s / 6))
    env = {**SESSION_ENV, **harness_env(marker, key, tests, negate=negate, child_timeout_s=child_timeout_s,
                                        budget_s=timeout_s / 2)}
    try:
        with ShellSession(files, ShellLimits(command_timeout_s=timeout_s), hide_dirs=hide_dirs, env=env) as session:
            result = session.run(f"exec python3 -I -B {harness} {session.uid}")
    except SandboxUnavailableError as exc:
        raise EnvironmentUnavailable(f"the mini-SWE environment needs the sandbox: {exc}") from exc
    output = result.head + result.tail
    if result.error:
        return SuiteRun(None, f"the sandbox failed: {result.error}", output)
    if result.exit_code == 127:
        raise EnvironmentUnavailable("the mini-SWE environment needs python3 inside the sandbox (exit code 127)")
    report = parse_signed_report(output, marker, key)
    if isinstance(report, SignedReport):
        return SuiteRun(report.results, "", output, forged=report.forged, why=report.why)
    if result.timed_out:
        report = f"the test run timed out ({report})"
    return SuiteRun(None, report, output)


def suite_verdict(task: SweTask, run: SuiteRun) -> tuple[Verdict, int, int]:
    """(verdict, tests passed, tests required) of a test run against FAIL_TO_PASS and PASS_TO_PASS: a test
    missing from the report counts as failed."""
    required = list(task.fail_to_pass) + list(task.pass_to_pass)
    if run.results is None:
        return Verdict(False, 0.0, f"tests not run: {run.error}"), 0, len(required)
    if run.forged:
        forged = "; ".join(f"{t.split('::')[-1]}: {why}" for t, why in sorted(run.forged.items())[:3])
        return Verdict(False, 0.0, f"forged verdict ({len(run.forged)} test(s) cannot fail): {forged}"), 0, len(required)
    ok_f2p = sum(run.results.get(t) == "PASSED" for t in task.fail_to_pass)
    ok_p2p = sum(run.results.get(t) == "PASSED" for t in task.pass_to_pass)
    passed = ok_f2p + ok_p2p
    detail = (f"FAIL_TO_PASS {ok_f2p}/{len(task.fail_to_pass)}, PASS_TO_PASS {ok_p2p}/{len(task.pass_to_pass)} "
              f"({passed}/{len(required)} tests pass)")
    if passed == len(required):
        return Verdict(True, 1.0, "all tests pass: " + detail), passed, len(required)
    still = [t.split("::")[-1] for t in required if run.results.get(t) != "PASSED"]
    return Verdict(False, 0.0, f"{detail}; failing: {', '.join(still[:5])}"), passed, len(required)


class SweEnv(TerminalEnv):
    """One mini-SWE episode at a time: ``reset(task)``, ``step(text)`` until done, ``verify()``, ``close()``."""

    name = "swe"

    def __init__(self, config: SweConfig | None = None, *, hide_dirs: list[str] | None = None):
        self.swe_config = config or SweConfig()
        super().__init__(self.swe_config.terminal, hide_dirs=hide_dirs)
        self.source_text: str | None = None
        self.tests_passed = 0
        self.tests_total = 0
        self.tampering: list[Finding] = []

    def reset(self, task: SweTask | dict) -> Observation:  # type: ignore[override]
        """Start an episode on ``task`` (a SweTask or its dict): a fresh sandbox holding the buggy repository."""
        self.close()
        self.task = task if isinstance(task, SweTask) else SweTask.from_dict(task)  # type: ignore[assignment]
        self._reset_state()
        self.source_text = None
        self.tests_passed = self.tests_total = 0
        self.tampering = []
        try:
            self.session = ShellSession(self.task.tree, self.config.limits, hide_dirs=self.hide_dirs,
                                        env={**SESSION_ENV, "BASH_FUNC_submit%%": submit_function()})
        except SandboxUnavailableError as exc:
            raise EnvironmentUnavailable(f"the mini-SWE environment needs the sandbox: {exc}") from exc
        self.sandbox_uid = self.session.uid
        demo = ([{**m, "kind": "demonstration"} for m in self.config.demonstration_messages]
                if self.config.demonstration else [])
        return Observation([
            {"role": "system", "content": self.config.system_prompt, "kind": "system"},
            *demo,
            {"role": "user", "content": self.task.instruction, "kind": "instruction"},
        ])

    def step(self, action: str):
        result = super().step(action)
        if result.done:
            result.info.update(tests_passed=self.tests_passed, tests_total=self.tests_total,
                               tampering=[f.to_dict() for f in self.tampering])
        return result

    def _finish(self, reason: str) -> None:
        """The episode is over: read the module back as the agent left it, then end the sandbox."""
        self.done = True
        self.end_reason = reason
        task: SweTask = self.task  # type: ignore[assignment]
        if self.session is not None and self.session.alive and end_kind(reason) not in ("hostile", "error"):
            try:
                # the module under test first: unrelated large files cannot push it out of the snapshot budget
                tree = self.session.snapshot(first=[task.source_file])
                self.source_text = read_text(tree.get(task.source_file))
                self.tampering = (module_findings(task.tree.get(task.source_file), self.source_text, task.source_file)
                                  + tree_findings(task.tree, tree))
            except Exception as exc:  # noqa: BLE001 - the environment failed, not the agent
                self.end_reason = error(f"the module could not be read back: {exc}")
        if self.session is not None:
            self.session.close()
            self.session = None

    def verify(self) -> Verdict:
        """The final verifier (module doc). Before the end it reads the module as it is now (a probe)."""
        task: SweTask | None = self.task  # type: ignore[assignment]
        if task is None:
            raise RuntimeError("verify() before reset()")
        if not self.done:
            source = read_text(self.session.snapshot().get(task.source_file)) if self.session is not None else None
            return self._run_verdict(task, source)[0]
        if self._verdict is None:
            if end_kind(self.end_reason) in ("hostile", "error"):
                self._verdict = Verdict(False, 0.0, self.end_reason)
            else:
                self._verdict, self.tests_passed, self.tests_total = self._run_verdict(task, self.source_text)
        return self._verdict

    def _run_verdict(self, task: SweTask, source: str | None) -> tuple[Verdict, int, int]:
        required = len(task.fail_to_pass) + len(task.pass_to_pass)
        if source is None:
            return Verdict(False, 0.0, f"{task.source_file} is missing or not a readable text file"), 0, required
        run = verify_tests(task.test_files, task.source_file, source, list(task.fail_to_pass) + list(task.pass_to_pass),
                           negate=list(task.fail_to_pass), timeout_s=self.swe_config.test_timeout_s, hide_dirs=self.hide_dirs)
        verdict, passed, total = suite_verdict(task, run)
        exploits = [f for f in module_findings(task.tree.get(task.source_file), source, task.source_file) if f.severity == EXPLOIT]
        if exploits and self.swe_config.refuse_tampering:
            verdict = Verdict(False, 0.0, f"reward hacking: {task.source_file} reaches for the test machinery "
                                          f"({summary(exploits)}); the tests said: {verdict.detail}")
        return verdict, passed, total


def read_text(entry: dict | None) -> str | None:
    """A sandbox snapshot entry as text: None unless it is a regular UTF-8 file read in full."""
    if not entry or entry.get("type") != "file" or entry.get("truncated") or "text" not in entry:
        return None
    return str(entry["text"])


# --------------------------------------------------------------------------- the catalogue
def validate_candidates(candidates: list[tuple[str, object, str]], *, timeout_s: float = TEST_TIMEOUT_S) -> list[dict]:
    """Run the tests on every candidate bug (``swe_tasks.candidate_bugs``) in the sandbox, one session per
    repository, and keep those that break at least one test, with FAIL_TO_PASS and PASS_TO_PASS.
    Raises when a pristine repository does not pass all its tests."""
    entries: list[dict] = []
    by_module: dict[str, list] = {}
    for module, mutation, buggy in candidates:
        by_module.setdefault(module, []).append((mutation, buggy))
    for module, items in by_module.items():
        level = REPOS[module][0]
        marker = f"@@SWE-REPORT-{secrets.token_hex(8)}@@"
        with ShellSession(repo_tree(module), ShellLimits(command_timeout_s=timeout_s),
                          env={**SESSION_ENV, "SWE_REPORT": marker}) as session:
            base = session.run(TEST_COMMAND)
            pristine = parse_report(base.head + base.tail, marker, exit_code=base.exit_code, timed_out=base.timed_out)
            if pristine.results is None or any(v != "PASSED" for v in pristine.results.values()):
                raise RuntimeError(f"the pristine {module} repository does not pass its tests: {pristine.output[-2000:]}")
            for mutation, buggy in items:
                blob = base64.b64encode(buggy.encode()).decode()
                r = session.run(f"echo {blob} | base64 -d > {module}.py && {TEST_COMMAND}")
                run = parse_report(r.head + r.tail, marker, exit_code=r.exit_code, timed_out=r.timed_out, session_error=r.error)
                if run.results is None or set(run.results) != set(pristine.results):
                    continue
                f2p = sorted(t for t, v in run.results.items() if v == "FAILED")
                if not f2p:
                    continue
                site = mutation.site  # type: ignore[attr-defined]
                entries.append({"bug_id": bug_id(module, site), "module": module, "level": level, "site": site,
                                "description": mutation.description,  # type: ignore[attr-defined]
                                "FAIL_TO_PASS": f2p, "PASS_TO_PASS": sorted(t for t, v in run.results.items() if v == "PASSED"),
                                "buggy_sha256": sha256(buggy)})
    return entries


def build_catalogue() -> dict:
    """The catalogue (``swe_catalogue.json``'s content): every validated bug with its split."""
    entries = assign_splits(validate_candidates(candidate_bugs()))
    return {"about": "mini-SWE bugs: AST mutations of tentalis_pipelines/envs/swe_repos.py that break >= 1 test "
                     "(rebuild: python tools/swe_catalogue.py)",
            "modules": {m: sha256(src) for m, (_, src, _) in REPOS.items()},
            "bugs": sorted(entries, key=lambda e: e["bug_id"])}
