"""The grounding check end to end: live sessions landed as the gateway lands them, the `grounding_flags`
asset, and the samples a checkpoint trains on under ``trainer.grounding_policy`` (docs/grounding.md).

Two sessions of the same question (one GRPO family): a weather tool returns 72.4 °F; in ``s-bad`` the
assistant answers "78 °F" (the reviewer liked it anyway: 0.9), in ``s-good`` it answers "72 °F" (0.2).
Each session: a tool call, the answer after the tool's output, the answer to a follow-up. Expected
values are computed here by hand, from the turns as landed, not from the stage's own helpers.
"""

from __future__ import annotations

import json

import pytest
from dagster import DagsterInstance, materialize
from transformers import AutoTokenizer

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.grounding_assets import grounding_flags
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from tentalis_pipelines import lineage, sessions
from tentalis_pipelines.gateway import landing
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.training.samples import build_training_samples
from tentalis_pipelines.training.trainer import GRPOConfig
from tests.session_rows import session_turns

SYSTEM = {"role": "system", "content": "You are a weather assistant. Use the tools when you need them."}
QUESTION = "What is the weather in Paris right now?"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOL_CALLS = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
OBSERVATION = json.dumps({"city": "Paris", "temp_f": 72.4, "humidity_pct": 41, "wind_mph": 9})
WRONG = "It is 78 °F in Paris, with 41% humidity."  # the tool said 72.4: "78 °F" is the one unsupported claim
RIGHT = "It is 72 °F in Paris, with 41% humidity."  # 72 rounds 72.4: supported
FOLLOW_UP = ("And the wind?", "The wind is 9 mph.")
PENALTY = 0.7  # not the default 1.0, so a penalty taken from anywhere but the config shows


def _script(answer: str):
    return [([SYSTEM, {"role": "user", "content": QUESTION}], CALL, TOOL_CALLS),
            ([{"role": "tool", "tool_call_id": "call_1", "content": OBSERVATION}], answer, None),
            ([{"role": "user", "content": FOLLOW_UP[0]}], FOLLOW_UP[1], None)]


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _flagged_batch(home, instance, tok, tiny_model_dir):
    """Land both sessions and their reviews through the gateway's landing functions, cut a sessions
    batch, materialise it through trajectories with the grounding check off, then grounding_flags on."""
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    turns = {"s-bad": session_turns(tok, "s-bad", _script(WRONG)), "s-good": session_turns(tok, "s-good", _script(RIGHT))}
    landing.land_records(lake, [{"kind": "turn", "row": r} for t in turns.values() for r in t])
    for sid, score in (("s-bad", 0.9), ("s-good", 0.2)):
        landing.land_review(lake, landing.review_row(tenant="acme", session_id=sid, turn_id=None, score=score, critique="", hint="",
                                                     reviewer="manager-1", rubric="style", review_id=None))
    batch_id = sessions.register_sessions_batch(paths.batches, sorted(turns))
    instance.add_dynamic_partitions("task_batches", [batch_id])
    resources = {"lakehouse": LakehouseResource(home=str(home)), "policy": PolicyResource(model=str(tiny_model_dir)),
                 "trainer": TrainerResource()}
    off = materialize([tasks, rollouts, step_scores, reviews, trajectories, grounding_flags], partition_key=batch_id,
                      instance=instance, resources={**resources, "review": ReviewResource()})
    assert off.success
    assert not lake.exists("grounding_flags")  # review.grounding off: nothing checked, nothing written
    on = materialize([grounding_flags], partition_key=batch_id, instance=instance,
                     resources={**resources, "review": ReviewResource(grounding=True)})
    assert on.success
    return lake, paths, batch_id, turns


def _sublist_at(haystack: list[int], needle: list[int]) -> int:
    hits = [i for i in range(len(haystack) - len(needle) + 1) if haystack[i:i + len(needle)] == needle]
    assert len(hits) == 1, f"the turn's tokens occur {len(hits)} times in the segment"
    return hits[0]


def _hand_flag(tok, turns, rollout) -> tuple[int, int, int, int]:
    """(turn start, turn end, first flagged token, end) in s-bad's completion, by hand: where the
    landed turn's tokens sit in the segment, and which of them the fast tokenizer's offset mapping puts
    over the characters of "78 °F"."""
    answer = turns["s-bad"][1]
    start = _sublist_at(rollout["completion_token_ids"], answer["completion_token_ids"])
    end = start + len(answer["completion_token_ids"])
    enc = tok(WRONG, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == answer["completion_token_ids"][:-1]  # the landed turn: the text's tokens + <|im_end|>
    c0 = WRONG.index("78 °F")
    c1 = c0 + len("78 °F")
    hit = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < c1 and b > c0]
    assert hit == list(range(hit[0], hit[-1] + 1))
    return start, end, start + hit[0], start + hit[-1] + 1


