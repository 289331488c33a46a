"""The launchers' and the hand-off's pure parts: choosing a launcher, the job's JSON, cleaning up after a
failed launch, reading an external run's report; the remote reward contract's parsing and scoring, by hand."""

from __future__ import annotations

import json

import pytest

from assets import launchers as dagster_launchers
from assets.resources import TrainerResource
from tentalis_pipelines.rewards import remote_reward as rr
from tentalis_pipelines.stages.training import InProcessLauncher
from tentalis_pipelines.training import launchers
from tentalis_pipelines.training.checkpoints import CheckpointError
from tentalis_pipelines.training.openrlhf import HandoffError, check_adapter_folder, export_row


def test_the_launcher_setting_picks_a_launcher_or_says_why_not():
    assert isinstance(TrainerResource().training_launcher(), InProcessLauncher)  # the default: today's path
    with pytest.raises(launchers.LauncherError, match="no local mode.*docs/launchers.md#tinker"):
        TrainerResource(launcher="tinker").training_launcher(context=object())
    with pytest.raises(launchers.LauncherError, match="unknown launcher 'slurm': pick one of in_process, subprocess, ray, tinker"):
        TrainerResource(launcher="slurm").training_launcher()
    with pytest.raises(launchers.LauncherError, match="runs through Dagster Pipes"):
        TrainerResource(launcher="subprocess").training_launcher()
    with pytest.raises(launchers.LauncherError, match="ray_address"):
        TrainerResource(launcher="ray").training_launcher(context=object())
    ray = TrainerResource(launcher="ray", ray_address="http://head:8265", ray_python="/opt/py", ray_num_gpus=1).training_launcher(object())
    assert isinstance(ray, dagster_launchers.PipesRayLauncher)
    job = _job()
    params = ray.submit_params(job)
    assert params["entrypoint"] == "/opt/py -m tentalis_pipelines.stages.pipes_entry"
    assert params["entrypoint_num_gpus"] == 1 and params["submission_id"] == "tentalis-ckpt-1"


def _job(**kw) -> launchers.TrainingJob:
    raw = {"lakehouse": "/h/lakehouse", "checkpoints": "/h/checkpoints", "models": "/h/models", "checkpoint_id": "ckpt-1",
           "policy_version": "base", "parent_adapter": None, "versions": {"trajectories": 3, "rollouts": 2},
           "trajectory_ids": ["r2", "r1"], "model": "embedded", "base_model": "SmolLM2-135M-Instruct", "config": {"beta": 0.0}}
    return launchers.TrainingJob(**{**raw, **kw})


def test_a_job_round_trips_through_json_and_a_foreign_one_is_refused():
    job = _job(parent_adapter="/h/checkpoints/ckpt-0")
    assert launchers.TrainingJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    raw = job.to_dict()
    raw.pop("versions")
    raw["extra"] = 1
    with pytest.raises(launchers.LauncherError, match=r"missing \['versions'\], unknown \['extra'\]"):
        launchers.TrainingJob.from_dict(raw)
    with pytest.raises(launchers.LauncherError, match=r"missing \[\], unknown \['extra'\]"):
        launchers.TrainingJob.from_dict({**job.to_dict(), "extra": 1})
    short = job.to_dict()
    short.pop("config")
    with pytest.raises(launchers.LauncherError, match=r"missing \['config'\], unknown \[\]"):
        launchers.TrainingJob.from_dict(short)


def test_only_the_listed_set_variables_travel_to_an_external_run(monkeypatch):
    for k in launchers.FORWARDED_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TENTALIS_HOME", "/shared/home")
    monkeypatch.setenv("AWS_REGION", "")  # set but empty: not forwarded
    monkeypatch.setenv("SOME_TOKEN", "secret")  # not in the list: never forwarded
    assert launchers.forwarded_env() == {"TENTALIS_HOME": "/shared/home"}
    assert launchers.forwarded_env({"TENTALIS_HOME": "/other", "X": "1"}) == {"TENTALIS_HOME": "/other", "X": "1"}
    ray = dagster_launchers.PipesRayLauncher(object(), "http://head:8265")
    params = ray.submit_params(_job())
    assert params["runtime_env"] == {"env_vars": {"TENTALIS_HOME": "/shared/home"}}
    assert "entrypoint_num_gpus" not in params and params["entrypoint"] == "python -m tentalis_pipelines.stages.pipes_entry"


