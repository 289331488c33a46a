"""Real servers for the deployment tests, started by the tests themselves on 127.0.0.1.

* :class:`PostgresServer`: a throwaway PostgreSQL cluster (Debian's ``postgresql`` package: ``initdb``,
  ``pg_ctl``). PostgreSQL refuses to run as root, so under root the cluster runs as the ``postgres`` user
  (``runuser``) in a temp folder that user owns, with its Unix socket in that folder.
* :class:`S3Server`: moto's S3 in server mode (``moto[server]``), a real HTTP endpoint that honours
  conditional writes (``If-None-Match: *``), which deltalake's commits rely on.
* :class:`NatsServer`: ``nats-server -js`` (Debian's ``nats-server`` package) with JetStream storage in a
  temp folder.
* :class:`RayCluster`: ``ray start --head`` (the ``ray`` extra), its job API on a free port.

All raise :class:`ServerUnavailable` with the reason (what is missing) when they cannot start; the
tests turn that into a skip that names it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class ServerUnavailable(RuntimeError):
    """The server cannot start on this machine; the message says what is missing."""


def skip_unavailable(what: str, exc: ServerUnavailable):
    """Skip the test, naming what is missing; under ``TENTALIS_SERVERS_REQUIRED=1`` (CI, whose ``.ci/run``
    installs the servers) fail instead, so a server that CI should have never turns into a silent skip."""
    import pytest

    if os.environ.get("TENTALIS_SERVERS_REQUIRED") == "1":
        pytest.fail(f"TENTALIS_SERVERS_REQUIRED=1 but {what} cannot start: {exc}")
    pytest.skip(f"{what} cannot start here: {exc}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bindir() -> Path:
    """The folder with ``initdb`` and ``pg_ctl``: ``$TENTALIS_PG_BINDIR``, else the newest
    ``/usr/lib/postgresql/*/bin`` (Debian), else ``PATH``."""
    candidates = [os.environ.get("TENTALIS_PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    which = shutil.which("initdb")
    candidates.append(str(Path(which).parent) if which else "")
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    raise ServerUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found in $TENTALIS_PG_BINDIR, "
                            "/usr/lib/postgresql/*/bin or PATH: install Debian's `postgresql` package")


