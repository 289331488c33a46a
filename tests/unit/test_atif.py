"""Episodes as ATIF v1.4 trajectories: both ways, the validator's errors, and the lakehouse round trip
(import lands live-session turns and the verdict's review; export gives the same trajectory back)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from tentalis_pipelines import episodes
from tentalis_pipelines.envs import atif
from tentalis_pipelines.envs.base import SUBMITTED, TURN_LIMIT, Environment, Observation, StepResult, Verdict
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import multiturn


class ToyEnv(Environment):
    """Ends on "done" (reward 1) or at its turn limit; "?" is a turn without a command (a format error)."""

    name = "toy"

    def __init__(self, max_turns: int = 3):
        self.max_turns = max_turns

    def reset(self, task):
        self.n, self.last = 0, ""
        return Observation([{"role": "system", "content": "sys", "kind": "system"},
                            {"role": "user", "content": "demo q", "kind": "demonstration"},
                            {"role": "assistant", "content": "demo a", "kind": "demonstration"},
                            {"role": "user", "content": task["prompt"], "kind": "instruction"}])

    def step(self, action):
        self.n += 1
        self.last = action.strip()
        done = self.last == "done" or self.n >= self.max_turns
        info = {"command": None if self.last == "?" else self.last, "exit_code": 0}
        if done:
            info["end_reason"] = SUBMITTED if self.last == "done" else TURN_LIMIT
        kind = "format_error" if self.last == "?" else "observation"
        return StepResult(Observation([{"role": "user", "content": f"saw {self.last}", "kind": kind}]),
                          self.verify().reward if done else 0.0, done, info)

    def verify(self):
        return Verdict(self.last == "done", 1.0 if self.last == "done" else 0.0, "toy check")


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


class IdsPolicy:
    """A scripted policy that gives token ids the way ChatPolicy does: each prompt extends the last
    context exactly (here: characters of a fixed rendering), and log-probs that float32 cannot hold."""

    def __init__(self, replies):
        self.replies = list(replies)

    def __call__(self, messages):
        prompt = encode("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>")
        text = self.replies.pop(0)
        ids = encode(text)
        return text, ids, [-0.1234567891234 * (k + 1) for k in range(len(ids))], prompt


def toy_episode(replies=("ls", "?", "done")):
    return run_episode(ToyEnv(), {"task_id": "toy-1", "prompt": "say done"}, IdsPolicy(replies))


def test_an_episode_goes_to_atif_and_back_whole():
    ep = toy_episode()
    assert ep.passed and ep.turns_used == 3 and ep.turns[1].action is None
    doc = atif.episode_to_atif(ep, session_id="s-1", model="m", timestamps=["2025-01-02T03:04:05+00:00"] * 3,
                               extra={"policy_version": "base"})
    atif.validate_atif(doc)
    json.loads(json.dumps(doc))  # JSON-ready
    assert doc["schema_version"] == "ATIF-v1.4" and doc["session_id"] == "s-1" and doc["agent"]["model_name"] == "m"
    sources = [s["source"] for s in doc["steps"]]
    assert sources == ["system", "user", "agent", "user", "agent", "agent", "agent"]  # demo assistant, then 3 turns
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, 8))
    first = doc["steps"][4]
    assert first["message"] == "ls" and first["tool_calls"] == [{"tool_call_id": "call_0", "function_name": "bash",
                                                                   "arguments": {"command": "ls"}}]
    assert first["observation"] == {"results": [{"source_call_id": "call_0", "content": "saw ls"}]}
    assert first["metrics"]["completion_token_ids"] == [108, 115] and first["metrics"]["logprobs"] == [-0.1234567891234, -0.2469135782468]
    assert first["metrics"]["prompt_token_ids"] == ep.turns[0].prompt_token_ids and first["metrics"]["prompt_tokens"] == len(ep.turns[0].prompt_token_ids)
    assert "tool_calls" not in doc["steps"][5]  # "?" ran no command
    assert doc["steps"][5]["observation"] == {"results": [{"content": "saw ?"}]}
    assert doc["final_metrics"]["total_completion_tokens"] == 2 + 1 + 4
    assert doc["extra"]["tentalis"]["verdict"] == {"passed": True, "reward": 1.0, "detail": "toy check"}
    back = atif.atif_to_episode(doc)
    assert back.to_dict() == ep.to_dict()
    assert back.messages[-1] == {"role": "assistant", "content": "done", "kind": "assistant"}  # the last reply stays out of context
    assert back.turns[-1].observation == "saw done"


def test_an_episode_whose_turns_and_policy_messages_disagree_is_not_exported():
    import dataclasses

    ep = toy_episode()
    with pytest.raises(ValueError, match="2 turns but 3 policy messages"):
        atif.episode_to_atif(dataclasses.replace(ep, turns=ep.turns[:-1]), session_id="s-1")


def test_a_trajectory_from_another_tool_imports_as_prompt_turns_and_observations():
    doc = {"schema_version": "ATIF-v1.4", "session_id": "harbor-1", "agent": {"name": "terminus-2", "version": "1.0"},
           "steps": [{"step_id": 1, "source": "system", "message": "You are an agent."},
                     {"step_id": 2, "source": "user", "message": "Create hello.txt."},
                     {"step_id": 3, "source": "agent", "message": "Creating it.", "reasoning_content": "easy",
                      "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "echo hi > hello.txt"}}],
                      "observation": {"results": [{"source_call_id": "c1", "content": ""}]},
                      "metrics": {"prompt_tokens": 3, "completion_tokens": 2, "prompt_token_ids": [1, 2, 3],
                                  "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}},
                     {"step_id": 4, "source": "agent", "message": "Done."}]}
    ep = atif.atif_to_episode(doc)
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert ep.turns[0].action == "echo hi > hello.txt" and ep.turns[0].token_ids == [7, 8] and ep.turns[0].logprobs == [-0.5, -0.25]
    assert ep.turns[1].token_ids is None and ep.turns[1].action is None
    assert not atif.has_verdict(doc) and ep.verdict == Verdict(False, 0.0, atif.NO_VERDICT) and ep.task_id == "harbor-1"


def good_doc():
    return atif.episode_to_atif(toy_episode(), session_id="s-1", model="m", timestamps=["2025-01-02T03:04:05+00:00"] * 3,
                                extra={"policy_version": "base", "temperature": 1.0, "backend": "transformers"})


def _set(path, value):
    def edit(doc):
        *head, last = path
        obj = doc
        for k in head:
            obj = obj[k]
        if value is KeyError:
            del obj[last]
        else:
            obj[last] = value
    return edit


BAD = [
    ("schema_version", _set(["schema_version"], "ATIF-v2.0"), "schema_version: 'ATIF-v2.0'"),
    ("no session id", _set(["session_id"], KeyError), "trajectory.session_id: required"),
    ("agent version", _set(["agent", "version"], 3), "agent.version: must be a string"),
    ("step ids out of order", _set(["steps", 2, "step_id"], 9), "steps[2].step_id: 9"),
    ("source", _set(["steps", 0, "source"], "assistant"), "steps[0].source: 'assistant'"),
    ("message missing", _set(["steps", 4, "message"], KeyError), "steps[4].message: required"),
    ("timestamp", _set(["steps", 4, "timestamp"], "yesterday"), "steps[4].timestamp: 'yesterday' is not an ISO 8601"),
    ("metrics on a user step", _set(["steps", 1, "metrics"], {"prompt_tokens": 1}), "steps[1]: metrics only apply to agent steps"),
    ("a typo in metrics", _set(["steps", 4, "metrics", "logprob"], [-1.0]), "steps[4].metrics: unknown field(s) logprob"),
    ("too few log-probs", _set(["steps", 4, "metrics", "logprobs"], [-0.5]), "steps[4].metrics.logprobs: 1 values for 2 completion_token_ids"),
    ("a positive log-prob", _set(["steps", 4, "metrics", "logprobs"], [-0.5, 0.5]), "steps[4].metrics.logprobs[1]"),
    ("a token id that is not an integer", _set(["steps", 4, "metrics", "completion_token_ids"], [108, "s"]),
     "steps[4].metrics.completion_token_ids[1]"),
    ("counts that disagree", _set(["steps", 4, "metrics", "completion_tokens"], 5), "steps[4].metrics.completion_tokens: 5"),
    ("a dangling source_call_id", _set(["steps", 4, "observation", "results", 0, "source_call_id"], "call_9"),
     "steps[4].observation.results[0].source_call_id: 'call_9'"),
    ("arguments as a string", _set(["steps", 4, "tool_calls", 0, "arguments"], "ls"), "steps[4].tool_calls[0].arguments"),
    ("the verdict's reward", _set(["extra", "tentalis", "verdict", "reward"], 2), "extra.tentalis.verdict.reward"),
    ("no steps", _set(["steps"], []), "steps: required, a non-empty array"),
]


@pytest.mark.parametrize("edit,expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_field_is_named_and_nothing_lands(tmp_path, edit, expected):
    doc = good_doc()
    atif.validate_atif(doc)
    bad = copy.deepcopy(doc)
    edit(bad)
    with pytest.raises(atif.ATIFError) as err:
        atif.validate_atif(bad)
    assert expected in str(err.value)
    lake = Lakehouse(tmp_path / "lake")
    other = atif.episode_to_atif(toy_episode(), session_id="s-2", model="m")
    with pytest.raises(atif.ATIFError, match="trajectory 1: "):
        episodes.import_episodes(lake, [other, bad])  # the good one first: still nothing lands
    assert not lake.exists("turns") and not lake.exists("sessions") and not lake.exists("reviews")


def test_files_read_back_as_written_and_a_bad_line_is_named(tmp_path):
    docs = [good_doc(), atif.episode_to_atif(toy_episode(("ls", "ls", "ls")), session_id="s-2")]
    for name in ("t.jsonl", "t.json"):
        assert atif.write_atif(docs, tmp_path / name) == 2
        assert atif.read_atif(tmp_path / name) == docs
    atif.write_atif(docs[:1], tmp_path / "one.json")
    assert isinstance(json.loads((tmp_path / "one.json").read_text()), dict)  # one trajectory: Harbor's trajectory.json shape
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + lines[1].replace('"source": "system"', '"source": "robot"', 1) + "\n")
    with pytest.raises(atif.ATIFError, match=r"(?s)bad.jsonl line 2: .*steps\[0\].source: 'robot'"):
        atif.read_atif(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="name the file .json or .jsonl"):
        atif.write_atif(docs, tmp_path / "t.txt")


def test_import_lands_session_turns_and_the_verdict_review_and_export_gives_the_trajectory_back(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    doc = good_doc()
    ep = atif.atif_to_episode(doc)
    out = episodes.import_episodes(lake, [doc])
    assert out == {"trajectories": 1, "sessions": 1, "replaced": 0, "unchanged": 0, "skipped": 0, "turns": 3, "reviews": 1}
    turns = sorted(lake.read("turns").to_pylist(), key=lambda t: t["turn_index"])
    assert [t["turn_id"] for t in turns] == ["s-1-0", "s-1-1", "s-1-2"] and {t["tenant"] for t in turns} == {"envs"}
    for t, turn in zip(turns, ep.turns):
        assert t["prompt_token_ids"] == turn.prompt_token_ids and t["completion_token_ids"] == turn.token_ids
        # Log-probs are stored as float32, exactly that rounding and no other.
        assert t["sampling_logprobs"] == [float(np.float32(x)) for x in turn.logprobs]
        assert t["policy_version"] == "base" and t["temperature"] == 1.0 and t["model"] == "m"
        assert t["created_at"].isoformat() == "2025-01-02T03:04:05+00:00"
    segments = multiturn.build_segments("s-1", turns)
    assert len(segments) == 1 and len(segments[0].spans) == 3  # each prompt extends the last: one training segment
    assert sum(segments[0].assistant_mask) == 2 + 1 + 4
    [review] = lake.read("reviews").to_pylist()
    assert (review["batch_id"], review["rollout_id"], review["session_id"], review["manager"]) == ("live", "s-1", "s-1", "verifier")
    assert review["score"] == 1.0 and review["critique"] == "passed (submitted) after 3 of 3 turns, 1 without a command: toy check"
    assert review["hint"] == ""
    # Export is the inverse: the same trajectory, token ids and (float32) log-probs included.
    [again] = episodes.export_sessions(lake, ["s-1"])
    expected = copy.deepcopy(doc)
    for s in expected["steps"]:
        if "logprobs" in s.get("metrics", {}):
            s["metrics"]["logprobs"] = [float(np.float32(x)) for x in s["metrics"]["logprobs"]]
    assert again == expected
    # Re-importing changes nothing; the same session id with other turns is refused, nothing lands.
    assert episodes.import_episodes(lake, [again])["unchanged"] == 1 and lake.count("turns") == 3 and lake.count("reviews") == 1
    other = atif.episode_to_atif(toy_episode(("ls", "ls", "ls")), session_id="s-1", model="m")
    with pytest.raises(episodes.ImportRefused, match=r"session\(s\) 's-1' \(turn\(s\) s-1-0, s-1-1, s-1-2.*--replace"):
        episodes.import_episodes(lake, [other])
    with pytest.raises(episodes.ImportRefused, match="another tenant"):
        episodes.import_episodes(lake, [again], tenant="someone-else")
    with pytest.raises(episodes.ImportRefused, match="share session_id"):
        episodes.import_episodes(lake, [other, other])
    assert lake.count("turns") == 3


def test_a_trajectory_without_a_verdict_lands_without_a_review(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    doc = {"schema_version": "ATIF-v1.3", "session_id": "h-1", "agent": {"name": "terminus-2", "version": "1.0", "model_name": "x"},
           "steps": [{"step_id": 1, "source": "user", "message": "hi"},
                     {"step_id": 2, "source": "agent", "message": "hello",
                      "metrics": {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-1.0]}}]}
    out = episodes.import_episodes(lake, [doc])
    assert out["turns"] == 1 and out["reviews"] == 0 and not lake.exists("reviews")
    [t] = lake.read("turns").to_pylist()
    assert t["policy_version"] == "external:terminus-2" and t["temperature"] is None and t["completion_token_ids"] == [3]


def test_segment_rows_give_each_turn_its_exact_prompt_completion_and_log_probs():
    rows = [{"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4, 5, 6, 7], "sampling_logprobs": [-0.1, -0.2, None, None, -0.3],
             "turn_spans": [{"turn_index": 0, "start": 0, "end": 2}, {"turn_index": 1, "start": 4, "end": 5}]},
            {"prompt_token_ids": [9], "completion_token_ids": [8], "sampling_logprobs": None,
             "turn_spans": [{"turn_index": 2, "start": 0, "end": 1}]}]
    assert episodes.segment_tokens(rows) == {0: ([1, 2], [3, 4], [-0.1, -0.2]), 1: ([1, 2, 3, 4, 5, 6], [7], [-0.3]),
                                             2: ([9], [8], None)}
