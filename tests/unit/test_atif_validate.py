"""The ATIF validator's contract, field by field: each bad field is named by its path with what would be
valid (the exact line a person reads), each limit is hit exactly (0, 1, 2^31 - 1, a reward of 0 and 1),
values meaning "unset" (None, empty, 0) pass where the format allows them, and several bad fields are
all named (the first 12, then a count)."""

from __future__ import annotations

import copy
import json

import pytest

from tentalis_pipelines.envs import atif

HEADER = "not a valid ATIF v1.4 trajectory (session_id {sid!r}):"


def full_doc() -> dict:
    """A valid trajectory using every field the format has (each optional one set)."""
    return {
        "schema_version": "ATIF-v1.4", "session_id": "s-1", "notes": "n",
        "agent": {"name": "tentalis", "version": "1", "model_name": "m", "extra": {}},
        "final_metrics": {"total_prompt_tokens": 0, "total_completion_tokens": 2, "total_cached_tokens": 0,
                          "total_cost_usd": 0.0, "total_steps": 3, "extra": {}},
        "extra": {"tentalis": {"environment": "terminal", "task_id": "t-1", "end_reason": "", "max_turns": 1,
                               "verdict": {"passed": False, "reward": 0.0, "detail": "d"}, "temperature": 0,
                               "policy_version": "base", "backend": "transformers", "check_kind": "tests",
                               "max_tokens": 1, "reward": 0.0, "info": {}}},
        "steps": [
            {"step_id": 1, "source": "system", "message": "", "extra": {}},
            {"step_id": 2, "source": "user", "message": "do it", "timestamp": "2025-10-16T14:30:00Z"},
            {"step_id": 3, "source": "agent", "message": "ok", "timestamp": "2025-10-16T14:30:01+00:00", "model_name": "m",
             "reasoning_effort": "low", "reasoning_content": "r",
             "tool_calls": [{"tool_call_id": "c0", "function_name": "bash", "arguments": {}}],
             "observation": {"results": [{"source_call_id": "c0", "content": "out",
                                          "subagent_trajectory_ref": [{"session_id": "sub", "trajectory_path": "p", "extra": {}}]},
                                         {"content": None}]},
             "metrics": {"prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0, "cost_usd": 0, "extra": {},
                         "prompt_token_ids": [0, 1, 2**31 - 1], "completion_token_ids": [7, 8], "logprobs": [0.0, -1e9]},
             "extra": {"tentalis": {"finish_reason": "stop", "action": "ls", "seconds_policy": 0, "seconds_env": 0.5,
                                    "info": {}, "message": {"role": "assistant"}, "observation_in_context": False,
                                    "observation_messages": [{"role": "user"}, {"role": "user"}]}}},
        ],
    }


def _at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _edit(path, value):
    def edit(doc):
        obj = _at(doc, path[:-1])
        if value is KeyError:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value
    return edit


def problems(doc, **kw) -> list[str]:
    with pytest.raises(atif.ATIFError) as err:
        atif.validate_atif(doc, **kw)
    head, *lines = str(err.value).split("\n  ")
    sid = doc.get("session_id") if isinstance(doc.get("session_id"), str) else "?"
    assert head == HEADER.format(sid=sid)
    return lines


def test_the_full_document_and_its_unset_values_are_valid():
    atif.validate_atif(full_doc())
    for version in atif.ACCEPTED_VERSIONS:
        d = full_doc()
        d["schema_version"] = version
        atif.validate_atif(d)
    d = full_doc()
    for key in ("notes", "final_metrics", "extra"):
        d[key] = None  # optional fields given as null
    atif.validate_atif(d)
    d = full_doc()
    d["steps"][2]["metrics"] = {"prompt_token_ids": None, "completion_token_ids": None, "logprobs": None, "extra": None,
                                "cost_usd": None, "prompt_tokens": None}
    d["steps"][2]["extra"] = {"tentalis": None}
    d["steps"][1]["extra"] = None
    atif.validate_atif(d, vocab_size=1)


