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


# --------------------------------------------------------------------------- the contract at its edges
def test_policy_outputs_of_every_length_are_read_and_their_numbers_normalised():
    import numpy as np

    same = PolicyOutput("x", [1])
    assert as_policy_output(same) is same
    assert as_policy_output(("only text",)) == PolicyOutput("only text", None, None, None)
    out = as_policy_output([7, np.array([3, 4]), np.array([-1, -0.5], dtype=np.float32), (9,)])
    assert out == PolicyOutput("7", [3, 4], [-1.0, -0.5], [9])
    assert [type(v) for v in out.token_ids + out.prompt_token_ids] == [int, int, int]
    assert [type(v) for v in out.logprobs] == [float, float]
    for bad in ((), ("a", [1], [-1.0], [2], "extra")):
        with pytest.raises(ValueError, match=r"^a policy returns \(text, token_ids, logprobs\[, prompt_token_ids\]\)$"):
            as_policy_output(bad)

    class Bare:  # only text: every token field unset, the finish reason the default
        text = "z"
        finish_reason = None

    assert as_policy_output(Bare()) == PolicyOutput("z", None, None, None, "stop")

    class Full:
        text, token_ids, logprobs, prompt_token_ids, finish_reason = "w", (1, 2), (-1, -2), [0], "length"

    assert as_policy_output(Full()) == PolicyOutput("w", [1, 2], [-1.0, -2.0], [0], "length")


class EndsWith(ToyEnv):
    """A ToyEnv whose ending step reports ``end_reason`` (None: reports none) and whose verifier says ``passed``."""

    def __init__(self, end_reason, passed=True, detail="checked", **kw):
        super().__init__(max_turns=1, **kw)
        self.end_reason, self.passed, self.detail = end_reason, passed, detail

    def step(self, action):
        info = {"command": action, "exit_code": 0}
        if self.end_reason is not None:
            info["end_reason"] = self.end_reason
        return StepResult(Observation([{"role": "user", "content": "a", "kind": "observation"},
                                       {"role": "user", "content": "b", "kind": "observation"}]), 1, True, info)

    def verify(self):
        return Verdict(self.passed, 1.0 if self.passed else 0.0, self.detail)


def test_a_hostile_or_error_end_fails_the_episode_whatever_the_verifier_says():
    ep = run_episode(EndsWith("hostile: network access"), {"task_id": 5, "prompt": "p", "level": 2}, lambda m: "x")
    assert not ep.passed and ep.reward == 0.0 and ep.verdict == Verdict(False, 0.0, "checked")
    assert ep.task_id == "5" and ep.info["level"] == 2 and ep.max_turns == 1 and ep.environment == "toy"
    ep = run_episode(EndsWith("error: sandbox died", detail=""), TASK, lambda m: "x")
    assert ep.verdict == Verdict(False, 0.0, "error: sandbox died")  # no detail of its own: the end reason
    ep = run_episode(EndsWith(SUBMITTED), TASK, lambda m: "x")
    assert ep.passed and ep.reward == 1.0 and ep.info["level"] is None
    ep = run_episode(EndsWith(None), TASK, lambda m: "x")
    assert ep.end_reason == TURN_LIMIT  # an ending step that names no reason ran out of turns


def test_each_turn_records_its_action_observation_info_and_timings():
    ep = run_episode(EndsWith(SUBMITTED), TASK, lambda m: PolicyOutput("go", [1], [-0.5], info={"seconds": 2.5}))
    (turn,) = ep.turns
    assert (turn.index, turn.text, turn.action, turn.observation) == (0, "go", "go", "a\nb")
    assert turn.info == {"exit_code": 0, "end_reason": SUBMITTED}  # the command is the action, not info
    assert turn.seconds_policy == 2.5 and turn.seconds_env >= 0.0 and ep.info["seconds"] >= 0.0
    assert ep.messages[-1] == {"role": "assistant", "content": "go", "kind": "assistant"}  # the last observation is not kept
    task_obj = TerminalLike("t-9", 3)
    ep = run_episode(EndsWith(SUBMITTED), task_obj, lambda m: "x")
    assert ep.task_id == "t-9" and ep.info["level"] == 3


