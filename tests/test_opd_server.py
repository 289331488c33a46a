"""A teacher behind an OpenAI-compatible server: `tentalis serve` scores prompts (`echo`, as vLLM does),
driven by the official openai client, and the `teacher_logprobs` asset uses it as the OPD teacher."""

from __future__ import annotations

import json

import pytest
import torch
from dagster import DagsterInstance, materialize
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets.batch_assets import reviews, rollouts, step_scores, tasks, teacher_logprobs, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines.inference.openai_backend import OpenAIBackend, OpenAIServerError
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks.batches import register_file_batch
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.trainer import GRPOConfig
from tests.test_gateway import Server, gateway_client

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("teacher-home")
    server = Server(home, tiny_model_dir, "--no-auth", "--flush-interval", "1").start()
    yield server
    server.stop()


def _hand(model, ids: list[int]) -> list[float]:
    """log p(ids[k] | ids[:k]) for k >= 1, one plain forward pass at temperature 1."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].tolist()


def test_echo_scores_token_ids_exactly_and_lands_no_turn(served, tiny_model_dir):
    client = gateway_client(served, "unused")
    model_id = client.models.list().data[0].id
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("What is 2 + 3? The answer is 5.", add_special_tokens=False)["input_ids"]
    r = client.completions.create(model=model_id, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) and r.usage.completion_tokens == 0
    assert lp.tokens == [tok.decode([i]) for i in ids]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert lp.token_logprobs[1:] == pytest.approx(_hand(model, ids), abs=1e-4)
    # vLLM's form (max_tokens 1): the prompt's log-probs, then one generated token
    r1 = client.completions.create(model=model_id, prompt=ids, max_tokens=1, echo=True, logprobs=0)
    assert len(r1.choices[0].logprobs.token_logprobs) == len(ids) + 1
    assert r1.choices[0].logprobs.token_logprobs[1:len(ids)] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    with pytest.raises(openai.UnprocessableEntityError, match="only valid with echo"):
        client.completions.create(model=model_id, prompt=ids, max_tokens=0)
    with pytest.raises(openai.UnprocessableEntityError, match="token ids must be in"):
        client.completions.create(model=model_id, prompt=[len(tok) + 5], max_tokens=0, echo=True, logprobs=0)
    assert served.wait_flushed()["wal_pending"] == 0
    lake = Lakehouse(Paths.from_env(served.home).lakehouse)
    assert not lake.exists("turns") or lake.count("turns") == 0  # scoring is not agent work


def test_a_server_that_echoes_no_prompt_logprobs_is_refused(served, tiny_model_dir):
    backend = OpenAIBackend(base_url=served.url, served_model="not-the-served-model")
    with pytest.raises(OpenAIServerError, match="HTTP 404"):
        backend.prompt_logprobs([[1, 2, 3]])
    with pytest.raises(ValueError, match="opd_teacher_model"):
        GRPOConfig(opd_teacher=served.url + "/v1")


def test_the_teacher_asset_scores_with_a_server_teacher(served, home, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "opd.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [{"prompt": "What is 6*7?", "reference": "42"},
                                                      {"prompt": "What is 2+9?", "reference": "11"}]) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    model_id = gateway_client(served, "unused").models.list().data[0].id
    res = {"lakehouse": LakehouseResource(home=str(home)),
           "policy": PolicyResource(model=str(tiny_model_dir), num_generations=2, max_new_tokens=10, dtype="float32"),
           "review": ReviewResource(),
           "trainer": TrainerResource(dtype="float32", device="cpu", w_rl=0.0, w_opd=1.0, opd_min_effect=0.0,
                                      opd_teacher=served.url + "/v1", opd_teacher_model=model_id)}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        assert materialize([tasks, rollouts, step_scores, reviews, teacher_logprobs, trajectories], partition_key=batch_id,
                           instance=instance, resources=res).success
    lake = Lakehouse(paths.lakehouse)
    rows = lake.read("teacher_logprobs", batch_id=batch_id).to_pylist()
    used = [r for r in rows if r["decision"] == opd.USED]
    assert used, "the tiny model's answers get the verifier's hint, which must be used"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()  # the served policy is the base
    ro = {r["rollout_id"]: r for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}
    tasks_by_id = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    for r in used:
        assert r["teacher"] == f"{served.url}/v1#{model_id}" and r["temperature"] == 1.0
        rollout = ro[r["rollout_id"]]
        completion = list(rollout["completion_token_ids"])
        student_ids = tok(rollout["prompt_text"], add_special_tokens=False)["input_ids"]
        teacher_text = opd.hinted_prompt(rollout["prompt_text"], tasks_by_id[rollout["task_id"]]["prompt"], r["hint"])
        teacher_ids = tok(teacher_text, add_special_tokens=False)["input_ids"]
        t = _hand(model, teacher_ids + completion)[len(teacher_ids) - 1:]
        s = _hand(model, student_ids + completion)[len(student_ids) - 1:]
        assert r["teacher_logprobs"] == pytest.approx(t, abs=1e-4) and r["student_logprobs"] == pytest.approx(s, abs=1e-4)
        assert r["opd_signal"] == pytest.approx([max(-1.0, min(1.0, a - b)) for a, b in zip(t, s)], abs=2e-4)