def test_the_contradicted_number_is_flagged_and_the_training_samples_apply_exactly_that(home, instance, tok, tiny_model_dir):
    lake, _, batch_id, turns = _flagged_batch(home, instance, tok, tiny_model_dir)
    ro = {r["session_id"]: r for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}
    bad = ro["s-bad"]
    t0, t1, f0, f1 = _hand_flag(tok, turns, bad)
    assert f1 - f0 >= 2  # "78 °F" spans several tokens: the whole claim is penalised, not one token
    assert tok.decode(bad["completion_token_ids"][f0:f1]).strip() == "78 °F"

    # Exactly one flag: s-bad's answer turn, on those tokens. The tool calls, the faithful answer and the
    # follow-ups (every other turn, all checked) raise none.
    [flag] = lake.read("grounding_flags", batch_id=batch_id).to_pylist()
    assert (flag["rollout_id"], flag["turn_index"], flag["kind"], flag["detector"]) == (bad["rollout_id"], 1, "number", "rules")
    assert (flag["turn_token_start"], flag["turn_token_end"], flag["token_start"], flag["token_end"]) == (t0, t1, f0, f1)
    assert flag["text"] == "78 °F" and (flag["char_start"], flag["char_end"]) == (6, 11)
    assert [(s["start"], s["end"]) for s in bad["turn_spans"]][1] == (t0, t1)

    # build_training_samples as run_training calls it (the trajectories in training order, the pinned versions).
    versions = lineage.table_versions(lake)
    fresh, _ = stage_training.trainable_trajectories(lake, "base", 0, versions)
    fresh = lineage.order_trajectories(fresh)
    by_id = {r["rollout_id"]: i for i, r in enumerate(fresh)}
    built = {}
    for policy in ("off", "penalize", "block"):
        counts: dict[str, int] = {}
        samples, _ = build_training_samples(lake, tok, fresh, versions, grounding_policy=policy, grounding_penalty=PENALTY,
                                            grounding_counts=counts)
        built[policy] = (samples, counts)
    off = built["off"][0]
    b, g = by_id[bad["rollout_id"]], by_id[ro["s-good"]["rollout_id"]]
    assert len(off) == 2 and built["off"][1] == {"penalized_tokens": 0, "blocked_turns": 0}
    # The reviewer liked s-bad (0.9 against 0.2): every trained token of it has a positive advantage.
    assert all(a > 0 for a, m in zip(off[b].token_advantages, off[b].loss_mask) if m)
    assert all(m == 1 for m in off[b].loss_mask[t0:t1])

    pen, counts = built["penalize"]
    expected = [-PENALTY if f0 <= i < f1 else a for i, a in enumerate(off[b].token_advantages)]
    assert pen[b].token_advantages == expected
    assert pen[b].loss_mask == off[b].loss_mask and pen[b].completion_ids == off[b].completion_ids
    assert pen[b].prompt_ids == off[b].prompt_ids and pen[b].advantage == off[b].advantage and pen[b].old_logps == off[b].old_logps
    assert pen[g] == off[g]  # the faithful session: untouched
    assert counts == {"penalized_tokens": f1 - f0, "blocked_turns": 0}

    blk, counts = built["block"]
    assert blk[b].loss_mask == [0 if t0 <= i < t1 else m for i, m in enumerate(off[b].loss_mask)]
    assert sum(off[b].loss_mask) - sum(blk[b].loss_mask) == t1 - t0  # that turn was trained on before: all of it is dropped
    assert blk[b].token_advantages == off[b].token_advantages and blk[b].completion_ids == off[b].completion_ids
    assert blk[g] == off[g]
    assert counts == {"penalized_tokens": 0, "blocked_turns": 1}


@pytest.mark.parametrize("policy", ["penalize", "block"])
def test_a_checkpoint_trains_on_the_grounded_samples_and_replay_rebuilds_them(policy, home, instance, tok, tiny_model_dir,
                                                                               monkeypatch):
    lake, paths, batch_id, turns = _flagged_batch(home, instance, tok, tiny_model_dir)
    bad = next(r for r in lake.read("rollouts", batch_id=batch_id).to_pylist() if r["session_id"] == "s-bad")
    t0, t1, f0, f1 = _hand_flag(tok, turns, bad)
    seen = []
    real = stage_training.train_grpo

    def spy(model, tokenizer, samples, config, *, state=None, on_step=None):
        seen.extend(samples)
        return real(model, tokenizer, samples, config, state=state, on_step=on_step)

    monkeypatch.setattr(stage_training, "train_grpo", spy)
    config = GRPOConfig(beta=0.0, dtype="float32", device="cpu", grounding_policy=policy, grounding_penalty=PENALTY)
    res = stage_training.train_checkpoint(lake, paths, PolicySettings(model=str(tiny_model_dir)), config, promote=False)
    ckpt_id = res.metadata["checkpoint_id"]
    [row] = lake.read("checkpoints").to_pylist()
    metrics = json.loads(row["metrics"])
    if policy == "penalize":
        assert (metrics["grounding_penalized_tokens"], metrics["grounding_blocked_turns"]) == (f1 - f0, 0)
    else:
        assert (metrics["grounding_penalized_tokens"], metrics["grounding_blocked_turns"]) == (0, 1)
    [trained_bad] = [s for s in seen if s.completion_ids == bad["completion_token_ids"]]
    if policy == "penalize":
        assert trained_bad.token_advantages[f0:f1] == [-PENALTY] * (f1 - f0)
    else:
        assert trained_bad.loss_mask[t0:t1] == [0] * (t1 - t0)

    # The replay rebuilds exactly the trained samples, and keeps doing so after the flags change: they
    # are read at the grounding_flags version pinned in the manifest.
    assert lineage.replay(lake, ckpt_id, tok) == seen
    assert lineage.verify_replay(lake, ckpt_id, tok)[0]
    lake.write_batch("grounding_flags", batch_id, [])  # a later check that found nothing
    assert lineage.replay(lake, ckpt_id, tok) == seen
    rows = lineage.order_trajectories(lake.read("trajectories", batch_id=batch_id).to_pylist())
    now, _ = build_training_samples(lake, tok, rows, grounding_policy=policy, grounding_penalty=PENALTY)
    assert now != seen  # ... while the current flags (none) would give other samples