def test_a_failed_launch_leaves_nothing_under_its_checkpoint_id_and_touches_no_other(tmp_path):
    for name in ("ckpt-1", ".tmp-ckpt-1-123@host", ".tmp-ckpt-1-9", "ckpt-10", ".tmp-ckpt-10-5@host", "ckpt-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_model.safetensors").write_text("x")
    removed = launchers.discard_partial(tmp_path, "ckpt-1")
    assert sorted(removed) == [".tmp-ckpt-1-123@host", ".tmp-ckpt-1-9", "ckpt-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-ckpt-10-5@host", "ckpt-10", "ckpt-2"]
    assert launchers.discard_partial(tmp_path / "absent", "ckpt-1") == []


def test_an_external_run_must_report_its_own_complete_adapter(tmp_path):
    job = _job(checkpoints=str(tmp_path))
    with pytest.raises(launchers.LauncherError, match="exited without reporting its adapter"):
        launchers.output_from_messages([{"other": 1}], job)
    with pytest.raises(launchers.LauncherError, match="reported .*ckpt-2, not"):
        launchers.output_from_messages([{"adapter_path": str(tmp_path / "ckpt-2")}], job)
    folder = tmp_path / "ckpt-1"
    folder.mkdir()
    (folder / "lineage.json").write_text(json.dumps({"checkpoint_id": "ckpt-1"}))
    # No completion marker: a run killed mid-save, never read back as done.
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        launchers.output_from_messages([{"adapter_path": str(folder)}], job)
    (folder / "COMPLETE").write_text(json.dumps({"files": ["lineage.json"]}))
    with pytest.raises(launchers.LauncherError, match="no training_output.json"):
        launchers.output_from_messages([{"adapter_path": str(folder)}], job)
    launchers.write_output_file(folder, {"loss": 0.5}, [{"step": 1, "loss": 0.5}])
    # An adapter of the same id in another checkpoints folder is not this job's.
    elsewhere = tmp_path / "elsewhere" / "ckpt-1"
    elsewhere.mkdir(parents=True)
    with pytest.raises(launchers.LauncherError, match="reported .*elsewhere/ckpt-1, not"):
        launchers.output_from_messages([{"adapter_path": str(elsewhere)}], job)
    # A complete folder (its marker lists no files) without the lineage manifest: not the entry point's.
    (folder / "lineage.json").unlink()
    (folder / "COMPLETE").write_text(json.dumps({"files": []}))
    with pytest.raises(launchers.LauncherError, match="no lineage.json"):
        launchers.output_from_messages([{"adapter_path": str(folder)}], job)
    (folder / "lineage.json").write_text(json.dumps({"checkpoint_id": "ckpt-1"}))
    # The last report is the run's answer (an earlier one, for another folder, is not read).
    out = launchers.output_from_messages([{"adapter_path": str(elsewhere)}, {"adapter_path": str(folder), "metrics": {"loss": 0.5}}], job)
    assert (out.metrics, out.history, out.manifest) == ({"loss": 0.5}, [{"step": 1, "loss": 0.5}], {"checkpoint_id": "ckpt-1"})


