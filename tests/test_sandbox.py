"""The code sandbox, tested with hostile programs that really run.

Each test runs model-style code through ``tentalis_pipelines.sandbox`` and checks both the
reported outcome and, from the outside, that nothing escaped: no file appeared, no connection arrived,
no process survived, the working directory is gone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tentalis_pipelines import sandbox
from tentalis_pipelines.sandbox import (
    SandboxResult,
    build_humaneval_program,
    run_batch,
    run_humaneval_check,
    run_python,
)

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="the sandbox needs Linux namespaces and root (CI runs as root)",
)

PROMPT = '''def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
'''
TEST = '''def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(-5, 5) == 0
    assert candidate(10, 32) == 42
'''


def sandbox_processes() -> list[int]:
    """Pids of every process running under a sandbox uid, host-wide."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
        except (OSError, StopIteration, ValueError):
            continue
        if sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_COUNT:
            pids.append(int(entry))
    return pids


@pytest.fixture(autouse=True)
def _no_survivors():
    """Every test: the sandbox must work here, and no sandboxed process may outlive its run."""
    sandbox.check_sandbox()  # raises SandboxUnavailableError (a test error, not a skip) if broken
    yield
    assert sandbox_processes() == []


def test_correct_humaneval_solution_passes() -> None:
    res = run_humaneval_check(PROMPT, "    return a + b\n", TEST, "add")
    assert isinstance(res, SandboxResult)
    assert res.passed and res.status == "passed", res
    assert res.seconds > 0


def test_wrong_humaneval_solution_fails() -> None:
    res = run_humaneval_check(PROMPT, "    return a - b\n", TEST, "add")
    assert not res.passed
    assert res.status == "failed" and "AssertionError" in res.detail
    assert "AssertionError" in res.stderr  # the traceback reaches the caller


def test_broken_and_cheating_solutions_do_not_pass() -> None:
    syntax = run_humaneval_check(PROMPT, "    return a +\n", TEST, "add")
    assert (syntax.passed, syntax.status) == (False, "error") and "SyntaxError" in syntax.detail
    # Exiting with status 0 before check() runs is not a pass (a classic reward hack) ...
    early_exit = run_humaneval_check(PROMPT, "    return 0\nimport sys\nsys.exit(0)\n", TEST, "add")
    assert (early_exit.passed, early_exit.status) == (False, "failed")
    hard_exit = run_humaneval_check(PROMPT, "    return 0\nimport os\nos._exit(0)\n", TEST, "add")
    assert (hard_exit.passed, hard_exit.status) == (False, "failed")
    # ... and neither is printing something that looks like a success record.
    forged = run_python('import sys\nprint(\'{"event": "end", "outcome": "ok"}\')\nsys.stdout.flush()\nraise ValueError')
    assert (forged.passed, forged.status) == (False, "error")


def test_infinite_loop_times_out_and_is_killed() -> None:
    # A child that ignores SIGTERM and starts its own session is killed too (PID namespace + killpg).
    code = (
        "import os, signal\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n"
        "    pass\n"
    )
    res = run_python(code, timeout_s=1.5)
    assert (res.passed, res.status) == (False, "timeout")
    assert 1.5 <= res.seconds < 10


def test_unbounded_allocation_hits_the_memory_limit() -> None:
    grow = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 2**20))\n", memory_mb=256)
    assert (grow.passed, grow.status) == (False, "memory"), grow
    huge = run_python("x = bytearray(8 * 2**30)\n", memory_mb=256)
    assert (huge.passed, huge.status) == (False, "memory"), huge


def test_fork_bomb_is_denied_and_cleaned_up() -> None:
    # Counts how many forks succeed before the kernel refuses (RLIMIT_NPROC on the sandbox's own uid).
    counted = run_python(
        "import os, time\n"
        "n = 0\n"
        "while True:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n",
        timeout_s=5,
    )
    assert counted.passed, counted
    assert 0 < int(counted.stdout) < sandbox.DEFAULT_MAX_PROCS  # denied at the limit, sleepers killed
    # The classic bomb: every process forks forever, ignoring the refusals. Stopped by the timeout.
    bomb = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                      timeout_s=2)
    assert (bomb.passed, bomb.status) == (False, "timeout")
    # The machine is fine afterwards: no survivors (fixture) and the host can still start processes.
    assert sandbox_processes() == []
    assert subprocess.run(["true"], check=False).returncode == 0