class PostgresServer:
    """A PostgreSQL cluster in a temp folder, listening on 127.0.0.1:<free port>, with database ``dagster``.

    Authentication is ``trust`` (local test cluster only). ``url`` is the SQLAlchemy/psycopg2 URL.
    """

    def __init__(self, database: str = "dagster"):
        self.database = database
        self.bindir = postgres_bindir()
        self.port = free_port()
        self.root: Path | None = None
        self._as: list[str] = []

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as, *args], capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def start(self) -> PostgresServer:
        """initdb, start on the free port, create the database; raises ServerUnavailable with the reason."""
        self.root = Path(tempfile.mkdtemp(prefix="tentalis-pg-"))
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root: run it as the postgres user, in a folder it owns.
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable("running as root and there is no `postgres` user to run PostgreSQL as") from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ServerUnavailable("running as root and `runuser` is missing (util-linux): cannot drop to the postgres user")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = [runuser, "-u", "postgres", "--"]
        data, log = self.root / "data", self.root / "server.log"
        init = self._run(str(self.bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                         "--no-sync", "--no-instructions")
        if init.returncode != 0:
            raise ServerUnavailable(f"initdb failed ({init.returncode}): {init.stderr.strip()[-800:]}")
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        started = self._run(str(self.bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start",
                            timeout=90)
        if started.returncode != 0:
            tail = log.read_text()[-800:] if log.exists() else ""
            raise ServerUnavailable(f"pg_ctl start failed ({started.returncode}): {started.stderr.strip()} {tail}")
        created = self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.database)
        if created.returncode != 0:
            self.stop()
            raise ServerUnavailable(f"createdb failed: {created.stderr.strip()}")
        return self

    def stop(self) -> None:
        """Stop the cluster (fast shutdown) and delete its folder."""
        if self.root is None:
            return
        if (self.root / "data" / "postmaster.pid").exists():
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w", "stop", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


class S3Server:
    """moto's S3 as a real HTTP server in its own process on 127.0.0.1:<free port>, with fake credentials.

    Its own process, not a thread of the test's: a deltalake call that keeps the GIL while it waits for
    the server (``DeltaTable.history`` does) would otherwise wait for a server that cannot run.
    ``env`` is what a Tentalis process needs to reach it (the standard ``AWS_*`` variables)."""

    access_key = "tentalis-test-key"
    secret_key = "tentalis-test-secret"
    region = "us-east-1"

    def __init__(self):
        try:
            import boto3  # noqa: F401
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise ServerUnavailable(f"moto's server mode is not installed (pip install 'moto[server]'): {exc}") from None
        self.port = free_port()
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region, "AWS_ALLOW_HTTP": "true"}

    def client(self):
        """A boto3 S3 client for this server (to create buckets and look at what landed)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region)

    def start(self) -> S3Server:
        """Start the server and wait until it answers; raises ServerUnavailable with the reason."""
        # Its request log goes to a file: a pipe nobody reads would fill up and stall the server.
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by stop()
        self._proc = subprocess.Popen([sys.executable, __file__, "s3", str(self.port)], stdout=subprocess.DEVNULL,
                                      stderr=self._log, text=True)
        deadline = time.monotonic() + 30
        while True:
            if self._proc.poll() is not None:
                self._log.seek(0)
                raise ServerUnavailable(f"moto server exited ({self._proc.returncode}): {self._log.read()[-800:]}")
            try:
                self.client().list_buckets()
                return self
            except Exception as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerUnavailable(f"moto server on {self.endpoint} did not answer: {exc}") from exc
                time.sleep(0.2)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None


def nats_server_binary() -> Path:
    """``$TENTALIS_NATS_SERVER``, else ``nats-server`` on PATH or in /usr/sbin, /usr/bin (Debian installs it in /usr/sbin)."""
    candidates = [os.environ.get("TENTALIS_NATS_SERVER", ""), shutil.which("nats-server") or "", "/usr/sbin/nats-server",
                  "/usr/bin/nats-server"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise ServerUnavailable("nats-server not found in $TENTALIS_NATS_SERVER, PATH, /usr/sbin or /usr/bin: install Debian's "
                            "`nats-server` package (apt-get install nats-server)")


class NatsServer:
    """``nats-server -js`` on 127.0.0.1:<free port>, JetStream files in a temp folder. ``url`` is nats://...

    ``stop()`` terminates it and deletes the folder; ``kill()`` SIGKILLs it and keeps the folder, so
    ``start()`` brings the same server (and its streams) back on the same port."""

    def __init__(self):
        self.binary = nats_server_binary()
        self.port = free_port()
        self.root: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="tentalis-nats-"))
        log = self.root / "server.log"
        self._proc = subprocess.Popen([str(self.binary), "-js", "-a", "127.0.0.1", "-p", str(self.port),
                                       "-sd", str(self.root / "jetstream"), "-l", str(log)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            if self._proc.poll() is not None:
                tail = log.read_text()[-800:] if log.exists() else ""
                raise ServerUnavailable(f"nats-server exited ({self._proc.returncode}): {tail}")
            if log.exists() and "Server is ready" in log.read_text():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise ServerUnavailable(f"nats-server on {self.url} did not become ready in 20 s")
            time.sleep(0.05)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def _session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (one this module started with ``start_new_session``, and nothing else)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[3]) == sid:
                out.append(int(p.name))
    return out


class RayCluster:
    """A real local Ray cluster: ``ray start --head --block`` (the ``ray`` extra) in its own session, on free
    ports, with its dashboard (the job API) at ``address``. ``stop()`` ends it and every process it forked
    (Ray's workers leave its process group, not its session), and deletes its temp folder."""

    def __init__(self, num_cpus: int = 2):
        self.ray = Path(sys.executable).parent / "ray"
        if not self.ray.exists():
            raise ServerUnavailable(f"no `ray` command next to {sys.executable}: pip install -e '.[ray]'")
        self.num_cpus = num_cpus
        self.dashboard_port = free_port()
        self.root: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout: float = 180) -> RayCluster:
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise ServerUnavailable(f"ray is not importable ({exc}): pip install -e '.[ray]'") from None
        self.root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's Unix socket paths must stay short
        cmd = [str(self.ray), "start", "--head", "--block", f"--port={free_port()}", f"--dashboard-port={self.dashboard_port}",
               "--dashboard-host=127.0.0.1", f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
               f"--num-cpus={self.num_cpus}", "--object-store-memory=100000000", "--include-dashboard=true",
               f"--temp-dir={self.root}", "--disable-usage-stats"]
        log = self.root / "ray-start.log"
        with open(log, "w") as fh:  # the child keeps its own copy of the descriptor
            # Patient health checks: on a busy 2-core host (tests run under `nice -n 19`) the default ones
            # (3 misses of 10 s) declared the head node dead mid-test and the cluster went away.
            env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_timeout_ms": "60000",
                   "RAY_health_check_period_ms": "10000", "RAY_health_check_failure_threshold": "30"}
            self._proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline, last = time.monotonic() + timeout, None
        while True:
            if self._proc.poll() is not None:
                tail = log.read_text()[-800:]
                self.stop()
                raise ServerUnavailable(f"ray start exited ({self._proc.returncode if self._proc else '?'}): {tail}")
            try:
                JobSubmissionClient(self.address).list_jobs()
                return self
            except Exception as exc:  # the dashboard is still coming up
                last = exc
            if time.monotonic() > deadline:
                self.stop()
                raise ServerUnavailable(f"Ray's dashboard at {self.address} did not answer within {timeout:.0f} s: {last}")
            time.sleep(1)

    def died(self) -> str | None:
        """None while the cluster runs; else why it ended (the tail of `ray start`'s log)."""
        if self._proc is None or self._proc.poll() is None:
            return None
        log = self.root / "ray-start.log" if self.root else None
        return f"ray start exited {self._proc.returncode}: " + (log.read_text()[-1500:] if log and log.exists() else "")

    def stop(self) -> None:
        if self._proc is not None:
            sid = self._proc.pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)
            for pid in _session_pids(sid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            self._proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def _atomic_conditional_puts() -> None:
    """Make moto's conditional PutObject one step, as it is on S3.

    moto checks ``If-None-Match: *`` and then stores the object, two steps on a threaded server, so two
    PUTs racing for the same new key (two writers committing the same Delta version) could both pass the
    check. S3 decides such a race atomically: one PUT wins, the other gets 412. Serialising moto's
    PutObject handler gives the same guarantee (one server process, so one lock suffices).
    """
    import threading

    from moto.s3.responses import S3Response

    if getattr(S3Response.put_object, "_tentalis_atomic", False):
        return
    lock = threading.Lock()
    original = S3Response.put_object

    def put_object(self, *args, **kwargs):
        with lock:
            return original(self, *args, **kwargs)

    put_object._tentalis_atomic = True
    S3Response.put_object = put_object


if __name__ == "__main__":  # the S3 server process: `python local_servers.py s3 PORT`
    if sys.argv[1:2] == ["s3"]:
        from moto.server import main

        _atomic_conditional_puts()
        main(["-H", "127.0.0.1", "-p", sys.argv[2]])
