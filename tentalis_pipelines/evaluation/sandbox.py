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
host's ``/proc/net/unix`` and are not covered.

The child side of the sandbox is this same file, run as a script (``python -I sandbox.py PARAMS``):
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
                      hide_sockets: Sequence[str] = ()) -> None:
    """Make everything read-only except ``workdir``; hide scratch and home dirs and host Unix sockets;
    keep Python reachable."""
    # Python must stay importable for the unprivileged uid: its prefixes may sit under a hidden dir
    # (a venv in /tmp) or under a directory closed to other users (pyenv in /root, mode 0700).
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    needed = _outermost([
        os.path.realpath(p)
        for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, exe_dir)
        if os.path.isdir(p)
    ])
    needed = [p for p in needed if p != "/"]
    overlays = [os.path.realpath(d) for d in HIDDEN_DIRS if os.path.isdir(d) and not os.path.islink(d)]
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
           f"mode=0700,uid={uid},gid={uid},size={max(1, disk_bytes // 1024)}k,nr_inodes=4096")
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


if __name__ == "__main__":  # pragma: no cover - the sandbox child
    _child_main(sys.argv)
