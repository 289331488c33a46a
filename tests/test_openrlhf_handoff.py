"""The OpenRLHF hand-off: `tentalis reward-server` speaks OpenRLHF v0.11.0's remote reward contract (a
real server, the exact request shapes, rewards checked by hand), the export round-trips to the pinned
Delta version, and an adapter that comes back imports as a checkpoint with lineage to its export."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tentalis_pipelines import lineage
from tentalis_pipelines.cli import app
from tentalis_pipelines.inference.prompts import chat_messages
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import openrlhf

# What OpenRLHF sends: the chat-templated prompt, and the prompt and response decoded together.
PROMPT = "<|im_start|>user\nTom has 12 marbles and finds 7 more. How many marbles does he have?<|im_end|>\n<|im_start|>assistant\n"
RIGHT = PROMPT + "<step>12 + 7 = 19</step>\n<answer>19</answer><|im_end|>"
WRONG_STEP = PROMPT + "<step>12 + 7 = 18</step>\n<answer>18</answer><|im_end|>"
UNTAGGED = PROMPT + "He has 19 marbles.<|im_end|>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def reward_server(tmp_path):
    """`tentalis reward-server` as a user starts it, logging to a file."""
    port, log = _free_port(), tmp_path / "rewards.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tentalis_pipelines.cli", "reward-server", "--port", str(port), "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the reward server did not start: {proc.stdout.read().decode()[-2000:]}")
            time.sleep(0.3)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_reward_server_answers_openrlhfs_requests_with_the_verifiers_rewards(reward_server):
    url, log = reward_server
    # One request per sample, as OpenRLHF v0.11.0's SingleTurnAgentExecutor sends them.
    one = httpx.post(f"{url}/get_reward", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]}).json()
    # By hand: correct (outcome 1), <step> and <answer> tags (format 0.6 + 0.4 = 1), its one equation
    # uses the task's numbers and is right (process 1), verifier manager 1.0:
    # 1.0 * 1 + 0.2 * 1 + 0.2 * 1 + 0.5 * 1.0 = 1.9.
    assert one == {"rewards": [pytest.approx(1.9)], "scores": [1.0],
                   "extra_logs": {"outcome": [1.0], "format": [1.0], "process": [1.0], "manager": [1.0], "checked_steps": [1.0]}}
    # A batch (the path OpenRLHF's own serve_rm uses, and "/"): aligned lists, a number label, a GSM8K reference.
    batch = httpx.post(f"{url}/", json={"query": [WRONG_STEP, UNTAGGED, RIGHT], "prompts": [PROMPT] * 3,
                                        "labels": ["19", "He adds 7 to 12. #### 19", 19]}).json()
    # WRONG_STEP: outcome 0, format 1, the step 12 + 7 = 18 is wrong (process 0), tagged wrong answer with a
    #   bad step -> manager 0.1: 0 + 0.2 + 0 + 0.05 = 0.25.
    # UNTAGGED: last number 19 is right (outcome 1), no tags (format 0), no equation (no process credit),
    #   right but untagged -> manager 0.7: 1 + 0 + 0.35 = 1.35.
    assert batch["rewards"] == [pytest.approx(0.25), pytest.approx(1.35), pytest.approx(1.9)]
    assert batch["scores"] == [0.0, 1.0, 1.0]
    assert batch["extra_logs"]["manager"] == [0.1, 0.7, 1.0] and batch["extra_logs"]["checked_steps"] == [1.0, 0.0, 1.0]
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["answer"], r["reward"]) for r in logged] == [("19", pytest.approx(1.9)), ("18", pytest.approx(0.25)),
                                                           ("19", pytest.approx(1.35)), ("19", pytest.approx(1.9))]


@pytest.mark.parametrize("body, status, says", [
    (b"{not json", 400, "not JSON"),
    (b'["a list"]', 422, "JSON object"),
    (json.dumps({"query": [RIGHT], "prompts": [PROMPT]}).encode(), 422, "'labels' is missing"),
    (json.dumps({"query": RIGHT, "prompts": [PROMPT], "labels": ["19"]}).encode(), 422, "'query' must be a list"),
    (json.dumps({"query": [RIGHT, RIGHT], "prompts": [PROMPT], "labels": ["19"]}).encode(), 422, "one entry per sample: got 2, 1 and 1"),
    (json.dumps({"query": [RIGHT], "prompts": [PROMPT], "labels": [{"answer": 19}]}).encode(), 422, "'labels[0]' must be a string or a number"),
    (json.dumps({"query": [RIGHT], "prompts": [PROMPT], "labels": [""]}).encode(), 422, "'labels[0]' must be a non-empty answer"),
    (json.dumps({"query": [], "prompts": [], "labels": []}).encode(), 422, "'query' is empty"),
    (json.dumps({"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"], "responses": ["x"]}).encode(), 422, "unknown fields ['responses']"),
])
def test_malformed_requests_get_a_clear_4xx_and_nothing_is_logged(reward_server, body, status, says):
    url, log = reward_server
    httpx.post(f"{url}/get_reward", json={"query": [RIGHT], "prompts": [PROMPT], "labels": ["19"]})
    before = _lines(log)
    r = httpx.post(f"{url}/get_reward", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and says in r.json()["error"], r.text
    assert _lines(log) == before == 1


def _tasks(lake: Lakehouse, batch_id: str, rows: list[tuple[str, str, str, str]]) -> None:
    now = now_utc()
    lake.write_batch("tasks", batch_id, [
        {"batch_id": batch_id, "task_id": tid, "source": "test", "environment": env, "prompt": prompt, "reference": ref,
         "difficulty": None, "metadata": "{}", "created_at": now} for tid, env, prompt, ref in rows])


def test_the_export_round_trips_to_its_pinned_tasks_version_and_the_adapter_imports_with_lineage(home, tiny_model_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    _tasks(lake, "b1", [("t1", "math", "What is 12 + 7?", "19"), ("t0", "math", "Ann has 3 bags of 4 pens. How many pens?", "3 * 4 = 12\n#### 12"),
                        ("t2", "code", "Write add(a, b).", "assert add(1, 2) == 3"), ("t3", "math", "No key", "")])
    _tasks(lake, "b2", [("t0", "math", "What is 9 / 3?", "\\boxed{3}")])
    pinned = lineage.table_versions(lake)["tasks"]
    runner = CliRunner()
    out = tmp_path / "export"
    res = runner.invoke(app, ["openrlhf", "export", "--out", str(out), "--home", str(home)])
    assert res.exit_code == 0, res.output
    manifest, rows = openrlhf.load_export(out)
    # Math tasks with a reference only, ordered by batch and task; labels are the reference answers.
    assert [(r["batch_id"], r["task_id"], r["label"]) for r in rows] == [("b1", "t0", "12"), ("b1", "t1", "19"), ("b2", "t0", "3")]
    assert rows[1]["input"] == chat_messages("What is 12 + 7?") and rows[1]["input"][-1] == {"role": "user", "content": "What is 12 + 7?"}
    assert manifest["tables"] == {"tasks": pinned} and manifest["rows"] == 3 and manifest["batches"] == ["b1", "b2"]
    assert manifest["openrlhf_version"] == openrlhf.OPENRLHF_VERSION
    # The tasks change afterwards; the export still round-trips to the version it pinned.
    _tasks(lake, "b1", [("t1", "math", "What is 12 + 8?", "20")])
    assert openrlhf.verify_export(lake, out) == []
    (out / "prompts.jsonl").write_text((out / "prompts.jsonl").read_text().replace("12 + 7", "12 + 9"))
    with pytest.raises(openrlhf.HandoffError, match="changed after export"):
        openrlhf.verify_export(lake, out)
    (out / "prompts.jsonl").write_text((out / "prompts.jsonl").read_text().replace("12 + 9", "12 + 7"))
    assert openrlhf.verify_export(lake, out) == []
    res = runner.invoke(app, ["openrlhf", "export", "--out", str(out), "--home", str(home)])
    assert res.exit_code != 0 and "already holds an export" in res.output

    # An adapter as OpenRLHF's save_model writes it (PEFT LoRA: adapter_config.json + safetensors).
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "openrlhf-out"
    model.save_pretrained(str(adapter))
    bad = tmp_path / "not-an-adapter"
    bad.mkdir()
    res = runner.invoke(app, ["openrlhf", "import", str(bad), "--export", str(out), "--home", str(home)])
    assert res.exit_code != 0 and "holds no LoRA adapter" in res.output
    assert not lake.exists("checkpoints") and not any(paths.checkpoints.glob("*")) if paths.checkpoints.exists() else True

    res = runner.invoke(app, ["openrlhf", "import", str(adapter), "--export", str(out), "--home", str(home),
                              "--base-model", str(tiny_model_dir), "--metrics", '{"reward_mean": 0.4}'])
    assert res.exit_code == 0, res.output
    (row,) = lake.read("checkpoints").to_pylist()
    assert not row["promoted"] and row["trained_on"] == ["b1", "b2"] and row["algorithm"] == "openrlhf:group_norm"
    assert json.loads(row["metrics"]) == {"export_rows": 3, "reward_mean": 0.4}
    folder = Path(row["adapter_uri"])
    assert (folder / "COMPLETE").exists() and folder.parent == paths.checkpoints
    src, imported = load_file(str(adapter / "adapter_model.safetensors")), load_file(str(folder / "adapter_model.safetensors"))
    assert set(src) == set(imported) and all(torch.equal(src[k], imported[k]) for k in src)
    recorded = lineage.load_manifest(lake, row["checkpoint_id"])
    assert recorded["export"]["export_id"] == manifest["export_id"] and recorded["tables"] == {"tasks": pinned}
    assert recorded["samples_digest"] == manifest["prompts_sha256"] == recorded["export"]["prompts_sha256"]
    assert json.loads((folder / "lineage.json").read_text()) == recorded
