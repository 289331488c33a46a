import csv
import io
import json
from datetime import datetime, timezone

from typer.testing import CliRunner

from tentalis_pipelines.cli import app
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths

runner = CliRunner()


def test_sql_formats(home):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    lake.write_batch("tasks", "b1", [{"batch_id": "b1", "task_id": f"t{i}", "source": "s", "environment": "math", "prompt": "p",
                                      "reference": "1", "difficulty": 1, "metadata": "{}", "created_at": datetime.now(timezone.utc)} for i in range(3)])
    out = runner.invoke(app, ["sql", "select count(*) as n from tasks", "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == [{"n": 3}]
    out = runner.invoke(app, ["sql", "select task_id from tasks order by task_id", "--format", "csv"])
    assert list(csv.DictReader(io.StringIO(out.stdout))) == [{"task_id": "t0"}, {"task_id": "t1"}, {"task_id": "t2"}]
    bad = runner.invoke(app, ["sql", "select * from nonexistent_table"])
    assert bad.exit_code == 1 and "SQL error" in bad.output


def test_status_on_empty_home(home):
    out = runner.invoke(app, ["status"])
    assert out.exit_code == 0, out.output
    assert "trajectories" in out.output


def _tasks(lake, n=3):
    lake.write_batch("tasks", "b1", [{"batch_id": "b1", "task_id": f"t{i}", "source": "s", "environment": "math", "prompt": "p",
                                      "reference": "1", "difficulty": 1, "metadata": "{}", "created_at": datetime.now(timezone.utc)} for i in range(n)])


def test_sql_is_read_only_over_the_lakehouse(home, tmp_path):
    """`tentalis sql` cannot read or write files, attach databases, load extensions or unlock itself."""
    import pytest
    from table_hashes import assert_unchanged, table_hashes

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    _tasks(lake)
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t\n")
    before = table_hashes(paths.lakehouse)
    delta_log = paths.lakehouse / "tasks" / "_delta_log"
    log_files = sorted(p.name for p in delta_log.iterdir())
    part = next((paths.lakehouse / "tasks").rglob("*.parquet"))
    attacks = [
        f"select * from read_text('{secret}')",
        f"select * from read_csv('{secret}')",
        f"select * from read_parquet('{part}')",
        f"copy (select 1 as x) to '{tmp_path / 'out.csv'}'",
        f"copy (select '{{}}' as x) to '{delta_log / '00000000000000000099.json'}' (format csv, header false)",
        f"attach '{tmp_path / 'other.db'}' as other",
        "install httpfs",
        "load httpfs",
        "set enable_external_access = true",
        "set lock_configuration = false",
    ]
    for query in attacks:
        out = runner.invoke(app, ["sql", query])
        assert out.exit_code == 1 and "SQL error" in out.output and "s3cr3t" not in out.output, (query, out.output)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "other.db").exists()
    assert sorted(p.name for p in delta_log.iterdir()) == log_files
    assert_unchanged(paths.lakehouse, before)
    # Ordinary queries over the views, joins included, still work.
    out = runner.invoke(app, ["sql", "select count(*) as n from tasks a join tasks b using (task_id)", "--format", "json"])
    assert out.exit_code == 0 and json.loads(out.stdout) == [{"n": 3}], out.output
    with pytest.raises(Exception, match="disabled|locked|Permission"):
        lake.sql(f"select * from read_text('{secret}')")


def test_sql_csv_output_defuses_spreadsheet_formulas(home):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    lake.quarantine([{"source": s, "line": i, "raw": "{}", "error": "e"}
                     for i, s in enumerate(['=HYPERLINK("http://x","click")', "+1+2", "@SUM(A1)", "-3", "plain"])])
    out = runner.invoke(app, ["sql", "select source, line from quarantine order by line", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["source"] for r in rows] == ["'=HYPERLINK(\"http://x\",\"click\")", "'+1+2", "'@SUM(A1)", "'-3", "plain"]
    assert [r["line"] for r in rows] == ["0", "1", "2", "3", "4"]  # numbers are not text: left alone


def test_ids_are_never_cut_in_a_narrow_terminal(home, monkeypatch):
    """Checkpoint ids printed by `status` are the ones `promote`/`rollback` take: they must print whole."""
    monkeypatch.setenv("COLUMNS", "60")
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    cid = "ckpt-20261122T115344-0e0f44"
    lake.append("checkpoints", [{"checkpoint_id": cid, "parent_id": "ckpt-20261122T110000-aaaaaa", "base_model": "m",
                                 "adapter_uri": "/x", "algorithm": "grpo", "config": "{}", "trained_on": ["b1"],
                                 "trajectory_ids": ["r1"], "trajectory_count": 1, "metrics": "{}", "promoted": False,
                                 "created_at": datetime.now(timezone.utc)}])
    out = runner.invoke(app, ["status"])
    assert out.exit_code == 0, out.output
    assert cid in out.output and "ckpt-20261122T110000-aaaaaa" in out.output, out.output


def test_version():
    from importlib.metadata import version

    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"tentalis {version('tentalis')}"


def test_manager_status_lists_a_score_update_beside_review_updates(home, monkeypatch):
    """A score update (`--part score`) records no reward, hints or score error: `manager status` once raised KeyError
    on its row. Both kinds print, each id whole, the missing cells as "-"."""
    monkeypatch.setenv("COLUMNS", "60")
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    now = datetime.now(timezone.utc)

    def row(cid, parent, metrics, n):
        return {"checkpoint_id": cid, "parent_id": parent, "base_model": "m", "adapter_uri": "/x", "algorithm": "cispo",
                "config": "{}", "trained_on": ["b1"], "trajectory_ids": [f"r{i}" for i in range(n)], "trajectory_count": n,
                "metrics": json.dumps(metrics), "promoted": False, "created_at": now}

    lake.append("manager_checkpoints", [
        row("m-34e43b188fbf", None, {"reward_mean": 0.2861, "usable_hint_share": 0.92, "rescue_rate": None,
                                     "score_error": 0.3614, "loss": 1.06}, 48),
        row("m-13d4ae786f40", "m-34e43b188fbf", {"part": "score", "loss": 0.8265, "failures": 76, "accepted": 76}, 152)])
    out = runner.invoke(app, ["manager", "status"])
    assert out.exit_code == 0, out.output
    cells = [[c.strip() for c in ln.strip("│ ").split("│")] for ln in out.output.splitlines() if ln.startswith("│ m-")]
    day = now.isoformat(" ")[:10]
    assert [c[:9] + [c[9][:10]] for c in cells] == [
        ["m-34e43b188fbf", "base", "review", "48", "+0.286", "92%", "-", "0.361", "1.060", day],
        ["m-13d4ae786f40", "m-34e43b188fbf", "score", "152", "-", "-", "-", "-", "0.827", day]]