class TerminalLike:
    """A task given as an object (a TerminalTask, a BfclTask): its id and level are attributes."""

    def __init__(self, task_id, level):
        self.task_id, self.level = task_id, level

    def __getitem__(self, key):
        return {"prompt": "p"}[key]


def test_every_way_an_episode_can_fail_is_recorded_with_its_cause():
    from tentalis_pipelines.envs.runner import EpisodeRun

    class StepFails(ToyEnv):
        def step(self, action):
            raise ValueError("bad state")

    class VerifyFails(EndsWith):
        def verify(self):
            raise KeyError("rules")

    class CloseFails(ToyEnv):
        def close(self):
            raise OSError("already gone")

    ep = run_episode(StepFails(), TASK, lambda m: "x")
    assert ep.end_reason == "error: step failed: ValueError: bad state" and ep.verdict.detail == ep.end_reason
    ep = run_episode(ToyEnv(), TASK, lambda m: ("a", [1], [-1.0], [1], "five"))
    assert ep.end_reason.startswith("error: policy returned tuple: a policy returns (text")
    ep = run_episode(ToyEnv(), TASK, lambda m: 1 / 0)
    assert ep.end_reason == "error: policy failed: ZeroDivisionError: division by zero" and ep.turns_used == 0
    ep = run_episode(VerifyFails(SUBMITTED), TASK, lambda m: "x")
    assert ep.verdict == Verdict(False, 0.0, "error: verify failed: 'rules'") and ep.reward == 0.0
    ep = run_episode(CloseFails(), TASK, lambda m: "done")
    assert ep.passed  # closing is best effort
    env = ToyEnv(fail_reset=True)
    ep = run_episode(env, TASK, lambda m: "done")
    assert ep.end_reason == "error: reset failed: OSError: no sandbox today" and ep.messages == [] and env.closed == 1
    run = EpisodeRun(ToyEnv(), TASK)
    run.start()
    run.advance(("done", [1], [-0.1]))
    assert run.done and run.reward == 1.0 and run.failed == ""
    run = EpisodeRun(ToyEnv(), TASK)
    run.start()
    run.advance(RuntimeError("x"))
    assert run.done and run.reward == 0.0 and run.failed == "policy failed: RuntimeError: x"


def test_an_environment_that_forgets_its_turn_limit_is_stopped_one_turn_past_it():
    class Endless(ToyEnv):
        def step(self, action):
            return StepResult(Observation([{"role": "user", "content": "more", "kind": "observation"}]), 0.0, False, {})

    ep = run_episode(Endless(max_turns=2), TASK, lambda m: "x")
    assert ep.turns_used == 3 and ep.end_reason == "error: the environment did not end the episode at its turn limit"
    assert [m["content"] for m in ep.messages[-2:]] == ["x", "more"]  # an open episode's observations are kept


def test_run_episodes_reports_each_episode_once_and_a_miscounting_policy_fails_the_round():
    seen = []
    tasks = [{"task_id": "a", "prompt": "stop early"}, {"task_id": "b", "prompt": "keep"}]
    eps = run_episodes(lambda: ToyEnv(max_turns=4), tasks, lambda cs: ["done" if c[-1]["content"] == "stop early" else "go"
                                                                       for c in cs], on_episode=lambda e: seen.append(e.task_id))
    assert seen == ["a", "b"] and [e.task_id for e in eps] == ["a", "b"] and [e.turns_used for e in eps] == [1, 4]
    eps = run_episodes(ToyEnv, tasks, lambda cs: ["done"])
    assert [e.end_reason for e in eps] == ["error: policy failed: ValueError: the policy returned 1 outputs for 2 conversations"] * 2
    # an episode that failed to start is reported before the first policy call
    order = []
    envs = iter([ToyEnv(fail_reset=True), ToyEnv()])
    eps = run_episodes(lambda: next(envs), tasks, lambda cs: order.append(len(cs)) or ["done"] * len(cs),
                       on_episode=lambda e: order.append(e.task_id))
    assert order == ["a", 1, "b"] and eps[0].end_reason.startswith("error: reset failed")
    assert run_episodes(ToyEnv, [], lambda cs: []) == []


