"""ATIF round trip through the lakehouse and the CLI, on real terminal episodes (the sandbox).

An environment batch of scripted episodes (the oracle, which passes, and a do-nothing agent, which fails)
with token ids and log-probs the way ChatPolicy gives them (each prompt extends the last context) is
exported with `tentalis episodes export`, imported into another home with `tentalis episodes import`,
and compared row by row: the imported session turns, their training segments and the verdict's review
are exactly what the environment batch holds (token ids and float32 log-probs included); exporting the
imported sessions gives the same file back; a sessions batch cut from them builds the same rollouts and
the same rewards as the environment batch."""

from __future__ import annotations

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from tentalis_pipelines import env_batches, sessions
from tentalis_pipelines.cli import app
from tentalis_pipelines.envs import agents, atif
from tentalis_pipelines.envs.runner import episode_to_turns, run_episode
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import generate_tasks
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.tasks.batches import terminal_task_rows
from tentalis_pipelines.training import multiturn

needs_sandbox = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                   reason="the sandbox needs Linux namespaces and root (CI runs as root)")
runner = CliRunner()
VOCAB = ["--vocab-size", str(0x110000)]  # WithIds's token ids are Unicode code points


class WithIds:
    """A scripted agent whose turns carry token ids and log-probs like ChatPolicy's: the prompt is a
    deterministic encoding of the conversation, so each turn's prompt extends the last context."""

    def __init__(self, agent):
        self.agent = agent

    def __call__(self, messages):
        text = self.agent(messages)
        prompt = [ord(c) for c in "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"]
        ids = [ord(c) for c in text]
        return text, ids, [-(k % 7 + 1) / 3.0 for k in range(len(ids))], prompt