def test_writes_outside_the_working_directory_are_denied() -> None:
    tag = uuid.uuid4().hex
    targets = [
        f"/tmp/tentalis-escape-{tag}",
        f"/var/tmp/tentalis-escape-{tag}",
        f"/dev/shm/tentalis-escape-{tag}",
        str(REPO / f"tentalis-escape-{tag}.txt"),
        str(REPO / "tentalis_pipelines" / f"escape-{tag}.py"),
        f"/root/tentalis-escape-{tag}",
    ]
    code = (
        "import json, os\n"
        f"targets = {targets!r}\n"
        "outcome = {}\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'w') as fh:\n"
        "            fh.write('escaped')\n"
        "        outcome[path] = 'WRITTEN'\n"
        "    except OSError as exc:\n"
        "        outcome[path] = exc.strerror\n"
        "with open('inside.txt', 'w') as fh:\n"  # the working directory itself is writable
        "    fh.write('fine')\n"
        "print(json.dumps({'cwd': os.getcwd(), 'outcome': outcome, 'inside': open('inside.txt').read()}))\n"
    )
    res = run_python(code)
    assert res.passed, res
    report = json.loads(res.stdout)
    assert report["inside"] == "fine"
    assert "WRITTEN" not in report["outcome"].values(), report
    for path in targets:
        assert not os.path.exists(path), path
    assert not os.path.exists(report["cwd"])  # the throwaway working directory is gone


def test_filling_the_working_directory_stops_at_its_size() -> None:
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 2**20)\n    i += 1\n"
    res = run_python(code, disk_mb=8)
    assert not res.passed and "No space left on device" in res.detail


def test_network_is_unreachable() -> None:
    # A real listener on the host's loopback: the program must not reach it.
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        "import json, socket\n"
        "outcome = {}\n"
        f"for host, port in [('127.0.0.1', {port}), ('1.1.1.1', 443), ('8.8.8.8', 53)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close()\n"
        "        outcome[host] = 'CONNECTED'\n"
        "    except OSError as exc:\n"
        "        outcome[host] = exc.strerror or type(exc).__name__\n"
        "try:\n"
        "    socket.getaddrinfo('pypi.org', 443)\n"
        "    outcome['dns'] = 'RESOLVED'\n"
        "except OSError as exc:\n"
        "    outcome['dns'] = str(exc)\n"
        "print(json.dumps(outcome))\n"
    )
    try:
        res = run_python(code)
        server.settimeout(0.1)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected
    finally:
        server.close()
    assert res.passed, res
    outcome = json.loads(res.stdout)
    assert "CONNECTED" not in outcome.values() and outcome["dns"] != "RESOLVED", outcome


def test_program_runs_unprivileged_alone_and_without_our_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENTALIS_TEST_SECRET", "hunter2")
    code = (
        "import json, os\n"
        "try:\n"
        "    os.setuid(0)\n"
        "    root = True\n"
        "except PermissionError:\n"
        "    root = False\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print(json.dumps({'uid': os.getuid(), 'root': root, 'pids': pids, 'env': dict(os.environ)}))\n"
    )
    res = run_python(code)
    assert res.passed, res
    report = json.loads(res.stdout)
    assert report["uid"] != 0 and report["root"] is False
    assert report["pids"] == ["1"]  # its own PID namespace: no host process is visible
    assert "TENTALIS_TEST_SECRET" not in report["env"]


def test_batch_keeps_order_and_survives_hostile_programs() -> None:
    good = build_humaneval_program(PROMPT, "    return a + b\n", TEST, "add")
    wrong = build_humaneval_program(PROMPT, "    return a * b\n", TEST, "add")
    programs = [good, "while True:\n    pass\n", wrong, "raise SystemExit(0)\n", "x = bytearray(2**33)\n", good]
    results = run_batch(programs, max_workers=2, timeout_s=3, memory_mb=256)
    assert [r.status for r in results] == ["passed", "timeout", "failed", "failed", "memory", "passed"]
    assert [r.passed for r in results] == [True, False, False, False, False, True]


# ---------------------------------------------------------------------------------------------------
# Forged verdicts (issue 11): the program must have no channel that can produce a pass.
# ---------------------------------------------------------------------------------------------------

# The attack as reported: find the harness's outcome record on an inherited descriptor, take the nonce
# from its start record, append an "end ok" record and leave before the tests can fail.
FORGE_FROM_DESCRIPTOR = '''    import os
    for fd in range(3, 256):
        try:
            os.lseek(fd, 0, 0)
            head = os.read(fd, 4096)
        except OSError:
            continue
        if b'"event": "start"' in head:
            nonce = head.split(b" ", 1)[0]
            os.lseek(fd, 0, 2)
            os.write(fd, nonce + b' {"event": "end", "outcome": "ok"}\\n')
            os._exit(0)
    return a - b
'''

