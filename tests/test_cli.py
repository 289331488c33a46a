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