STEP = ["steps", 2]
M = [*STEP, "metrics"]
T = ["extra", "tentalis"]
ST = [*STEP, "extra", "tentalis"]
RES = [*STEP, "observation", "results", 0]

BAD = [
    # the root
    (["foo"], 1, ["trajectory: unknown field(s) foo (ATIF v1.4 allows agent, extra, final_metrics, notes, schema_version, "
                  "session_id, steps; put anything else under 'extra')"]),
    (["schema_version"], "ATIF-v2.0", ["schema_version: 'ATIF-v2.0' is not one this reader knows; use one of ATIF-v1.0, "
                                       "ATIF-v1.1, ATIF-v1.2, ATIF-v1.3, ATIF-v1.4"]),
    (["schema_version"], KeyError, ["schema_version: None is not one this reader knows; use one of ATIF-v1.0, "
                                    "ATIF-v1.1, ATIF-v1.2, ATIF-v1.3, ATIF-v1.4"]),
    (["session_id"], KeyError, ["trajectory.session_id: required (a string)"]),
    (["session_id"], None, ["trajectory.session_id: required (a string)"]),
    (["session_id"], 5, ["trajectory.session_id: must be a string, not int"]),
    (["session_id"], " ", ["trajectory.session_id: must not be empty"]),
    (["notes"], 5, ["trajectory.notes: must be a string, not int"]),
    (["agent"], KeyError, ["agent: required (an object with name and version)"]),
    (["agent"], "tentalis", ["agent: must be a JSON object, not str"]),
    (["agent", "tools"], [], ["agent: unknown field(s) tools (ATIF v1.4 allows extra, model_name, name, version; "
                              "put anything else under 'extra')"]),
    (["agent", "name"], "", ["agent.name: must not be empty"]),
    (["agent", "version"], KeyError, ["agent.version: required (a string)"]),
    (["agent", "version"], 3, ["agent.version: must be a string, not int"]),
    (["agent", "model_name"], 1, ["agent.model_name: must be a string, not int"]),
    (["final_metrics"], [], ["final_metrics: must be a JSON object, not list"]),
    (["final_metrics", "total"], 1, ["final_metrics: unknown field(s) total (ATIF v1.4 allows extra, total_cached_tokens, "
                                     "total_completion_tokens, total_cost_usd, total_prompt_tokens, total_steps; put anything else under 'extra')"]),
    (["final_metrics", "total_prompt_tokens"], -1, ["final_metrics.total_prompt_tokens: must be a non-negative integer, not -1"]),
    (["final_metrics", "total_completion_tokens"], 1.0, ["final_metrics.total_completion_tokens: must be a non-negative integer, not 1.0"]),
    (["final_metrics", "total_cached_tokens"], True, ["final_metrics.total_cached_tokens: must be a non-negative integer, not True"]),
    (["final_metrics", "total_steps"], "3", ["final_metrics.total_steps: must be a non-negative integer, not '3'"]),
    (["final_metrics", "total_cost_usd"], "1", ["final_metrics.total_cost_usd: must be a number, not '1'"]),
    (["final_metrics", "total_cost_usd"], float("inf"), ["final_metrics.total_cost_usd: must be a number, not inf"]),
    (["extra"], "x", ["extra: must be a JSON object, not str"]),
    # the root's extra.tentalis
    (T, [], ["extra.tentalis: must be a JSON object, not list"]),
    ([*T, "environment"], KeyError, ["extra.tentalis.environment: required (a string)"]),
    ([*T, "task_id"], " ", ["extra.tentalis.task_id: must not be empty"]),
    ([*T, "end_reason"], KeyError, ["extra.tentalis.end_reason: required (a string)"]),
    ([*T, "end_reason"], 0, ["extra.tentalis.end_reason: must be a string, not int"]),
    ([*T, "max_turns"], 0, ["extra.tentalis.max_turns: required, a positive integer (not 0)"]),
    ([*T, "max_turns"], True, ["extra.tentalis.max_turns: required, a positive integer (not True)"]),
    ([*T, "max_turns"], KeyError, ["extra.tentalis.max_turns: required, a positive integer (not None)"]),
    ([*T, "verdict"], None, ["extra.tentalis.verdict: required, an object with passed (bool), reward (number in [0, 1]) "
                             "and detail (string)"]),
    ([*T, "verdict", "passed"], 1, ["extra.tentalis.verdict.passed: must be true or false, not 1"]),
    ([*T, "verdict", "passed"], KeyError, ["extra.tentalis.verdict.passed: must be true or false, not None"]),
    ([*T, "verdict", "reward"], -0.01, ["extra.tentalis.verdict.reward: must be a number in [0, 1], not -0.01"]),
    ([*T, "verdict", "reward"], 1.01, ["extra.tentalis.verdict.reward: must be a number in [0, 1], not 1.01"]),
    ([*T, "verdict", "reward"], KeyError, ["extra.tentalis.verdict.reward: must be a number in [0, 1], not None"]),
    ([*T, "verdict", "detail"], 5, ["extra.tentalis.verdict.detail: must be a string, not int"]),
    ([*T, "temperature"], -0.1, ["extra.tentalis.temperature: must be a number >= 0, not -0.1"]),
    ([*T, "temperature"], "1", ["extra.tentalis.temperature: must be a number >= 0, not '1'"]),
    ([*T, "policy_version"], "", ["extra.tentalis.policy_version: must not be empty"]),
    ([*T, "backend"], 1, ["extra.tentalis.backend: must be a string, not int"]),
    ([*T, "check_kind"], " ", ["extra.tentalis.check_kind: must not be empty"]),
    ([*T, "tools"], "wc", ["extra.tentalis.tools: must be a list of program names (non-empty strings), not 'wc'"]),
    ([*T, "tools"], ["wc", ""], ["extra.tentalis.tools: must be a list of program names (non-empty strings), not ['wc', '']"]),
    ([*T, "tools"], [3], ["extra.tentalis.tools: must be a list of program names (non-empty strings), not [3]"]),
    ([*T, "max_tokens"], 0, ["extra.tentalis.max_tokens: must be a positive integer below 2^31, not 0"]),
    ([*T, "max_tokens"], 2**31, ["extra.tentalis.max_tokens: must be a positive integer below 2^31, not 2147483648"]),
    ([*T, "max_tokens"], 1.0, ["extra.tentalis.max_tokens: must be a positive integer below 2^31, not 1.0"]),
    ([*T, "reward"], "x", ["extra.tentalis.reward: must be a number, not 'x'"]),
    ([*T, "info"], [], ["extra.tentalis.info: must be a JSON object, not list"]),
    # the steps
    (["steps"], [], ["steps: required, a non-empty array of step objects"]),
    (["steps"], KeyError, ["steps: required, a non-empty array of step objects"]),
    (["steps"], {"1": {}}, ["steps: required, a non-empty array of step objects"]),
    (["steps", 0], "step", ["steps[0]: must be a JSON object, not str"]),
    (["steps", 0, "role"], "system", ["steps[0]: unknown field(s) role (ATIF v1.4 allows extra, message, metrics, model_name, "
                                      "observation, reasoning_content, reasoning_effort, source, step_id, timestamp, tool_calls; "
                                      "put anything else under 'extra')"]),
    (["steps", 0, "step_id"], "1", ["steps[0].step_id: '1', but step ids run 1, 2, 3, ... in order (expected 1)"]),
    (["steps", 0, "step_id"], True, ["steps[0].step_id: True, but step ids run 1, 2, 3, ... in order (expected 1)"]),
    (["steps", 1, "step_id"], 3, ["steps[1].step_id: 3, but step ids run 1, 2, 3, ... in order (expected 2)"]),
    (["steps", 0, "source"], "assistant", ["steps[0].source: 'assistant'; must be one of system, user, agent"]),
    (["steps", 0, "message"], KeyError, ["steps[0].message: required, a string (it may be empty), not NoneType"]),
    (["steps", 0, "message"], 5, ["steps[0].message: required, a string (it may be empty), not int"]),
    ([*STEP, "timestamp"], "yesterday", ["steps[2].timestamp: 'yesterday' is not an ISO 8601 timestamp (e.g. 2025-10-16T14:30:00Z)"]),
    ([*STEP, "timestamp"], 5, ["steps[2].timestamp: 5 is not an ISO 8601 timestamp (e.g. 2025-10-16T14:30:00Z)"]),
    (["steps", 1, "reasoning_content"], "r", ["steps[1]: reasoning_content only apply to agent steps, and this step's source is 'user'"]),
    (["steps", 0, "reasoning_effort"], "low", ["steps[0]: reasoning_effort only apply to agent steps, and this step's source is 'system'"]),
    ([*STEP, "model_name"], 1, ["steps[2].model_name: must be a string, not int"]),
    ([*STEP, "reasoning_content"], [], ["steps[2].reasoning_content: must be a string, not list"]),
    # tool calls and observations
    ([*STEP, "tool_calls"], "ls", ["steps[2].tool_calls: must be an array, not str",
                                   "steps[2].observation.results[0].source_call_id: 'c0' names no tool call of this step "
                                   "(its tool_call_ids: none)"]),
    ([*STEP, "tool_calls", 0], "ls", ["steps[2].tool_calls[0]: must be a JSON object, not str",
                                      "steps[2].observation.results[0].source_call_id: 'c0' names no tool call of this step "
                                      "(its tool_call_ids: none)"]),
    ([*STEP, "tool_calls", 0, "id"], "x", ["steps[2].tool_calls[0]: unknown field(s) id (ATIF v1.4 allows arguments, "
                                           "function_name, tool_call_id; put anything else under 'extra')"]),
    ([*STEP, "tool_calls", 0, "function_name"], "", ["steps[2].tool_calls[0].function_name: must not be empty"]),
    ([*STEP, "tool_calls", 0, "function_name"], KeyError, ["steps[2].tool_calls[0].function_name: required (a string)"]),
    ([*STEP, "tool_calls", 0, "arguments"], KeyError, ["steps[2].tool_calls[0].arguments: required, a JSON object (may be {}), not NoneType"]),
    ([*STEP, "tool_calls", 0, "arguments"], "ls", ["steps[2].tool_calls[0].arguments: required, a JSON object (may be {}), not str"]),
    ([*STEP, "observation"], "out", ["steps[2].observation: must be a JSON object, not str"]),
    ([*STEP, "observation", "text"], "x", ["steps[2].observation: unknown field(s) text (ATIF v1.4 allows results; "
                                           "put anything else under 'extra')"]),
    ([*STEP, "observation", "results"], KeyError, ["steps[2].observation.results: required, an array of result objects"]),
    ([*STEP, "observation", "results"], "x", ["steps[2].observation.results: required, an array of result objects"]),
    (RES, "out", ["steps[2].observation.results[0]: must be a JSON object, not str"]),
    ([*RES, "status"], 0, ["steps[2].observation.results[0]: unknown field(s) status (ATIF v1.4 allows content, source_call_id, "
                           "subagent_trajectory_ref; put anything else under 'extra')"]),
    ([*RES, "content"], 5, ["steps[2].observation.results[0].content: must be a string, not int"]),
    ([*RES, "source_call_id"], "c9", ["steps[2].observation.results[0].source_call_id: 'c9' names no tool call of this step "
                                      "(its tool_call_ids: c0)"]),
    ([*RES, "subagent_trajectory_ref"], {}, ["steps[2].observation.results[0].subagent_trajectory_ref: must be an array"]),
    ([*RES, "subagent_trajectory_ref"], [5], ["steps[2].observation.results[0].subagent_trajectory_ref[0]: must be a JSON object, not int"]),
    ([*RES, "subagent_trajectory_ref", 0, "session_id"], KeyError,
     ["steps[2].observation.results[0].subagent_trajectory_ref[0].session_id: required (a string)"]),
    ([*RES, "subagent_trajectory_ref", 0, "path"], "p",
     ["steps[2].observation.results[0].subagent_trajectory_ref[0]: unknown field(s) path (ATIF v1.4 allows extra, session_id, "
      "trajectory_path; put anything else under 'extra')"]),
    # metrics
    (M, [], ["steps[2].metrics: must be a JSON object, not list"]),
    ([*M, "prompt_tokens"], -1, ["steps[2].metrics.prompt_tokens: must be a non-negative integer, not -1",
                                 "steps[2].metrics.prompt_tokens: -1 but prompt_token_ids holds 3 ids; they must agree"]),
    ([*M, "completion_tokens"], 2.0, ["steps[2].metrics.completion_tokens: must be a non-negative integer, not 2.0"]),
    ([*M, "cached_tokens"], -1, ["steps[2].metrics.cached_tokens: must be a non-negative integer, not -1"]),
    ([*M, "cost_usd"], True, ["steps[2].metrics.cost_usd: must be a number, not True"]),
    ([*M, "prompt_token_ids"], "0 1 2", ["steps[2].metrics.prompt_token_ids: must be an array of integer token ids, not str"]),
    ([*M, "prompt_token_ids"], [0, -1, 2], ["steps[2].metrics.prompt_token_ids[1]: token ids must be integers in [0, 2^31), not -1"]),
    ([*M, "prompt_token_ids"], [0, 2**31, 1.0], ["steps[2].metrics.prompt_token_ids[1]: token ids must be integers in [0, 2^31), "
                                                 "not 2147483648 (2 bad in all)"]),
    ([*M, "completion_token_ids"], [7, True], ["steps[2].metrics.completion_token_ids[1]: token ids must be integers in [0, 2^31), not True"]),
    ([*M, "logprobs"], "-0.5", ["steps[2].metrics.logprobs: must be an array of numbers (one per completion token), not str"]),
    ([*M, "logprobs"], [-0.5, 1e-9], ["steps[2].metrics.logprobs[1]: a log-probability is a finite number <= 0, not 1e-09"]),
    ([*M, "logprobs"], [float("-inf"), -1.0], ["steps[2].metrics.logprobs[0]: a log-probability is a finite number <= 0, not -inf"]),
    ([*M, "logprobs"], [-0.5], ["steps[2].metrics.logprobs: 1 values for 2 completion_token_ids; give one log-prob per "
                                "completion token (or leave logprobs out)"]),
    ([*M, "prompt_tokens"], 4, ["steps[2].metrics.prompt_tokens: 4 but prompt_token_ids holds 3 ids; they must agree"]),
    ([*M, "completion_tokens"], 0, ["steps[2].metrics.completion_tokens: 0 but completion_token_ids holds 2 ids; they must agree"]),
    ([*M, "extra"], "x", ["steps[2].metrics.extra: must be a JSON object, not str"]),
    # a step's extra.tentalis
    ([*STEP, "extra"], [], ["steps[2].extra: must be a JSON object, not list"]),
    (ST, "x", ["steps[2].extra.tentalis: must be a JSON object, not str"]),
    ([*ST, "finish_reason"], 1, ["steps[2].extra.tentalis.finish_reason: must be a string, not int"]),
    ([*ST, "action"], ["ls"], ["steps[2].extra.tentalis.action: must be a string, not list"]),
    ([*ST, "seconds_policy"], -1, ["steps[2].extra.tentalis.seconds_policy: must be a number of seconds >= 0, not -1"]),
    ([*ST, "seconds_env"], float("nan"), ["steps[2].extra.tentalis.seconds_env: must be a number of seconds >= 0, not nan"]),
    ([*ST, "info"], "x", ["steps[2].extra.tentalis.info: must be a JSON object, not str"]),
    ([*ST, "message"], "x", ["steps[2].extra.tentalis.message: must be a JSON object, not str"]),
    ([*ST, "observation_messages"], "user", ["steps[2].extra.tentalis.observation_messages: must be an array of objects, not str"]),
    ([*ST, "observation_messages"], [{}, "user"], ["steps[2].extra.tentalis.observation_messages[1]: must be a JSON object, not str"]),
    ([*ST, "observation_in_context"], "no", ["steps[2].extra.tentalis.observation_in_context: must be true or false, not 'no'"]),
    ([*ST, "observation_in_context"], 0, ["steps[2].extra.tentalis.observation_in_context: must be true or false, not 0"]),
]


