"""A sandbox for model-written Python code (HumanEval-style programs and anything else).

Model-written code never runs in the pipeline's own process. Every program runs in a fresh child
process that is isolated with plain Linux mechanisms and nothing outside util-linux (``unshare``, an
essential Debian package, always installed):

* **namespaces** (``unshare --mount --net --pid --ipc --uts --fork --kill-child --mount-proc``): a
  network namespace with only a downed loopback, so no socket can reach 127.0.0.1 or anywhere else;
  a PID namespace, so the program sees only its own processes and every process it started dies with
  it; a private mount namespace, in which our changes below are invisible to the host;
* **a read-only view of the filesystem**: inside the mount namespace every mount is remounted
  read-only and ``nosuid``; ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run``, ``/root`` and ``/home``
  are covered by empty read-only tmpfs; the Python installation is mounted back in read-only, and
  the working directory is a fresh size-limited tmpfs (the single writable place; it vanishes with
  the namespace, and its host-side directory is deleted after the run);
* **an unprivileged uid** of its own (a fresh uid per run, no supplementary groups,
  ``no_new_privs``), so that ``RLIMIT_NPROC`` binds (it does not bind root) and counts only this
  program's processes, and file permissions apply on top of the read-only mounts;
* **resource limits**: ``RLIMIT_AS`` (memory), ``RLIMIT_NPROC`` (fork bombs), ``RLIMIT_CPU``,
  ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE``; plus a wall-clock timeout after which every
  process of the run is killed (by uid, then the process group; the PID namespace takes any rest);
* **a minimal environment** (no inherited variables: no tokens or keys reach the program).

The namespaces and mounts need root (the pipeline and CI run as root). On a machine where they are
not available, :func:`check_sandbox` raises :class:`SandboxUnavailableError` with the reason rather
than silently scoring every program as failed.

A failing or hostile program never raises into the caller: it comes back as a :class:`SandboxResult`
whose ``status`` says what happened.

**Verdicts the program cannot forge** (:func:`run_humaneval_check`). The tests and the candidate run in
two processes under two different throwaway uids. The *candidate* process runs the model's code and
answers calls to the entry point over a pipe; the *tester* process runs the benchmark's own prompt and
tests, calls the entry point through a proxy, and alone holds the descriptor on which the outcome is
reported. Values cross as data (tagged JSON of None, bool, int, float, str, bytes, list, tuple, dict,
set, frozenset), never as code or pickles. Being another uid, the candidate cannot read or write the
tester's descriptors or memory through ``/proc``, ptrace it or signal it; exiting early, printing a fake
record or writing to every descriptor it has reaches nothing that decides the verdict. A return value
of another type (a function, a generator, an object) fails the test with a ``TypeError``.

:func:`run_python` runs a plain program in one process and reports how it ended ("passed" = it ran to
its end without an exception). That is the program's own account, so it is not a verdict on anything:
scoring code uses :func:`run_humaneval_check`.

**Host Unix sockets** stay reachable through the filesystem even without a network: every socket path
bound on the host (``/proc/net/unix``) that the hidden directories do not already cover is covered with
``/dev/null`` inside the sandbox, so ``connect()`` is refused.

Limits of the design: the program can read world-readable host files outside the hidden dirs (the
repository, /etc); Unix sockets bound in other network namespaces (containers) are not listed by the
host's ``/proc/net/unix`` and are not covered. (Shell sessions, below, do not have this limit: their
root holds only what a shell needs.)

The child side of the sandbox is this same file, run as a script (``python -I sandbox/__init__.py PARAMS``):
it therefore imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import random
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

__all__ = [
    "SandboxResult",
    "SandboxUnavailableError",
    "ShellLimits",
    "ShellResult",
    "ShellSession",
    "ShellSessionError",
    "build_humaneval_program",
    "check_sandbox",
    "run_batch",
    "run_humaneval_check",
    "run_python",
]

# Outcomes of a run (SandboxResult.status).
PASSED = "passed"  # ran to the end without an exception
FAILED = "failed"  # an assertion failed, or the program exited before reaching its end
ERROR = "error"  # any other exception (syntax error, NameError, a denied write, ...), or a sandbox error
TIMEOUT = "timeout"  # wall-clock (or CPU) time limit
MEMORY = "memory"  # the address-space limit was hit
CRASHED = "crashed"  # killed by a signal (segfault, ...) without reporting an outcome

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_PROCS = 32
DEFAULT_MAX_FILE_MB = 16  # largest file the program may write (its stdout/stderr files included)
DEFAULT_DISK_MB = 64  # size of the working directory (a tmpfs, so in memory, outside RLIMIT_AS)
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024

# Each run gets its own uid from this range (no /etc/passwd entry needed). A uid per run makes
# RLIMIT_NPROC count this run's processes only, and leftovers of a run are findable by uid.
UID_BASE = 3_100_000
UID_COUNT = 1_000_000

# Directories covered by an empty read-only tmpfs inside the sandbox: scratch space shared with the
# host (a write there would survive the run, a read could see other programs' files) and home dirs.
HIDDEN_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home")

_PROGRAM_NAME = "program.py"

# A shell session's command gets the write end of the submission channel on this descriptor (module doc).
SUBMIT_FD = 3
SUBMISSION_BYTES = 4096  # of what a command writes to the submission channel, the first this many are kept
PROCESS_SAMPLE_S = 0.05  # how often the server counts a running command's processes


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one program.

    ``passed`` is true only when the program ran to its end (for a HumanEval program: ``check``
    returned); ``status`` is one of ``passed``, ``failed``, ``error``, ``timeout``, ``memory``,
    ``crashed``; ``detail`` is a short human-readable reason (e.g. the exception type).
    """

    passed: bool
    status: str
    stdout: str
    stderr: str
    seconds: float
    returncode: int | None = None
    detail: str = ""


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot run on this machine (not root, no ``unshare``, namespaces refused, ...)."""


# --------------------------------------------------------------------------------------------------
# Parent side: the API the pipeline calls.
# --------------------------------------------------------------------------------------------------


def build_humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The program that HumanEval runs: prompt + completion, then the tests, then ``check(entry_point)``."""
    return f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"


