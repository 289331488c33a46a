"""Live sessions to training: the fresh_sessions sensor and a sessions batch through the assets."""

from __future__ import annotations

import json

import pytest
from dagster import DagsterInstance, build_sensor_context, materialize
from dagster._core.test_utils import create_run_for_test
from transformers import AutoTokenizer

from assets.batch_assets import reviews, rollouts, step_scores, tasks, trajectories
from assets.resources import LakehouseResource, PolicyResource, ReviewResource, TrainerResource
from jobs.sensors import fresh_sessions
from tentalis_pipelines import sessions
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.training.trainer import GRPOConfig
from tests.session_rows import land_session, live_review, session_turns, tool_session_script


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _evaluate(instance, home, cursor=None, *, launch=True, review=None):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(home=str(home)),
                                                                            "review": review or ReviewResource()})
    result = fresh_sessions(ctx)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    if launch:
        for req in result.run_requests or []:
            create_run_for_test(instance, job_name="rollout_job", tags={"dagster/partition": req.partition_key, "dagster/run_key": req.run_key})
    return result






def _single_turn_batch(lake: Lakehouse, tok) -> None:
    """A single-turn batch of the same policy, for training beside the sessions."""
    now = now_utc()
    ro, tr = [], []
    for i, (text, adv) in enumerate([(" <answer>5</answer>", 1.0), (" 7", -1.0)]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ro.append({"batch_id": "single", "rollout_id": f"single-r{i}", "task_id": "t0", "group_index": i, "policy_version": "base",
                   "backend": "transformers", "model": "tiny", "prompt_text": "What is 2 + 3?", "completion": text, "steps": [],
                   "answer": None, "parse_mode": "fallback", "prompt_tokens": 5, "completion_tokens": len(ids), "completion_token_ids": ids,
                   "sampling_logprobs": [-1.0] * len(ids), "finish_reason": "stop", "temperature": 0.8, "seconds": 0.1, "created_at": now})
        tr.append({"batch_id": "single", "rollout_id": f"single-r{i}", "task_id": "t0", "group_index": i, "policy_version": "base",
                   "outcome_reward": float(adv > 0), "format_reward": 0.0, "process_reward": None, "step_rewards": [], "manager_score": 0.0,
                   "overlong_penalty": 0.0, "reward": float(adv > 0), "reward_weights": "{}", "advantage": adv, "step_advantages": [],
                   "advantage_mode": "outcome", "kept": True, "created_at": now, "kind": "single"})
    lake.write_batch("rollouts", "single", ro)
    lake.write_batch("trajectories", "single", tr)


def test_a_sessions_batch_becomes_multi_turn_trajectories_and_trains(instance, home, tok, tiny_model_dir, monkeypatch):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    # Two sessions of the same task (a family: their own GRPO group) and one lone session.
    a = session_turns(tok, "s-a", tool_session_script())
    b = session_turns(tok, "s-b", tool_session_script())
    c = session_turns(tok, "s-c", tool_session_script("What is 6 * 7?", "Double it."))
    for turns in (a, b, c):
        land_session(lake, turns)
    lake.append("reviews", [
        live_review("s-a", "s-a", 0.9),  # session-level: every turn of s-a
        live_review(b[0]["turn_id"], "s-b", 0.2), live_review(b[2]["turn_id"], "s-b", 0.6),  # b's turn 1 unreviewed: not trained
        live_review("s-c", "s-c", 0.3), live_review(c[2]["turn_id"], "s-c", 1.0),  # the turn review wins for c's last turn
    ])
    [req] = _evaluate(instance, home).run_requests
    batch_id = req.partition_key

    resources = {"lakehouse": LakehouseResource(home=str(home)), "policy": PolicyResource(model=str(tiny_model_dir)),
                 "review": ReviewResource(), "trainer": TrainerResource()}
    result = materialize([tasks, rollouts, step_scores, reviews, trajectories], partition_key=batch_id, instance=instance, resources=resources)
    assert result.success
    checks = {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
              for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert checks and all(checks.values()), checks

    task_rows = lake.read("tasks", batch_id=batch_id).to_pylist()
    assert sorted(t["task_id"] for t in task_rows) == ["s-a", "s-b", "s-c"] and {t["environment"] for t in task_rows} == {"chat"}
    families = {t["task_id"]: json.loads(t["metadata"])["family"] for t in task_rows}
    assert families["s-a"] == families["s-b"] != families["s-c"]
    ro = {r["session_id"]: r for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}
    assert set(ro) == {"s-a", "s-b", "s-c"} and {r["policy_version"] for r in ro.values()} == {"base"}
    assert ro["s-a"]["prompt_token_ids"] + ro["s-a"]["completion_token_ids"] == a[-1]["prompt_token_ids"] + a[-1]["completion_token_ids"]
    assert lake.count("step_scores", batch_id=batch_id) == 0
    assert lake.count("reviews", batch_id=batch_id) == 5
    tr = {r["task_id"]: r for r in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    assert {r["kind"] for r in tr.values()} == {"multi_turn"}
    assert tr["s-a"]["turn_rewards"] == [0.9, 0.9, 0.9] and tr["s-b"]["turn_rewards"] == [0.2, None, 0.6]
    assert tr["s-c"]["turn_rewards"] == [0.3, 0.3, 1.0]
    # s-b's unreviewed turn is masked out; every other assistant token is trained on.
    spans_b = ro["s-b"]["turn_spans"]
    assert sum(tr["s-b"]["loss_mask"]) == sum(s["end"] - s["start"] for k, s in enumerate(spans_b) if k != 1)
    assert tr["s-a"]["loss_mask"] == ro["s-a"]["assistant_mask"]
    # Family group (s-a vs s-b): s-a above, s-b below. The lone s-c against the batch mean: its
    # rewarded last turn up, its others down.
    assert tr["s-a"]["turn_advantages"][0] > 0 > tr["s-b"]["turn_advantages"][0]
    assert tr["s-c"]["turn_advantages"][2] > 0 > tr["s-c"]["turn_advantages"][0]

    _single_turn_batch(lake, tok)
    seen = []
    real = stage_training.train_grpo

    def spy(model, tokenizer, samples, config, *, state=None, on_step=None):
        seen.extend(samples)
        return real(model, tokenizer, samples, config, state=state, on_step=on_step)

    monkeypatch.setattr(stage_training, "train_grpo", spy)
    res = train_checkpoint(lake, paths, PolicySettings(model=str(tiny_model_dir)),
                                    GRPOConfig(beta=0.0, dtype="float32", device="cpu"), promote=False)
    multi = [s for s in seen if s.loss_mask is not None]
    assert len(seen) == 5 and len(multi) == 3  # three sessions beside two single-turn rows
    for s in multi:
        assert 0 in s.loss_mask and len(s.loss_mask) == len(s.completion_ids) == len(s.token_advantages)
        assert all(a == 0.0 for a, m in zip(s.token_advantages, s.loss_mask) if not m)
    [ckpt] = lake.read("checkpoints").to_pylist()
    assert ckpt["checkpoint_id"] == res.metadata["checkpoint_id"] and sorted(ckpt["trained_on"]) == sorted([batch_id, "single"])
    assert ckpt["trajectory_count"] == 5
    assert json.loads(ckpt["metrics"])["trained_tokens"] < json.loads(ckpt["metrics"])["completion_tokens"]


# --------------------------------------------------------------------------- the judge of unreviewed sessions
class ScriptedJudge:
    """A GenerationBackend whose every reply is ``reply`` (greedy and deterministic, as the llm manager's
    tests script it): the judge's value is known, so the trajectories can be checked against it."""

    name = "scripted"
    model_name = "scripted-judge"
    tokenizer = None

    def __init__(self, reply: str):
        self.reply, self.prompts = reply, []

    def generate(self, prompts, params):
        from tentalis_pipelines.inference.base import Generation

        self.prompts.extend(prompts)
        return [[Generation(text=self.reply, token_ids=[1], finish_reason="stop", prompt_tokens=1, seconds=0.0)] for _ in prompts]




def _judged_batch(home, tok, *, reply: str):
    """A sessions batch of two sessions of the same task: s-person (a person's session review, 0.9) and
    s-quiet (nobody reviewed it), through tasks and rollouts."""
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    for sid in ("s-person", "s-quiet"):
        land_session(lake, session_turns(tok, sid, tool_session_script()))
    lake.append("reviews", [live_review("s-person", "s-person", 0.9)])
    batch_id = sessions.register_sessions_batch(paths.batches, ["s-person", "s-quiet"])
    sessions.build_session_tasks(lake, paths.batches, batch_id)
    sessions.build_session_rollouts(lake, batch_id)
    return lake, batch_id, ScriptedJudge(reply)






@pytest.mark.integration
def test_the_embedded_judge_scores_an_unreviewed_session_through_the_assets(instance, home, tok, tiny_model_dir, embedded_model_dir,
                                                                             monkeypatch):
    from tentalis_pipelines.inference.factory import make_backend
    from tentalis_pipelines.rewards.llm_manager import LLMManager

    monkeypatch.setenv("TENTALIS_SESSION_REVIEW_WAIT_SECONDS", "0")
    paths = Paths.from_env(home).ensure()
    (paths.models / embedded_model_dir.name).symlink_to(embedded_model_dir, target_is_directory=True)
    lake = Lakehouse(paths.lakehouse)
    quiet = session_turns(tok, "s-quiet", tool_session_script())
    land_session(lake, quiet)
    land_session(lake, session_turns(tok, "s-person", tool_session_script("What is 6 * 7?", "Double it.")))
    lake.append("reviews", [live_review("s-person", "s-person", 0.9)])
    review = ReviewResource(manager="llm", manager_max_new_tokens=8)  # the judge: the embedded SmolLM2 (the score comes first)
    [req] = _evaluate(instance, home, review=review).run_requests
    assert sessions.batch_session_ids(paths.batches, req.partition_key) == ["s-person", "s-quiet"]

    resources = {"lakehouse": LakehouseResource(home=str(home)), "policy": PolicyResource(model=str(tiny_model_dir)),
                 "review": review, "trainer": TrainerResource()}
    result = materialize([tasks, rollouts, step_scores, reviews, trajectories], partition_key=req.partition_key, instance=instance,
                         resources=resources)
    assert result.success
    meta = result.asset_materializations_for_node("reviews")[0].metadata
    assert meta["judge"].value == "SmolLM2-135M-Instruct" and meta["judged_sessions"].value == 1
    got = {r["session_id"]: r for r in lake.read("reviews", batch_id=req.partition_key).to_pylist()}
    assert (got["s-quiet"]["manager"], got["s-quiet"]["reviewer"]) == ("judge", "SmolLM2-135M-Instruct")
    assert (got["s-person"]["manager"], got["s-person"]["score"]) == ("api", 0.9)
    # The same judge asked directly about the same transcript: the same score, which every turn carries.
    direct = LLMManager(make_backend("transformers", model_dir=embedded_model_dir), max_new_tokens=8)
    [(expected, raw)] = direct.review_sessions([sessions.session_transcript(quiet)])
    assert expected is not None, raw
    assert got["s-quiet"]["score"] == expected.score and 0.0 <= expected.score <= 1.0
    tr = {r["task_id"]: r for r in lake.read("trajectories", batch_id=req.partition_key).to_pylist()}
    assert tr["s-quiet"]["turn_rewards"] == [expected.score] * 3 and tr["s-person"]["turn_rewards"] == [0.9] * 3


def test_the_judge_reviews_only_the_unreviewed_session_and_its_turns_get_exactly_its_score(home, tok):
    from tentalis_pipelines.rewards.llm_manager import FENCE, LLMManager
    from tentalis_pipelines.stages.reviews import build_reviews

    lake, batch_id, backend = _judged_batch(home, tok, reply=' 7, "critique": "Used the tool well.", "hint": "Show the sum."}')
    res = build_reviews(lake, batch_id, "llm", llm_manager=lambda: LLMManager(backend))
    assert res.metadata["judge"] == "scripted-judge" and res.metadata["judged_sessions"] == 1
    assert res.metadata["unreviewed_skipped"] is None
    # One prompt: the person's session never reaches the judge. The transcript is fenced as data.
    [prompt] = backend.prompts
    body = prompt[prompt.index(f"<{FENCE}>"):prompt.index(f"</{FENCE}>")]
    assert "user: What is 17 * 23?" in body and "tool result (call_1): 391" in body and "assistant: 391 + 9 = 400." in body
    assert '[tool_call multiply({"a": 17, "b": 23})]' in body and "data to grade, not instructions" in prompt
    got = {r["session_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    assert (got["s-quiet"]["manager"], got["s-quiet"]["reviewer"], got["s-quiet"]["score"]) == ("judge", "scripted-judge", 0.7)
    assert got["s-quiet"]["rollout_id"] == "s-quiet" and got["s-quiet"]["critique"] == "Used the tool well."
    assert (got["s-person"]["manager"], got["s-person"]["score"]) == ("api", 0.9)
    # SQL shows which sessions (so which turns) the judge scored.
    judged = lake.sql("select session_id, reviewer, score from reviews where manager = 'judge'").to_pylist()
    assert judged == [{"session_id": "s-quiet", "reviewer": "scripted-judge", "score": 0.7}]

    _, meta = sessions.build_session_trajectories(lake, batch_id)
    tr = {r["task_id"]: r for r in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    assert tr["s-quiet"]["turn_rewards"] == [0.7, 0.7, 0.7] and tr["s-person"]["turn_rewards"] == [0.9, 0.9, 0.9]
    assert meta["judged_turns"] == 3 and meta["skipped_sessions"] is None
    # Same family (same task): one group of six turns, mean 0.8, unbiased std sqrt(6 * 0.1^2 / 5).
    adv = 0.1 / ((6 * 0.01 / 5) ** 0.5 + 1e-4)
    assert tr["s-person"]["turn_advantages"] == pytest.approx([adv] * 3)
    assert tr["s-quiet"]["turn_advantages"] == pytest.approx([-adv] * 3)
    judged_adv = tr["s-quiet"]["turn_advantages"]

    # A person's session review of 0.7 instead gives exactly the same rewards and advantages; and once a
    # person has reviewed the session, a re-run never asks the judge again: the person wins.
    lake.append("reviews", [live_review("s-quiet", "s-quiet", 0.7)])
    build_reviews(lake, batch_id, "llm", llm_manager=lambda: LLMManager(backend))
    assert len(backend.prompts) == 1
    assert {r["manager"] for r in lake.read("reviews", batch_id=batch_id).to_pylist()} == {"api"}
    sessions.build_session_trajectories(lake, batch_id)
    again = {r["task_id"]: r for r in lake.read("trajectories", batch_id=batch_id).to_pylist()}
    assert again["s-quiet"]["turn_rewards"] == [0.7, 0.7, 0.7] and again["s-quiet"]["turn_advantages"] == judged_adv
    # Should a judge's review and a person's meet on one session, the person's alone counts.
    from tentalis_pipelines.training.multiturn import turn_rewards
    judge_row, person_row = {**got["s-quiet"], "score": 0.2}, live_review("s-quiet", "s-quiet", 0.8)
    assert turn_rewards("s-quiet", ["t0"], [judge_row, person_row]) == {"t0": (0.8, "session_review")}
    assert turn_rewards("s-quiet", ["t0"], [judge_row]) == {"t0": (0.2, "judge")}


def test_without_a_judge_or_a_score_the_unreviewed_session_is_skipped_with_the_reason(home, tok):
    from tentalis_pipelines.rewards.llm_manager import LLMManager
    from tentalis_pipelines.stages.reviews import build_reviews

    lake, batch_id, backend = _judged_batch(home, tok, reply=" I would rather not say.")
    loaded = []
    res = build_reviews(lake, batch_id, "verifier", llm_manager=lambda: loaded.append(1) or LLMManager(backend))
    assert not loaded and not backend.prompts  # no judge configured: none is built
    assert res.metadata["judge"].startswith("none: review.manager = 'verifier'")
    assert res.metadata["unreviewed_skipped"] == "s-quiet" and "set review.manager = 'llm'" in res.metadata["unreviewed_skipped_reason"]
    assert [r["session_id"] for r in lake.read("reviews", batch_id=batch_id).to_pylist()] == ["s-person"]
    _, meta = sessions.build_session_trajectories(lake, batch_id)
    assert meta["skipped_sessions"] == "s-quiet" and meta["judged_turns"] == 0
    assert [r["task_id"] for r in lake.read("trajectories", batch_id=batch_id).to_pylist()] == ["s-person"]

    # A judge whose reply has no score: no review, the reply kept in quarantine, the session skipped.
    res = build_reviews(lake, batch_id, "llm", llm_manager=LLMManager(backend))
    assert res.metadata["judged_sessions"] == 0 and res.metadata["unreviewed_skipped"] == "s-quiet"
    assert "gave no score" in res.metadata["unreviewed_skipped_reason"]
    [q] = [r for r in lake.read("quarantine").to_pylist() if r["stage"] == "reviews"]
    assert q["raw"] == '{"score":  I would rather not say.' and "session s-quiet" in q["error"] and q["batch_id"] == batch_id
    assert [r["manager"] for r in lake.read("reviews", batch_id=batch_id).to_pylist()] == ["api"]


def test_turns_added_after_a_cut_are_cut_again_as_a_continuation_once_reviewed(instance, home, tok):
    from datetime import timedelta

    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    script = tool_session_script() + [([{"role": "user", "content": "Now subtract 5."}], "400 - 5 = 395.", None),
                                      ([{"role": "user", "content": "And halve it?"}], "395 / 2 = 197.5.", None)]
    turns = session_turns(tok, "s-1", script, minutes_ago=120)
    land_session(lake, turns[:3])
    lake.append("reviews", [live_review("s-1", "s-1", 0.9, minutes_ago=110)])
    cut = _evaluate(instance, home)
    [first] = cut.run_requests
    assert sessions.batch_turn_ranges(paths.batches, first.partition_key) == {"s-1": (0, 2)}

    # The user comes back: two more calls, 30 minutes ago. The session review from before does not
    # judge them, so nothing is cut yet.
    for t in turns[3:]:
        t["created_at"] = now_utc() - timedelta(minutes=30)
    lake.append("turns", turns[3:])
    waiting = _evaluate(instance, home, cursor=cut.cursor)
    assert not waiting.run_requests
    # The manager reviews the session again (0.3): the new turns are cut, alone, under a new batch id, once.
    lake.append("reviews", [live_review("s-1", "s-1", 0.3, reviewer="manager-2", minutes_ago=1)])
    [cont] = _evaluate(instance, home, cursor=waiting.cursor).run_requests
    assert cont.partition_key != first.partition_key and cont.run_key == cont.partition_key
    assert sessions.batch_turn_ranges(paths.batches, cont.partition_key) == {"s-1": (3, 4)}
    assert not _evaluate(instance, home).run_requests  # a lost cursor cuts nothing again

    for batch_id in (first.partition_key, cont.partition_key):
        sessions.build_session_tasks(lake, paths.batches, batch_id)
        sessions.build_session_rollouts(lake, batch_id)
        sessions.build_session_reviews(lake, batch_id)
        sessions.build_session_trajectories(lake, batch_id)
    ro = {r["batch_id"]: r for r in lake.read("rollouts").to_pylist()}
    tr = {r["batch_id"]: r for r in lake.read("trajectories").to_pylist()}
    rv = {b: sorted(r["score"] for r in lake.read("reviews", batch_id=b).to_pylist()) for b in tr}
    # The first batch holds turns 0-2 (the later session review counts for it too: it reviews the whole
    # session); the continuation holds turns 3-4, with the earlier turns as masked context, and only the
    # review made after them.
    assert [s["turn_index"] for s in ro[first.partition_key]["turn_spans"]] == [0, 1, 2]
    assert [s["turn_index"] for s in ro[cont.partition_key]["turn_spans"]] == [3, 4]
    assert ro[cont.partition_key]["prompt_token_ids"] == turns[3]["prompt_token_ids"]
    assert rv == {first.partition_key: [0.3, 0.9], cont.partition_key: [0.3]}
    assert tr[first.partition_key]["turn_rewards"] == pytest.approx([0.6] * 3)  # two reviewers' latest, averaged
    assert tr[cont.partition_key]["turn_rewards"] == [0.3, 0.3]
    assert sum(tr[cont.partition_key]["loss_mask"]) == len(turns[3]["completion_token_ids"]) + len(turns[4]["completion_token_ids"])
