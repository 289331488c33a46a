"""The OpenRLHF export and import through the library, without a model: the rows exported (math tasks with
a reference, their reference answers as labels), the export pinned to its tasks version, an edited or
reused export refused, and an imported adapter recorded unpromoted with lineage to its export.
(``test_openrlhf_handoff.py`` drives the same through the CLI with a real PEFT adapter.)"""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines import lineage
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import openrlhf


def _tasks(lake, batch_id, rows):
    lake.write_batch("tasks", batch_id, [
        {"batch_id": batch_id, "task_id": tid, "source": "test", "environment": env, "prompt": prompt, "reference": ref,
         "difficulty": None, "metadata": "{}", "created_at": now_utc()} for tid, env, prompt, ref in rows])


def test_an_export_round_trips_and_an_imported_adapter_is_recorded_with_its_lineage(home, tmp_path):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    _tasks(lake, "b1", [("t1", "math", "What is 12 + 7?", "12 + 7 = 19\n#### 19"), ("t2", "code", "Write add.", "assert add(1, 2) == 3"),
                        ("t3", "math", "No key", "  ")])
    pinned = lineage.table_versions(lake)["tasks"]
    out = tmp_path / "export"
    manifest = openrlhf.export_prompts(lake, out)
    _, rows = openrlhf.load_export(out)
    assert [(r["task_id"], r["label"]) for r in rows] == [("t1", "19")]  # the answer, not the worked solution
    assert manifest["tables"] == {"tasks": pinned} and manifest["rows"] == 1
    _tasks(lake, "b1", [("t1", "math", "What is 12 + 8?", "20")])  # the tasks change after the export
    assert openrlhf.verify_export(lake, out) == []
    with pytest.raises(openrlhf.HandoffError, match="already holds an export"):
        openrlhf.export_prompts(lake, out)
    text = (out / openrlhf.PROMPTS_FILE).read_text()
    (out / openrlhf.PROMPTS_FILE).write_text(text.replace('"19"', '"18"'))
    with pytest.raises(openrlhf.HandoffError, match="changed after export"):
        openrlhf.load_export(out)
    (out / openrlhf.PROMPTS_FILE).write_text(text)

    adapter = tmp_path / "openrlhf-out"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    row = openrlhf.import_adapter(lake, paths.checkpoints, adapter, out, base_model="m", metrics={"reward_mean": 0.4})
    assert row["export_id"] == manifest["export_id"]
    [stored] = lake.read("checkpoints").to_pylist()
    assert stored["checkpoint_id"] == row["checkpoint_id"] and not stored["promoted"] and stored["trained_on"] == ["b1"]
    assert json.loads(stored["metrics"]) == {"export_rows": 1, "reward_mean": 0.4}
    recorded = lineage.load_manifest(lake, row["checkpoint_id"])
    assert recorded["samples_digest"] == manifest["prompts_sha256"] and recorded["tables"] == {"tasks": pinned}
    assert recorded["export"]["export_id"] == manifest["export_id"]
    assert (paths.checkpoints / row["checkpoint_id"] / "adapter_model.safetensors").read_bytes() == b"weights"