def run_humaneval_check(
    prompt: str,
    completion: str,
    test: str,
    entry_point: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> SandboxResult:
    """Run a HumanEval-style completion against its tests in the sandbox; ``passed`` means all pass.

    The verdict comes from a separate tester process that the completion cannot reach (module
    docstring): ``prompt + completion`` run in the candidate process, ``prompt + test`` and
    ``check(entry_point)`` in the tester, which calls the entry point through a pipe.
    """
    check_sandbox()
    try:
        return _run_sandboxed(
            prompt + completion,
            tester_source=f"{prompt}\n\n{test}\n",
            entry_point=entry_point,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_procs=DEFAULT_MAX_PROCS,
            max_file_mb=DEFAULT_MAX_FILE_MB,
            disk_mb=DEFAULT_DISK_MB,
            max_output_bytes=DEFAULT_MAX_OUTPUT_BYTES,
        )
    except Exception as exc:  # noqa: BLE001 - the caller must go on whatever happened
        return SandboxResult(False, ERROR, "", f"sandbox error: {exc!r}", 0.0, None, f"sandbox error: {exc}")


def run_python(
    code: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_procs: int = DEFAULT_MAX_PROCS,
    max_file_mb: int = DEFAULT_MAX_FILE_MB,
    disk_mb: int = DEFAULT_DISK_MB,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> SandboxResult:
    """Run Python source in the sandbox and report what happened.

    Never raises for anything the program does; raises :class:`SandboxUnavailableError` only when the
    sandbox itself cannot work on this machine (checked once per process).
    """
    check_sandbox()
    try:
        return _run_sandboxed(
            code,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_procs=max_procs,
            max_file_mb=max_file_mb,
            disk_mb=disk_mb,
            max_output_bytes=max_output_bytes,
        )
    except Exception as exc:  # noqa: BLE001 - the caller must go on whatever happened
        return SandboxResult(False, ERROR, "", f"sandbox error: {exc!r}", 0.0, None, f"sandbox error: {exc}")


def run_batch(
    programs: Sequence[str],
    *,
    max_workers: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> list[SandboxResult]:
    """Run many programs (e.g. from :func:`build_humaneval_program`), at most ``max_workers`` at a time.

    Results come back in the order of ``programs``. Threads suffice for the concurrency: each run is
    a child process that the thread merely waits for.
    """
    from concurrent.futures import ThreadPoolExecutor

    check_sandbox()  # once, up front, so that a broken setup fails loudly instead of per program
    with ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix="sandbox") as pool:
        futures = [pool.submit(run_python, p, timeout_s=timeout_s, memory_mb=memory_mb) for p in programs]
        return [f.result() for f in futures]


_check_lock = threading.Lock()
_check_error: str | None = None
_checked = False


def check_sandbox() -> None:
    """Make sure the sandbox works here (once per process); raise :class:`SandboxUnavailableError` if not.

    Checks the prerequisites, then runs one trivial program through the whole sandbox.
    """
    global _checked, _check_error
    with _check_lock:
        if not _checked:
            _check_error = _probe()
            _checked = True
    if _check_error is not None:
        raise SandboxUnavailableError(_check_error)


def _probe() -> str | None:
    """None when the sandbox works, else why not."""
    if not sys.platform.startswith("linux"):
        return f"the code sandbox needs Linux namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return (
            "the code sandbox needs root (it creates mount/network/PID namespaces and runs the program "
            "under a throwaway unprivileged uid); run the pipeline as root"
        )
    if shutil.which("unshare") is None:
        return "the code sandbox needs `unshare` from util-linux: apt-get install -y util-linux"
    try:
        res = _run_sandboxed(
            "print('sandbox-ok')",
            timeout_s=60.0,  # generous: the machine may be busy training
            memory_mb=DEFAULT_MEMORY_MB,
            max_procs=DEFAULT_MAX_PROCS,
            max_file_mb=1,
            disk_mb=1,
            max_output_bytes=4096,
        )
    except Exception as exc:  # noqa: BLE001 - reported to the caller as the reason
        return f"the code sandbox failed to start: {exc!r}"
    if not res.passed or res.stdout.strip() != "sandbox-ok":
        return f"the code sandbox does not work here ({res.status}: {res.detail}): {res.stderr.strip()[-2000:]}"
    return None


_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def _allocate_uid() -> int:
    # Random, so that several pipeline processes on one machine are very unlikely to share a uid.
    with _uid_lock:
        while True:
            uid = UID_BASE + random.randrange(UID_COUNT)
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process that runs as ``uid`` (normally none: the PID namespace took them)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            os.kill(int(entry), signal.SIGKILL)
                        break
        except (OSError, ValueError):
            continue  # the process went away meanwhile


def _read_capped(fh: IO[bytes], limit: int, *, keep: str) -> str:
    """At most ``limit`` bytes of an output file, its head (stdout) or tail (stderr, where tracebacks are)."""
    size = fh.seek(0, os.SEEK_END)
    if size <= limit:
        fh.seek(0)
        return fh.read().decode("utf-8", errors="replace")
    if keep == "head":
        fh.seek(0)
        return fh.read(limit).decode("utf-8", errors="replace") + f"\n[... {size - limit} bytes cut]"
    fh.seek(size - limit)
    return f"[{size - limit} bytes cut ...]\n" + fh.read(limit).decode("utf-8", errors="replace")


def host_unix_socket_paths(limit: int = 4096) -> list[str]:
    """Filesystem paths of the Unix sockets bound in this network namespace (from ``/proc/net/unix``)."""
    paths: list[str] = []
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="surrogateescape") as fh:
            next(fh, None)  # header
            for line in fh:
                fields = line.rstrip("\n").split(None, 7)
                if len(fields) == 8 and fields[7].startswith("/"):
                    paths.append(fields[7])
    except OSError:
        return []
    return sorted(set(paths))[:limit]


def _run_sandboxed(
    code: str,
    *,
    tester_source: str | None = None,
    entry_point: str | None = None,
    timeout_s: float,
    memory_mb: int,
    max_procs: int,
    max_file_mb: int,
    disk_mb: int,
    max_output_bytes: int,
) -> SandboxResult:
    uid = _allocate_uid()
    tester_uid = _allocate_uid() if tester_source is not None else None
    # A host directory (root-only) that holds the source for the child; inside the sandbox a fresh
    # size-limited tmpfs owned by the sandbox uid is mounted on the same path as the working directory.
    workdir = tempfile.mkdtemp(prefix="tentalis-sandbox-")
    start = time.monotonic()
    try:
        program_path = os.path.join(workdir, _PROGRAM_NAME)
        with open(program_path, "w", encoding="utf-8") as fh:
            fh.write(code)
        tester_path = os.path.join(workdir, "tester.py")
        if tester_source is not None:
            with open(tester_path, "w", encoding="utf-8") as fh:
                fh.write(tester_source)

        # A nonce, sent on stdin, marks the child's outcome records: the program cannot forge an outcome
        # by printing or writing one, and exiting early (sys.exit(0), os._exit(0)) leaves no "ok" record.
        nonce = secrets.token_hex(16)
        cpu_s = max(1, math.ceil(timeout_s)) + 1
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            tempfile.TemporaryFile() as rec,
        ):
            params = {
                "workdir": workdir,
                "program": program_path,
                "uid": uid,
                "result_fd": rec.fileno(),
                "memory_bytes": int(memory_mb) * 1024 * 1024,
                "max_procs": int(max_procs),
                "cpu_s": cpu_s,
                "file_bytes": int(max_file_mb) * 1024 * 1024,
                "disk_bytes": int(disk_mb) * 1024 * 1024,
                "hide_sockets": host_unix_socket_paths(),
            }
            if tester_source is not None:
                params.update(tester=tester_path, tester_uid=tester_uid, entry_point=entry_point)
            cmd = [
                shutil.which("unshare") or "unshare",
                "--mount", "--net", "--pid", "--ipc", "--uts",
                "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
                "--",
                sys.executable, "-I", "-B", os.path.abspath(__file__), json.dumps(params),
            ]  # fmt: skip
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
            }
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                pass_fds=(rec.fileno(),),
                cwd=workdir,
                env=env,
                start_new_session=True,  # its own process group, killed as a whole on timeout
            )
            timed_out = False
            try:
                with contextlib.suppress(BrokenPipeError, OSError):
                    assert proc.stdin is not None
                    proc.stdin.write(nonce.encode() + b"\n")
                    proc.stdin.close()
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
            finally:
                if proc.returncode is None:
                    # Kill the program's processes first (the PID namespace's init among them, and with
                    # it the whole namespace), so that `unshare` lives to reap them: killed together,
                    # the init would be left as a zombie for the host's init to reap.
                    _kill_uid(uid)
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        # Still in setup (running as root), or stuck: the whole process group. It is not
                        # reaped yet, so its process group id cannot have been reused.
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            seconds = time.monotonic() - start
            stdout = _read_capped(out, max_output_bytes, keep="head")
            stderr = _read_capped(err, max_output_bytes, keep="tail")
            records = _read_records(rec, nonce)
        return _classify(records, proc.returncode, timed_out, stdout, stderr, seconds)
    finally:
        for u in (uid, tester_uid):
            if u is not None:
                _kill_uid(u)
                _release_uid(u)
        shutil.rmtree(workdir, ignore_errors=True)


def _read_records(fh: IO[bytes], nonce: str) -> list[dict]:
    fh.seek(0)
    data = fh.read(1024 * 1024).decode("utf-8", errors="replace")
    records = []
    prefix = f"{nonce} "
    for line in data.splitlines():
        if line.startswith(prefix):
            with contextlib.suppress(ValueError):
                records.append(json.loads(line[len(prefix):]))
    return records


def _classify(
    records: list[dict], returncode: int | None, timed_out: bool, stdout: str, stderr: str, seconds: float
) -> SandboxResult:
    def result(status: str, detail: str) -> SandboxResult:
        return SandboxResult(status == PASSED, status, stdout, stderr, seconds, returncode, detail)

    final = next((r for r in reversed(records) if r.get("event") == "end"), None)
    if timed_out:
        return result(TIMEOUT, "wall-clock time limit")
    if final is None:
        # The program never reported an outcome: it exited early, or was killed.
        if not any(r.get("event") == "start" for r in records):
            return result(ERROR, "sandbox did not start")
        if returncode is not None and returncode < 0:
            sig = -returncode
            if sig == signal.SIGXCPU:
                return result(TIMEOUT, "CPU time limit")
            if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
                return result(MEMORY, "memory limit")
            return result(CRASHED, f"killed by {signal.Signals(sig).name}")
        if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
            return result(MEMORY, "memory limit")
        return result(FAILED, f"exited (code {returncode}) before the end of the program")
    outcome = final.get("outcome")
    if outcome == "ok":
        if returncode == 0:
            return result(PASSED, "ok")
        return result(FAILED, f"exit code {returncode}")
    if outcome == "sandbox_error":
        return result(ERROR, f"sandbox setup failed: {final.get('message', '')}")
    exc_type = str(final.get("type", ""))
    message = str(final.get("message", ""))[:500]
    if exc_type == "AssertionError":
        return result(FAILED, f"AssertionError: {message}".rstrip(": "))
    if exc_type == "MemoryError":
        return result(MEMORY, "memory limit (MemoryError)")
    if exc_type == "SystemExit":
        return result(FAILED, f"program called exit({message}) before its end")
    if exc_type == _CANDIDATE_EXITED:
        return result(FAILED, f"the candidate process ended before the tests did: {message}")
    return result(ERROR, f"{exc_type}: {message}".rstrip(": "))


