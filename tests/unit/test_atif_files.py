"""ATIF files and the foreign-trajectory mapping from the contract: how each file form is read and
written (every bad entry named with its line or item), what a trajectory from another tool becomes
(its first bash call as the command, observation results as observations, no verdict), and what an
exported episode's defaults and limits are."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines.envs import atif
from tentalis_pipelines.envs.base import AssistantTurn, Episode, Verdict


# --------------------------------------------------------------------------- files
def test_write_atif_forms_and_a_wrong_suffix(tmp_path):
    a = {"session_id": "a", "m": "é\u2028"}
    b = {"session_id": "b"}
    assert atif.write_atif(iter([a, b]), tmp_path / "t.jsonl") == 2
    assert (tmp_path / "t.jsonl").read_text(encoding="utf-8") == json.dumps(a, ensure_ascii=False) + "\n" + json.dumps(b) + "\n"
    assert atif.write_atif([a], tmp_path / "one.json") == 1
    assert (tmp_path / "one.json").read_text(encoding="utf-8") == json.dumps(a, ensure_ascii=False, indent=2) + "\n"
    assert atif.write_atif([a, b], tmp_path / "two.json") == 2
    assert json.loads((tmp_path / "two.json").read_text()) == [a, b]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json", "t.jsonl", "two.json"]  # no temporary file left
    with pytest.raises(ValueError, match=r"^.*t\.txt: name the file \.json or \.jsonl \(one trajectory per line\)$"):
        atif.write_atif([a], tmp_path / "t.txt")
    assert not (tmp_path / "t.txt").exists()


def test_read_entries_of_a_jsonl_file_names_each_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_bytes(b'{"a": 1}\n\n  \n{"b": "x\xe2\x80\xa8y"}\n{oops\n[1]\nab\xffc\n')
    entries = atif.read_entries(f)
    assert [(e.index, e.where, e.line, e.doc, e.error) for e in entries] == [
        (0, "t.jsonl line 1", 1, {"a": 1}, None),
        (1, "t.jsonl line 4", 4, {"b": "x\u2028y"}, None),  # U+2028 inside a string is not a line end
        (2, "t.jsonl line 5", 5, None, "t.jsonl line 5: not JSON (Expecting property name enclosed in double quotes at column 2)"),
        (3, "t.jsonl line 6", 6, [1], None),
        (4, "t.jsonl line 7", 7, None, "t.jsonl line 7: not UTF-8 text (byte 0xff at offset 2); save the file as UTF-8 and import it again"),
    ]
    assert entries[1].raw == '{"b": "x\u2028y"}' and entries[2].raw == "{oops" and entries[4].raw == "ab\ufffdc"


def test_read_entries_of_a_json_file(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"a": 1}')
    [e] = atif.read_entries(f)
    assert (e.index, e.where, e.line, e.raw, e.doc, e.error) == (0, "t.json", None, '{"a": 1}', {"a": 1}, None)
    f.write_text('[{"a": "\\ud800"}, 2]')
    assert [(e.index, e.where, e.line, e.raw, e.doc) for e in atif.read_entries(f)] == [
        (0, "t.json item 0", None, '{"a": "\\ud800"}', {"a": "\ud800"}), (1, "t.json item 1", None, "2", 2)]
    f.write_text("[]")
    assert atif.read_entries(f) == []
    f.write_text(" \n")
    assert atif.read_entries(f) == []
    f.write_text("{\n  nope")
    [e] = atif.read_entries(f)
    assert (e.where, e.doc, e.error) == ("t.json", None, "t.json: not JSON (Expecting property name enclosed in double quotes at line 2 column 3)")
    f.write_bytes(b'{"a": "\xc3("}')
    [e] = atif.read_entries(f)
    assert e.error == "t.json: not UTF-8 text (byte 0xc3 at offset 7); save the file as UTF-8 and import it again"
    assert e.raw == '{"a": "\ufffd("}' and e.doc is None


# --------------------------------------------------------------------------- another tool's trajectory
def foreign(steps, **root):
    return {"schema_version": "ATIF-v1.2", "session_id": "h-1", "agent": {"name": "terminus", "version": "2"}, "steps": steps, **root}


def test_a_foreign_agent_step_takes_its_first_bash_call_with_a_string_command():
    calls = [{"tool_call_id": "a", "function_name": "python", "arguments": {"command": "print(1)"}},
             {"tool_call_id": "b", "function_name": "bash", "arguments": {"command": ["ls"]}},
             {"tool_call_id": "c", "function_name": "bash", "arguments": {}},
             {"tool_call_id": "d", "function_name": "bash", "arguments": {"command": "pwd"}},
             {"tool_call_id": "e", "function_name": "bash", "arguments": {"command": "rm -rf /"}}]
    steps = [{"step_id": 1, "source": "agent", "message": "m", "tool_calls": calls,
              "observation": {"results": [{"source_call_id": "d", "content": "/root"}, {"content": None}, {"content": "x"}]}}]
    ep = atif.atif_to_episode(foreign(steps))
    [turn] = ep.turns
    assert (turn.action, turn.observation, turn.finish_reason, turn.seconds_policy, turn.seconds_env, turn.info) == (
        "pwd", "/root\n\nx", "stop", 0.0, 0.0, {})
    assert ep.messages == [{"role": "assistant", "kind": "assistant", "content": "m"},
                           {"role": "user", "kind": "observation", "content": "/root"},
                           {"role": "user", "kind": "observation", "content": ""},
                           {"role": "user", "kind": "observation", "content": "x"}]
    # "action" recorded by Tentalis wins, even when it says the turn ran no command
    steps[0]["extra"] = {"tentalis": {"action": None, "observation_messages": [{"role": "tool"}] * 3}}
    ep = atif.atif_to_episode(foreign(steps))
    assert ep.turns[0].action is None and [m["role"] for m in ep.messages[1:]] == ["tool"] * 3


def test_a_foreign_trajectory_has_no_verdict_and_its_own_identity():
    steps = [{"step_id": 1, "source": "system", "message": "s"}, {"step_id": 2, "source": "user", "message": "u"}]
    doc = foreign(steps, extra={"vendor": {}})
    ep = atif.atif_to_episode(doc)
    assert ep == Episode(environment="atif", task_id="h-1", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                         turns=[], verdict=Verdict(False, 0.0, atif.NO_VERDICT), end_reason="", reward=0.0, max_turns=1,
                         info={"agent": "terminus", "schema_version": "ATIF-v1.2"})
    assert not atif.has_verdict(doc) and atif.tentalis_extra(doc) == {} and atif.tentalis_extra(foreign(steps, extra=None)) == {}
    steps += [{"step_id": 3, "source": "agent", "message": "a"}, {"step_id": 4, "source": "agent", "message": "b"}]
    assert atif.atif_to_episode(foreign(steps)).max_turns == 2


def test_observation_kinds_that_do_not_pair_with_the_results_are_refused():
    steps = [{"step_id": 1, "source": "user", "message": "u"},
             {"step_id": 2, "source": "agent", "message": "m", "observation": {"results": [{"content": "a"}, {"content": "b"}]},
              "extra": {"tentalis": {"observation_messages": [{"role": "user"}]}}}]
    with pytest.raises(atif.ATIFError, match=r"^steps\[1\]\.extra\.tentalis\.observation_messages: 1 entries for 2 observation "
                                             r"results; they must pair up$"):
        atif.atif_to_episode(foreign(steps))
    steps[1]["extra"]["tentalis"]["observation_in_context"] = False  # the episode ended: nothing to pair
    ep = atif.atif_to_episode(foreign(steps))
    assert ep.turns[0].observation == "a\nb" and len(ep.messages) == 2


def test_a_verdict_without_a_root_reward_gives_the_verdicts_reward_and_an_empty_detail():
    root = {"environment": "terminal", "task_id": "t", "end_reason": "submitted", "max_turns": 4,
            "verdict": {"passed": True, "reward": 0.75}}
    doc = foreign([{"step_id": 1, "source": "agent", "message": "a", "timestamp": "2025-01-01T00:00:00Z"},
                   {"step_id": 2, "source": "agent", "message": "demo", "timestamp": "2025-01-01T00:00:01Z",
                    "extra": {"tentalis": {"message": {"role": "assistant", "kind": "demonstration"}}}},
                   {"step_id": 3, "source": "agent", "message": "b"}], extra={"tentalis": root})
    ep = atif.atif_to_episode(doc)
    assert (ep.verdict, ep.reward, ep.max_turns, ep.end_reason, ep.environment, ep.task_id, ep.info) == (
        Verdict(True, 0.75, ""), 0.75, 4, "submitted", "terminal", "t", {})
    assert atif.has_verdict(doc) and atif.step_timestamps(doc) == ["2025-01-01T00:00:00Z", None]  # the demonstration is no turn
    assert [t.text for t in ep.turns] == ["a", "b"]
    assert ep.messages[1] == {"role": "assistant", "kind": "demonstration", "content": "demo"}


# --------------------------------------------------------------------------- export details
def _episode(turns, messages):
    return Episode(environment="terminal", task_id="t", messages=messages, turns=turns, verdict=Verdict(True, 1.0, "ok"),
                   end_reason="submitted", reward=1.0, max_turns=5, info={})


def test_an_exported_episode_counts_tokens_and_stamps_only_the_turns_it_has_times_for():
    turns = [AssistantTurn(index=0, text="a", token_ids=[1, 2], logprobs=[-0.1, -0.2], prompt_token_ids=[9], action="ls",
                           observation="o"),
             AssistantTurn(index=1, text="b", token_ids=[3], logprobs=[-0.3], prompt_token_ids=[9, 1, 2, 5], action=None)]
    msgs = [{"role": "tool", "content": "sys"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "o"},
            {"role": "assistant", "content": "b"}]
    doc = atif.episode_to_atif(_episode(turns, msgs), session_id="s", timestamps=["2025-01-01T00:00:00Z"])
    assert doc["final_metrics"] == {"total_prompt_tokens": 5, "total_completion_tokens": 3, "total_steps": 3}
    assert "model_name" not in doc["agent"] and doc["agent"]["name"] == "tentalis"
    assert doc["steps"][0]["source"] == "user"  # a role ATIF has no source for is a user step
    agent_steps = doc["steps"][1:]
    assert [s.get("timestamp") for s in agent_steps] == ["2025-01-01T00:00:00Z", None]
    assert agent_steps[0]["metrics"] == {"prompt_tokens": 1, "completion_tokens": 2, "prompt_token_ids": [9],
                                         "completion_token_ids": [1, 2], "logprobs": [-0.1, -0.2]}
    assert agent_steps[0]["tool_calls"] == [{"tool_call_id": "call_0", "function_name": "bash", "arguments": {"command": "ls"}}]
    assert agent_steps[0]["observation"] == {"results": [{"source_call_id": "call_0", "content": "o"}]}
    assert "tool_calls" not in agent_steps[1] and "observation" not in agent_steps[1] and "model_name" not in agent_steps[1]
    atif.validate_atif(doc)
    back = atif.atif_to_episode(doc)
    assert back.turns == turns and back.messages == msgs  # and it comes back whole


def test_a_turn_without_token_ids_exports_without_metrics_and_its_last_observation_out_of_context():
    turns = [AssistantTurn(index=0, text="a", action="ls", observation="final output")]
    doc = atif.episode_to_atif(_episode(turns, [{"role": "assistant", "kind": "assistant", "content": "a"}]), session_id="s", model="m")
    [step] = doc["steps"]
    assert "metrics" not in step and step["model_name"] == "m" and doc["agent"]["model_name"] == "m"
    assert step["observation"] == {"results": [{"source_call_id": "call_0", "content": "final output"}]}
    assert step["extra"]["tentalis"]["observation_in_context"] is False and "message" not in step["extra"]["tentalis"]
    ep = atif.atif_to_episode(doc)
    assert ep.turns[0].observation == "final output" and ep.messages == [{"role": "assistant", "content": "a", "kind": "assistant"}]
