"""Hinted OPD on live sessions: the hint goes into the segment's exact prompt tokens after the last user
message, the longest usable hint of the segment's reviews is the one used, only assistant tokens get a
signal (checked against a hand forward pass), and the trainer gets w_rl * A_turn + w_opd * signal."""

from __future__ import annotations

import pytest
import torch
from dagster import DagsterInstance, materialize
from transformers import AutoModelForCausalLM, AutoTokenizer

from assets.batch_assets import reviews, rollouts, step_scores, tasks, teacher_logprobs, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines import sessions
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.training import opd
from tentalis_pipelines.training.samples import build_training_samples
from tests.session_rows import SYSTEM, land_session, live_review, session_turns, tool_session_script

QUESTION = "What is 17 * 23?"
HINT_A = "Call the multiply tool before you answer."
HINT_B = "Add the tool's result to the follow-up number."


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_the_hint_is_inserted_after_the_last_user_message_and_nothing_else_moves(tok):
    ids = list(tok.apply_chat_template([SYSTEM, {"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"])
    assert opd.hinted_prompt_ids(tok, ids, QUESTION, "  ") == ids  # empty hint: the student's context, exactly
    out = opd.hinted_prompt_ids(tok, ids, QUESTION, HINT_A)
    text = tok.decode(ids, clean_up_tokenization_spaces=False)
    at = text.index(QUESTION) + len(QUESTION)
    assert tok.decode(out, clean_up_tokenization_spaces=False) == text[:at] + "\n\n" + opd.HINT_PREFIX + HINT_A + text[at:]
    inserted = tok("\n\n" + opd.HINT_PREFIX + HINT_A, add_special_tokens=False)["input_ids"]
    cut = next(k for k in range(len(ids)) if out[k] != ids[k])
    assert out[:cut] == ids[:cut] and out[cut:cut + len(inserted)] == inserted and out[cut + len(inserted):] == ids[cut:]
    with pytest.raises(ValueError, match="last user message"):
        opd.hinted_prompt_ids(tok, ids, "a question the prompt never asked", HINT_A)


def _hand_logps(model, prompt_ids, completion_ids, temperature):
    full = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(full).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].tolist()


def test_session_segments_get_the_longest_usable_hint_and_a_signal_on_assistant_tokens_only(home, tok, tiny_model_dir):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    a = session_turns(tok, "s-a", tool_session_script())
    b = session_turns(tok, "s-b", tool_session_script())
    c = session_turns(tok, "s-c", tool_session_script("What is 6 * 7?", "Double it."))
    for turns in (a, b, c):
        land_session(lake, turns)
    lake.append("reviews", [
        live_review("s-a", "s-a", 0.9, hint=HINT_A),
        live_review(b[0]["turn_id"], "s-b", 0.2, hint="Use the tool."),  # usable, but shorter than b's other hint
        live_review(b[2]["turn_id"], "s-b", 0.6, hint=HINT_B),
        live_review("s-c", "s-c", 0.3, hint="try again"),  # trivial: never the teacher's context
    ])
    batch_id = sessions.register_sessions_batch(paths.batches, ["s-a", "s-b", "s-c"])
    assets = [tasks, rollouts, step_scores, reviews, teacher_logprobs, trajectories]

    def resources(**trainer):
        return {"lakehouse": LakehouseResource(home=str(home)), "policy": PolicyResource(model=str(tiny_model_dir), dtype="float32"),
                "review": ReviewResource(), "trainer": TrainerResource(dtype="float32", device="cpu", opd_min_effect=0.0, **trainer)}

    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        assert materialize(assets, partition_key=batch_id, instance=instance, resources=resources(w_rl=1.0, w_opd=0.5)).success
        teacher = {r["rollout_id"]: r for r in lake.read("teacher_logprobs", batch_id=batch_id).to_pylist()}
        ro = {r["rollout_id"]: r for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}
        by_session = {ro[rid]["session_id"]: row for rid, row in teacher.items()}
        assert set(by_session) == {"s-a", "s-b", "s-c"}  # one decision row per segment
        assert (by_session["s-a"]["decision"], by_session["s-a"]["hint"]) == (opd.USED, HINT_A)
        assert (by_session["s-b"]["decision"], by_session["s-b"]["hint"]) == (opd.USED, HINT_B)  # the longest usable hint
        assert by_session["s-c"]["decision"] == opd.TRIVIAL and by_session["s-c"]["opd_signal"] is None
        assert by_session["s-a"]["hint_source"] == "api" and by_session["s-a"]["teacher"] == "self:base"

        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        for sid, hint in (("s-a", HINT_A), ("s-b", HINT_B)):
            row = by_session[sid]
            r = ro[row["rollout_id"]]
            teacher_ids = opd.hinted_prompt_ids(tok, r["prompt_token_ids"], QUESTION, hint)
            t = _hand_logps(model, teacher_ids, r["completion_token_ids"], r["temperature"])
            s = _hand_logps(model, r["prompt_token_ids"], r["completion_token_ids"], r["temperature"])
            mask = r["assistant_mask"]
            expect = [max(-1.0, min(1.0, x - y)) if m else 0.0 for x, y, m in zip(t, s, mask)]
            assert row["opd_signal"] == pytest.approx(expect, abs=2e-4)
            assert 0 in mask and all(v == 0.0 for v, m in zip(row["opd_signal"], mask) if not m)  # tool results, user turns
            assert any(abs(v) > 1e-3 for v in row["opd_signal"])  # the hint moves the teacher

        traj = {t["rollout_id"]: t for t in lake.read("trajectories", batch_id=batch_id).to_pylist()}
        assert all((t["w_rl"], t["w_opd"]) == (1.0, 0.5) for t in traj.values())
        samples, _ = build_training_samples(lake, tok, list(traj.values()))  # in the trajectories' order
        assert len(samples) == len(traj) == 3
        for (rid, t), s in zip(traj.items(), samples):
            sig = teacher[rid]["opd_signal"]
            assert t["opd_signal"] == sig
            expect = [a + 0.5 * x for a, x in zip(t["token_advantages"], sig)] if sig is not None else t["token_advantages"]
            assert s.token_advantages == pytest.approx(expect) and s.loss_mask == t["loss_mask"]

        # OPD only: the segment without a usable hint has nothing to learn from and is not kept.
        assert materialize([trajectories], partition_key=batch_id, instance=instance, resources=resources(w_rl=0.0, w_opd=1.0)).success
        kept = {ro[t["rollout_id"]]["session_id"]: t["kept"] for t in lake.read("trajectories", batch_id=batch_id).to_pylist()}
        assert kept == {"s-a": True, "s-b": True, "s-c": False}
