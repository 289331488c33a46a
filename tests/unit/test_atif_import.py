"""`tentalis episodes import` from its contract (issue 73): all or nothing (a bad trajectory anywhere in
the file lands nothing, is named with its line and kept in quarantine), one Delta commit per table,
token ids inside the policy's vocabulary, identical re-imports a no-op and changed ones refused unless
``--replace``; and input the project's own export never writes (empty files, foreign fields, a log-prob
of exactly 0.0, a temperature of 0, optional fields left out, U+2028 inside a message)."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from tentalis_pipelines import episodes
from tentalis_pipelines.cli import app
from tentalis_pipelines.envs import atif
from tentalis_pipelines.lakehouse import Lakehouse

runner = CliRunner()
LANDED = ("turns", "sessions", "reviews")


def doc(sid: str, *, turns: int = 2, verdict: bool = True, text: str = "looking") -> dict:
    """A trajectory as Tentalis exports one: system and user steps, then ``turns`` agent steps with a
    bash call, its observation, and token ids (each prompt extends the last) and log-probs."""
    steps = [{"step_id": 1, "source": "system", "message": "You are an agent."},
             {"step_id": 2, "source": "user", "message": "Do the task."}]
    prompt = [1, 2, 3]
    for t in range(turns):
        completion = [10 + t, 20 + t]
        steps.append({"step_id": len(steps) + 1, "timestamp": "2026-12-01T10:00:00+00:00", "source": "agent",
                      "message": f"{text} {t}", "tool_calls": [{"tool_call_id": f"c{t}", "function_name": "bash",
                                                                  "arguments": {"command": f"ls {t}"}}],
                      "observation": {"results": [{"source_call_id": f"c{t}", "content": f"out {t}"}]},
                      "metrics": {"prompt_token_ids": list(prompt), "completion_token_ids": completion, "logprobs": [-0.5, -0.25]}})
        prompt = prompt + completion + [5]
    d = {"schema_version": "ATIF-v1.4", "session_id": sid, "agent": {"name": "tentalis", "version": "1", "model_name": "m"},
         "steps": steps}
    if verdict:
        d["extra"] = {"tentalis": {"environment": "terminal", "task_id": f"task-{sid}", "end_reason": "submitted", "max_turns": turns,
                                   "verdict": {"passed": True, "reward": 1.0, "detail": "ok"}, "policy_version": "base"}}
    return d


def jsonl(path, docs) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))  # ensure_ascii: a lone surrogate travels as \\udXXX
    return str(path)


def landed(lake: Lakehouse) -> dict[str, int]:
    return {t: lake.count(t) if lake.exists(t) else 0 for t in LANDED}


def versions(lake: Lakehouse) -> dict[str, int | None]:
    return {t: lake.stats(t)["version"] for t in LANDED}


# --------------------------------------------------------------------------- all or nothing
def test_a_lone_surrogate_in_the_third_trajectory_lands_nothing_and_is_named_with_its_line(tmp_path):
    docs = [doc(f"s-{k}") for k in range(5)]
    docs[2]["steps"][3]["message"] = "half a pair: \ud83d here"
    path = jsonl(tmp_path / "t.jsonl", docs)
    home = tmp_path / "home"
    result = runner.invoke(app, ["episodes", "import", path, "--home", str(home), "--vocab-size", "100"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "t.jsonl line 3 (trajectory 2)" in text and "steps[3].message: holds a lone surrogate" in text
    assert "replace the character" in text and "nothing was imported" in text and "quarantine" in text
    lake = Lakehouse(home / "lakehouse")
    assert landed(lake) == {"turns": 0, "sessions": 0, "reviews": 0}
    [q] = lake.read("quarantine").to_pylist()
    assert (q["source"], q["line"], q["stage"]) == (path, 3, "episodes-import")
    assert json.loads(q["raw"])["session_id"] == "s-2" and "lone surrogate" in q["error"]


def test_a_lone_surrogate_anywhere_is_refused_before_any_write(tmp_path):
    """Keys and values at any depth, the session id too: the library call lands nothing either."""
    lake = Lakehouse(tmp_path / "lake")
    for edit in (lambda d: d["steps"][2]["observation"]["results"][0].update(content="\udc80"),
                 lambda d: d["steps"][2]["tool_calls"][0]["arguments"].update({"\ud800k": "v"}),
                 lambda d: d.update(session_id="s-\udfff")):
        bad = doc("s-1")
        edit(bad)
        with pytest.raises(atif.ATIFError, match="(?s)trajectory 1: .*lone surrogate"):
            episodes.import_episodes(lake, [doc("s-0"), bad], vocab_size=100)
        assert landed(lake) == {"turns": 0, "sessions": 0, "reviews": 0}


def test_every_bad_trajectory_is_named_and_quarantined_not_only_the_first(tmp_path):
    docs = [doc(f"s-{k}") for k in range(5)]
    docs[1]["steps"][2]["metrics"]["logprobs"] = [0.5, -1.0]
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(d) for d in docs]
    lines[3] = lines[3][:-5]  # not JSON
    path.write_bytes(("\n".join(lines[:4]) + "\n\n").encode() + b'{"session_id": "\xff"}\n' + lines[4].encode() + b"\n")
    lake = Lakehouse(tmp_path / "lake")
    with pytest.raises(episodes.PlanErrors) as err:
        episodes.import_file(lake, path, vocab_size=100)
    text = str(err.value)
    assert "t.jsonl line 2 (trajectory 1): " in text and "steps[2].metrics.logprobs[0]" in text
    assert "t.jsonl line 4: not JSON" in text and "(trajectory 3)" in text
    assert "t.jsonl line 6: not UTF-8 text (byte 0xff" in text and "(trajectory 4)" in text  # line 5 is blank
    assert [k for k, _ in err.value.problems] == [1, 3, 4]
    assert landed(lake) == {"turns": 0, "sessions": 0, "reviews": 0}
    assert sorted(r["line"] for r in lake.read("quarantine").to_pylist()) == [2, 4, 6]


FOREIGN_TENTALIS = [
    ("max_tokens past int32", ["extra", "tentalis", "max_tokens"], 2**31, "extra.tentalis.max_tokens: must be a positive integer"),
    ("seconds as text", ["steps", 2, "extra"], {"tentalis": {"seconds_policy": "fast"}}, "steps[2].extra.tentalis.seconds_policy"),
    ("info as a list", ["steps", 3, "extra"], {"tentalis": {"info": [1]}}, "steps[3].extra.tentalis.info: must be a JSON object"),
    ("observation kinds as text", ["steps", 2, "extra"], {"tentalis": {"observation_messages": "user"}},
     "steps[2].extra.tentalis.observation_messages: must be an array"),
    ("root info as text", ["extra", "tentalis", "info"], "x", "extra.tentalis.info: must be a JSON object"),
]


@pytest.mark.parametrize("where,value,named", [c[1:] for c in FOREIGN_TENTALIS], ids=[c[0] for c in FOREIGN_TENTALIS])
def test_another_tools_extra_tentalis_of_the_wrong_shape_is_named_before_any_write(tmp_path, where, value, named):
    """``extra.tentalis`` as another tool might write it: every field the import reads is checked, so
    nothing fails (or lands) half way."""
    lake = Lakehouse(tmp_path / "lake")
    bad = doc("s-1")
    obj = bad
    for k in where[:-1]:
        obj = obj[k]
    obj[where[-1]] = value
    with pytest.raises(atif.ATIFError) as err:
        episodes.import_episodes(lake, [doc("s-0"), bad])
    assert str(err.value).startswith("trajectory 1: ") and named in str(err.value)
    assert landed(lake) == {"turns": 0, "sessions": 0, "reviews": 0}


# --------------------------------------------------------------------------- batched writes
def test_an_import_of_several_trajectories_is_one_commit_per_table(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    out = episodes.import_episodes(lake, [doc(f"s-{k}") for k in range(4)], vocab_size=100)
    assert (out["sessions"], out["turns"], out["reviews"]) == (4, 8, 4)
    assert versions(lake) == {"turns": 0, "sessions": 0, "reviews": 0}  # each table: its first commit only
    out = episodes.import_episodes(lake, [doc(f"s-{k}") for k in range(4, 7)], vocab_size=100)
    assert versions(lake) == {"turns": 1, "sessions": 1, "reviews": 1} and landed(lake) == {"turns": 14, "sessions": 7, "reviews": 7}


# --------------------------------------------------------------------------- vocabulary
def test_token_ids_must_lie_inside_the_vocabulary_boundary_exact(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    d = doc("s-1")
    d["steps"][3]["metrics"]["completion_token_ids"] = [11, 99]  # 99 is the last id of a 100-id vocabulary
    episodes.import_episodes(lake, [d], vocab_size=100)
    for where in ("completion_token_ids", "prompt_token_ids"):
        bad = doc("s-2")
        bad["steps"][2]["metrics"][where] = [100] * len(bad["steps"][2]["metrics"][where])
        with pytest.raises(atif.ATIFError, match=rf"steps\[2\].metrics.{where}\[0\]: token id 100 is outside the policy's "
                                                  r"vocabulary of 100 ids.*outside in all"):
            episodes.import_episodes(lake, [bad], vocab_size=100)
    assert landed(lake)["sessions"] == 1


def test_the_cli_bounds_token_ids_by_the_policys_tokenizer_and_says_how_to_go_on_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TENTALIS_MODEL", str(tmp_path / "no-model"))
    with_ids = jsonl(tmp_path / "ids.jsonl", [doc("s-1")])
    result = runner.invoke(app, ["episodes", "import", with_ids, "--home", str(tmp_path / "h")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "cannot check the token ids" in text and "--vocab-size N" in text
    result = runner.invoke(app, ["episodes", "import", with_ids, "--home", str(tmp_path / "h"), "--vocab-size", "21"])
    assert result.exit_code == 2 and "token id 21 is outside" in " ".join(result.output.split())
    # A trajectory without token ids needs no tokenizer.
    no_ids = doc("s-2")
    for s in no_ids["steps"]:
        s.pop("metrics", None)
    result = runner.invoke(app, ["episodes", "import", jsonl(tmp_path / "plain.jsonl", [no_ids]), "--home", str(tmp_path / "h")])
    assert result.exit_code == 0 and "1 new session(s)" in result.output


# --------------------------------------------------------------------------- re-imports
def test_an_identical_re_import_writes_nothing(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    docs = [doc("s-1"), doc("s-2", verdict=False)]
    episodes.import_episodes(lake, docs, vocab_size=100)
    before = versions(lake)
    out = episodes.import_episodes(lake, copy.deepcopy(docs), vocab_size=100)
    assert (out["sessions"], out["unchanged"], out["turns"], out["reviews"]) == (0, 2, 0, 0)
    assert versions(lake) == before  # not one commit


CHANGES = [
    ("a message", lambda d: d["steps"][3].update(message="something else"), "turn(s) s-1-1"),
    ("a log-prob", lambda d: d["steps"][2]["metrics"].update(logprobs=[-0.5, -2.0]), "turn(s) s-1-0"),
    ("a turn fewer", lambda d: (d["steps"].pop(), d["extra"]["tentalis"].update(max_turns=1)), "turns (2 landed, 1 in the file)"),
    ("the verdict", lambda d: d["extra"]["tentalis"]["verdict"].update(passed=False, reward=0.0), "verdict"),
    ("the verdict dropped", lambda d: d.pop("extra"), "verdict (landed, none in the file)"),
    ("an observation", lambda d: d["steps"][3]["observation"]["results"][0].update(content="other"), "transcript"),
]


@pytest.mark.parametrize("edit,named", [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_a_changed_re_import_is_refused_and_replace_swaps_that_session_whole(tmp_path, edit, named):
    lake = Lakehouse(tmp_path / "lake")
    episodes.import_episodes(lake, [doc("s-1"), doc("s-2")], vocab_size=100)
    before = {t: lake.read(t).to_pylist() for t in LANDED}
    changed = doc("s-1")
    edit(changed)
    with pytest.raises(episodes.ImportRefused, match=r"session\(s\) 's-1' \(.*" + named.replace("(", r"\(").replace(")", r"\)")
                       + r".*--replace"):
        episodes.import_episodes(lake, [changed, doc("s-3")], vocab_size=100)
    assert {t: lake.read(t).to_pylist() for t in LANDED} == before  # s-3 did not land either
    out = episodes.import_episodes(lake, [changed, doc("s-3")], vocab_size=100, replace=True)
    assert (out["replaced"], out["sessions"]) == (1, 1)
    # The session now holds exactly what a fresh import of the changed trajectory lands; s-2 is untouched.
    fresh = Lakehouse(tmp_path / "fresh")
    episodes.import_episodes(fresh, [changed], vocab_size=100)

    def rows(lk, table, sid):
        drop = {"created_at", "seen_at"}
        return sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True, default=str)
                       for r in lk.read(table).to_pylist() if r["session_id"] == sid)

    for t in LANDED:
        assert rows(lake, t, "s-1") == rows(fresh, t, "s-1"), t
        assert rows(lake, t, "s-2") == sorted(json.dumps({k: v for k, v in r.items() if k not in {"created_at"}}, sort_keys=True,
                                                         default=str) for r in before[t] if r["session_id"] == "s-2"), t
    assert episodes.import_episodes(lake, [changed], vocab_size=100)["unchanged"] == 1  # and now it is the same


def test_an_import_that_died_between_its_commits_is_completed_by_importing_again(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    episodes.import_episodes(lake, [doc("s-1")], vocab_size=100)
    lake.delete("reviews", "true")  # as if the process died after landing turns and sessions
    out = episodes.import_episodes(lake, [doc("s-1")], vocab_size=100)
    assert (out["reviews"], out["turns"], out["unchanged"]) == (1, 0, 0) and landed(lake) == {"turns": 2, "sessions": 1, "reviews": 1}


# --------------------------------------------------------------------------- the file's contract
@pytest.mark.parametrize("name,content", [("e.jsonl", ""), ("blank.jsonl", "\n\n  \n"), ("e.json", ""), ("a.json", "[]")])
def test_an_empty_file_is_refused_and_lands_nothing(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    lake = Lakehouse(tmp_path / "lake")
    with pytest.raises(atif.ATIFError, match=f"{name}: holds no trajectory"):
        episodes.import_file(lake, tmp_path / name)
    assert landed(lake) == {"turns": 0, "sessions": 0, "reviews": 0} and not lake.exists("quarantine")


@pytest.mark.parametrize("name", ["one.json", "one.jsonl", "array.json", "several.jsonl"])
def test_one_or_several_trajectories_in_either_file_form(tmp_path, name):
    docs = [doc("s-1")] if name.startswith("one") else [doc("s-1"), doc("s-2", turns=3), doc("s-3", verdict=False)]
    path = tmp_path / name
    path.write_text(json.dumps(docs[0]) if name == "one.json" else
                    json.dumps(docs) if name.endswith(".json") else "".join(json.dumps(d) + "\n" for d in docs))
    lake = Lakehouse(tmp_path / "lake")
    out = episodes.import_file(lake, path, vocab_size=100)
    n = len(docs)
    assert (out["trajectories"], out["sessions"], out["reviews"]) == (n, n, min(n, 2))
    assert sorted(lake.read("sessions", columns=["session_id"]).column("session_id").to_pylist()) == [d["session_id"] for d in docs]


def test_foreign_input_the_export_never_writes_lands_as_its_fields_say(tmp_path):
    """Aggregates in final_metrics, other tools' keys under extra, a log-prob of exactly 0.0 (a sure
    token), a temperature of 0 (greedy, not "unset"), U+2028 and U+0085 inside a message (JSON allows
    them raw; ``str.splitlines`` would cut the line there), optional fields left out."""
    d = doc("h-1")
    d["final_metrics"] = {"total_prompt_tokens": 99, "total_completion_tokens": 4, "total_cached_tokens": 0, "total_cost_usd": 0.0,
                          "total_steps": 4, "extra": {"vendor": "x"}}
    d["notes"] = "from another harness"
    d["extra"]["tentalis"]["temperature"] = 0
    d["extra"]["other_tool"] = {"run": 7}
    d["steps"][2]["extra"] = {"other_tool": {"latency": 3}}
    d["steps"][2]["metrics"]["logprobs"] = [0.0, -0.0]
    d["steps"][3]["message"] = "line\u2028separator and next\u0085line"
    d["steps"][3].pop("timestamp")
    path = tmp_path / "foreign.jsonl"
    path.write_text(json.dumps(d, ensure_ascii=False) + "\n", encoding="utf-8")
    lake = Lakehouse(tmp_path / "lake")
    out = episodes.import_file(lake, path, vocab_size=100)
    assert (out["sessions"], out["turns"]) == (1, 2)
    turns = sorted(lake.read("turns").to_pylist(), key=lambda t: t["turn_index"])
    assert turns[0]["sampling_logprobs"] == [0.0, 0.0] and turns[1]["sampling_logprobs"] == [-0.5, -0.25]
    assert [t["temperature"] for t in turns] == [0.0, 0.0]
    assert json.loads(turns[1]["response"])["content"] == "line\u2028separator and next\u0085line"
    # The unstamped turn takes the import's time; re-importing the same file is still a no-op.
    assert episodes.import_file(lake, path, vocab_size=100)["unchanged"] == 1
    # An unknown key outside extra is refused (Harbor's models forbid it too), naming where to put it.
    d["vendor_field"] = 1
    path.write_text(json.dumps(d) + "\n")
    with pytest.raises(atif.ATIFError, match="unknown field.*vendor_field.*put anything else under 'extra'"):
        episodes.import_file(lake, path, vocab_size=100)


def test_a_minimal_foreign_trajectory_without_any_optional_field_imports(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    minimal = {"schema_version": "ATIF-v1.0", "session_id": "m-1", "agent": {"name": "other", "version": "0.1"},
               "steps": [{"step_id": 1, "source": "user", "message": ""}, {"step_id": 2, "source": "agent", "message": "ok"}]}
    out = episodes.import_episodes(lake, [minimal], vocab_size=100)
    assert (out["sessions"], out["turns"], out["reviews"]) == (1, 1, 0)
    [t] = lake.read("turns").to_pylist()
    assert t["prompt_token_ids"] == [] and t["sampling_logprobs"] is None and t["temperature"] is None and t["model"] == ""
