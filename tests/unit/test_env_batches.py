"""Environment batches without a model or a sandbox: registration (the held-out split is never trained
on), the kind's resolution, the review-from-verdict rule and the per-task GRPO groups, by hand."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest

from tentalis_pipelines import env_batches
from tentalis_pipelines.envs import terminal_tasks, verdicts
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.stages import kinds
from tentalis_pipelines.tasks import batches

NOW = datetime.now(timezone.utc)


# --------------------------------------------------------------------------- registration
def test_a_terminal_batch_is_registered_once_with_its_parameters(tmp_path):
    bid = batches.register_terminal_batch(tmp_path, seed=3, num_tasks=5, levels=(1, 2), max_turns=4)
    assert bid == "terminal-s3-n5-l12"
    assert json.loads((tmp_path / bid / "manifest.json").read_text()) == {
        "kind": "terminal", "family": "terminal", "source": "terminal", "seed": 3, "num_tasks": 5, "levels": [1, 2],
        "recipe": {"temperature": 0.4, "max_new_tokens": 128, "max_turns": 4, "num_generations": None}}
    assert batches.register_terminal_batch(tmp_path, seed=3, num_tasks=5, levels=(1, 2), max_turns=4) == bid  # idempotent
    with pytest.raises(ValueError, match="other parameters"):
        batches.register_terminal_batch(tmp_path, seed=3, num_tasks=5, levels=(1, 2), max_turns=2, batch_id=bid)
    with pytest.raises(batches.ReservedSeedError):
        batches.register_terminal_batch(tmp_path, seed=batches.HELD_OUT_SEED_BASE, num_tasks=5)
    with pytest.raises(ValueError, match="levels"):
        batches.register_terminal_batch(tmp_path, seed=1, num_tasks=5, levels=(4,))
    with pytest.raises(ValueError, match="levels"):
        batches.register_terminal_batch(tmp_path, seed=1, num_tasks=5, levels=(-1,))
    assert batches.next_terminal_seed(tmp_path) == 4


def test_the_tasks_of_a_terminal_batch_are_task_rows_of_the_training_split(tmp_path):
    bid = batches.register_terminal_batch(tmp_path, seed=0, num_tasks=7, levels=(1, 2, 3), max_turns=3)
    rows = batches.load_batch(tmp_path, bid, NOW).tasks
    assert len(rows) == 7 and [r["difficulty"] for r in rows] == [1, 2, 3, 1, 2, 3, 1]
    for r in rows:
        meta = json.loads(r["metadata"])
        assert (r["batch_id"], r["source"], r["environment"]) == (bid, "generator:terminal", "terminal")
        assert meta["split"] == "train" and meta["max_turns"] == 3
        index = int(r["task_id"].split("-")[3])
        assert index >= terminal_tasks.DEFAULT_TEST_PER_LEVEL  # never one of the first 30 of a level
        task = terminal_tasks.TerminalTask.from_task_row(r)
        assert task.instruction == r["prompt"] and task.check == json.loads(r["reference"])
    # Seed 0 is the held-out seed: its training split starts at task 30 of each level.
    assert rows[0]["task_id"] == "terminal-s0-l1-0030-" + rows[0]["task_id"].split("-", 4)[4]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_no_training_task_is_a_held_out_task(seed):
    held_out = batches.terminal_held_out_tasks()
    assert len(held_out) == 120 and {t.split for t in held_out} == {"test"}
    fingerprints = {batches.terminal_fingerprint(t) for t in held_out}
    ids = {t.task_id for t in held_out}
    train = batches.terminal_training_tasks(seed, 120, (1, 2, 3))
    assert len({t.task_id for t in train}) == 120
    assert all(t.split == "train" and t.task_id not in ids and batches.terminal_fingerprint(t) not in fingerprints for t in train)


def test_a_training_task_equal_to_a_held_out_one_is_skipped(monkeypatch):
    """Should the generator give a training task identical to a held-out one, the batch takes the next."""
    real = terminal_tasks.make_task

    def clone_of_held_out(level, index, *, seed=0, test_per_level=terminal_tasks.DEFAULT_TEST_PER_LEVEL):
        if index == 30:  # the first training task of every level: a copy of held-out task 0
            held = real(level, 0, seed=batches.TERMINAL_HELD_OUT_SEED)
            return terminal_tasks.TerminalTask(f"terminal-s{seed}-l{level}-0030-copy", level, held.family, held.instruction,
                                               held.tree, held.check, held.solution, split="train", seed=seed)
        return real(level, index, seed=seed, test_per_level=test_per_level)

    monkeypatch.setattr(terminal_tasks, "make_task", clone_of_held_out)
    [task] = batches.terminal_training_tasks(5, 1, (1,))
    assert task.task_id.startswith("terminal-s5-l1-0031-")


def test_an_interrupted_terminal_cycle_is_resumed(tmp_path):
    bid = batches.register_terminal_batch(tmp_path, seed=1, num_tasks=4, levels=(1,))
    assert batches.interrupted_cycle_batch(tmp_path, task_source="terminal", num_tasks=4, levels=(1,), settled=set()) == bid
    assert batches.interrupted_cycle_batch(tmp_path, task_source="terminal", num_tasks=4, levels=(1,), settled={bid}) is None
    assert batches.interrupted_cycle_batch(tmp_path, task_source="terminal", num_tasks=8, levels=(1,), settled=set()) is None


# --------------------------------------------------------------------------- the kind
def test_a_terminal_batch_resolves_to_the_environment_kind(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    bid = batches.register_terminal_batch(tmp_path / "batches", seed=1, num_tasks=2, levels=(1,))
    lake.write_batch("tasks", bid, batches.load_batch(tmp_path / "batches", bid, NOW).tasks)
    assert kinds.batch_kind(lake, bid) is kinds.ENVIRONMENT
    assert kinds.KINDS.index(kinds.ENVIRONMENT) < kinds.KINDS.index(kinds.TASKS)


# --------------------------------------------------------------------------- reviews from verdicts
def _review(**kw):
    args = {"passed": False, "reward": 0.0, "detail": "", "end_reason": "submitted", "check_kind": "answer", "format_errors": 0,
            "turns": 3, "max_turns": 8, **kw}
    return verdicts.verdict_review(**args)


def test_a_verdict_becomes_a_review_by_hand():
    ok = _review(passed=True, reward=1.0, detail="answer matches", turns=2)
    assert ok == {"manager": "verifier", "score": 1.0, "critique": "passed (submitted) after 2 of 8 turns: answer matches",
                  "hint": "", "failure": "passed"}
    wrong = _review(detail="submitted '3', expected '4'", format_errors=1)
    assert wrong["score"] == 0.0 and wrong["failure"] == "wrong_answer"
    assert wrong["critique"] == "failed (submitted) after 3 of 8 turns, 1 without a command: submitted '3', expected '4'"
    assert wrong["hint"] == verdicts.HINTS["wrong_answer"] and "submit" in wrong["hint"]
    assert _review(check_kind="tree")["failure"] == "wrong_tree"
    assert _review(end_reason="turn_limit", turns=8, format_errors=2)["failure"] == "turn_limit"
    # Every turn without a command: a format failure, whatever the end.
    assert _review(end_reason="turn_limit", turns=8, format_errors=8)["hint"] == verdicts.HINTS["format"]
    hostile = _review(end_reason="hostile: network access", detail="hostile: network access", turns=1)
    assert (hostile["failure"], hostile["score"]) == ("hostile", 0.0) and "network" in hostile["hint"]
    assert _review(end_reason="error: policy failed: ContextTooLong", turns=0)["hint"] == ""  # not the agent's doing
    # A partial reward passes through as the score.
    assert _review(reward=0.5)["score"] == 0.5


def test_the_verifier_names_the_solutions_tools_after_a_wrong_result_or_no_submission_only():
    from tentalis_pipelines.envs.terminal_tasks import solution_tools

    tools = ["wc"]
    for end, kind, why in (("turn_limit", "answer", "turn_limit"), ("submitted", "answer", "wrong_answer"), ("submitted", "tree", "wrong_tree")):
        hint = _review(end_reason=end, check_kind=kind, tools=tools)["hint"]
        assert hint == verdicts.HINTS[why] + " The tool for it: wc."
    assert _review(end_reason="submitted", tools=["sort", "uniq", "head"])["hint"].endswith(" The tools for it: sort, uniq, head.")
    # passed, format-only, hostile and error reviews never name a tool; no tools (None-like: empty) adds nothing
    assert _review(passed=True, reward=1.0, tools=tools)["hint"] == ""
    assert _review(end_reason="turn_limit", turns=8, format_errors=8, tools=tools)["hint"] == verdicts.HINTS["format"]
    assert _review(end_reason="hostile: network access", turns=1, tools=tools)["hint"] == verdicts.HINTS["hostile"]
    assert _review(end_reason="error: sandbox died", turns=1, tools=tools)["hint"] == ""
    assert _review(tools=())["hint"] == verdicts.HINTS["wrong_answer"]
    # the tools: first words of each command of a pipeline or list, loop bodies included; looking and submit are not tools
    assert solution_tools(["wc -l < a.txt", "submit 4"]) == ["wc"]
    assert solution_tools(["sort v.txt | uniq -c | sort -rn | head -n 1", "submit bob"]) == ["sort", "uniq", "head"]
    assert solution_tools(['cd docs && for f in *.txt; do mv "$f" "${f%.txt}.md"; done', "ls docs", "submit"]) == ["mv"]
    assert solution_tools(["mkdir -p urgent", "grep -lw urgent inbox/* | xargs -I{} mv {} urgent/", "ls inbox urgent"]) == ["mkdir", "grep", "xargs"]
    assert solution_tools(["cat a.txt", "submit x"]) == [] and solution_tools([]) == []


# --------------------------------------------------------------------------- trajectories by hand
def _rollout(bid, task_id, g, spans, n):
    eid = env_batches.episode_id(bid, task_id, "base", g)
    return {"batch_id": bid, "rollout_id": eid, "task_id": task_id, "group_index": g, "policy_version": "base", "backend": "transformers",
            "model": "m", "prompt_text": "", "completion": "", "steps": [], "answer": None, "parse_mode": "episode:submitted",
            "prompt_tokens": 2, "completion_tokens": n, "completion_token_ids": list(range(n)), "sampling_logprobs": None,
            "finish_reason": "stop", "temperature": 0.8, "seconds": 0.0, "created_at": NOW, "session_id": eid,
            "prompt_token_ids": [1, 2], "assistant_mask": [0] * n,
            "turn_spans": [{"turn_id": f"{eid}-{k}", "turn_index": k, "start": a, "end": b} for k, (a, b) in enumerate(spans)],
            "episode": json.dumps({"environment": "terminal", "end_reason": "submitted", "passed": True, "reward": 1.0, "detail": "",
                                   "turns": len(spans), "max_turns": 4, "format_errors": 0, "check_kind": "answer", "level": 1})}


def test_the_g_episodes_of_a_task_are_its_group_and_only_assistant_tokens_are_trained(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    bid = "terminal-s1-n2-l1"
    rollouts = [_rollout(bid, "t0", 0, [(0, 2), (5, 7)], 8), _rollout(bid, "t0", 1, [(0, 3)], 3),
                _rollout(bid, "t1", 0, [(0, 1)], 1), _rollout(bid, "t1", 1, [(0, 1)], 1)]
    lake.write_batch("rollouts", bid, rollouts)
    scores = {(r["task_id"], r["group_index"]): s for r, s in zip(rollouts, [1.0, 0.0, 0.0, 0.0])}
    lake.write_batch("reviews", bid, [{"batch_id": bid, "rollout_id": r["rollout_id"], "manager": "verifier",
                                       "score": scores[(r["task_id"], r["group_index"])], "critique": "", "hint": "", "created_at": NOW,
                                       "session_id": r["session_id"]} for r in rollouts])
    n, meta = env_batches.build_environment_trajectories(lake, bid, dynamic_sampling=True)
    assert n == 4 and meta["groups"] == 2 and meta["groups_with_signal"] == 1
    tr = {(r["task_id"], r["group_index"]): r for r in lake.read("trajectories", batch_id=bid).to_pylist()}
    # t0: rewards 1 and 0, mean 0.5, unbiased std sqrt(0.5) = 0.7071: advantages +-0.5 / (0.7071 + 1e-4) = +-0.70701.
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert tr[("t0", 0)]["advantage"] == pytest.approx(a) and tr[("t0", 1)]["advantage"] == pytest.approx(-a)
    assert tr[("t0", 0)]["loss_mask"] == [1, 1, 0, 0, 0, 1, 1, 0]  # the observation between the turns is masked out
    assert tr[("t0", 0)]["token_advantages"] == pytest.approx([a, a, 0, 0, 0, a, a, 0])
    assert tr[("t0", 0)]["turn_rewards"] == [1.0, 1.0] and tr[("t0", 0)]["reward"] == 1.0 and tr[("t0", 0)]["kind"] == "multi_turn"
    # t1: both failed, no signal: advantage 0, dropped by dynamic sampling.
    assert tr[("t1", 0)]["advantage"] == 0.0 and not tr[("t1", 0)]["kept"] and tr[("t0", 1)]["kept"]
    ok, _, _ = env_batches.one_review_per_episode(lake, bid)
    assert ok


def test_the_terminal_benchmark_is_the_held_out_split():
    from tentalis_pipelines.evaluation.benchmarks import BENCHMARKS, level_success, load_benchmark

    assert "terminal" in BENCHMARKS
    name, items = load_benchmark("terminal")
    assert name == "terminal" and len(items) == 120
    assert all(it.environment == "terminal" and it.extra["task"]["split"] == "test" for it in items)
    assert {it.extra["level"] for it in items} == {0, 1, 2, 3}
    train = {t.task_id for t in batches.terminal_training_tasks(0, 150, (1, 2, 3))}
    assert not train & {it.item_id for it in items}
    _, some = load_benchmark("terminal", limit=6)
    assert len(some) == 6 and some == load_benchmark("terminal", limit=6)[1]  # a fixed seeded subset

    from tentalis_pipelines.evaluation.benchmarks import ItemResult

    results = [ItemResult(it, "", None, ok, ok, True) for it, ok in zip(items[30:33] + items[60:62], [True, False, False, True, True])]  # levels 1, 2
    assert items[0].extra["level"] == 0 and items[30].extra["level"] == 1
    per_level = level_success(results)
    # Level 1: 1 of 3, Wilson 95% [0.0615, 0.7923]; level 2: 2 of 2, [0.3424, 1.0].
    assert per_level["1"] == {"n": 3, "success": 0.3333, "ci_low": 0.0615, "ci_high": 0.7923}
    assert per_level["2"]["success"] == 1.0 and per_level["2"]["ci_low"] == pytest.approx(0.3424, abs=1e-4)
    level0 = level_success([ItemResult(items[0], "", None, False, False, True)])
    assert level0 == {"0": {"n": 1, "success": 0.0, "ci_low": 0.0, "ci_high": level0["0"]["ci_high"]}}  # level 0 is kept