@pytest.mark.parametrize("path, value, expected", BAD, ids=[".".join(map(str, b[0])) + f"={b[1]!r}"[:30] for b in BAD])
def test_each_bad_field_is_named_by_its_path_with_what_would_be_valid(path, value, expected):
    doc = full_doc()
    _edit(path, value)(doc)
    assert problems(doc) == expected


def test_a_document_that_is_not_an_object_is_named_alone():
    for doc, kind in (([], "list"), ("{}", "str"), (None, "NoneType")):
        with pytest.raises(atif.ATIFError, match=rf"^trajectory: must be a JSON object, not {kind}$"):
            atif.validate_atif(doc)


def test_token_ids_outside_the_vocabulary_are_named_with_the_fix_boundary_exact():
    doc = full_doc()
    doc["steps"][2]["metrics"]["prompt_token_ids"] = [0, 9, 9]
    atif.validate_atif(doc, vocab_size=10)  # 9 is the last id of a vocabulary of 10
    doc["steps"][2]["metrics"]["completion_token_ids"] = [10, 11]
    fix = ("; these ids come from another tokenizer: import trajectories sampled from this policy, "
           "or give the vocabulary of the tokenizer that made them")
    assert problems(doc, vocab_size=10) == [
        "steps[2].metrics.completion_token_ids[0]: token id 10 is outside the policy's vocabulary of 10 ids ([0, 10)) "
        "(2 outside in all)" + fix]
    doc["steps"][2]["metrics"]["completion_token_ids"] = [1, 10]
    doc["steps"][2]["metrics"]["prompt_token_ids"] = [0, 10, 2]
    assert problems(doc, vocab_size=10) == [
        "steps[2].metrics.prompt_token_ids[1]: token id 10 is outside the policy's vocabulary of 10 ids ([0, 10))" + fix,
        "steps[2].metrics.completion_token_ids[1]: token id 10 is outside the policy's vocabulary of 10 ids ([0, 10))" + fix]