def test_session_ids_change_with_the_task_the_tokens_and_the_salt():
    from tentalis_pipelines.envs.runner import episode_session_id

    ep = _episode()
    sid = episode_session_id(ep)
    assert sid.startswith("toy-") and len(sid) == len("toy-") + 16 and int(sid[4:], 16) >= 0
    assert episode_session_id(_episode()) == sid
    assert episode_session_id(ep, salt="1") != sid
    other = Episode(**{**ep.__dict__, "task_id": "toy-2"})
    assert episode_session_id(other) != sid
    ep.turns[0].token_ids = [10, 12]
    assert episode_session_id(ep) != sid


def test_policy_turns_are_assistant_messages_not_of_a_demonstration():
    from tentalis_pipelines.envs.runner import is_policy_turn, model_messages

    assert is_policy_turn({"role": "assistant", "content": "x"})  # no kind: the policy's
    assert is_policy_turn({"role": "assistant", "content": "x", "kind": "assistant"})
    assert not is_policy_turn({"role": "assistant", "content": "x", "kind": "demonstration"})
    assert not is_policy_turn({"role": "user", "content": "x", "kind": "assistant"})
    assert model_messages([{"role": "user", "content": 3, "kind": "x"}]) == [{"role": "user", "content": "3"}]


class WordTokenizer:
    """A tokenizer with the transformers calling convention: one id per character of each word."""

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, *, add_generation_prompt, tokenize, return_dict):
        assert (add_generation_prompt, tokenize, return_dict) == (True, True, False)
        self.calls.append(("template", messages))
        return [len(m["content"]) for m in messages] + [0]

    def __call__(self, text, *, add_special_tokens):
        assert add_special_tokens is False
        self.calls.append(("text", text))
        return {"input_ids": [ord(c) for c in text]}


def test_turn_rows_carry_every_setting_and_tokenise_only_what_the_policy_did_not_give():
    from datetime import datetime, timezone

    replies = iter([("ab", None, [-0.1], None), ("done", [12, 13], [-0.1, -0.2], [1, 2])])
    ep = run_episode(ToyEnv(), TASK, lambda m: next(replies))
    ep.turns[0].seconds_policy = 0.25
    tok = WordTokenizer()
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    rows = episode_to_turns(ep, session_id="s1", tenant="t", model="m", policy_version="v3", backend="vllm",
                            temperature=1, max_tokens=64, tokenizer=tok, created_at=when)
    first, second = rows
    assert first["prompt_token_ids"] == [3, 6, 6, 8, 0] and first["completion_token_ids"] == [97, 98]
    assert first["sampling_logprobs"] is None  # one log-prob for two tokens: not aligned, dropped
    assert second["prompt_token_ids"] == [1, 2] and second["completion_token_ids"] == [12, 13]
    assert second["sampling_logprobs"] == [-0.1, -0.2]
    assert [c[0] for c in tok.calls] == ["template", "text"]  # the second turn's ids came from the policy
    for r, i in zip(rows, (0, 1)):
        assert (r["turn_id"], r["session_id"], r["tenant"], r["turn_index"], r["choice_index"]) == (f"s1-{i}", "s1", "t", i, 0)
        assert (r["model"], r["policy_version"], r["backend"], r["endpoint"], r["tools"]) == ("m", "v3", "vllm", "chat.completions", "[]")
        assert r["temperature"] == 1.0 and type(r["temperature"]) is float and r["max_tokens"] == 64
        assert r["stream"] is False and r["created_at"] == when and r["finish_reason"] == "stop"
        assert r["prompt_tokens"] == len(r["prompt_token_ids"]) and r["completion_tokens"] == len(r["completion_token_ids"])
    assert json.loads(first["response"]) == {"role": "assistant", "content": "ab"}
    assert first["latency_ms"] == 250.0 and second["latency_ms"] == 0.0
    # without ids and without a tokenizer the token columns stay empty; an empty reply is never tokenised
    bare = episode_to_turns(ep, created_at=when)
    assert bare[0]["prompt_token_ids"] == [] and bare[0]["completion_token_ids"] == [] and bare[0]["sampling_logprobs"] is None
    assert bare[0]["session_id"] == bare[1]["session_id"] != "s1"
    empty = run_episode(ToyEnv(max_turns=1), TASK, lambda m: ("", [], []))
    tok = WordTokenizer()
    (row,) = episode_to_turns(empty, tokenizer=tok)
    assert row["completion_token_ids"] == [] and row["sampling_logprobs"] == [] and [c[0] for c in tok.calls] == ["template"]
    assert row["created_at"].tzinfo is timezone.utc and (datetime.now(timezone.utc) - row["created_at"]).total_seconds() < 60


