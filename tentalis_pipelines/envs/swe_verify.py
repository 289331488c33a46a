"""The mini-SWE verdict's test harness: a report the module under test cannot write or alter from its own process.

The agent's runner (``swe_repos.RUNNER``) runs every test in one process with the module and prints its
report; a module can forge that (print the report at exit, wrap ``builtins.getattr`` so that tests do
nothing). The verdict therefore runs :data:`HARNESS` instead, in a fresh sandbox holding the pristine test
files and the agent's module, and trusts nothing the module's process says beyond one message per test:

* **Two processes.** The harness (``python3 -I -B``, ``exec``'d by the shell so it holds the command's
  output pipe alone) never imports the module: it reads the test files' text and its secrets first, makes
  itself undumpable (``prctl(PR_SET_DUMPABLE, 0)``: a process of the same uid can then neither open its
  ``/proc/<pid>/fd`` nor ptrace it) and runs each test in a child of its own. A child gets the test file's
  text on stdin (edits on disk by an earlier child do not count), its own output file (never the
  harness's output) and a result pipe whose write end is its only way to report; it reports once (a tuple
  literal built with ``repr`` and ``%``, which no module can patch, unlike ``json``'s encoder), then leaves
  with ``os._exit(0)`` (no ``atexit`` hook runs); after each child the harness kills every other process
  of its uid (``kill(-1)``), so no descendant of one test's module outlives it. The harness prints one
  line: a marker random per run, the report (JSON) and its HMAC under a key random per run that only the
  harness holds; the host (:func:`parse_signed_report`) accepts that line only, signature checked.
  Nothing printed by the tested code is read as a result.
* **Vacuous tests.** The child runs the test with the builtins it saved before importing anything (a
  patched ``getattr`` or ``exec`` does not reach it), counts the ``assert`` statements the test executed
  (the test file is compiled with each ``assert T`` rewritten as ``assert count() and T``), and after
  the test runs a *canary* (``assert False`` compiled into the test module) that must fail. A test
  passes only when it raised nothing, executed an ``assert`` where it has one, and the canary failed. A
  FAIL_TO_PASS test with ``assert`` statements also runs in a fresh child with every ``assert T``
  negated: when the real run passed, the negated one must fail (the first assert that held now fails).
  (A PASS_TO_PASS test passes on the buggy module already, so forging it gains nothing.) Real and negated
  runs go in a random order, the working directory is restored after each and no process outlives
  one, so a child cannot learn from its pid, the files or a leftover process which run it is. A passing
  canary or negated run is a **forged** verdict: the report names the test and why, and the reward is 0.

What is left (docs/environments.md): the module still runs in the child's process, so a module that finds
and imitates the child's own machinery (its result pipe, its frames, its counters) for the real run but
not for the negated one can still forge; doing so needs introspection that ``swe_tamper`` flags.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field

KEY_ENV = "TENTALIS_VERIFY_KEY"
MARKER_ENV = "TENTALIS_VERIFY_MARKER"
PLAN_ENV = "TENTALIS_VERIFY_PLAN"

# The child: reads its test file's text and orders on stdin, saves what it needs before the module can
# touch it, runs one test, writes one JSON message to the result pipe (moved to a random fd) and leaves
# with os._exit.
CHILD = r'''
def _main():
    # Everything lives in this function's frame, nothing in __main__'s globals: a plain ``import __main__``
    # by the module finds no order, fd or counter (reaching the frame needs introspection: swe_tamper).
    import sys, os, json, ast, types, signal, random
    _exec, _compile, _str, _type = exec, compile, str, type
    # The message is a tuple literal built with repr and %: C code of str and int that no module can patch
    # (json.dumps looks its encoder up at call time, so a module could swap it).
    _write, _exit, _repr, _setitimer, _ITIMER = os.write, os._exit, repr, signal.setitimer, signal.ITIMER_REAL
    _BaseException, _ast_parse, _abspath = BaseException, ast.parse, os.path.abspath
    order = json.loads(sys.stdin.read())
    fd = order["fd"]
    while fd == order["fd"]:  # the result pipe moves to a number no argument or order names
        fd = random.SystemRandom().randrange(40, 250)
    os.dup2(order["fd"], fd)
    os.close(order["fd"])
    hits = [0]

    def count():
        hits[0] += 1
        return True

    class Rewrite(ast.NodeTransformer):
        def __init__(self, negate_in, active=False):
            self.negate_in, self.active = negate_in, active

        def visit_FunctionDef(self, node):
            inner = Rewrite(self.negate_in, self.active or node.name == self.negate_in)
            node.body = [inner.visit(s) for s in node.body]
            return node

        def visit_Assert(self, node):
            test = ast.UnaryOp(ast.Not(), node.test) if self.active else node.test
            call = ast.Call(ast.Name(order["counter"], ast.Load()), [], [])
            return ast.copy_location(ast.Assert(ast.BoolOp(ast.And(), [call, test]), node.msg), node)

    def alarm(signum, frame):
        raise TimeoutError("the test ran past %g s" % order["limit_s"])

    def describe(exc):
        try:
            text = _str(exc)
            return (_str(_type(exc).__name__) + (": " + text if text else ""))[:300]
        except _BaseException:
            return "an exception that cannot be described"

    path = _abspath(order["file"])
    tree = Rewrite(order["test"] if order["negate"] else None).visit(_ast_parse(order["source"]))
    ast.fix_missing_locations(tree)
    code = _compile(tree, path, "exec")
    canary = _compile("def %s():\n    assert False, 'canary'\n" % order["canary"], path, "exec")
    sys.path.insert(0, os.getcwd())
    name = order["file"][:-3]
    module = types.ModuleType(name)
    module.__file__ = path
    namespace = module.__dict__
    namespace[order["counter"]] = count
    sys.modules[name] = module
    signal.signal(signal.SIGALRM, alarm)
    error = None
    try:
        _setitimer(_ITIMER, order["limit_s"], 0.1)
        _exec(code, namespace)
        namespace[order["test"]]()
    except _BaseException as exc:
        error = describe(exc)
    finally:
        _setitimer(_ITIMER, 0)
    asserts = hits[0]
    canary_failed = False
    try:
        _setitimer(_ITIMER, order["limit_s"], 0.1)
        _exec(canary, namespace)
        namespace[order["canary"]]()
    except _BaseException:
        canary_failed = True
    finally:
        _setitimer(_ITIMER, 0)
    _write(fd, ("(%s, %s, %d, %s)" % (_repr(order["test"]), _repr(error), asserts, _repr(canary_failed))).encode())
    _exit(0)


_main()
'''

# The harness: trusted, never imports the module. Plan (env): test ids to run, limits. Prints one signed line.
HARNESS = r'''
import os, sys
key = os.environ.pop("''' + KEY_ENV + r'''").encode()
marker = os.environ.pop("''' + MARKER_ENV + r'''")
import ast, ctypes, hashlib, hmac, json, secrets, shutil, signal, subprocess, tempfile, time
plan = json.loads(os.environ.pop("''' + PLAN_ENV + r'''"))
CHILD = plan["child"]
try:
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4: no /proc/<pid>/fd, no ptrace
    dumpable = False
except Exception:
    dumpable = True
start_files = {}  # the working directory as the host wrote it (restored after every child)
for name in os.listdir("."):
    if os.path.isfile(name) and not os.path.islink(name):
        with open(name, "rb") as fh:
            start_files[name] = fh.read()
sources, asserts_in = {}, {}
for test_id in plan["tests"]:
    test_file = test_id.split("::")[0]
    if test_file not in sources:
        try:
            with open(test_file, encoding="utf-8") as fh:
                sources[test_file] = fh.read()
            tree = ast.parse(sources[test_file])
        except Exception:
            sources[test_file] = None
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                asserts_in[test_file + "::" + node.name] = sum(isinstance(n, ast.Assert) for n in ast.walk(node))
env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.getcwd(), "LANG": "C.UTF-8"}
# kill(-1) only as the sandbox's own unprivileged uid, named by the host on the command line: run anywhere
# else (by hand, as root) it would kill far more than the tests' processes.
sandbox_uid = len(sys.argv) > 1 and os.getuid() != 0 and str(os.getuid()) == sys.argv[1]


def run_child(test_file, test, negate):
    r, w = os.pipe()
    order = {"file": test_file, "source": sources[test_file], "test": test, "negate": negate, "fd": w,
             "limit_s": plan["limit_s"], "counter": "_tentalis_count_" + secrets.token_hex(6),
             "canary": "test_" + secrets.token_hex(6)}
    out_file = tempfile.TemporaryFile()  # not a pipe: a descendant holding it open cannot stall the wait
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", CHILD], stdin=subprocess.PIPE,
                                stdout=out_file, stderr=out_file, pass_fds=(w,), env=env, start_new_session=True)
    finally:
        os.close(w)
    try:
        proc.stdin.write(json.dumps(order).encode())
        proc.stdin.close()
    except OSError:
        pass
    try:
        code = proc.wait(timeout=plan["child_timeout_s"])
    except subprocess.TimeoutExpired:
        code = None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except Exception:
        pass
    if sandbox_uid:  # every other process of this uid (a child's escaped descendants): the next child runs alone
        try:
            os.kill(-1, signal.SIGKILL)
        except Exception:
            pass
    if code is None:
        proc.kill()
        proc.wait()
    os.set_blocking(r, False)
    data = b""
    try:
        while len(data) < 65536:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    os.close(r)
    size = out_file.seek(0, 2)
    out_file.seek(max(0, size - 300))
    output = out_file.read().decode("utf-8", "replace")
    out_file.close()
    if code is None:
        return None, "timed out after %g s" % plan["child_timeout_s"]
    if code != 0:
        return None, "the test process exited with status %d without reporting: %s" % (code, output.strip()[-200:])
    try:
        sent = ast.literal_eval(data.decode())
        assert type(sent) is tuple and len(sent) == 4 and sent[0] == test and type(sent[2]) is int
        message = {"test": sent[0], "error": sent[1], "asserts": sent[2], "canary_failed": sent[3] is True}
    except Exception:
        return None, "the test process sent no valid report (%d bytes)" % len(data)
    return message, output


def restore():
    """The working directory back to what it held at the start: no file one child wrote reaches the next."""
    try:
        os.chmod(".", 0o700)
        for name in os.listdir("."):
            if name in start_files and os.path.isfile(name) and not os.path.islink(name):
                continue
            if os.path.isdir(name) and not os.path.islink(name):
                for root, dirs, _ in os.walk(name):
                    for d in dirs:
                        os.chmod(os.path.join(root, d), 0o700)
                os.chmod(name, 0o700)
                shutil.rmtree(name)
            else:
                os.unlink(name)
        for name, data in start_files.items():
            with open(name, "rb") as fh:
                same = fh.read() == data
            if not same:
                with open(name, "wb") as fh:
                    fh.write(data)
        return True
    except Exception:
        return False


results, why, forged = {}, {}, {}
runs = []
for test_id in plan["tests"]:
    test_file, _, test = test_id.partition("::")
    if sources.get(test_file) is None or test_id not in asserts_in:
        results[test_id], why[test_id] = "FAILED", "no such test in the pristine test files"
        continue
    runs.append((test_id, False))
    if asserts_in[test_id] and test_id in plan["negate"]:
        runs.append((test_id, True))
# A random order, every negated run whatever the real one gives, each child in a restored directory and
# alone: a child cannot learn from its pid, the files or a leftover process whether it is a real or a negated run.
secrets.SystemRandom().shuffle(runs)
outcomes = {}
start = time.monotonic()
for test_id, negate in runs:
    if time.monotonic() - start > plan["budget_s"]:
        outcomes[test_id, negate] = None, "not run: the tests used up their %g s" % plan["budget_s"]
        continue
    test_file, _, test = test_id.partition("::")
    outcomes[test_id, negate] = run_child(test_file, test, negate)
    if not restore():
        outcomes[test_id, negate] = None, "the working directory could not be restored after it"
for test_id in plan["tests"]:
    if test_id in results:
        continue
    message, detail = outcomes[test_id, False]
    if message is None:
        results[test_id], why[test_id] = "FAILED", detail
        continue
    if not message.get("canary_failed"):
        forged[test_id] = "an assert False canary passed in the test's process"
    if message.get("error"):
        results[test_id], why[test_id] = "FAILED", str(message["error"])[:300]
        continue
    need = asserts_in[test_id]
    if need and not message.get("asserts"):
        results[test_id], why[test_id] = "FAILED", "passed without executing any of its %d assert statements" % need
        forged.setdefault(test_id, why[test_id])
        continue
    results[test_id] = "PASSED"
    if (test_id, True) in outcomes:
        negated, detail = outcomes[test_id, True]
        if negated is None and detail.startswith("not run"):
            results[test_id], why[test_id] = "FAILED", "its negated run did not run: " + detail
        elif negated is not None and not negated.get("error"):
            forged.setdefault(test_id, "the test with its asserts negated passed too")
report = json.dumps({"results": results, "why": why, "forged": forged, "dumpable": dumpable}, sort_keys=True)
mac = hmac.new(key, report.encode(), hashlib.sha256).hexdigest()
sys.stdout.write(marker + mac + " " + report + "\n")
sys.stdout.flush()
'''


@dataclass(frozen=True)
class SignedReport:
    """The harness's report: ``results`` (test id -> PASSED/FAILED), ``why`` (test id -> reason for a
    failure), ``forged`` (test id -> why the harness judged its pass forged)."""

    results: dict[str, str]
    why: dict[str, str] = field(default_factory=dict)
    forged: dict[str, str] = field(default_factory=dict)


def new_secrets() -> tuple[str, str]:
    """(marker, key) for one verdict: both random, never reused."""
    return f"@@SWE-VERDICT-{secrets.token_hex(8)}@@", secrets.token_hex(32)


def harness_env(marker: str, key: str, tests: list[str], *, negate: list[str] | None = None, limit_s: float = 1.0,
                child_timeout_s: float = 5.0, budget_s: float = 20.0) -> dict[str, str]:
    """The environment that carries the harness its secrets and plan (it removes them before any child):
    ``tests`` to run, and those of them that run again negated when they pass (default: all; the verdict
    names FAIL_TO_PASS: a PASS_TO_PASS test passes without a forgery, so forging it gains nothing)."""
    plan = {"tests": list(tests), "negate": list(tests if negate is None else negate), "limit_s": limit_s,
            "child_timeout_s": child_timeout_s, "budget_s": budget_s, "child": CHILD}
    return {KEY_ENV: key, MARKER_ENV: marker, PLAN_ENV: json.dumps(plan)}


def sign(report: str, key: str) -> str:
    return hmac.new(key.encode(), report.encode(), hashlib.sha256).hexdigest()


def parse_signed_report(output: str, marker: str, key: str) -> SignedReport | str:
    """The report from the harness's output, or why there is none. Only the last line counts, and only
    when it carries ``marker`` and a valid HMAC of the report under ``key``."""
    lines = output.rstrip("\n").split("\n")
    last = lines[-1] if lines else ""
    if not last.startswith(marker):
        return "the test harness gave no report" if marker not in output else "the test harness's report is not its last line"
    mac, _, report = last[len(marker):].partition(" ")
    if not hmac.compare_digest(mac, sign(report, key)):
        return "the test report's signature does not match (forged)"
    try:
        data = json.loads(report)
        results = {str(k): str(v) for k, v in data["results"].items()}
    except (ValueError, KeyError, AttributeError, TypeError):
        return "the test report is malformed"
    if not all(v in ("PASSED", "FAILED") for v in results.values()):
        return "the test report is malformed"
    return SignedReport(results, {str(k): str(v) for k, v in (data.get("why") or {}).items()},
                        {str(k): str(v) for k, v in (data.get("forged") or {}).items()})
