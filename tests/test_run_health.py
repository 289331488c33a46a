"""A SIGKILLed run must not wedge the `gpu` pool (issue 11), tried with real processes on a real instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus

ROOT = Path(__file__).resolve().parents[1]

# One process per run, as `dagster asset materialize` or a script would start it. `import assets` is what
# loading Tentalis' assets does in any entry point (it installs jobs/run_health.py).
SCRIPT = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import assets  # noqa: F401
    from dagster import DagsterInstance, asset, materialize

    marker, hold = Path(sys.argv[1]), float(sys.argv[2])

    @asset(pool="gpu")
    def model_step():
        marker.write_text("holding")
        time.sleep(hold)
        return 1

    result = materialize([model_step], instance=DagsterInstance.get())
    print("RUN", result.run_id, "OK" if result.success else "FAILED", flush=True)
''')


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture()
def dagster_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())  # the project's gpu pool, limit 1
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def _start(tmp_path: Path, name: str, hold: float) -> tuple[subprocess.Popen, Path]:
    marker = tmp_path / f"{name}.holding"
    script = tmp_path / "run_once.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(script), str(marker), str(hold)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, marker


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, f"{path.name} never appeared"
        time.sleep(0.2)


def test_a_killed_run_frees_the_gpu_pool_and_a_blocked_step_sleeps(dagster_home, tmp_path):
    holder, held = _start(tmp_path, "holder", hold=600)
    _wait_for(held, holder)  # the holder's step has the only gpu slot
    waiter, waited = _start(tmp_path, "waiter", hold=0)
    try:
        # The waiter gets as far as waiting for the slot, then must sleep rather than poll.
        time.sleep(8)
        assert not waited.exists(), "the pool let two steps in at once"
        cpu0 = _cpu_seconds(waiter.pid)
        time.sleep(4)
        busy = _cpu_seconds(waiter.pid) - cpu0
        assert busy < 1.0, f"a step waiting for the gpu slot burned {busy:.2f} s of CPU in 4 s"

        holder.send_signal(signal.SIGKILL)
        holder.wait()
        t0 = time.time()
        out, _ = waiter.communicate(timeout=90)
        assert waiter.returncode == 0 and " OK" in out, out
        assert time.time() - t0 < 60, "the next run waited too long for the dead run's slot"
    finally:
        for p in (holder, waiter):
            if p.poll() is None:
                p.kill()
                p.wait()
    instance = DagsterInstance.get()
    statuses = sorted(r.status.value for r in instance.get_runs())
    assert statuses == ["FAILURE", "SUCCESS"], statuses  # the killed run is failed, not STARTED forever
    failed = next(r for r in instance.get_runs() if r.status == DagsterRunStatus.FAILURE)
    reasons = [e.message for e in instance.all_logs(failed.run_id) if e.message and "is gone" in e.message]
    assert reasons, "the killed run carries no reason"
    assert instance.event_log_storage.get_concurrency_info("gpu").claimed_slots == []