SURROGATE = ("holds a lone surrogate '\\ud800' at character 1, which is not Unicode text (UTF-8 cannot encode it); "
             "fix the tool that wrote it, or replace the character (e.g. with U+FFFD) before importing")


def test_a_lone_surrogate_is_named_by_its_path_in_values_and_keys():
    doc = full_doc()
    doc["steps"][0]["message"] = "a\ud800"
    doc["steps"][2]["tool_calls"][0]["arguments"] = {"x\ud800y": ["ok", "b\ud800"]}
    doc["extra"]["a\ud800"] = 1
    lines = problems(doc)
    assert lines == [  # extra holds anything: only the key is named
        "extra (a key): " + SURROGATE,
        "steps[0].message: " + SURROGATE,
        "steps[2].tool_calls[0].arguments (a key): " + SURROGATE,
        "steps[2].tool_calls[0].arguments.x\\ud800y[1]: " + SURROGATE,
    ]
    d2 = full_doc()
    d2["\ud800"] = 1
    assert problems(d2)[0] == "trajectory (a key): holds a lone surrogate '\\ud800' at character 0, which is not Unicode text " \
                              "(UTF-8 cannot encode it); fix the tool that wrote it, or replace the character (e.g. with U+FFFD) before importing"


def test_twelve_problems_are_shown_and_the_rest_counted():
    doc = full_doc()
    doc["session_id"] = 7
    for i in range(11):
        doc[f"k{i:02d}"] = 1
    doc["steps"][0]["step_id"] = 0
    lines = problems(doc)  # 1 (keys) + 1 (session id) + 1 (step id) = 3: all shown
    assert len(lines) == 3
    for i in range(3):
        doc["steps"][i]["source"] = "bot"
    doc["steps"][1]["message"] = None
    for key in ("environment", "task_id", "end_reason"):
        del doc["extra"]["tentalis"][key]
    doc["extra"]["tentalis"]["max_turns"] = 0
    doc["agent"]["name"] = ""
    lines = problems(doc)
    assert len(lines) == 13 and lines[-1] == "... and 1 more" and lines[:2] == [
        "trajectory: unknown field(s) k00, k01, k02, k03, k04, k05, k06, k07, k08, k09, k10 (ATIF v1.4 allows agent, extra, "
        "final_metrics, notes, schema_version, session_id, steps; put anything else under 'extra')",
        "trajectory.session_id: must be a string, not int"]
    doc["agent"]["name"] = "tentalis"  # exactly 12: no count
    assert len(problems(doc)) == 12