PROMPT = "<|im_start|>user\nA box holds 6 rows of 5 eggs. 4 break. How many are left?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("response, label, expected", [
    # right, tagged, both steps check out: 1 + 0.2*1 + 0.2*1 + 0.5*1.0 = 1.9
    ("<step>6 * 5 = 30</step><step>30 - 4 = 26</step><answer>26</answer>", "26", (1.9, 1.0, 1.0, 1.0, 1.0, 2)),
    # wrong second step carried to the answer: 0 + 0.2*1 + 0.2*(1+0)/2 + 0.5*0.1 = 0.35
    ("<step>6 * 5 = 30</step><step>30 - 4 = 25</step><answer>25</answer>", "26", (0.35, 0.0, 1.0, 0.5, 0.1, 2)),
    # right number, answer tag but no step tags (format 0.6); the line's equation checks: 1 + 0.12 + 0.2 + 0.5*0.7 = 1.67
    ("6 * 5 - 4 = 26\n<answer>26</answer>", "#### 26", (1.67, 1.0, 0.6, 1.0, 0.7, 1)),
    # stopped after one step: the last number (30) is the untagged answer, wrong; step tags only (format 0.4);
    # the step checks (process 1); untagged wrong answer -> manager 0: 0 + 0.2*0.4 + 0.2*1 + 0 = 0.28
    ("<step>6 * 5 = 30</step>", "26", (0.28, 0.0, 0.4, 1.0, 0.0, 1)),
    # no number anywhere: no answer, so no process credit even where a step could be read: 0
    ("<step>I am not sure.</step>", "26", (0.08, 0.0, 0.4, None, 0.0, 0)),
])
def test_a_query_is_scored_as_the_loop_scores_a_math_rollout(response, label, expected):
    s = rr.score_query(PROMPT + response + "<|im_end|>", PROMPT, label)
    reward, outcome, fmt, process, manager, checked = expected
    assert s.reward == pytest.approx(reward) and (s.outcome, s.format, s.manager, s.checked_steps) == (outcome, fmt, manager, checked)
    assert s.process == (None if process is None else pytest.approx(process))


def test_the_response_is_what_follows_the_prompt():
    assert rr.response_of("PQ answer", "PQ") == " answer"
    assert rr.response_of("<s>PQ answer", "PQ") == " answer"  # a BOS the decoder put in front
    assert rr.response_of("something else", "PQ") == "something else"


def test_requests_that_break_the_contract_name_the_field_and_the_fix():
    good = {"query": ["a"], "prompts": ["p"], "labels": ["1"]}
    assert rr.parse_request(good) == (["a"], ["p"], ["1"])
    assert rr.parse_request({**good, "labels": [7]}) == (["a"], ["p"], ["7"])  # a numeric label (GSM8K JSONL)
    cases = [({**good, "labels": [True]}, "'labels[0]' must be a string or a number, not bool"),
             ({**good, "labels": [float("nan")]}, "'labels[0]' must be a string or a number"),
             ({**good, "prompts": [1]}, "'prompts[0]' must be a string, not int"),
             ({"query": ["a"], "prompts": ["p"], "labels": None}, "'labels' is missing"),
             ({**good, "query": ["a"] * (rr.MAX_QUERIES + 1), "prompts": ["p"] * (rr.MAX_QUERIES + 1),
               "labels": ["1"] * (rr.MAX_QUERIES + 1)}, "at most 4096"),
             ("text", "must be a JSON object")]
    for body, says in cases:
        with pytest.raises(rr.RewardRequestError, match=says.replace("[", r"\[").replace("]", r"\]")):
            rr.parse_request(body)


def test_an_export_row_is_the_policys_messages_and_the_reference_answer(tmp_path):
    row = export_row({"batch_id": "b", "task_id": "t", "prompt": "What is 2 + 2?", "reference": "2 + 2 = 4\n#### 4"})
    assert row["label"] == "4" and row["input"][0]["role"] == "system" and row["input"][-1] == {"role": "user", "content": "What is 2 + 2?"}
    assert export_row({"batch_id": "b", "task_id": "t", "prompt": "q", "reference": "4"}, worked_example=False)["input"][1:] == \
        [{"role": "user", "content": "q"}]
    with pytest.raises(HandoffError, match="not a folder"):
        check_adapter_folder(tmp_path / "nope")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    (tmp_path / "adapter_model.safetensors").write_text("x")
    with pytest.raises(HandoffError, match="only LoRA adapters import"):
        check_adapter_folder(tmp_path)
