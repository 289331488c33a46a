"""Issue 13, end to end: a real `tentalis serve` subprocess lands an agent's session (a tool call the
model wrote, the tool's result fed back, a streamed reply) and its manager's review; the gateway's own
`sessions`/`turns`/`reviews` rows are cut by the `fresh_sessions` sensor into a sessions batch, whose
assets build the multi-turn trajectory; its loss mask is 1 exactly on the tokens the client received as
assistant replies, checked token by token against what the client saw.

A random tiny model cannot write a tool call, so the served model is the tiny Llama taught (a few
seconds of Adam, greedy decoding) to answer this one conversation: its first reply is a Hermes tool call
the gateway parses into ``tool_calls``, exactly as a tool-using model's would be."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import httpx
import pytest
import torch
from dagster import DagsterInstance, build_sensor_context, materialize
from dagster._core.test_utils import create_run_for_test
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from jobs.sensors import fresh_sessions
from tentalis_pipelines import sessions
from tentalis_pipelines.gateway import chat
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tests.conftest import CACHE
from tests.test_gateway import TOOLS, Server, gateway_client, run_cli

openai = pytest.importorskip("openai")

SESSION = "sess-e2e"
SYSTEM = {"role": "system", "content": "You can add with the add tool."}
QUESTION = {"role": "user", "content": "What is 2+3?"}
CALL = {"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'  # what a Hermes model writes
ANSWER, AGAIN = "2 + 3 = 5.", "Again: the sum is 5."


def _script(tool_call_id: str = "call_x") -> list[tuple[list[dict], str]]:
    """(messages of each call, the reply the model is taught to write for it)."""
    first = [SYSTEM, QUESTION]
    second = first + [{"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": tool_call_id}]},
                      {"role": "tool", "tool_call_id": tool_call_id, "content": "5"}]
    third = second + [{"role": "assistant", "content": ANSWER}, {"role": "user", "content": "Say it again."}]
    return [(first, TOOL_TEXT), (second, ANSWER), (third, AGAIN)]


@pytest.fixture(scope="module")
def taught_model(tiny_model_dir):
    """The tiny Llama, taught to write each reply of the script (its tokens + <|im_end|>) after that call's
    prompt. The calls extend one another, so one pass over the last call's context teaches all three; it
    is taught until greedy decoding is right by a margin. Cached beside the tiny model."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    context, targets = [], []  # targets: (start, token ids) of each reply inside the context
    for messages, reply in _script():
        prompt = chat.render_chat(tok, messages, TOOLS)[1]
        assert prompt[: len(context)] == context  # the next call's prompt re-renders the history verbatim
        completion = tok(reply, add_special_tokens=False)["input_ids"] + [im_end]
        targets.append((len(prompt), completion))
        context = prompt + completion
    key = hashlib.sha256(json.dumps([context, [t[0] for t in targets]]).encode()).hexdigest()[:12]
    out = CACHE / "models" / f"tiny-tools-{key}"
    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    positions = torch.tensor([start - 1 + i for start, ids in targets for i in range(len(ids))])
    labels = torch.tensor([t for _, ids in targets for t in ids])
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    ids = torch.tensor([context])
    for _ in range(400):
        logits = model.lm_head(model.model(input_ids=ids).last_hidden_state[0, positions])
        right = logits.gather(1, labels[:, None]).squeeze(1)
        margin = right - logits.scatter(1, labels[:, None], float("-inf")).max(1).values
        if margin.min().item() > 2.0:
            break
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    else:
        raise AssertionError(f"the tiny model did not learn the script (margin {margin.min().item():.2f})")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def test_a_served_session_with_a_tool_call_becomes_a_trajectory_masked_on_exactly_the_replies(
        taught_model, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TENTALIS_HOME", str(home))
    monkeypatch.setenv("TENTALIS_SESSION_SETTLE_SECONDS", "0")
    key = run_cli(home, "keys", "create", "--tenant", "acme").stdout.strip()
    server = Server(home, taught_model, "--flush-interval", "0.2").start()
    try:
        agent = gateway_client(server, key, SESSION)
        [(first, _), (second, _), (third, _)] = _script()
        r1 = agent.chat.completions.create(model="tentalis", messages=first, tools=TOOLS, max_tokens=64, temperature=0)
        m1 = r1.choices[0].message
        assert (m1.content, r1.choices[0].finish_reason, len(m1.tool_calls)) == (None, "tool_calls", 1)
        call = m1.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})
        # the agent runs the tool and sends the call and its result back, as the client received them
        second = first + [m1.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        r2 = agent.chat.completions.create(model="tentalis", messages=second, tools=TOOLS, max_tokens=64, temperature=0)
        answer = r2.choices[0].message.content
        assert answer == ANSWER and r2.choices[0].finish_reason == "stop"
        third = second + [{"role": "assistant", "content": answer}, third[-1]]
        streamed = ""
        for chunk in agent.chat.completions.create(model="tentalis", messages=third, tools=TOOLS, max_tokens=64, temperature=0,
                                                   stream=True):
            streamed += "".join(ch.delta.content or "" for ch in chunk.choices)
        assert streamed == AGAIN
        review = httpx.post(server.url + "/v1/reviews", headers={"Authorization": f"Bearer {key}"},
                            json={"session_id": SESSION, "score": 0.8, "critique": "used the tool", "reviewer": "manager-1"})
        assert review.status_code == 200, review.text
        server.wait_flushed()
    finally:
        server.stop()

    # the production path: the sensor cuts the gateway's rows into a batch, the batch's assets run
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(instance=instance, resources={"lakehouse": LakehouseResource(home=str(home)), "review": ReviewResource()})
        result = fresh_sessions(ctx)
        [req] = result.run_requests
        batch_id = req.partition_key
        for dp in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(dp.partitions_def_name, list(dp.partition_keys))
        create_run_for_test(instance, job_name="rollout_job", tags={"dagster/partition": batch_id, "dagster/run_key": req.run_key})
        assert sessions.batch_session_ids(paths.batches, batch_id) == [SESSION]
        resources = {"lakehouse": LakehouseResource(home=str(home)), "policy": PolicyResource(model=str(taught_model)),
                     "review": ReviewResource(), "trainer": TrainerResource()}
        done = materialize([tasks, rollouts, step_scores, reviews, trajectories], partition_key=batch_id, instance=instance,
                           resources=resources)
        assert done.success
    [ro] = lake.read("rollouts", batch_id=batch_id).to_pylist()
    [tr] = lake.read("trajectories", batch_id=batch_id).to_pylist()
    assert tr["kind"] == "multi_turn" and tr["turn_rewards"] == [0.8, 0.8, 0.8]
    assert tr["loss_mask"] == ro["assistant_mask"]  # every turn reviewed: the loss mask is the assistant mask

    # one sample: the last call's whole context, its first call's prompt as the prompt
    tok = AutoTokenizer.from_pretrained(taught_model)
    turns = sorted(lake.read("turns").to_pylist(), key=lambda t: t["turn_index"])
    assert [t["session_id"] for t in turns] == [SESSION] * 3
    assert ro["prompt_token_ids"] == turns[0]["prompt_token_ids"] == chat.render_chat(tok, first, TOOLS)[1]
    context = ro["prompt_token_ids"] + ro["completion_token_ids"]
    assert context == turns[2]["prompt_token_ids"] + turns[2]["completion_token_ids"]
    completion, mask = ro["completion_token_ids"], tr["loss_mask"]
    assert len(mask) == len(completion) and set(mask) == {0, 1}

    # masked-in: exactly the three replies the client received (with the <|im_end|> the model wrote), in order
    runs, masked_out, k = [], [], 0
    while k < len(mask):
        j = k
        while j < len(mask) and mask[j] == mask[k]:
            j += 1
        (runs if mask[k] else masked_out).append(tok.decode(completion[k:j]))
        k = j
    assert runs == [TOOL_TEXT + "<|im_end|>", answer + "<|im_end|>", streamed + "<|im_end|>"]
    assert chat.parse_tool_calls(runs[0].removesuffix("<|im_end|>"))[1][0]["function"] == call.function.model_dump()
    # masked-out: only the template and the tool's / user's words between the replies; the system prompt,
    # tool schemas and question are the (untrained) prompt
    assert masked_out == ["\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                          "\n<|im_start|>user\nSay it again.<|im_end|>\n<|im_start|>assistant\n"]
    assert mask[0] == 1 and mask[-1] == 1