def test_the_review_names_the_episode_its_verdict_and_who_reviewed():
    from datetime import datetime, timezone

    ep = _episode()
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    review = episode_review(ep, session_id="s1", batch_id="b7", manager="judge", created_at=when)
    assert review == {"batch_id": "b7", "rollout_id": "s1", "manager": "judge", "score": 1.0,
                      "critique": "submitted: toy", "hint": "", "created_at": when, "session_id": "s1",
                      "reviewer": "judge", "rubric": "toy-final-state"}
    default = episode_review(ep)
    assert default["batch_id"] == "live" and default["manager"] == default["reviewer"] == "verifier"
    assert default["session_id"] == default["rollout_id"] == episode_to_turns(ep)[0]["session_id"]
    assert default["created_at"].tzinfo is timezone.utc


def test_a_fresh_run_has_not_ended_and_earned_nothing():
    from tentalis_pipelines.envs.runner import EpisodeRun

    run = EpisodeRun(ToyEnv(), TASK)
    assert run.done is False and run.end_reason == "" and run.reward == 0.0 and run.failed == ""
    assert run.messages == [] and run.turns == []


def test_the_finish_reason_and_the_timings_of_a_turn_are_kept_as_given():
    class OnlyText:  # an output object with no finish_reason attribute at all
        text = "done"

    ep = run_episode(ToyEnv(), TerminalLikeNoLevel("t-1"), lambda m: OnlyText())
    assert ep.turns[0].finish_reason == "stop" and ep.passed and ep.info["level"] is None
    ep = run_episode(ToyEnv(max_turns=1), TASK, lambda m: PolicyOutput("x", finish_reason="length"))
    assert ep.turns[0].finish_reason == "length"
    assert 0.0 <= ep.turns[0].seconds_env < 5.0 and 0.0 <= ep.info["seconds"] < 5.0  # durations, not clock readings


class TerminalLikeNoLevel:
    """A task object with an id and no level attribute."""

    def __init__(self, task_id):
        self.task_id = task_id

    def __getitem__(self, key):
        return {"prompt": "p"}[key]


def test_session_ids_do_not_depend_on_key_order_and_no_salt_is_the_empty_salt():
    from tentalis_pipelines.envs.runner import episode_session_id

    ep = _episode()
    shuffled = Episode(**{**ep.__dict__, "messages": [dict(reversed(list(m.items()))) for m in ep.messages]})
    assert [list(m) for m in shuffled.messages] != [list(m) for m in ep.messages]
    assert episode_session_id(shuffled) == episode_session_id(ep) == episode_session_id(ep, salt="")


def test_turn_rows_default_to_the_envs_tenant_and_backend_at_temperature_0():
    (row, _) = episode_to_turns(_episode())
    assert (row["tenant"], row["model"], row["policy_version"], row["backend"]) == ("envs", "", "base", "envs")
    assert row["temperature"] == 0.0 and row["max_tokens"] is None
