"""The PRM head on the tiny random model: features at each step's end, deterministic training, versions with
lineage, the contamination guard refusing a planted ProcessBench problem, and the step scorer's errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from assets.resources import ReviewResource
from tentalis_pipelines.reviewers.prm_head import (
    HeadConfig,
    load_trunk,
    step_features,
    tokenize_solution,
    tokenize_solution_spans,
    train_head,
)
from tentalis_pipelines.reviewers.prm_reviewer import (
    PRMHeadNotTrained,
    PRMHeadScorer,
    latest_version,
    manifest_of,
    versions,
)
from tentalis_pipelines.rewards.judge import JudgeRequest
from tentalis_pipelines.settings import Paths
from tests.prm_data import TRAIN, train_tiny_head, write_data_root


@pytest.fixture()
def data_root(tmp_path: Path) -> Path:
    return write_data_root(tmp_path)


_train = train_tiny_head


def test_features_are_read_at_each_steps_last_token(tiny_model_dir):
    trunk = load_trunk(tiny_model_dir, 2)
    problem, steps = "3 apples and 4 pears?", ["3 + 4 = 7 fruits.", "The answer is 7."]
    ids, ends = tokenize_solution(trunk.tokenizer, problem, steps, max_tokens=512)
    assert len(ends) == 2 and ends[-1] == len(ids) - 1 and ends[0] < ends[1]
    (f,) = step_features(trunk, [(problem, steps)])
    h = trunk.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    assert f.shape == (2, trunk.model.config.hidden_size)
    np.testing.assert_allclose(f, h[ends].float().numpy(), rtol=1e-4, atol=1e-4)
    # several layers from one pass: layer 2 is the same feature
    (both,) = step_features(trunk, [(problem, steps)], layers=[1, 2])
    np.testing.assert_allclose(both[:, 1], f, rtol=1e-4, atol=1e-4)
    # a token budget cuts the later steps off (they stay unscored)
    (cut,) = step_features(trunk, [(problem, steps)], max_tokens=ends[0] + 2)
    assert cut.shape[0] == 1
    with pytest.raises(ValueError, match="outside the model's 1..2 blocks"):
        load_trunk(tiny_model_dir, 3)


def test_train_head_is_deterministic_and_learns_a_separable_rule():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    cfg = HeadConfig(epochs=200, seed=3, weight_decay=1e-2)  # light L2: this checks that it learns, not the default
    a = train_head(x, y, cfg)
    b = train_head(x, y, cfg)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    with torch.no_grad():
        acc = ((a(torch.as_tensor(x)) > 0).numpy() == y.astype(bool)).mean()
    assert acc > 0.95
    with pytest.raises(ValueError, match="0 \\(wrong\\) or 1"):
        train_head(x, y * 2, HeadConfig(epochs=1))


def test_trained_versions_refuse_the_planted_benchmark_problem_and_repeat_exactly(home, tiny_model_dir, data_root):
    v1 = _train(home, tiny_model_dir, data_root)
    v2 = _train(home, tiny_model_dir, data_root)
    assert (v1.name, v2.name) == ("v0001", "v0002") and versions(home) == ["v0001", "v0002"]
    assert latest_version(home) == v2
    a, b = torch.load(v1 / "head.pt"), torch.load(v2 / "head.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same labels: the same weights
    m1, m2 = manifest_of(v1), manifest_of(v2)
    assert m1["threshold"] == m2["threshold"]
    refused = m1["lineage"]["contamination"]["refused"]
    assert [r["problem_id"] for r in refused] == ["gsm8k-train-00003"]
    assert (refused[0]["match"]["benchmark"], refused[0]["match"]["item_id"], refused[0]["match"]["tier"]) == (
        "processbench-gsm8k", "gsm8k-0", "exact")
    assert "gsm8k-train-00003" not in m1["lineage"]["gsm8k_train"]["problem_ids"]
    assert len(m1["lineage"]["gsm8k_train"]["problem_ids"]) == len(TRAIN)
    assert m1["lineage"]["labels"]["kinds"]["reference"] == len(TRAIN)
    assert len(m1["lineage"]["gsm8k_train"]["sha256"]) == 64


def test_the_threshold_is_chosen_on_out_of_fold_scores_of_both_renderings(home, tiny_model_dir, data_root, monkeypatch):
    """`prm train`'s default: every labelled solution in both renderings is scored by a head trained without
    its fold (only the ProcessBench-shaped rendering trains), and the stored threshold and held-out F1 are
    the rule chosen on exactly those scores; `folds=1` keeps the old single held-out slice."""
    from tentalis_pipelines.reviewers import prm_reviewer
    from tentalis_pipelines.reviewers.prm_head import choose_rule
    from tentalis_pipelines.reviewers.prm_reviewer import TrainSettings, train_reviewer

    seen: dict = {}
    real = prm_reviewer.out_of_fold_scores

    def spy(features, labels, groups, config, **kw):
        out = real(features, labels, groups, config, **kw)
        seen.update(kw, labels=[list(x) for x in labels], groups=list(groups), out=out, steps=[len(f) for f in features])
        return out

    monkeypatch.setattr(prm_reviewer, "out_of_fold_scores", spy)
    m = manifest_of(_train(home, tiny_model_dir, data_root))
    n = len(seen["groups"]) // 2
    assert seen["folds"] == 5 and m["threshold_from"] == "5-fold out-of-fold scores"
    assert n == m["lineage"]["labels"]["solutions"] and seen["groups"][:n] == seen["groups"][n:]  # plain, then pbstyle
    assert seen["trains"] == [False] * n + [True] * n
    first = [next((i for i, x in enumerate(lab) if x == 0), -1) for lab in seen["labels"]]
    rule, f1 = choose_rule(seen["out"], first)
    assert (m["threshold"], m["held_out_f1"]) == (rule.threshold, f1)
    assert m["lineage"]["labels"]["train_steps"] == sum(seen["steps"][n:])  # the final head learns from the pbstyle rows

    seen.clear()
    v = train_reviewer(home, tiny_model_dir, data_root, config=HeadConfig(layer=2, epochs=40),
                       settings=TrainSettings(train_problems=50, folds=1, held_out=0.34, use_embeddings=False), cache_dir=home / "cache")
    assert not seen and manifest_of(v)["threshold_from"] == "a held-out slice of 34% of the problems"
    with pytest.raises(ValueError, match="folds must be 1"):
        TrainSettings(folds=0)


def _rollout_lake(home: Path):
    """A lakehouse holding two tasks, each with two wrong rollouts (a false equation at step 1, a wrong answer:
    calculator and verifier agree), one right rollout (true arithmetic, the right answer: calculator and verifier
    agree) and one right rollout with no equation (the verifier alone: not labelled)."""
    from datetime import datetime, timezone

    from tentalis_pipelines.lakehouse import Lakehouse

    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    now = datetime.now(timezone.utc)
    tasks = [("t0", "Ann has 3 bags of 4 apples. How many apples?", "12"), ("t1", "Bo has 5 boxes of 6 pens. How many pens?", "30")]
    lake.write_batch("tasks", "b1", [{"batch_id": "b1", "task_id": t, "source": "s", "environment": "math", "prompt": p, "reference": r,
                                      "difficulty": 1, "metadata": "{}", "created_at": now} for t, p, r in tasks])
    sols = {"t0": [(["3 bags of 4.", "3 * 4 = 13", "So 13 apples."], "13"), (["Bags: 3.", "3 * 4 = 11", "The answer is 11."], "11"),
                   (["3 * 4 = 12", "The answer is 12."], "12"), (["Twelve apples."], "12")],
            "t1": [(["5 boxes of 6.", "5 * 6 = 31", "So 31 pens."], "31"), (["Boxes: 5.", "5 * 6 = 36", "The answer is 36."], "36"),
                   (["5 * 6 = 30", "The answer is 30."], "30"), (["Thirty pens."], "30")]}
    lake.write_batch("rollouts", "b1", [
        {"batch_id": "b1", "rollout_id": f"{t}-r{i}", "task_id": t, "group_index": i, "policy_version": "base", "backend": "x", "model": "m",
         "prompt_text": "p", "completion": " ".join(steps), "steps": steps, "answer": ans, "parse_mode": "tagged", "prompt_tokens": 1,
         "completion_tokens": 1, "completion_token_ids": [1], "sampling_logprobs": None, "finish_reason": "stop", "temperature": 0.8,
         "seconds": 0.1, "created_at": now}
        for t, rows in sols.items() for i, (steps, ans) in enumerate(rows)])
    return lake


def test_the_policys_rollouts_train_weighted_and_as_the_policy_wrote_them(home, tiny_model_dir, data_root, monkeypatch):
    """With a lakehouse, its consensus-labelled rollouts join the GSM8K labels: each of their steps weighs
    ``rollout_weight`` in every head's loss (the fold heads and the final one), they train in both renderings
    (GSM8K solutions only in ProcessBench's shape), and two rollouts of one task share a fold."""
    from tentalis_pipelines.reviewers import prm_reviewer
    from tentalis_pipelines.reviewers.prm_reviewer import TrainSettings, train_reviewer

    lake = _rollout_lake(home)
    seen: dict = {}
    real_oof, real_train = prm_reviewer.out_of_fold_scores, prm_reviewer.train_head

    def oof(features, labels, groups, config, **kw):
        seen.update(kw, groups=list(groups), steps=[len(f) for f in features])
        return real_oof(features, labels, groups, config, **kw)

    def train(x, y, config, weights=None):
        seen["final_weights"] = np.asarray(weights)
        return real_train(x, y, config, weights)

    monkeypatch.setattr(prm_reviewer, "out_of_fold_scores", oof)
    monkeypatch.setattr(prm_reviewer, "train_head", train)
    v = train_reviewer(home, tiny_model_dir, data_root, lake=lake, config=HeadConfig(layer=2, epochs=40),
                       settings=TrainSettings(train_problems=50, use_embeddings=False, rollout_weight=4.0), cache_dir=home / "cache")
    m = manifest_of(v)
    assert m["lineage"]["labels"]["kinds"]["rollout"] == 6 and m["settings"]["rollout_weight"] == 4.0
    assert sorted(m["lineage"]["lakehouse"]["rollout_ids"]) == [f"b1/t{t}-r{r}" for t in (0, 1) for r in (0, 1, 2)]
    n = len(seen["groups"]) // 2  # plain, then pbstyle; the 6 rollouts come last in each
    rollout_rows = [i for half in (0, n) for i in range(half + n - 6, half + n)]
    assert [i for i, w in enumerate(seen["weights"]) if w != 1.0] == rollout_rows and {seen["weights"][i] for i in rollout_rows} == {4.0}
    assert seen["trains"] == [False] * (n - 6) + [True] * 6 + [True] * n
    g = seen["groups"]
    assert g[n - 6] == g[n - 5] == g[n - 4] == g[2 * n - 6] != g[n - 3] == g[n - 2] == g[n - 1]  # by task, across renderings
    assert g[n - 6] == "rollout-problem:Ann has 3 bags of 4 apples. How many apples?"
    # the final head: every training step of a rollout weighs 4, every GSM8K step 1
    rollout_steps = sum(seen["steps"][i] for i in rollout_rows)
    w = seen["final_weights"]
    assert int((w == 4.0).sum()) == rollout_steps == m["lineage"]["labels"]["train_rollout_steps"] > 0
    assert int((w == 1.0).sum()) == m["lineage"]["labels"]["train_steps"] - rollout_steps == sum(seen["steps"][n:2 * n - 6])
    with pytest.raises(ValueError, match="rollout_weight must be a positive number.*--no-rollouts"):
        TrainSettings(rollout_weight=0.0)


def test_step_scorer_prm_head_scores_in_unit_interval(home, tiny_model_dir, data_root):
    _train(home, tiny_model_dir, data_root)
    scorer = PRMHeadScorer(home, tiny_model_dir)
    out = scorer.score_steps([JudgeRequest("2 boxes of 3?", ["2 * 3 = 6", "The answer is 6."]), JudgeRequest("1?", ["1"])])
    assert [len(x) for x in out] == [2, 1]
    assert all(0.0 <= j.score <= 1.0 and j.votes == [j.score] and "prm_head v0001" in j.rationale for x in out for j in x)


def test_choosing_prm_head_without_a_trained_head_names_the_command(home):
    paths = Paths.from_env(home)
    with pytest.raises(PRMHeadNotTrained, match="tentalis prm train"):
        ReviewResource(step_scorer="prm_head").step_judge(paths)
    assert ReviewResource(step_scorer="calculator").step_judge(paths) is None


TASK = "Tom has 4 pens and buys 3 more. How many pens does he have?"


def test_the_heads_step_scores_drive_process_mode_by_hand(home, tiny_model_dir, data_root):
    """`review.step_scorer = prm_head` end to end through the batch stages: the head's P(correct) per step is the
    step reward, their mean the process reward, and process mode adds DeepSeekMath's per-step advantage (the
    group's step rewards normalised, suffix-summed, divided by the number of steps) to the outcome advantage,
    all checked against numbers computed here from the head's own scores."""
    from tentalis_pipelines.lakehouse import Lakehouse, now_utc
    from tentalis_pipelines.rewards.advantages import token_advantages
    from tentalis_pipelines.rewards.steps import parse_completion
    from tentalis_pipelines.stages.reviews import build_reviews
    from tentalis_pipelines.stages.step_scores import build_step_scores
    from tentalis_pipelines.stages.trajectories import build_trajectories

    _train(home, tiny_model_dir, data_root)
    scorer = PRMHeadScorer(home, tiny_model_dir)
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    completions = ["<step>4 + 3 = 7</step>\n<answer>7</answer>",
                   "<step>4 * 3 = 12</step>\n<step>12 - 1 = 11</step>\n<answer>11</answer>",
                   "<step>4 + 3 = 8</step>\n<step>8 + 0 = 8</step>\n<step>So 8 pens.</step>\n<answer>8</answer>",
                   "<step>He buys some more pens.</step>"]  # no answer: its step earns no process reward
    now = now_utc()
    lake.write_batch("tasks", "b1", [{"batch_id": "b1", "task_id": "t0", "source": "test", "environment": "math", "prompt": TASK,
                                      "reference": "7", "difficulty": 1, "metadata": "{}", "created_at": now}])
    parsed = [parse_completion(c) for c in completions]
    lake.write_batch("rollouts", "b1", [{
        "batch_id": "b1", "rollout_id": f"r{i}", "task_id": "t0", "group_index": i, "policy_version": "base", "backend": "test",
        "model": "test", "prompt_text": TASK, "completion": c, "steps": p.steps, "answer": p.answer, "parse_mode": p.parse_mode,
        "prompt_tokens": 10, "completion_tokens": 20, "completion_token_ids": [1] * 20, "sampling_logprobs": None,
        "finish_reason": "stop", "temperature": 0.8, "seconds": 0.1, "created_at": now} for i, (c, p) in enumerate(zip(completions, parsed))])
    build_step_scores(lake, "b1", scorer="prm_head", judge=scorer)
    build_reviews(lake, "b1", manager="verifier")
    build_trajectories(lake, "b1", advantage_mode="process")
    rows = sorted(lake.read("trajectories", batch_id="b1").to_pylist(), key=lambda r: r["rollout_id"])

    head = [[j.score for j in js] for js in scorer.score_steps([JudgeRequest(TASK, p.steps) for p in parsed])]
    assert [len(h) for h in head] == [1, 2, 3, 1]
    stored = lake.read("step_scores", batch_id="b1").to_pylist()
    assert {(r["rollout_id"], r["step_index"]): r["score"] for r in stored} == pytest.approx(
        {(f"r{i}", j): s for i, h in enumerate(head) for j, s in enumerate(h)}) and {r["scorer"] for r in stored} == {"prm_head"}
    for row, h in zip(rows, head):
        assert row["step_rewards"] == pytest.approx(h)
    assert [r["process_reward"] for r in rows[:3]] == pytest.approx([float(np.mean(h)) for h in head[:3]]) and rows[3]["process_reward"] is None
    # the reward: the weighted sum of its parts, with the head's process reward among them
    for r in rows:
        w = json.loads(r["reward_weights"])
        total = (w["outcome"] * r["outcome_reward"] + w["format"] * r["format_reward"] + w["process"] * (r["process_reward"] or 0.0)
                 + w["manager"] * r["manager_score"])
        assert r["reward"] == pytest.approx(total) and w["process"] > 0
    rewards = np.array([r["reward"] for r in rows])
    assert [r["advantage"] for r in rows] == pytest.approx(((rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4)).tolist())
    # DeepSeekMath by hand on the head's scores
    pool = np.array([s for h in head for s in h])
    mean, std = pool.mean(), pool.std(ddof=1)
    for r, h in zip(rows, head):
        norm = [(s - mean) / (std + 1e-4) for s in h]
        by_hand = [sum(norm[j:]) / len(h) for j in range(len(h))]
        assert r["step_advantages"] == pytest.approx(by_hand) and r["advantage_mode"] == "process"
    # process mode adds (never replaces): a token of step j carries the outcome advantage plus step j's
    two = rows[1]
    assert token_advantages([0, 0, 1, None], two["advantage"], two["step_advantages"]) == pytest.approx(
        [two["advantage"] + two["step_advantages"][0]] * 2 + [two["advantage"] + two["step_advantages"][1], two["advantage"]])


def _write_group(lake, batch_id, completions):
    from tentalis_pipelines.lakehouse import now_utc
    from tentalis_pipelines.rewards.steps import parse_completion

    now = now_utc()
    lake.write_batch("tasks", batch_id, [{"batch_id": batch_id, "task_id": "t0", "source": "test", "environment": "math",
                                          "prompt": TASK, "reference": "7", "difficulty": 1, "metadata": "{}", "created_at": now}])
    parsed = [parse_completion(c) for c in completions]
    lake.write_batch("rollouts", batch_id, [{
        "batch_id": batch_id, "rollout_id": f"r{i}", "task_id": "t0", "group_index": i, "policy_version": "base", "backend": "test",
        "model": "test", "prompt_text": TASK, "completion": c, "steps": p.steps, "answer": p.answer, "parse_mode": p.parse_mode,
        "prompt_tokens": 10, "completion_tokens": 20, "completion_token_ids": [1] * 20, "sampling_logprobs": None,
        "finish_reason": "stop", "temperature": 0.8, "seconds": 0.1, "created_at": now} for i, (c, p) in enumerate(zip(completions, parsed))])
    return parsed


def test_a_model_judges_only_completions_in_the_step_format(home, tiny_model_dir, data_root):
    """A completion without `<step>` tags (its steps are the parser's guess, its lines) is not sent to the head:
    its step rows are stored unscored with the reason, it earns no process reward, and the group's step rewards
    are normalised over the formatted completions' steps alone (by hand). The calculator still checks its
    equation: the rule is for a model's judgement, which a policy can win with prose (round 2 of
    experiments/prm_step_scorer), not for an arithmetic fact."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages.reviews import build_reviews
    from tentalis_pipelines.stages.step_scores import UNFORMATTED, build_step_scores, in_step_format
    from tentalis_pipelines.stages.trajectories import build_trajectories

    _train(home, tiny_model_dir, data_root)
    scorer = PRMHeadScorer(home, tiny_model_dir)
    sent = []

    class Spy:
        def score_steps(self, requests):
            requests = list(requests)
            sent.extend(r.steps for r in requests)
            return scorer.score_steps(requests)

    completions = ["<step>4 + 3 = 7</step>\n<answer>7</answer>",
                   "4 + 3 = 7\nSo he has 7 pens.",  # no tags: the fallback parse finds two lines and the answer 7
                   "<step>4 * 3 = 12</step>\n<step>12 - 1 = 11</step>\n<answer>11</answer>"]
    assert [in_step_format(c) for c in completions] == [True, False, True] and not in_step_format(None)
    # the step tags decide, not the answer tag
    assert in_step_format("<step>4 + 3 = 7</step>") and not in_step_format("4 + 3 = 7\n<answer>7</answer>")
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    parsed = _write_group(lake, "b1", completions)
    assert parsed[1].steps == ["4 + 3 = 7", "So he has 7 pens."] and parsed[1].answer == "7"
    build_step_scores(lake, "b1", scorer="prm_head", judge=Spy())
    assert sent == [parsed[0].steps, parsed[2].steps]
    stored = {(r["rollout_id"], r["step_index"]): r for r in lake.read("step_scores", batch_id="b1").to_pylist()}
    assert len(stored) == 5
    assert [(stored[("r1", j)]["score"], stored[("r1", j)]["votes"], stored[("r1", j)]["rationale"]) for j in (0, 1)] == \
        [(None, [], UNFORMATTED)] * 2
    head = [[j.score for j in js] for js in scorer.score_steps([JudgeRequest(TASK, parsed[i].steps) for i in (0, 2)])]
    assert [stored[("r0", 0)]["score"], stored[("r2", 0)]["score"], stored[("r2", 1)]["score"]] == pytest.approx(head[0] + head[1])
    build_reviews(lake, "b1", manager="verifier")
    build_trajectories(lake, "b1", advantage_mode="process")
    rows = sorted(lake.read("trajectories", batch_id="b1").to_pylist(), key=lambda r: r["rollout_id"])
    assert rows[1]["outcome_reward"] == 1.0 and rows[1]["process_reward"] is None and rows[1]["step_advantages"] == [0.0, 0.0]
    pool = np.array(head[0] + head[1])
    mean, std = pool.mean(), pool.std(ddof=1)
    for r, h in zip((rows[0], rows[2]), head):
        norm = [(s - mean) / (std + 1e-4) for s in h]
        assert r["step_advantages"] == pytest.approx([sum(norm[j:]) / len(h) for j in range(len(h))])
        assert r["process_reward"] == pytest.approx(float(np.mean(h)))
    # the calculator checks the unformatted completion's equation all the same
    _write_group(lake, "b2", completions)
    build_step_scores(lake, "b2", scorer="calculator")
    calc = {(r["rollout_id"], r["step_index"]): r["score"] for r in lake.read("step_scores", batch_id="b2").to_pylist()}
    assert calc[("r1", 0)] == 1.0 and calc[("r1", 1)] is None


def test_mean_pooling_averages_each_steps_tokens(tiny_model_dir):
    trunk = load_trunk(tiny_model_dir, 2)
    problem, steps = "3 apples and 4 pears?", ["3 + 4 = 7 fruits.", "The answer is 7."]
    ids, spans = tokenize_solution_spans(trunk.tokenizer, problem, steps, max_tokens=512)
    assert spans[0][0] == len(trunk.tokenizer(problem, add_special_tokens=False)["input_ids"]) and spans[1][0] == spans[0][1] + 1
    h = trunk.model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
    (mean,) = step_features(trunk, [(problem, steps)], pooling="mean")
    np.testing.assert_allclose(mean, torch.stack([h[a: b + 1].mean(0) for a, b in spans]).numpy(), rtol=1e-4, atol=1e-4)
    (both,) = step_features(trunk, [(problem, steps)], pooling="last+mean", layers=[2])
    np.testing.assert_allclose(both[:, 0], np.concatenate([h[[b for _, b in spans]].numpy(), mean], 1), rtol=1e-4, atol=1e-4)


def test_surprise_features_are_each_steps_log_probs_under_the_whole_model(tiny_model_dir):
    """A ``full`` trunk reads block 1 as the cut one does, and each step's surprise is, by hand from the LM's
    own logits: the mean and minimum log-probability of the step's tokens, then of its tokens holding a digit
    (the whole step when none does). Two solutions of different lengths in one padded batch."""
    from transformers import AutoModelForCausalLM

    from tentalis_pipelines.reviewers.prm_head import HeadConfig, head_features, step_features_and_surprise

    cut, full = load_trunk(tiny_model_dir, 1), load_trunk(tiny_model_dir, 1, full=True)
    sols = [("3 apples and 4 pears?", ["3 + 4 = 7 fruits.", "The answer is seven."]), ("Two boxes of 5?", ["2 * 5 = 10"])]
    feats, surprise = step_features_and_surprise(full, sols, pooling="mean", surprise=True)
    for f, g in zip(feats, step_features(cut, sols, pooling="mean")):
        np.testing.assert_allclose(f, g, rtol=1e-4, atol=1e-4)
    lm = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=full.dtype).eval()
    for (problem, steps), got in zip(sols, surprise):
        ids, spans = tokenize_solution_spans(full.tokenizer, problem, steps, max_tokens=512)
        with torch.no_grad():
            logp = torch.log_softmax(lm(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        lp = [0.0] + [float(logp[j - 1, ids[j]]) for j in range(1, len(ids))]
        want = []
        for a, b in spans:
            seg = lp[a: b + 1]
            dig = [lp[j] for j in range(a, b + 1) if any(c.isdigit() for c in full.tokenizer.decode([ids[j]]))] or seg
            want.append([sum(seg) / len(seg), min(seg), sum(dig) / len(dig), min(dig)])
        assert got.shape == (len(steps), 4)
        np.testing.assert_allclose(got, np.asarray(want), rtol=2e-3, atol=2e-3)
    # the second step of the first solution ("The answer is seven.") has no digit: its digit columns are the step's
    assert surprise[0][1, 2] == pytest.approx(surprise[0][1, 0]) and surprise[0][1, 3] == pytest.approx(surprise[0][1, 1])
    (row, _) = head_features(full, sols, HeadConfig(layer=1, features="hidden+surprise"))
    np.testing.assert_allclose(row[:, -4:], surprise[0], rtol=1e-6)
    with pytest.raises(ValueError, match="full=True"):
        step_features_and_surprise(cut, sols, surprise=True)


def test_a_surprise_head_trains_stores_and_scores_through_the_product(home, tiny_model_dir, data_root, embedded_model_dir):
    """`HeadConfig(features="hidden+surprise")` end to end: `train_reviewer` reads the whole model, the stored head is
    four columns wider than the hidden state, `PRMHeadScorer` loads the whole model again and scores; a head
    scored against a model of another width names the fix; as a learning run's step scorer it is refused
    (`PRMHeadGameable`), while a hidden-state head is served (the process-mode test above)."""
    from tentalis_pipelines.reviewers.prm_head import HeadCheckpoint, feature_dim
    from tentalis_pipelines.reviewers.prm_reviewer import TrainSettings, train_reviewer

    cfg = HeadConfig(layer=1, epochs=40, features="hidden+surprise")
    v = train_reviewer(home, tiny_model_dir, data_root, config=cfg,
                       settings=TrainSettings(train_problems=50, use_embeddings=False), cache_dir=home / "cache")
    ck = HeadCheckpoint.load(v)
    hidden = load_trunk(tiny_model_dir, 1).model.config.hidden_size
    assert ck.config.surprise and int(ck.head.mean.shape[0]) == hidden + 4 == feature_dim(ck.config, hidden)
    assert feature_dim(HeadConfig(layer=2, layers=(1, 2), pooling="last+mean", features="hidden"), hidden) == 4 * hidden
    scorer = PRMHeadScorer(home, tiny_model_dir)
    assert scorer.trunk.lm_head is not None
    # a head that reads the surprise judges, but a learning run may not train on its step scores (it is gamed)
    from tentalis_pipelines.reviewers.prm_reviewer import PRMHeadGameable

    with pytest.raises(PRMHeadGameable, match="v0001 reads the model's own surprise .*--features hidden"):
        ReviewResource(step_scorer="prm_head").step_judge(Paths.from_env(home))
    (scores,) = scorer.score(["2 boxes of 3?"], [["2 * 3 = 6", "The answer is 6."]])
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    with pytest.raises(ValueError, match="train a head for this model"):
        PRMHeadScorer(home, embedded_model_dir)
    # the surprise alone: four columns, no hidden state
    only = train_reviewer(home, tiny_model_dir, data_root, config=HeadConfig(layer=1, epochs=40, features="surprise"),
                          settings=TrainSettings(train_problems=50, use_embeddings=False), cache_dir=home / "cache")
    assert int(HeadCheckpoint.load(only).head.mean.shape[0]) == 4
    (scores,) = PRMHeadScorer(home, tiny_model_dir).score(["2 boxes of 3?"], [["2 * 3 = 6", "The answer is 6."]])
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    with pytest.raises(ValueError, match="features 'logits' is not one of"):
        HeadConfig(features="logits")