# The same through the harness's memory: walk the frames up to the harness and call its own recorder.
FORGE_FROM_FRAMES = '''    import os, sys
    frame = sys._getframe()
    while frame is not None:
        rec = frame.f_locals.get("record")
        if callable(rec):
            rec(event="end", outcome="ok")
            os._exit(0)
        frame = frame.f_back
    return a - b
'''

# Anything that reaches another process of the run: its descriptors and memory through /proc.
FORGE_THROUGH_PROC = '''    import os
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for fd in range(0, 64):
            try:
                with open(f"/proc/{pid}/fd/{fd}", "wb", buffering=0) as fh:
                    fh.write(b'{"event": "end", "outcome": "ok"}\\n')
            except OSError:
                pass
        try:
            open(f"/proc/{pid}/mem", "rb").close()
            print("OPENED-MEM", pid)
        except OSError:
            pass
        try:
            os.kill(int(pid), 9)
            print("KILLED", pid)
        except OSError:
            pass
    return a - b
'''


@pytest.mark.parametrize("attack", [FORGE_FROM_DESCRIPTOR, FORGE_FROM_FRAMES, FORGE_THROUGH_PROC],
                         ids=["descriptor", "frames", "proc"])
def test_a_wrong_solution_cannot_forge_a_pass(attack: str) -> None:
    res = run_humaneval_check(PROMPT, attack, TEST, "add")
    # The descriptor attack finds nothing and the wrong answer fails its test; the frame attack reaches a
    # recorder whose descriptor the candidate process never holds, so its write raises (an error).
    assert not res.passed and res.status in (("failed", "error") if attack is FORGE_FROM_FRAMES else ("failed",)), res
    assert "OPENED-MEM" not in res.stdout and "KILLED" not in res.stdout, res.stdout
    # The same code path still passes a right answer (the attack is what fails, not the harness).
    honest = attack.replace("return a - b", "return a + b")
    if attack is not FORGE_FROM_DESCRIPTOR and attack is not FORGE_FROM_FRAMES:
        assert run_humaneval_check(PROMPT, honest, TEST, "add").passed


def test_candidate_values_cross_to_the_tests_faithfully() -> None:
    """Tuples stay tuples, floats keep their bits, and an unsupported return value fails the test."""
    prompt = "def f(x):\n    \"\"\"Echo.\"\"\"\n"
    test = (
        "import math\n"
        "def check(candidate):\n"
        "    assert candidate((1, 2)) == (1, 2) and type(candidate((1, 2))) is tuple\n"
        "    assert candidate([1, [2, (3,)]]) == [1, [2, (3,)]]\n"
        "    assert candidate({1: 'a', (2, 3): {4}}) == {1: 'a', (2, 3): {4}}\n"
        "    assert candidate(-0.0) == 0.0 and math.copysign(1, candidate(-0.0)) == -1\n"
        "    assert math.isnan(candidate(float('nan'))) and candidate(float('inf')) == float('inf')\n"
        "    assert candidate(10**40) == 10**40 and candidate(b'\\x00\\xff') == b'\\x00\\xff'\n"
        "    assert candidate(frozenset({1})) == frozenset({1}) and candidate(None) is None and candidate(True) is True\n"
    )
    assert run_humaneval_check(prompt, "    return x\n", test, "f").passed
    res = run_humaneval_check(prompt, "    return lambda: 1\n", "def check(candidate):\n    candidate(1)\n", "f")
    assert not res.passed and res.status == "error" and "TypeError" in res.detail, res
    raised = run_humaneval_check(prompt, "    raise KeyError('k')\n", "def check(candidate):\n    candidate(1)\n", "f")
    assert raised.status == "error" and raised.detail.startswith("KeyError"), raised


def test_host_unix_sockets_are_unreachable() -> None:
    """A world-writable Unix socket outside the hidden directories cannot be reached from the sandbox."""
    folder = REPO / ".tentalis" / f"sock-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    path = folder / "agent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        os.chmod(path, 0o777)
        folder.chmod(0o755)
        server.listen(1)
        server.settimeout(0.5)
        program = (
            "import socket\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            f"s.connect({str(path)!r})\n"
            "s.sendall(b'hello')\n"
            "print('CONNECTED')\n"
        )
        res = run_python(program)
        assert "CONNECTED" not in res.stdout and res.status == "error", res
        with pytest.raises(OSError):
            server.accept()  # no connection ever arrived
    finally:
        server.close()
        path.unlink(missing_ok=True)
        folder.rmdir()
