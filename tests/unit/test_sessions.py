"""Live sessions to training: the fresh_sessions sensor and a sessions batch through the assets."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, build_sensor_context

from assets.resources import LakehouseResource, ReviewResource
from jobs.sensors import fresh_sessions
from tentalis_pipelines import sessions
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tests.session_rows import land_session, live_review, session_turns, tool_session_script


@pytest.fixture()
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture(scope="module")
def tok(smol_tokenizer):
    return smol_tokenizer  # the tiny model's tokenizer is this one


def _evaluate(instance, home, cursor=None, *, launch=True, review=None):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(home=str(home)),
                                                                            "review": review or ReviewResource()})
    result = fresh_sessions(ctx)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    if launch:
        # Imported here: Dagster's test utilities bring SQLAlchemy (0.3 s of CPU), which every xdist worker
        # would pay at collection.
        from dagster._core.test_utils import create_run_for_test

        for req in result.run_requests or []:
            create_run_for_test(instance, job_name="rollout_job", tags={"dagster/partition": req.partition_key, "dagster/run_key": req.run_key})
    return result


def test_a_reviewed_session_is_cut_once_and_an_unreviewed_one_is_not(instance, home, tok):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    reviewed, unreviewed = (session_turns(tok, sid, tool_session_script()) for sid in ("s-reviewed", "s-quiet"))
    active = session_turns(tok, "s-active", tool_session_script(), minutes_ago=0)  # still in use: waits for the settle time
    for turns in (reviewed, unreviewed, active):
        land_session(lake, turns)
    lake.append("reviews", [live_review(reviewed[1]["turn_id"], "s-reviewed", 0.9), live_review("s-active", "s-active", 0.5)])

    first = _evaluate(instance, home)
    [req] = first.run_requests
    batch_id = req.partition_key
    assert batch_id.startswith("sessions-") and req.run_key == batch_id
    assert instance.get_dynamic_partitions("task_batches") == [batch_id]
    assert sessions.batch_session_ids(paths.batches, batch_id) == ["s-reviewed"]  # snapshot taken

    # Once: neither the next tick, nor a lost cursor, nor a second review of the same session cuts it again.
    again = _evaluate(instance, home, cursor=first.cursor)
    lake.append("reviews", [live_review("s-reviewed", "s-reviewed", 0.4, reviewer="manager-2")])
    lost = _evaluate(instance, home, cursor=None)
    assert not again.run_requests and not lost.run_requests
    assert instance.get_dynamic_partitions("task_batches") == [batch_id]

    # A newly reviewed session becomes the next batch; the unreviewed one never does.
    lake.append("reviews", [live_review("s-quiet", "s-quiet", 0.1)])
    third = _evaluate(instance, home, cursor=lost.cursor)
    [req3] = third.run_requests
    assert sessions.batch_session_ids(paths.batches, req3.partition_key) == ["s-quiet"]
    assert "s-active" not in {s for ids in sessions.cut_sessions(paths.batches).values() for s in ids}


def test_a_cut_whose_run_never_started_is_requested_again(instance, home, tok):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    turns = session_turns(tok, "s-1", tool_session_script())
    land_session(lake, turns)
    lake.append("reviews", [live_review("s-1", "s-1", 0.9)])
    first = _evaluate(instance, home, launch=False)  # the daemon died before creating the run
    batch_id = first.run_requests[0].partition_key
    again = _evaluate(instance, home, cursor=first.cursor)
    assert [(r.partition_key, r.run_key) for r in again.run_requests] == [(batch_id, batch_id)]


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


def test_an_unreviewed_session_is_cut_once_after_the_review_wait_and_only_with_a_judge(instance, home, tok, monkeypatch):
    monkeypatch.setenv("TENTALIS_SESSION_REVIEW_WAIT_SECONDS", "1800")
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    # last turns 3598 s ago (past the 1800 s wait) and 598 s ago (managers still have time to review)
    old, recent = session_turns(tok, "s-old", tool_session_script()), session_turns(tok, "s-recent", tool_session_script(), minutes_ago=10)
    reviewed = session_turns(tok, "s-reviewed", tool_session_script())
    for turns in (old, recent, reviewed):
        land_session(lake, turns)
    lake.append("reviews", [live_review("s-reviewed", "s-reviewed", 0.9)])
    judge = ReviewResource(manager="llm")

    # No judge configured: only the reviewed session is cut; the unreviewed ones wait for a person.
    first = _evaluate(instance, home)
    assert [sessions.batch_session_ids(paths.batches, r.partition_key) for r in first.run_requests] == [["s-reviewed"]]
    again = _evaluate(instance, home, cursor=first.cursor)
    assert not again.run_requests and "no reviewed session" in again.skip_reason.skip_message

    # With the judge: the session unreviewed past the wait is cut, once; the recent one is not.
    second = _evaluate(instance, home, cursor=again.cursor, review=judge)
    [req] = second.run_requests
    assert req.run_key == req.partition_key and sessions.batch_session_ids(paths.batches, req.partition_key) == ["s-old"]
    third = _evaluate(instance, home, cursor=second.cursor, review=judge)
    lost = _evaluate(instance, home, cursor=None, review=judge)
    assert not third.run_requests and not lost.run_requests
    assert "unreviewed for 1800 s" in third.skip_reason.skip_message
    assert len(instance.get_dynamic_partitions("task_batches")) == 2
    # Once the wait has passed for it too, the recent one follows in a batch of its own.
    monkeypatch.setenv("TENTALIS_SESSION_REVIEW_WAIT_SECONDS", "300")
    [req4] = _evaluate(instance, home, cursor=lost.cursor, review=judge).run_requests
    assert sessions.batch_session_ids(paths.batches, req4.partition_key) == ["s-recent"]
    monkeypatch.setenv("TENTALIS_SESSION_REVIEW_WAIT_SECONDS", "an hour")
    with pytest.raises(ValueError, match="TENTALIS_SESSION_REVIEW_WAIT_SECONDS='an hour' is not a number"):
        _evaluate(instance, home, review=judge)


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