def _cli(*args):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@needs_sandbox
def test_an_environment_batch_exports_to_atif_and_imports_as_sessions_that_train_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("TENTALIS_DATA_DIR", os.environ.get("TENTALIS_DATA_DIR", "/work/shared/data"))
    src = Paths.from_env(str(tmp_path / "src")).ensure()
    lake = Lakehouse(src.lakehouse)
    batch_id = "terminal-atif-test"
    tasks = [t for t in generate_tasks(32, levels=(1,)) if t.split == "train"][:2]
    created = now_utc()
    lake.write_batch("tasks", batch_id, terminal_task_rows(batch_id, tasks, created, max_turns=4))
    rows, originals = [], {}
    for task in tasks:
        for g, agent in enumerate((agents.oracle_agent(task), agents.do_nothing_agent())):
            ep = run_episode(TerminalEnv(TerminalConfig(max_turns=4)), task, WithIds(agent))
            eid = env_batches.episode_id(batch_id, task.task_id, "base", g)
            originals[eid] = ep
            rows += env_batches.episode_rollout_rows(batch_id, task, g, ep, policy_version="base", model="m", temperature=1.0,
                                                     max_tokens=None, created_at=created)
    assert sorted(e.passed for e in originals.values()) == [False, False, True, True]
    lake.write_batch("rollouts", batch_id, rows)
    env_batches.build_environment_reviews(lake, batch_id)
    rollouts = {r["rollout_id"]: r for r in lake.read("rollouts", batch_id=batch_id).to_pylist()}
    env_reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}

    out = tmp_path / "episodes.jsonl"
    assert "wrote 4 trajectory(ies)" in _cli("episodes", "export", "--batch", batch_id, "--out", str(out), "--home", str(src.home))
    docs = atif.read_atif(out)
    assert [d["session_id"] for d in docs] == sorted(originals)
    for d in docs:  # the episode comes back whole (log-probs as the rollouts store them: float32)
        ep = atif.atif_to_episode(d)
        assert ep.transcript() == originals[d["session_id"]].transcript()
        assert [t.token_ids for t in ep.turns] == [t.token_ids for t in originals[d["session_id"]].turns]

    dst = Paths.from_env(str(tmp_path / "dst")).ensure()
    assert "4 new session(s)" in _cli("episodes", "import", str(out), "--home", str(dst.home), *VOCAB)
    lake2 = Lakehouse(dst.lakehouse)
    turns = lake2.read("turns").to_pylist()
    for eid, ep in originals.items():
        mine = sorted((t for t in turns if t["session_id"] == eid), key=lambda t: t["turn_index"])
        expected = episode_to_turns(ep, session_id=eid, model="m", policy_version="base", backend="transformers", temperature=1.0)
        assert len(mine) == len(expected) == ep.turns_used
        for got, want in zip(mine, expected):
            for col in ("turn_id", "messages", "response", "prompt_token_ids", "completion_token_ids", "policy_version", "temperature",
                        "finish_reason"):
                assert got[col] == want[col], col
            assert got["sampling_logprobs"] == pytest.approx(want["sampling_logprobs"], rel=1e-6)
        # The training segment of the imported session is the environment batch's rollout, token for token.
        [seg] = multiturn.build_segments(eid, mine)
        ro = rollouts[eid]
        assert seg.prompt_ids == ro["prompt_token_ids"] and seg.completion_ids == ro["completion_token_ids"]
        assert seg.assistant_mask == ro["assistant_mask"] and seg.old_logps == ro["sampling_logprobs"]
        assert [(s.turn_id, s.start, s.end) for s in seg.spans] == [(s["turn_id"], s["start"], s["end"]) for s in ro["turn_spans"]]
    reviews = {r["rollout_id"]: r for r in lake2.read("reviews").to_pylist()}
    assert set(reviews) == set(originals)
    for eid, r in reviews.items():
        assert (r["batch_id"], r["manager"], r["session_id"]) == ("live", "verifier", eid)
        assert (r["score"], r["critique"], r["hint"]) == (env_reviews[eid]["score"], env_reviews[eid]["critique"], env_reviews[eid]["hint"])

    # Lossless both ways: the imported sessions export to the same trajectories.
    again = tmp_path / "again.json"
    _cli("episodes", "export", *sum((["--session", s] for s in sorted(originals)), []), "--out", str(again), "--home", str(dst.home))
    assert atif.read_atif(again) == docs
    assert "0 new session(s)" in _cli("episodes", "import", str(again), "--home", str(dst.home), *VOCAB)  # nothing changes
    assert lake2.count("turns") == len(turns)

    # Cut into a sessions batch, the imported episodes train as the environment batch's do.
    sb = sessions.register_sessions_batch(dst.batches, sorted(originals))
    sessions.build_session_tasks(lake2, dst.batches, sb)
    sessions.build_session_rollouts(lake2, sb)
    sessions.build_session_reviews(lake2, sb)
    sessions.build_session_trajectories(lake2, sb)
    for r in lake2.read("rollouts", batch_id=sb).to_pylist():
        ro = rollouts[r["session_id"]]
        for col in ("prompt_token_ids", "completion_token_ids", "assistant_mask", "sampling_logprobs"):
            assert r[col] == ro[col], col
    rewards = {t["rollout_id"]: t for t in lake2.read("trajectories", batch_id=sb).to_pylist()}
    by_session = {r["rollout_id"]: r["session_id"] for r in lake2.read("rollouts", batch_id=sb).to_pylist()}
    assert len(rewards) == 4
    for rid, t in rewards.items():
        assert t["kind"] == "multi_turn" and t["reward"] == env_reviews[by_session[rid]]["score"]
        assert t["loss_mask"] == rollouts[by_session[rid]]["assistant_mask"]


@needs_sandbox
def test_import_of_a_bad_file_names_the_field_and_lands_nothing(tmp_path):
    task = [t for t in generate_tasks(32, levels=(1,)) if t.split == "train"][0]
    ep = run_episode(TerminalEnv(TerminalConfig(max_turns=4)), task, WithIds(agents.oracle_agent(task)))
    doc = atif.episode_to_atif(ep, session_id="e-1", model="m", extra={"policy_version": "base", "temperature": 1.0})
    doc["steps"][-1]["metrics"]["logprobs"] = doc["steps"][-1]["metrics"]["logprobs"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    home = tmp_path / "h"
    result = runner.invoke(app, ["episodes", "import", str(bad), "--home", str(home), *VOCAB])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"steps[{len(doc['steps']) - 1}].metrics.logprobs" in text and "nothing was imported" in text
    assert not Lakehouse(Paths.from_env(str(home)).lakehouse).exists("turns")