# --------------------------------------------------------------------------------------------------
# Child side: runs inside the namespaces created by `unshare`, first as root (to arrange the mounts),
# then as the throwaway uid (to run the program). Standard library only.
# --------------------------------------------------------------------------------------------------

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


class _SetupError(Exception):
    pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _enc(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    if libc.mount(_enc(source), _enc(target), _enc(fstype), flags, _enc(data)) != 0:
        e = ctypes.get_errno()
        raise _SetupError(f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}): {os.strerror(e)}")


def _mountinfo() -> list[tuple[int, int, str, set[str]]]:
    """(mount id, parent id, mount point, per-mount options) for every mount in this namespace."""
    mounts = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            # Mount points escape space, tab, newline and backslash as octal.
            point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode()
            mounts.append((int(fields[0]), int(fields[1]), point, set(fields[5].split(","))))
    return mounts


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    """The paths that are not inside another one of them."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _blocking_ancestor(path: str) -> str | None:
    """The outermost directory on the way to ``path`` that an unrelated uid cannot traverse (no o+x)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        try:
            if not os.stat(d).st_mode & 0o001:
                return d
        except OSError:
            return None
    return None


def _setup_filesystem(libc: ctypes.CDLL, workdir: str, uid: int, disk_bytes: int,
                      hide_sockets: Sequence[str] = (), hide_dirs: Sequence[str] = (), inodes: int = 4096) -> None:
    """Make everything read-only except ``workdir``; hide scratch and home dirs (and ``hide_dirs``) and
    host Unix sockets; keep Python reachable."""
    # Python must stay importable for the unprivileged uid: its prefixes may sit under a hidden dir
    # (a venv in /tmp) or under a directory closed to other users (pyenv in /root, mode 0700).
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    needed = _outermost([
        os.path.realpath(p)
        for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, exe_dir)
        if os.path.isdir(p)
    ])
    needed = [p for p in needed if p != "/"]
    overlays = [os.path.realpath(d) for d in (*HIDDEN_DIRS, *hide_dirs) if os.path.isdir(d) and not os.path.islink(d)]
    for p in [*needed, workdir]:
        blocker = _blocking_ancestor(p)
        if blocker is not None:
            overlays.append(blocker)
    overlays = [d for d in _outermost(overlays) if d != "/"]

    # Handles to what we re-mount inside the overlays, taken before the overlays hide them.
    flags = getattr(os, "O_PATH", 0o10000000) | os.O_DIRECTORY
    exposed = [(p, os.open(p, flags)) for p in needed if any(_under(p, o) for o in overlays)]

    # 1. No mount event may leak to the host (unshare already made everything private; belt and braces).
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # 2. Every existing mount read-only and nosuid; keep nodev/noexec where they were.
    for _mid, _parent, point, opts in _mountinfo():
        keep = (MS_NODEV if "nodev" in opts else 0) | (MS_NOEXEC if "noexec" in opts else 0)
        try:
            _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep)
        except _SetupError:
            if os.path.exists(point):
                raise
            # A mount point that is no longer reachable (overmounted) cannot be written through.
    # 3. Empty tmpfs over scratch and closed directories (read-only once the exposures are in).
    for d in overlays:
        _mount(libc, "tentalis-sandbox", d, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # 4. Python back in, read-only.
    for path, fd in exposed:
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        os.close(fd)
    # 4b. Host Unix sockets outside the overlays: connect() needs only the path, and a read-only mount
    #     does not stop it. /dev/null on top makes the path a character device, so connect() is refused.
    for path in hide_sockets:
        if any(_under(path, o) for o in overlays):
            continue
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except OSError:
            continue  # gone since the parent listed it
        _mount(libc, "/dev/null", path, None, MS_BIND)
        _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # 5. The working directory, the one writable place: a size-limited tmpfs owned by the sandbox uid
    #    (a host directory would let the program fill the host disk); it vanishes with the namespace.
    os.makedirs(workdir, exist_ok=True)
    _mount(libc, "tentalis-sandbox-work", workdir, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=0700,uid={uid},gid={uid},size={max(1, disk_bytes // 1024)}k,nr_inodes={int(inodes)}")
    for d in overlays:
        _mount(libc, None, d, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=1m")

    # 6. Verify: every reachable mount but the working directory is read-only.
    mounts = _mountinfo()
    shadowed = {parent for _mid, parent, point, _o in mounts for pid, _p, ppoint, _o2 in mounts
                if pid == parent and ppoint == point}
    for mid, _parent, point, opts in mounts:
        if mid in shadowed or point == workdir:
            continue
        if "ro" not in opts:
            raise _SetupError(f"mount {point} is still writable")


# ---- the shell session's filesystem: a fresh root that holds only what a shell needs ------------------

# What of the host a shell session sees (read-only): the system's programs and libraries, and these /etc
# entries (names, or prefixes ending in ``*``). Nothing else of the host: no /home, /root, /work, /opt,
# /srv, /mnt, /var, /sys; /etc's credentials and tool configs (gitconfig, pip.conf, npmrc, ssh, ssl,
# shadow) stay out. /etc/passwd and /etc/group are written for the session (root and the agent).
SHELL_ROOT_DIRS = ("usr",)
SHELL_ROOT_MAYBE_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SHELL_ETC = ("alternatives", "bash.bashrc", "debian_version", "gai.conf", "host.conf", "hosts", "inputrc",
             "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "localtime", "magic", "magic.mime",
             "mime.types", "mtab", "nsswitch.conf", "os-release", "perl", "profile", "protocols", "python3*",
             "services", "shells", "terminfo", "timezone", "vim")
SHELL_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# Empty, read-only directories of the fresh root (a write there fails with "Read-only file system").
SHELL_EMPTY_DIRS = ("tmp", "var/tmp", "run", "dev/shm", "home")
# pivot_root(2) has no libc wrapper: its system call number per architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
MNT_DETACH = 2


def _shell_etc_entries() -> list[str]:
    names = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/etc")):
            if any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in SHELL_ETC):
                names.append(name)
    return names


def _bind_ro(libc: ctypes.CDLL, source: str, target: str, flags: int = MS_NOSUID) -> None:
    """Bind ``source`` (not its submounts) on ``target``, then make that mount read-only."""
    _mount(libc, source, target, None, MS_BIND)
    _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def _setup_shell_root(libc: ctypes.CDLL, params: dict) -> None:  # pragma: no cover - in the sandbox
    """Build a fresh root for a shell session and pivot into it (module doc): /usr (and the /bin, /lib*
    links), a minimal /etc, a minimal /dev, a fresh read-only /proc of the session's PID namespace, empty
    read-only /tmp, /var/tmp, /run, /home, and the working directory, the one writable place. The host's
    root is detached afterwards: nothing else of it is reachable from inside."""
    workdir, uid = params["workdir"], int(params["uid"])
    new = "/tmp"  # any directory will do: the mount namespace is private, the host never sees this tmpfs
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    _mount(libc, "tentalis-root", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")
    bound: list[str] = []
    for name in SHELL_ROOT_DIRS:
        os.mkdir(f"{new}/{name}", 0o755)
        _bind_ro(libc, f"/{name}", f"{new}/{name}")
        bound.append(f"/{name}")
    for name in SHELL_ROOT_MAYBE_LINKS:
        host = f"/{name}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{new}/{name}")
        elif os.path.isdir(host):
            os.mkdir(f"{new}/{name}", 0o755)
            _bind_ro(libc, host, f"{new}/{name}")
            bound.append(host)
    # /etc: the session's own passwd and group, and the entries a shell and its tools read.
    os.mkdir(f"{new}/etc", 0o755)
    with open(f"{new}/etc/passwd", "w") as fh:
        fh.write(f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nagent:x:{uid}:{uid}:agent:{workdir}:/bin/bash\n")
    with open(f"{new}/etc/group", "w") as fh:
        fh.write(f"root:x:0:\nagent:x:{uid}:\n")
    for name in _shell_etc_entries():
        host, target = f"/etc/{name}", f"{new}/etc/{name}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), target)
            continue
        if os.path.isdir(host):
            os.mkdir(target, 0o755)
        elif os.path.isfile(host):
            open(target, "w").close()  # noqa: SIM115 - a mount point for the bind
        else:
            continue
        _bind_ro(libc, host, target)
        bound.append(host)
    # /dev: the harmless character devices, bound from the host (a device node on a read-only mount can
    # still be written: `> /dev/null` works), and the /proc/self/fd links.
    os.makedirs(f"{new}/dev", 0o755)
    for name in SHELL_DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{new}/dev/{name}", "w").close()  # noqa: SIM115 - a mount point for the bind
            _bind_ro(libc, f"/dev/{name}", f"{new}/dev/{name}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    for d in SHELL_EMPTY_DIRS:
        os.makedirs(f"{new}/{d}", 0o755, exist_ok=True)
    # Host Unix sockets and hidden directories that lie inside what was bound.
    for path in params.get("hide_sockets", ()):
        if any(_under(path, b) for b in bound):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    _bind_ro(libc, "/dev/null", new + path, MS_NOSUID | MS_NODEV)
    for d in params.get("hide_dirs", ()):
        if any(_under(d, b) for b in bound) and os.path.isdir(d):
            _mount(libc, "tentalis-hidden", new + d, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755,size=4k")
    os.mkdir(f"{new}/proc", 0o555)
    _mount(libc, "proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    os.makedirs(new + workdir, 0o755, exist_ok=True)
    _mount(libc, "tentalis-sandbox-work", new + workdir, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=0700,uid={uid},gid={uid},size={max(1, int(params['disk_bytes']) // 1024)}k,"
           f"nr_inodes={int(params['inodes'])}")
    # Into the new root; the host's root is detached (lazily: nothing of it stays reachable).
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise _SetupError(f"no pivot_root system call number for {os.uname().machine}")
    os.chdir(new)
    if libc.syscall(number, b".", b".") != 0:
        raise _SetupError(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    if libc.umount2(b".", MNT_DETACH) != 0:
        raise _SetupError(f"umount2 of the host's root: {os.strerror(ctypes.get_errno())}")
    os.chdir("/")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # Verify: the host's root is gone, and every mount but the working directory is read-only.
    mounts = _mountinfo()
    shadowed = {parent for _mid, parent, point, _o in mounts for pid, _p, ppoint, _o2 in mounts
                if pid == parent and ppoint == point}
    for mid, _parent, point, opts in mounts:
        if mid in shadowed or point == workdir:
            continue
        if "ro" not in opts:
            raise _SetupError(f"mount {point} is still writable")


def _drop_privileges(libc: ctypes.CDLL, uid: int) -> None:
    # no_new_privs: setuid-root binaries (su, mount, ...) cannot give root back.
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _SetupError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # all capabilities go with uid 0
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise _SetupError("could not drop root")
    # Changing uid made the process non-dumpable, which makes /proc/self root-owned and unreadable
    # to the program itself; only processes of this sandbox could see it anyway.
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _set_limits(params: dict) -> None:
    limits = {
        resource.RLIMIT_AS: params["memory_bytes"],
        resource.RLIMIT_NPROC: params["max_procs"],  # binds once we are not root; counts threads too
        resource.RLIMIT_FSIZE: params["file_bytes"],
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    # Soft CPU limit sends SIGXCPU, the hard one a SIGKILL a second later.
    resource.setrlimit(resource.RLIMIT_CPU, (params["cpu_s"], params["cpu_s"] + 1))


# ---- two processes: the candidate answers calls, the tester decides ---------------------------------

_CANDIDATE_EXITED = "CandidateExited"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_MAX_DEPTH = 64


class _CandidateError(Exception):
    """An exception raised by the candidate's code, rebuilt in the tester by name and message only."""

    def __init__(self, remote_type: str, message: str):
        super().__init__(message)
        self.remote_type = remote_type


def encode_value(value: object, depth: int = 0) -> object:
    """A Python value as tagged JSON (exact for the types HumanEval uses); TypeError for anything else."""
    if depth > _MAX_DEPTH:
        raise TypeError("value nested too deeply to cross the sandbox")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"i": str(value)}  # as text: JSON numbers lose big ints in some readers
    if isinstance(value, float):
        return {"f": repr(value)}  # repr round-trips exactly, including -0.0, inf and nan
    if isinstance(value, bytes):
        return {"b": value.hex()}
    if isinstance(value, list):
        return [encode_value(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"t": [encode_value(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"fs": [encode_value(v, depth + 1) for v in value]}
    if isinstance(value, set):
        return {"s": [encode_value(v, depth + 1) for v in value]}
    raise TypeError(f"a value of type {type(value).__name__} cannot cross the sandbox (data types only)")


def decode_value(data: object, depth: int = 0) -> object:
    """The inverse of :func:`encode_value`; builds only built-in data types, whatever ``data`` holds."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or isinstance(data, (bool, str)):
        return data
    if isinstance(data, list):
        return [decode_value(v, depth + 1) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        (tag, v), = data.items()
        if tag == "i" and isinstance(v, str):
            return int(v)
        if tag == "f" and isinstance(v, str):
            return float(v)
        if tag == "b" and isinstance(v, str):
            return bytes.fromhex(v)
        if isinstance(v, list):
            if tag == "t":
                return tuple(decode_value(x, depth + 1) for x in v)
            if tag == "s":
                return {decode_value(x, depth + 1) for x in v}
            if tag == "fs":
                return frozenset(decode_value(x, depth + 1) for x in v)
            if tag == "d":
                return {decode_value(k, depth + 1): decode_value(x, depth + 1) for k, x in v}
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


def _send(fd: int, message: dict, write=os.write, dumps=json.dumps) -> None:
    payload = dumps(message).encode()
    data = len(payload).to_bytes(8, "big") + payload
    while data:
        data = data[write(fd, data):]


def _recv(fd: int, read=os.read, loads=json.loads) -> dict | None:
    """One message, or None at end of stream (the other side is gone)."""
    def exactly(n: int) -> bytes | None:
        chunks, got = [], 0
        while got < n:
            chunk = read(fd, min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    head = exactly(8)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > _MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes from the candidate (limit {_MAX_MESSAGE_BYTES})")
    body = exactly(size)
    if body is None:
        return None
    message = loads(body.decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError("malformed message from the candidate")
    return message


def _two_process_check(libc, params, source, tester_source, result_fd, record, print_exception):  # pragma: no cover
    """Fork the candidate (runs ``source``, serves calls) and become the tester (runs the tests). Never returns."""
    entry_point = str(params["entry_point"])
    calls_r, calls_w = os.pipe()
    replies_r, replies_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the candidate: it never holds the outcome descriptor
        try:
            os.close(result_fd)
            os.close(calls_w)
            os.close(replies_r)
            _drop_privileges(libc, int(params["uid"]))
        except BaseException:  # noqa: BLE001
            os._exit(3)
        _serve_candidate(source, entry_point, calls_r, replies_w, print_exception)
    os.close(calls_r)
    os.close(replies_w)
    try:
        _drop_privileges(libc, int(params["tester_uid"]))
        os.chdir("/")  # the working directory belongs to the candidate's uid
    except BaseException as exc:  # noqa: BLE001
        record(event="end", outcome="sandbox_error", message=f"{type(exc).__name__}: {exc}")
        os._exit(3)

    def remote_error(reply: dict | None) -> _CandidateError:
        if reply is None:
            return _CandidateError(_CANDIDATE_EXITED, "it exited or was killed")
        name, message = reply.get("raise", ["Error", ""])[:2]
        return _CandidateError(str(name)[:100], str(message)[:500])

    def candidate(*args, **kwargs):
        _send(calls_w, {"args": encode_value(list(args)), "kwargs": encode_value(kwargs)})
        reply = _recv(replies_r)
        if reply is None or "raise" in reply:
            raise remote_error(reply)
        return decode_value(reply.get("value"))

    code = 0
    try:
        hello = _recv(replies_r)
        if hello is None or "raise" in hello:
            raise remote_error(hello)
        globs = {"__name__": "__main__", "__file__": "tests.py"}
        exec(compile(tester_source, "tests.py", "exec"), globs)  # noqa: S102 - the benchmark's own tests
        globs["check"](candidate)
        outcome: dict[str, object] = {"outcome": "ok"}
    except BaseException as exc:  # noqa: BLE001 - every way the tests can end is an outcome
        code = 1
        name = exc.remote_type if isinstance(exc, _CandidateError) else type(exc).__name__
        message = str(exc.code) if isinstance(exc, SystemExit) else str(exc)
        outcome = {"outcome": "exception", "type": name, "message": message[:500]}
        if not isinstance(exc, _CandidateError):
            with contextlib.suppress(BaseException):
                print_exception(type(exc), exc, exc.__traceback__)
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(BaseException):
        record(event="end", **outcome)
    os._exit(code)  # as the namespace's init, this also ends the candidate


def _serve_candidate(source, entry_point, calls_r, replies_w, print_exception):  # pragma: no cover
    """The candidate process: run the model's code, then answer calls to ``entry_point`` until EOF."""
    send, recv, exit_ = _send, _recv, os._exit  # kept before the program can touch module globals

    def failure(exc: BaseException) -> dict:
        message = str(exc.code) if isinstance(exc, SystemExit) else str(exc)
        return {"raise": [type(exc).__name__, message[:500]]}

    globs = {"__name__": "__main__", "__file__": _PROGRAM_NAME, "__builtins__": __builtins__}
    try:
        exec(compile(source, _PROGRAM_NAME, "exec"), globs)  # noqa: S102 - that is the point, in the sandbox
        fn = globs.get(entry_point)
        if not callable(fn):
            raise NameError(f"name {entry_point!r} is not defined")
        send(replies_w, {"ready": True})
    except BaseException as exc:  # noqa: BLE001
        with contextlib.suppress(BaseException):
            print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        with contextlib.suppress(BaseException):
            send(replies_w, failure(exc))
        exit_(1)
    while True:
        try:
            call = recv(calls_r)
        except BaseException:  # noqa: BLE001
            exit_(1)
        if call is None:
            exit_(0)
        try:
            value = fn(*decode_value(call["args"]), **decode_value(call["kwargs"]))
            reply = {"value": encode_value(value)}
        except BaseException as exc:  # noqa: BLE001 - reported to the tester as the candidate's exception
            reply = failure(exc)
        try:
            send(replies_w, reply)
        except BaseException:  # noqa: BLE001
            exit_(1)


def _child_main(argv: list[str]) -> None:  # pragma: no cover - runs in the sandbox child
    import traceback

    print_exception = traceback.print_exception  # taken before the program can break the import system
    params = json.loads(argv[1])
    nonce = sys.stdin.readline().strip()
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    result_fd = int(params["result_fd"])
    write, dumps, flush = os.write, json.dumps, sys.stdout.flush  # kept before the program can touch them

    def record(**fields: object) -> None:
        write(result_fd, f"{nonce} {dumps(fields)}\n".encode())

    record(event="start")
    try:
        libc = _libc()
        with open(params["program"], encoding="utf-8") as fh:
            source = fh.read()
        tester_source = None
        if params.get("tester"):
            with open(params["tester"], encoding="utf-8") as fh:
                tester_source = fh.read()
        _setup_filesystem(libc, params["workdir"], int(params["uid"]), int(params["disk_bytes"]),
                          params.get("hide_sockets", ()))
        # The program's own copy, in the working directory (tracebacks and inspect read it from there).
        with open(os.path.join(params["workdir"], _PROGRAM_NAME), "w", encoding="utf-8") as fh:
            fh.write(source)
        os.chdir(params["workdir"])
        _set_limits(params)
        if tester_source is None:
            _drop_privileges(libc, int(params["uid"]))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, the program does not run
        record(event="end", outcome="sandbox_error", message=f"{type(exc).__name__}: {exc}")
        os._exit(3)

    if tester_source is not None:
        _two_process_check(libc, params, source, tester_source, result_fd, record, print_exception)

    del params, argv
    globs = {"__name__": "__main__", "__file__": _PROGRAM_NAME, "__builtins__": __builtins__}
    code = 0
    try:
        exec(compile(source, _PROGRAM_NAME, "exec"), globs)  # noqa: S102 - that is the point, in the sandbox
        outcome: dict[str, object] = {"outcome": "ok"}
    except BaseException as exc:  # noqa: BLE001 - every way a program can end is an outcome
        code = 1
        message = str(exc.code) if isinstance(exc, SystemExit) else str(exc)
        outcome = {"outcome": "exception", "type": type(exc).__name__, "message": message[:500]}
        with contextlib.suppress(BaseException):
            # The traceback from the program's own frames on (not this harness's).
            print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
    with contextlib.suppress(BaseException):
        flush()
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(BaseException):
        record(event="end", **outcome)
    # _exit: skip atexit handlers and threads the program left behind.
    os._exit(code)



# --------------------------------------------------------------------------------------------------
# Shell sessions: one sandbox per agent episode, many bash commands in it.
# --------------------------------------------------------------------------------------------------
#
# An agent environment runs one shell command per turn, and the files a command writes must be there for
# the next one. A ShellSession is one sandbox (the same namespaces as above) that lives for the whole
# episode. Its filesystem is a fresh root that holds only what a shell needs (``_setup_shell_root``: /usr,
# a minimal /etc and /dev, its own /proc, empty read-only /tmp; the host's root is detached, so /work,
# /root, /home and every other host file are simply not there). Its working directory is the same size-
# and inode-limited tmpfs as a program's (not a host directory: that would let a command fill the host's
# disk), seeded with the episode's file tree. Its processes together are held to ``episode_memory_mb``
# by a memory cgroup where the host allows one (``_EpisodeCgroup``), else by RLIMIT_AS x RLIMIT_NPROC.
# What a command did is reported from what the sandbox observed, never from its output: the process
# count, the cgroup's OOM kills, the network namespace's no-route counter, and the submission channel
# (a pipe on SUBMIT_FD that the server reads apart from the output). Inside, the namespace's init is a small server,
# root in the namespace, that never runs anything it is sent: for each command it forks a child that
# drops to the session's throwaway uid (no_new_privs, rlimits, no inherited descriptors, /dev/null as
# stdin) and execs ``bash -c COMMAND`` in the working directory. When that shell exits, or the time limit
# passes, every process of the uid is killed at once (``kill(-1)`` from a process of that uid, atomic in
# the kernel, so a fork bomb cannot outrun it) and reaped: nothing a command starts outlives it. The
# server keeps the first and last ``keep_output_bytes`` of the command's output (stdout and stderr
# together, as a terminal shows them) and counts the rest, so memory stays bounded whatever it prints.
# ``snapshot()`` reads the tree back (as root, never following a symlink, with no process of the uid
# alive) for the host to check; nothing in the tree is executed on the host.


# ---- the episode's memory limit: a cgroup where the host allows one -----------------------------------

CGROUP_ENV = "TENTALIS_SANDBOX_CGROUP"  # "0": never use a cgroup (the rlimit bound only)
MEMORY_CGROUP_V2 = "cgroup-v2"  # memory.max on the session's own cgroup: all its processes together
MEMORY_CGROUP_V1 = "cgroup-v1"  # memory.limit_in_bytes, the same on a v1 memory controller
MEMORY_RLIMIT = "rlimit"  # no cgroup: RLIMIT_AS per process x the process cap bounds the sum


class _EpisodeCgroup:
    """A memory cgroup for one shell session, made by the host side (the session's server only writes
    its command processes into it, through a descriptor it opened before leaving the host's root).

    ``create`` returns None where no cgroup can be made (no writable cgroup filesystem, the memory
    controller not delegated, ``TENTALIS_SANDBOX_CGROUP=0``); the session then falls back to the rlimit
    bound. ``oom_kills()`` is the kernel's count of processes killed at the limit: the signal a memory
    violation is decided from."""

    def __init__(self, path: str, kind: str):
        self.path, self.kind = path, kind

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> _EpisodeCgroup | None:
        if os.environ.get(CGROUP_ENV, "1") == "0" or not sys.platform.startswith("linux"):
            return None
        for kind, base in cls._bases():
            path = os.path.join(base, name)
            try:
                os.mkdir(path, 0o700)
            except OSError:
                continue
            group = cls(path, kind)
            try:
                if kind == MEMORY_CGROUP_V2:
                    group._write("memory.max", str(limit_bytes))
                    with contextlib.suppress(OSError):
                        group._write("memory.swap.max", "0")
                else:
                    group._write("memory.limit_in_bytes", str(limit_bytes))
                    with contextlib.suppress(OSError):
                        group._write("memory.memsw.limit_in_bytes", str(limit_bytes))
                group.oom_kills()  # readable, or not usable
            except (OSError, ValueError):
                group.remove()
                continue
            return group
        return None

    @staticmethod
    def _bases() -> list[tuple[str, str]]:
        """Where this process's cgroups are: the v2 one (if its memory controller is enabled for children,
        or can be), then the v1 memory controller's."""
        out: list[tuple[str, str]] = []
        try:
            with open("/proc/self/cgroup") as fh:
                lines = [ln.rstrip("\n").split(":", 2) for ln in fh]
            with open("/proc/self/mountinfo") as fh:
                mounts = [ln.split() for ln in fh]
        except OSError:
            return out
        for fields in mounts:
            sep = fields.index("-")
            fstype, point, super_opts = fields[sep + 1], fields[4], fields[sep + 3].split(",")
            for line in lines:
                if len(line) != 3:
                    continue
                hier, controllers, rel = line
                if fstype == "cgroup2" and hier == "0" and controllers == "":
                    base = os.path.normpath(point + rel)
                    with contextlib.suppress(OSError):
                        with open(os.path.join(base, "cgroup.subtree_control")) as fh:
                            enabled = fh.read().split()
                        if "memory" not in enabled:
                            with open(os.path.join(base, "cgroup.subtree_control"), "w") as fh:
                                fh.write("+memory")
                        out.append((MEMORY_CGROUP_V2, base))
                elif fstype == "cgroup" and "memory" in super_opts and "memory" in controllers.split(","):
                    out.append((MEMORY_CGROUP_V1, os.path.normpath(point + rel)))
        return out

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as fh:
            fh.write(value)

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_kills(self) -> int:
        """How many of the group's processes the kernel killed at the memory limit so far."""
        name = "memory.events" if self.kind == MEMORY_CGROUP_V2 else "memory.oom_control"
        with open(os.path.join(self.path, name)) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        raise ValueError(f"no oom_kill count in {name}")

    def remove(self) -> None:
        """Remove the (empty) group; retried briefly while the kernel finishes with its last processes."""
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)


@dataclass(frozen=True)
class ShellLimits:
    """Limits of a :class:`ShellSession` (per command unless stated)."""

    command_timeout_s: float = DEFAULT_TIMEOUT_S  # wall clock; the CPU limit is one second more
    memory_mb: int = DEFAULT_MEMORY_MB  # address space of each process
    episode_memory_mb: int = DEFAULT_MEMORY_MB  # memory of all the session's processes together (a cgroup)
    max_procs: int = 64  # processes (and threads) of the session's uid at once
    max_file_mb: int = 4  # largest file a command may write
    disk_mb: int = 16  # the working directory's size (a tmpfs, for the whole session)
    max_inodes: int = 2048  # files and directories in the working directory
    keep_output_bytes: int = 16 * 1024  # of a command's output, the first and the last this many bytes
    snapshot_max_bytes: int = 8 * 1024 * 1024  # file contents read back by snapshot()


@dataclass(frozen=True)
class ShellResult:
    """How one command ended. ``head`` + ``tail`` is its output (stdout and stderr interleaved) with
    ``omitted_bytes`` left out between them; ``exit_code`` is the shell's (128 + N for a signal);
    ``timed_out``: killed at the time limit; ``process_limit``: it ran into the process limit (a fork
    bomb: the server saw the session's uid at the cap); ``memory_limit``: the kernel killed a process at
    the episode's memory limit (the cgroup's OOM-kill count rose); ``network_attempts``: packets the
    session's network namespace had no route for (the kernel's ``OutNoRoutes`` counter: a connect or send
    to any IPv4 address); ``submitted``/``submission``: the command wrote to the submission channel
    (descriptor :data:`SUBMIT_FD`, read by the server alone; never its output); ``killed_processes``:
    processes it left running, killed when it ended; ``error``: the session itself failed (not the
    command), and it is closed. Every flag comes from what the sandbox observed, none from the output."""

    exit_code: int | None
    head: str
    tail: str
    output_bytes: int
    omitted_bytes: int
    seconds: float
    timed_out: bool = False
    process_limit: bool = False
    killed_processes: int = 0
    error: str = ""
    memory_limit: bool = False
    network_attempts: int = 0
    submitted: bool = False
    submission: str = ""


class ShellSessionError(RuntimeError):
    """The shell session could not start, or died (not something a command did)."""


def shell_workdir() -> str:
    """Where the working directory appears inside a shell session: ``/home/agent`` (``/tmp/agent`` on a
    host without ``/home``). Both lie under a hidden directory, so creating it touches nothing on the host."""
    for base in ("/home", "/tmp"):
        if os.path.isdir(base) and not os.path.islink(base):
            return f"{base}/agent"
    raise SandboxUnavailableError("a shell session needs /home or /tmp to exist")


def default_hidden_dirs() -> list[str]:
    """Host directories a shell session hides besides the scratch and home dirs: this project's tree
    (source, lakehouse, caches) and ``$TENTALIS_HOME``. (The Python installation stays visible, read-only.)"""
    dirs = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
    home = os.environ.get("TENTALIS_HOME")
    if home:
        dirs.append(os.path.abspath(home))
    return [d for d in dirs if d != "/" and os.path.isdir(d)]


def _encode_tree(files: dict[str, str | bytes]) -> dict[str, object]:
    out: dict[str, object] = {}
    for path, content in files.items():
        shell_tree_parts(path)  # refuse a bad path here, before anything starts
        if isinstance(content, bytes):
            out[path] = {"hex": content.hex()}
        elif isinstance(content, str):
            out[path] = content
        else:
            raise TypeError(f"content of {path!r} must be str or bytes, not {type(content).__name__}")
    return out


def shell_tree_parts(path: str) -> list[str]:
    """The components of a relative tree path (``a/b.txt``; ``a/`` names an empty directory);
    ValueError for an absolute path, ``..``, ``.`` or an empty component."""
    body = path[:-1] if path.endswith("/") else path
    parts = body.split("/")
    if not body or path.startswith("/") or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise ValueError(f"not a relative path inside the tree: {path!r}")
    return parts


class ShellSession:
    """One sandbox for one agent episode: ``run(command)`` as often as needed, ``snapshot()``, ``close()``.

    ``files`` (relative path -> text or bytes; a path ending in ``/`` is an empty directory) seeds the
    working directory; ``env`` adds variables to every command's (minimal) environment (an exported bash
    function is ``BASH_FUNC_name%%``); ``hide_dirs`` are covered where they lie inside what the session's
    root binds from the host (elsewhere they are not visible anyway). ``memory_limit`` says how the
    episode's memory is bounded: ``{"kind": "cgroup-v2" | "cgroup-v1" | "rlimit", "bytes": N}``. Raises :class:`SandboxUnavailableError` where the sandbox cannot work and
    :class:`ShellSessionError` when the session fails to start. Use as a context manager or call
    :meth:`close`.
    """

    def __init__(self, files: dict[str, str | bytes], limits: ShellLimits | None = None, *,
                 hide_dirs: Sequence[str] | None = None, env: dict[str, str] | None = None):
        check_sandbox()
        tree = _encode_tree(files)
        extra_env = {str(k): str(v) for k, v in (env or {}).items()}
        if any(not k or "=" in k or "\0" in k + v for k, v in extra_env.items()):
            raise ValueError("environment variable names must be non-empty, without '=' or NUL")
        self.limits = limits or ShellLimits()
        self.workdir = shell_workdir()
        self.uid = _allocate_uid()
        self._dead = ""
        self._closed = False
        self._reply_fd = -1
        lim = self.limits
        episode_bytes = int(lim.episode_memory_mb) * 1024 * 1024
        self._cgroup = _EpisodeCgroup.create(f"tentalis-sandbox-{self.uid}-{os.getpid()}", episode_bytes)
        # How the episode's memory is bounded (module doc), for the episode's record.
        self.memory_limit = (
            {"kind": self._cgroup.kind, "bytes": episode_bytes} if self._cgroup is not None else
            {"kind": MEMORY_RLIMIT, "bytes": int(lim.memory_mb) * 1024 * 1024 * int(lim.max_procs)}
        )
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - the session's server log, closed by close()
        reply_r, reply_w = os.pipe()
        params = {
            "mode": "shell",
            "workdir": self.workdir,
            "uid": self.uid,
            "reply_fd": reply_w,
            "bash": shutil.which("bash") or "/bin/bash",
            "memory_bytes": int(lim.memory_mb) * 1024 * 1024,
            "max_procs": int(lim.max_procs),
            "file_bytes": int(lim.max_file_mb) * 1024 * 1024,
            "disk_bytes": int(lim.disk_mb) * 1024 * 1024,
            "inodes": int(lim.max_inodes),
            "keep_bytes": int(lim.keep_output_bytes),
            "snapshot_max_bytes": int(lim.snapshot_max_bytes),
            "hide_sockets": host_unix_socket_paths(),
            "extra_env": extra_env,
            "hide_dirs": default_hidden_dirs() if hide_dirs is None else [os.path.abspath(d) for d in hide_dirs],
            "cgroup_procs": self._cgroup.procs_file if self._cgroup is not None else None,
        }
        cmd = [
            shutil.which("unshare") or "unshare",
            "--mount", "--net", "--pid", "--ipc", "--uts",
            "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
            "--",
            sys.executable, "-I", "-B", os.path.abspath(__file__), json.dumps(params),
        ]  # fmt: skip
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=self._log, stderr=self._log, pass_fds=(reply_w,), cwd="/",
                env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True,
            )
        except BaseException:
            os.close(reply_r)
            os.close(reply_w)
            self._closed = True
            _release_uid(self.uid)
            self._log.close()
            if self._cgroup is not None:
                self._cgroup.remove()
            raise
        os.close(reply_w)
        self._reply_fd = reply_r
        reply = self._request({"op": "init", "files": tree}, timeout_s=60.0)
        if "ok" not in reply:
            why = reply.get("error") or self._dead or "no reply"
            self.close()
            raise ShellSessionError(f"the shell session did not start: {why}")

    # -- requests ------------------------------------------------------------------------------------
    def _request(self, message: dict, *, timeout_s: float) -> dict:
        if self._closed or self._dead:
            return {"error": self._dead or "the session is closed"}
        try:
            assert self._proc.stdin is not None
            payload = json.dumps(message).encode()
            self._proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
            self._proc.stdin.flush()
            reply = self._read_reply(time.monotonic() + timeout_s)
        except Exception as exc:  # noqa: BLE001 - a broken pipe, a garbled frame: the session is over
            reply = None
            self._dead = f"the shell session failed: {type(exc).__name__}: {exc}"
        if reply is None:
            self._dead = self._dead or f"the shell session stopped answering ({self._log_tail()})"
            self._terminate()
            return {"error": self._dead}
        return reply

    def _read_reply(self, deadline: float) -> dict | None:
        import select

        buf = bytearray()
        need = 8
        size = None
        while len(buf) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._reply_fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self._reply_fd, need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if size is None and len(buf) >= 8:
                size = int.from_bytes(buf[:8], "big")
                if size > 4 * _MAX_MESSAGE_BYTES:
                    raise ValueError(f"reply of {size} bytes")
                need = 8 + size
        message = json.loads(bytes(buf[8:need]).decode("utf-8"))
        if not isinstance(message, dict):
            raise ValueError("malformed reply")
        return message

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            size = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, size - 2000))
            return self._log.read().decode("utf-8", errors="replace").strip() or "no output"
        return "no output"

    # -- the API -------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not (self._closed or self._dead)

    @property
    def pid(self) -> int:
        """The host pid of the session's ``unshare`` (its process group is the session's)."""
        return self._proc.pid

    def run(self, command: str, *, timeout_s: float | None = None) -> ShellResult:
        """Run ``bash -c command`` in the working directory; never raises for what the command does."""
        limit = self.limits.command_timeout_s if timeout_s is None else float(timeout_s)
        oom_before = self._oom_kills()
        reply = self._request({"op": "run", "command": command, "timeout_s": limit}, timeout_s=limit + 30.0)
        if "error" in reply:
            return ShellResult(None, "", "", 0, 0, 0.0, error=str(reply["error"]))
        oom_after = self._oom_kills()
        return ShellResult(
            exit_code=reply.get("exit_code"), head=reply.get("head", ""), tail=reply.get("tail", ""),
            output_bytes=int(reply.get("output_bytes", 0)), omitted_bytes=int(reply.get("omitted_bytes", 0)),
            seconds=float(reply.get("seconds", 0.0)), timed_out=bool(reply.get("timed_out")),
            process_limit=bool(reply.get("process_limit")), killed_processes=int(reply.get("killed", 0)),
            memory_limit=oom_before is not None and oom_after is not None and oom_after > oom_before,
            network_attempts=int(reply.get("network_attempts", 0)),
            submitted=bool(reply.get("submitted")), submission=str(reply.get("submission", "")),
        )

    def _oom_kills(self) -> int | None:
        if self._cgroup is None:
            return None
        try:
            return self._cgroup.oom_kills()
        except (OSError, ValueError):
            return None

    def snapshot(self, first: Sequence[str] = ()) -> dict[str, dict]:
        """The working directory as it is now: relative path -> entry, where an entry is ``{"type":
        "file", "text": ..., "mode": ...}`` (``"hex"`` instead of ``"text"`` for bytes that are not
        UTF-8; ``"truncated": true`` past ``snapshot_max_bytes``), ``{"type": "dir"}``, ``{"type":
        "symlink", "target": ...}``, ``{"type": "other"}`` or ``{"type": "unreadable", "error": ...}``.
        The files named in ``first`` (relative paths) are read before any other, so that unrelated large
        files cannot use up the budget they need; however deep the agent made the tree, it is read (by
        directory descriptors, never by a path too long for the kernel). Raises ShellSessionError if the
        session died."""
        reply = self._request({"op": "snapshot", "first": [str(p) for p in first]}, timeout_s=60.0)
        if "error" in reply:
            raise ShellSessionError(str(reply["error"]))
        return dict(reply["tree"])

    def close(self) -> None:
        """End the session: every process in it is killed and its working directory vanishes."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            if not self._dead and self._proc.stdin is not None:
                payload = json.dumps({"op": "close"}).encode()
                self._proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
                self._proc.stdin.flush()
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=5)
        self._terminate()
        with contextlib.suppress(OSError):
            if self._reply_fd >= 0:
                os.close(self._reply_fd)
        self._reply_fd = -1
        with contextlib.suppress(Exception):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        self._log.close()
        _release_uid(self.uid)
        if self._cgroup is not None:
            self._cgroup.remove()

    def _terminate(self) -> None:
        """Kill whatever is left of the session (its uid's processes, then the process group)."""
        _kill_uid(self.uid)
        if self._proc.returncode is None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        _kill_uid(self.uid)

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the shell session's server, inside the namespace (standard library only) ------------------------

def _shell_main(params: dict) -> None:  # pragma: no cover - runs in the sandbox child
    import select

    reply_fd = int(params["reply_fd"])
    os.umask(0o022)

    def reply(message: dict) -> None:
        _send(reply_fd, message)

    try:
        init = _recv(0)  # read first: the host's write of a large tree must not wait for the setup
        if init is None:
            os._exit(0)
        libc = _libc()
        # The snapshot walks a tree as deep as the agent made it with one descriptor per level.
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
        if params.get("cgroup_procs"):
            # Opened on the host's root, before it is detached: each command's process joins through it.
            params["_cgroup_fd"] = os.open(params["cgroup_procs"], os.O_WRONLY | os.O_CLOEXEC)
        # Codecs load lazily, from the Python installation that the new root no longer holds.
        b"x".decode("unicode_escape").encode("latin-1").decode("utf-8", errors="replace")
        _setup_shell_root(libc, params)
        _shell_write_tree(params["workdir"], init.get("files") or {}, int(params["uid"]))
    except Exception as exc:  # noqa: BLE001 - reported to the host, the session does not start
        with contextlib.suppress(Exception):
            reply({"error": f"{type(exc).__name__}: {exc}"})
        os._exit(3)
    reply({"ok": True})
    while True:
        try:
            message = _recv(0)
        except Exception:  # noqa: BLE001 - a garbled request: end the session
            message = None
        if message is None or message.get("op") == "close":
            _shell_kill_all(int(params["uid"]))
            os._exit(0)
        try:
            if message.get("op") == "run":
                answer = _shell_run(libc, params, str(message["command"]), float(message["timeout_s"]), select)
            elif message.get("op") == "snapshot":
                answer = {"tree": _shell_snapshot(params["workdir"], int(params["snapshot_max_bytes"]),
                                                  [str(p) for p in message.get("first") or []])}
            else:
                answer = {"error": f"unknown request {message.get('op')!r}"}
        except Exception as exc:  # noqa: BLE001 - the session goes on; the host sees the reason
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        reply(answer)


def _shell_write_tree(root: str, files: dict, uid: int) -> None:  # pragma: no cover - in the sandbox
    for rel, content in files.items():
        parts = shell_tree_parts(rel)
        is_dir = rel.endswith("/")
        d = root
        for part in parts if is_dir else parts[:-1]:
            d = os.path.join(d, part)
            if not os.path.isdir(d):
                os.mkdir(d, 0o755)
                os.lchown(d, uid, uid)
        if is_dir:
            continue
        data = bytes.fromhex(content["hex"]) if isinstance(content, dict) else str(content).encode("utf-8")
        path = os.path.join(d, parts[-1])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.lchown(path, uid, uid)


def _shell_pids(uid: int, *, zombies: bool = False) -> list[int]:  # pragma: no cover - in the sandbox
    """Processes of ``uid`` in this PID namespace (its own /proc), zombies left out unless asked."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                state, owner = "", -1
                for line in fh:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        owner = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
        if owner == uid and (zombies or state not in ("Z", "X")):
            out.append(int(entry))
    return out


def _shell_reap(statuses: dict[int, int]) -> None:  # pragma: no cover - in the sandbox
    """Reap every exited child (as the namespace's init, orphans are ours too)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def _shell_kill_all(uid: int, statuses: dict[int, int] | None = None) -> int:  # pragma: no cover
    """SIGKILL every process of ``uid`` and reap them; how many were alive at first."""
    statuses = {} if statuses is None else statuses
    first = None
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        alive = _shell_pids(uid)
        if first is None:
            first = len(alive)
        if alive:
            killer = os.fork()
            if killer == 0:
                try:
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    os.kill(-1, signal.SIGKILL)  # every process this uid may signal, atomically; not itself
                finally:
                    os._exit(0)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(killer, 0)
        _shell_reap(statuses)
        if not _shell_pids(uid, zombies=True):
            break
        time.sleep(0.002)
    return first or 0


def _shell_exec(libc: ctypes.CDLL, params: dict, command: str, out_fd: int, submit_fd: int,
                timeout_s: float) -> None:  # pragma: no cover
    """The forked child: the episode's cgroup, limits, the uid, then ``bash -c command``. Never returns."""
    try:
        if params.get("_cgroup_fd") is not None:
            os.write(int(params["_cgroup_fd"]), b"0")  # this process, and so all it starts
        os.setsid()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.dup2(submit_fd, SUBMIT_FD, inheritable=True)
        os.closerange(SUBMIT_FD + 1, 1 << 20)  # the request and reply pipes never reach the command
        workdir = params["workdir"]
        os.chdir(workdir)
        limits = {
            resource.RLIMIT_AS: int(params["memory_bytes"]),
            resource.RLIMIT_NPROC: int(params["max_procs"]),
            resource.RLIMIT_FSIZE: int(params["file_bytes"]),
            resource.RLIMIT_NOFILE: 256,
            resource.RLIMIT_CORE: 0,
        }
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))
        cpu = max(1, math.ceil(timeout_s)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        _drop_privileges(libc, int(params["uid"]))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "PWD": workdir,
               "LANG": "C.UTF-8", "TERM": "dumb", "PAGER": "cat", "USER": "agent", "LOGNAME": "agent",
               **params.get("extra_env", {})}
        os.execve(params["bash"], [params["bash"], "-c", command], env)
    except BaseException:  # noqa: BLE001
        pass
    os._exit(127)


def _shell_run(libc: ctypes.CDLL, params: dict, command: str, timeout_s: float, select) -> dict:  # pragma: no cover
    """Run one command to its end or its time limit, then kill what it left; its output kept head and tail."""
    uid, keep = int(params["uid"]), int(params["keep_bytes"])
    start = time.monotonic()
    no_routes = _shell_no_routes()
    out_r, out_w = os.pipe()
    submit_r, submit_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _shell_exec(libc, params, command, out_w, submit_w, timeout_s)
    os.close(out_w)
    os.close(submit_w)
    head, tail = bytearray(), bytearray()
    total = 0
    submission, submit_bytes = bytearray(), 0

    def take_submission() -> bool:
        """Read what is waiting on the submission channel (at most SUBMISSION_BYTES kept); False at EOF."""
        nonlocal submit_bytes
        chunk = os.read(submit_r, 1 << 16)
        submit_bytes += len(chunk)
        submission.extend(chunk[: max(0, SUBMISSION_BYTES - len(submission))])
        return bool(chunk)

    def absorb(chunk: bytes) -> None:
        nonlocal total
        total += len(chunk)
        if len(head) < keep:
            take = keep - len(head)
            head.extend(chunk[:take])
            chunk = chunk[take:]
        if chunk:
            tail.extend(chunk)
            if len(tail) > keep:
                del tail[: len(tail) - keep]

    pidfd = os.pidfd_open(pid)
    statuses: dict[int, int] = {}
    timed_out, reading, submit_open = False, True, True
    peak, next_count = 0, 0.0
    try:
        deadline = start + timeout_s
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                timed_out = True
                break
            if now >= next_count:  # the process count as the server sees it (a fork bomb at the cap)
                peak = max(peak, len(_shell_pids(uid, zombies=True)))  # zombies count against RLIMIT_NPROC
                next_count = now + PROCESS_SAMPLE_S
            watched = [pidfd] + ([out_r] if reading else []) + ([submit_r] if submit_open else [])
            ready, _, _ = select.select(watched, [], [], min(remaining, PROCESS_SAMPLE_S))
            if out_r in ready:
                chunk = os.read(out_r, 1 << 16)
                if chunk:
                    absorb(chunk)
                else:
                    reading = False
            if submit_r in ready:
                submit_open = take_submission()
            if pidfd in ready:
                break
        if not timed_out:
            statuses[pid] = os.waitpid(pid, 0)[1]
        left = len(_shell_pids(uid))
        peak = max(peak, left)
        killed = _shell_kill_all(uid, statuses)
        drain_until = time.monotonic() + 2.0
        while (reading or submit_open) and time.monotonic() < drain_until:  # every writer is dead: read to EOF
            watched = ([out_r] if reading else []) + ([submit_r] if submit_open else [])
            ready, _, _ = select.select(watched, [], [], max(0.0, drain_until - time.monotonic()))
            if not ready:
                break
            if out_r in ready:
                chunk = os.read(out_r, 1 << 16)
                if chunk:
                    absorb(chunk)
                else:
                    reading = False
            if submit_r in ready:
                submit_open = take_submission()
    finally:
        os.close(pidfd)
        os.close(out_r)
        os.close(submit_r)
    if pid not in statuses:
        with contextlib.suppress(ChildProcessError):
            statuses[pid] = os.waitpid(pid, 0)[1]
    status = statuses.get(pid)
    exit_code = None
    if status is not None:
        code = os.waitstatus_to_exitcode(status)
        exit_code = 128 - code if code < 0 else code
    # The first record (submit ends each with a NUL); the answer is decoded and stripped by the caller.
    answer = bytes(submission).split(b"\0", 1)[0]
    return {
        "exit_code": exit_code,
        "head": head.decode("utf-8", errors="replace"),
        "tail": tail.decode("utf-8", errors="replace"),
        "output_bytes": total,
        "omitted_bytes": total - len(head) - len(tail),
        "seconds": time.monotonic() - start,
        "timed_out": timed_out,
        "process_limit": peak >= int(params["max_procs"]) - 1,
        "killed": killed if not timed_out else max(0, killed - 1),
        "network_attempts": max(0, _shell_no_routes() - no_routes),
        "submitted": submit_bytes > 0,
        "submission": answer.decode("utf-8", errors="replace"),
    }


def _shell_no_routes() -> int:  # pragma: no cover - in the sandbox
    """The namespace's count of IPv4 packets and connects that found no route (its loopback is down, so
    every attempt to reach any address counts): the kernel's ``Ip: OutNoRoutes``."""
    try:
        with open("/proc/net/snmp") as fh:
            rows = [line.split() for line in fh if line.startswith("Ip:")]
        return int(rows[1][rows[0].index("OutNoRoutes")])
    except (OSError, ValueError, IndexError):
        return 0


def _shell_snapshot(root: str, max_bytes: int, first: Sequence[str] = ()) -> dict:  # pragma: no cover - in the sandbox
    """The tree under ``root``; no process of the session is alive (each command's end killed them all).

    Every directory is opened relative to its parent's descriptor (``O_NOFOLLOW``), so a tree deeper than
    PATH_MAX is read like any other. Files are read in two passes against the one ``max_bytes`` budget:
    the ``first`` paths (those a check needs), then the rest in walk order."""
    out: dict[str, dict] = {}
    budget = max_bytes
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    file_flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

    def read_file(dir_fd: int, name: str, st: os.stat_result) -> dict[str, object]:
        nonlocal budget
        entry: dict[str, object] = {"type": "file", "mode": stat.S_IMODE(st.st_mode), "size": st.st_size}
        fd = os.open(name, file_flags, dir_fd=dir_fd)
        try:
            want = max(0, min(st.st_size, budget))
            chunks, got = [], 0
            while got < want:
                chunk = os.read(fd, want - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
        budget -= len(data)
        if len(data) < st.st_size:
            entry["truncated"] = True
        try:
            entry["text"] = data.decode("utf-8")
        except UnicodeDecodeError:
            entry["hex"] = data.hex()
        return entry

    # Pass 1: the files the caller needs, reached component by component (never through a symlink).
    for rel in first:
        try:
            parts = shell_tree_parts(rel)
        except ValueError:
            continue
        if rel in out or rel.endswith("/"):
            continue
        fds: list[int] = []
        try:
            fd = os.open(root, dir_flags)
            fds.append(fd)
            for part in parts[:-1]:
                fd = os.open(part, dir_flags, dir_fd=fd)
                fds.append(fd)
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                out[rel] = read_file(fd, parts[-1], st)
        except OSError:
            pass  # not there (or not a plain path): the walk below records what is
        finally:
            for f in fds:
                os.close(f)

    # Pass 2: everything, depth first, one open descriptor per level of the current path.
    stack: list[tuple[int, str, list[str]]] = []
    top = os.open(root, dir_flags)
    stack.append((top, "", sorted(os.listdir(top))))
    while stack:
        dir_fd, rel, names = stack[-1]
        if not names:
            os.close(dir_fd)
            stack.pop()
            continue
        name = names.pop(0)
        path = f"{rel}/{name}" if rel else name
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                out[path] = {"type": "dir", "mode": stat.S_IMODE(st.st_mode)}
                child = os.open(name, dir_flags, dir_fd=dir_fd)
                try:
                    children = sorted(os.listdir(child))
                except OSError:
                    os.close(child)
                    raise
                stack.append((child, path, children))
            elif stat.S_ISLNK(st.st_mode):
                out[path] = {"type": "symlink", "target": os.readlink(name, dir_fd=dir_fd)}
            elif stat.S_ISREG(st.st_mode):
                if path not in out:
                    out[path] = read_file(dir_fd, name, st)
            else:
                out[path] = {"type": "other"}
        except OSError as exc:  # the agent's tree, not the session: recorded as such, the walk goes on
            out[path] = {"type": "unreadable", "error": os.strerror(exc.errno) if exc.errno else str(exc)}
    return out


if __name__ == "__main__":  # pragma: no cover - the sandbox child
    if json.loads(sys.argv[1]).get("mode") == "shell":
        _shell_main(json.loads(sys.argv[1]))
    else:
        _child_main(sys.argv)
