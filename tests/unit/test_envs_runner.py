"""The episode runner and the way episodes reach the sessions machinery (no sandbox, no model)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tentalis_pipelines import schemas
from tentalis_pipelines.envs.base import (
    SUBMITTED,
    TURN_LIMIT,
    Environment,
    EnvironmentUnavailable,
    Episode,
    Observation,
    StepResult,
    Verdict,
    end_kind,
)
from tentalis_pipelines.envs.runner import (
    PolicyOutput,
    as_policy_output,
    episode_review,
    episode_to_turns,
    prompt_messages_per_turn,
    run_episode,
    run_episodes,
)
from tentalis_pipelines.training import multiturn


class ToyEnv(Environment):
    """Ends on the action "done" (reward 1) or at its turn limit; echoes each action."""

    name = "toy"

    def __init__(self, max_turns: int = 3, fail_reset: bool = False):
        self.max_turns = max_turns
        self.fail_reset = fail_reset
        self.closed = 0
        self.last = ""

    def reset(self, task):
        if self.fail_reset:
            raise OSError("no sandbox today")
        self.n, self.last = 0, ""
        return Observation([{"role": "system", "content": "sys", "kind": "system"},
                            {"role": "user", "content": "demo q", "kind": "demonstration"},
                            {"role": "assistant", "content": "demo a", "kind": "demonstration"},
                            {"role": "user", "content": task["prompt"], "kind": "instruction"}])

    def step(self, action):
        self.n += 1
        self.last = action.strip()
        done = self.last == "done" or self.n >= self.max_turns
        info = {"command": self.last}
        if done:
            info["end_reason"] = SUBMITTED if self.last == "done" else TURN_LIMIT
        return StepResult(Observation([{"role": "user", "content": f"saw {self.last}", "kind": "observation"}]),
                          self.verify().reward if done else 0.0, done, info)

    def verify(self):
        return Verdict(self.last == "done", 1.0 if self.last == "done" else 0.0, "toy")

    def close(self):
        self.closed += 1


TASK = {"task_id": "toy-1", "prompt": "say done"}


def test_runner_records_each_turn_with_its_tokens_and_the_verdict():
    replies = iter([("hello", [5, 6], [-0.5, -0.25], [1, 2, 3]), ("done", [7], [-0.1], [1, 2, 3, 5, 6, 9, 9])])
    seen = []

    def policy(messages):
        seen.append(messages)
        return next(replies)

    env = ToyEnv()
    ep = run_episode(env, TASK, policy)
    assert ep.end_reason == SUBMITTED and ep.passed and ep.reward == 1.0 and ep.turns_used == 2
    assert [t.token_ids for t in ep.turns] == [[5, 6], [7]]
    assert [t.logprobs for t in ep.turns] == [[-0.5, -0.25], [-0.1]]
    assert ep.turns[1].prompt_token_ids == [1, 2, 3, 5, 6, 9, 9]
    assert ep.turns[0].action == "hello" and ep.turns[0].observation == "saw hello"
    # the policy sees role and content only, the conversation grows by turn and observation
    assert seen[1][-2:] == [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "saw hello"}]
    assert all(set(m) == {"role", "content"} for m in seen[1])
    assert [m["kind"] for m in ep.messages][-3:] == ["assistant", "observation", "assistant"]
    assert env.closed >= 1


def test_turn_limit_and_failures_end_with_a_reason_and_close_the_env():
    env = ToyEnv(max_turns=2)
    ep = run_episode(env, TASK, lambda m: "nope")
    assert ep.end_reason == TURN_LIMIT and ep.turns_used == 2 and not ep.passed

    def broken(messages):
        raise RuntimeError("backend down")

    env = ToyEnv()
    ep = run_episode(env, TASK, broken)
    assert end_kind(ep.end_reason) == "error" and "backend down" in ep.end_reason and ep.reward == 0.0
    assert env.closed >= 1
    ep = run_episode(ToyEnv(fail_reset=True), TASK, lambda m: "done")
    assert ep.end_reason.startswith("error: reset failed") and ep.turns_used == 0


def test_policy_output_shapes():
    assert as_policy_output("x") == PolicyOutput("x")
    assert as_policy_output(("x", [1], [-1.0])) == PolicyOutput("x", [1], [-1.0], None)
    assert as_policy_output(["x", [1], None, [4, 5]]).prompt_token_ids == [4, 5]

    class Gen:
        text, token_ids, logprobs, finish_reason = "y", [2], [-0.5], "length"

    out = as_policy_output(Gen())
    assert (out.text, out.token_ids, out.finish_reason, out.prompt_token_ids) == ("y", [2], "length", None)
    with pytest.raises(ValueError):
        as_policy_output(("a", 1, 2, 3, 4))


def test_run_episodes_batches_live_conversations_in_lock_step():
    calls = []

    def batch(conversations):
        calls.append(len(conversations))
        return ["done" if c[-1]["content"] in ("stop early", "saw go") else "go" for c in conversations]

    tasks = [{"task_id": "a", "prompt": "stop early"}, {"task_id": "b", "prompt": "keep"}, {"task_id": "c", "prompt": "x"}]
    eps = run_episodes(lambda: ToyEnv(max_turns=4), tasks, batch)
    assert [e.task_id for e in eps] == ["a", "b", "c"]
    assert [e.turns_used for e in eps] == [1, 2, 2]
    assert calls == [3, 2]
    assert all(e.passed for e in eps)


def _episode() -> Episode:
    # Turn 2's prompt extends turn 1's context (prompt + completion) by the observation's tokens.
    replies = iter([("first", [10, 11], [-0.5, -0.7], [1, 2, 3]), ("done", [12, 13, 2], [-0.1, -0.2, -0.3],
                                                                   [1, 2, 3, 10, 11, 40, 41])])
    return run_episode(ToyEnv(), TASK, lambda m: next(replies))


def test_demonstration_turns_are_context_not_policy_turns():
    prompts = prompt_messages_per_turn(_episode())
    assert len(prompts) == 2
    assert prompts[0][-1] == {"role": "user", "content": "say done"}
    assert {"role": "assistant", "content": "demo a"} in prompts[0]


def test_episode_becomes_turn_rows_and_one_training_segment():
    ep = _episode()
    rows = episode_to_turns(ep, temperature=1.0, model="m", policy_version="base")
    turns_schema = schemas.SCHEMAS["turns"]
    assert all(set(r) == set(turns_schema.names) for r in rows)  # the gateway's turns shape, every column
    assert pa.Table.from_pylist(rows, schema=turns_schema).num_rows == 2
    assert [r["turn_index"] for r in rows] == [0, 1] and len({r["session_id"] for r in rows}) == 1
    assert json.loads(rows[1]["messages"])[-1] == {"role": "user", "content": "saw first"}
    segments = multiturn.build_segments(rows[0]["session_id"], rows)
    assert len(segments) == 1
    seg = segments[0]
    assert seg.prompt_ids == [1, 2, 3]
    assert seg.completion_ids == [10, 11, 40, 41, 12, 13, 2]
    assert seg.assistant_mask == [1, 1, 0, 0, 1, 1, 1]  # the observation's tokens are masked out
    assert seg.old_logps == [-0.5, -0.7, None, None, -0.1, -0.2, -0.3]
    # the verifier's verdict is the session-level review every turn is rewarded with
    review = episode_review(ep)
    reviews_schema = schemas.SCHEMAS["reviews"]
    assert set(review) <= set(reviews_schema.names)
    pa.Table.from_pylist([review], schema=reviews_schema)
    rewards = multiturn.turn_rewards(rows[0]["session_id"], [r["turn_id"] for r in rows], [review])
    assert rewards == {r["turn_id"]: (1.0, "session_review") for r in rows}
    failed = run_episode(ToyEnv(max_turns=1), TASK, lambda m: ("nope", [10], [-0.5], [1, 2, 3]))
    assert not failed.passed and episode_review(failed)["score"] == 0.0
    assert episode_review(failed)["critique"].startswith("turn_limit")


def test_episode_ids_differ_between_episodes_of_one_task():
    a, b = _episode(), run_episode(ToyEnv(), TASK, lambda m: ("done", [99], [-1.0], [1, 2, 3]))
    assert episode_to_turns(a)[0]["session_id"] != episode_to_turns(b)[0]["session_id"]
    # the same task opens with the same messages: one GRPO family
    fa = multiturn.session_family(episode_to_turns(a)[0]["messages"])
    assert fa == multiturn.session_family(episode_to_turns(b)[0]["messages"])


def test_an_environment_that_cannot_run_here_fails_loudly():
    class Unavailable(ToyEnv):
        def reset(self, task):
            raise EnvironmentUnavailable("no sandbox on this machine")

    with pytest.raises(EnvironmentUnavailable):
        run_episode(Unavailable(), TASK, lambda m: "done")
    with pytest.raises(EnvironmentUnavailable):
        run_episodes(Unavailable, [TASK], lambda cs: ["done"] * len(cs))