def test_read_atif_names_each_bad_trajectory_by_line_and_counts_past_ten(tmp_path):
    good = full_doc()
    lines = [json.dumps(good)]
    for i in range(11):
        bad = copy.deepcopy(good)
        bad["session_id"] = f"s{i}"
        bad["steps"][0]["source"] = "bot"
        lines.append(json.dumps(bad))
    lines.insert(3, "{nope")
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(atif.ATIFError) as err:
        atif.read_atif(f)
    text = str(err.value)
    assert text.startswith("t.jsonl line 2: not a valid ATIF v1.4 trajectory (session_id 's0'):\n  "
                           "steps[0].source: 'bot'; must be one of system, user, agent\n"
                           "t.jsonl line 3: not a valid ATIF v1.4 trajectory (session_id 's1'):\n  ")
    assert "\nt.jsonl line 4: not JSON (Expecting property name enclosed in double quotes at column 2)\n" in text
    assert text.endswith("\n... and 2 more bad trajectories") and "line 11:" in text and "line 12:" not in text
    f.write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(atif.ATIFError) as err:
        atif.read_atif(f)
    assert "more bad" not in str(err.value)
    f.write_text(json.dumps(good) + "\n")
    assert atif.read_atif(f) == [good]
    f.write_text("\n \n")
    with pytest.raises(atif.ATIFError, match=r"^t.jsonl: holds no trajectory$"):
        atif.read_atif(f)


