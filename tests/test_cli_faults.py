"""SIGKILL during `tentalis retract` and `tentalis maintain`, at named moments and at random ones: every
table stays readable (Delta and DuckDB), maintenance loses no row, and a retraction is either complete or
finished by running the same command again, never half-applied and forgotten.

The runs are real CLI processes killed with SIGKILL (tests/kill_at.py arms the moment), over a lakehouse
with three trained, promoted checkpoints (tests/unit/test_lineage.py's ``cycles``)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tentalis_pipelines import audit, retraction
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.schemas import SCHEMAS
from tentalis_pipelines.training import serving
from tests.test_lineage_integration import REVIEWED, SECRET, copy_home, cycles  # noqa: F401 - cycles is a fixture

KILL_AT = Path(__file__).with_name("kill_at.py")
REASON = "the reviewer withdrew it"


def _cli(home: Path, *args: str, kill: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "TENTALIS_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    cmd = [sys.executable, str(KILL_AT), kill, *args] if kill else [sys.executable, "-m", "tentalis_pipelines.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _snapshot(lake: Lakehouse) -> dict[str, list[str]]:
    """Every table's rows (sorted, as JSON), read through Delta; and each queried through DuckDB."""
    out = {}
    con = lake.duckdb([n for n in SCHEMAS if lake.exists(n)])
    for name in SCHEMAS:
        if lake.exists(name):
            rows = sorted(json.dumps(r, sort_keys=True, default=str) for r in lake.read(name).to_pylist())
            (count,) = con.execute(f"select count(*) from {name}").fetchone()
            assert count == len(rows), name
            out[name] = rows
    return out


RETRACT_KILLS = [
    "audit.record:1:after",  # the intent is recorded, nothing deleted yet
    "lakehouse.Lakehouse.delete:1:after",  # human_reviews deleted, not vacuumed
    "lakehouse.Lakehouse.purge_log_history:1:before",
    "lakehouse.Lakehouse.delete:2:after",  # the review itself gone, its group's trajectories not yet
    "lakehouse.Lakehouse.vacuum:3:before",
    "audit.record:2:after",  # one of the two checkpoints marked
    "training.serving.promote:1:before",
    "training.serving.promote:1:after",
]


@pytest.mark.parametrize("kill", RETRACT_KILLS)
def test_sigkill_during_retract_leaves_it_resumable_and_every_table_readable(cycles, tmp_path, kill):  # noqa: F811
    c1, c2, c3 = cycles["ids"]
    paths, lake = copy_home(cycles["home"], tmp_path / "home")
    r = _cli(paths.home, "retract", "--review", REVIEWED, "--reason", REASON, "--actor", "alice", kill=kill)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    _snapshot(lake)  # every table readable after the kill
    assert audit.rows(lake, action="retraction") == []  # not complete ...
    assert retraction.pending_retraction(lake, f"review {REVIEWED}") is not None  # ... and not forgotten

    r = _cli(paths.home, "retract", "--review", REVIEWED, "--reason", REASON, "--actor", "alice", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    # the same end as one uninterrupted retraction
    _snapshot(lake)
    assert [p for p in Path(lake.root).rglob("*") if p.is_file() and SECRET[:40].encode() in p.read_bytes()] == []
    assert lake.read("trajectories", batch_id="b2").num_rows == 0
    assert sorted(r["rollout_id"] for r in lake.read("reviews", batch_id="b2").to_pylist()) == ["b2-r1", "b2-r2", "b2-r3"]
    assert lake.read("trajectories", batch_id="b1").num_rows == 4
    (done,) = audit.rows(lake, action="retraction")
    assert (done["subject"], done["from_state"], done["to_state"]) == (f"review {REVIEWED}", c3, c1)
    assert json.loads(done["detail"])["affected"] == {c2: "direct", c3: f"inherited from {c2}"}
    assert sorted(r["subject"] for r in audit.rows(lake, action=audit.TAINTED)) == sorted([c2, c3])
    assert serving.serving_checkpoint(lake) == c1
    assert [(h["from_checkpoint"], h["to_checkpoint"]) for h in serving.serving_history(lake) if h["action"] == "retract"] == [(c3, c1)]
    assert retraction.pending_retraction(lake, f"review {REVIEWED}") is None
    with pytest.raises(retraction.RetractionError, match="no review"):
        retraction.retract(lake, review=REVIEWED, reason="again", actor="alice")


MAINTAIN = ("maintain", "--retention-hours", "0", "--allow-unsafe-retention", "--format", "json")
MAINTAIN_KILLS = [
    "lakehouse.Lakehouse.optimize:2:after",  # a table compacted, not yet vacuumed
    "lakehouse.Lakehouse.vacuum:1:before",
    "lakehouse.Lakehouse.vacuum:3:after",
    "lakehouse.Lakehouse.create_checkpoint:2:before",
]


def _maintain_then_check(lake: Lakehouse, home: Path, before: dict[str, list[str]], killed: subprocess.CompletedProcess | int) -> None:
    rc = killed if isinstance(killed, int) else killed.returncode
    assert rc in (-signal.SIGKILL, 0), killed
    assert _snapshot(lake) == before  # readable, every row still there
    r = _cli(home, *MAINTAIN)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert _snapshot(lake) == before


def test_sigkill_during_maintain_at_named_moments_and_at_random_ones(cycles, tmp_path):  # noqa: F811
    paths, lake = copy_home(cycles["home"], tmp_path / "home")
    for k in range(3):  # small files for compaction to merge
        lake.append("audit", [{"actor": "t", "at": audit.now_utc(), "action": f"note{k}", "subject": "s", "from_state": None,
                               "to_state": None, "reason": "filler", "detail": None}])
    before = _snapshot(lake)
    for kill in MAINTAIN_KILLS:
        r = _cli(paths.home, *MAINTAIN, kill=kill)
        assert r.returncode == -signal.SIGKILL, (kill, r.returncode, r.stderr[-3000:])
        _maintain_then_check(lake, paths.home, before, r)
    # From outside, at seeded random moments of a run over freshly fragmented tables.
    rng = random.Random(33)
    env = {**os.environ, "TENTALIS_HOME": str(paths.home), "DAGSTER_HOME": str(paths.home / "dagster")}
    for _ in range(3):
        for k in range(4):
            lake.append("audit", [{"actor": "t", "at": audit.now_utc(), "action": f"more{k}", "subject": "s",
                                   "from_state": None, "to_state": None, "reason": "filler", "detail": None}])
        before = _snapshot(lake)
        proc = subprocess.Popen([sys.executable, "-m", "tentalis_pipelines.cli", *MAINTAIN], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.0, 6.0))  # the CLI's imports take ~2 s; maintenance of every table a few more
        proc.send_signal(signal.SIGKILL)
        _maintain_then_check(lake, paths.home, before, proc.wait())