@pytest.mark.parametrize("n_bad, tail", [(10, "steps[0].source: 'bot'; must be one of system, user, agent"),
                                         (11, "steps[0].source: 'bot'; must be one of system, user, agent\n"
                                              "... and 1 more bad trajectories")])
def test_read_atif_shows_ten_bad_trajectories_and_counts_from_the_eleventh(tmp_path, n_bad, tail):
    bad = full_doc()
    bad["steps"][0]["source"] = "bot"
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(bad) + "\n" for _ in range(n_bad)))
    with pytest.raises(atif.ATIFError) as err:
        atif.read_atif(f)
    text = str(err.value)
    assert text.endswith("t.jsonl line 10: not a valid ATIF v1.4 trajectory (session_id 's-1'):\n  " + tail)
    assert text.count("not a valid ATIF") == 10


def test_read_atif_checks_token_ids_against_the_vocabulary_it_is_given(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(full_doc()))
    assert atif.read_atif(f, vocab_size=2**31) == [full_doc()]
    with pytest.raises(atif.ATIFError, match=r"^t\.json: .*\n  steps\[2\]\.metrics\.prompt_token_ids\[1\]: token id 1 is outside "
                                             r"the policy's vocabulary of 1 ids"):
        atif.read_atif(f, vocab_size=1)
