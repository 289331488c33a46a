"""`tentalis prm eval` on the tiny model: the head's agreement with ProcessBench's human labels and with the
verifier lands in judge_agreement, by hand, replaced on a rerun and carried over by the stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.reviewers.prm_head import HeadConfig
from tentalis_pipelines.reviewers.prm_reviewer import PRMHeadScorer, TrainSettings, train_reviewer
from tentalis_pipelines.settings import Paths

# the same data folder as tests/test_prm_head.py
TRAIN = [
    ("Tom has 3 bags with 4 apples each. He eats 2. How many apples are left?",
     "He had 3*4 = <<3*4=12>>12 apples.\nHe has 12-2 = <<12-2=10>>10 left.\n#### 10"),
    ("A pen costs 5 dollars. Ann buys 6 pens and pays with 50 dollars. How much change does she get?",
     "The pens cost 5*6 = <<5*6=30>>30 dollars.\nHer change is 50-30 = <<50-30=20>>20 dollars.\n#### 20"),
    ("A farm has 7 cows and 9 times as many hens. How many animals are there?",
     "There are 7*9 = <<7*9=63>>63 hens.\nThere are 63+7 = <<63+7=70>>70 animals.\n#### 70"),
    ("Mia reads 12 pages a day for 5 days, then 8 pages. How many pages did she read?",
     "She read 12*5 = <<12*5=60>>60 pages in 5 days.\nIn all 60+8 = <<60+8=68>>68 pages.\n#### 68"),
    ("A box holds 24 eggs. Sam has 3 boxes and breaks 5 eggs. How many eggs are whole?",
     "He has 24*3 = <<24*3=72>>72 eggs.\nWhole: 72-5 = <<72-5=67>>67 eggs.\n#### 67"),
    ("Lee earns 15 dollars an hour and works 8 hours, then spends 40 dollars. How much is left?",
     "He earns 15*8 = <<15*8=120>>120 dollars.\nLeft: 120-40 = <<120-40=80>>80 dollars.\n#### 80"),
]
PLANTED = "Sue lives in a fun neighborhood. One weekend, the neighbors placed 18 pink plastic flamingos out on Sue's front yard."


@pytest.fixture()
def data_root(tmp_path: Path) -> Path:
    """A data folder: GSM8K train (with a ProcessBench problem planted in it), GSM8K test, ProcessBench gsm8k."""
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "processbench").mkdir()
    rows = [{"question": q, "answer": a} for q, a in TRAIN]
    rows.insert(2, {"question": PLANTED, "answer": "She has 18*2 = <<18*2=36>>36.\n#### 36"})
    (root / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "An unrelated test question about 9 boats?", "answer": "#### 9"}) + "\n")
    (root / "processbench" / "gsm8k.jsonl").write_text(json.dumps(
        {"id": "gsm8k-0", "problem": PLANTED, "steps": ["18 flamingos.", "The answer is 18."], "label": -1}) + "\n")
    return root


def _train(home: Path, tiny: Path, root: Path, seed: int = 0) -> Path:
    return train_reviewer(home, tiny, root, config=HeadConfig(layer=2, epochs=40, seed=seed),
                          settings=TrainSettings(train_problems=50, held_out=0.34, seed=seed, use_embeddings=False),
                          cache_dir=home / "cache")


def test_prm_eval_writes_agreement_with_people_and_the_verifier(home, tiny_model_dir, data_root, monkeypatch):
    from typer.testing import CliRunner

    from tentalis_pipelines.cli import app
    from tentalis_pipelines.stages.judge_agreement import build_judge_agreement

    monkeypatch.setenv("TENTALIS_DATA_DIR", str(data_root))
    _train(home, tiny_model_dir, data_root)
    pb = [{"id": f"gsm8k-{i}", "problem": f"Item {i}: 2 boxes of {i + 3} pens?", "steps": [f"2 * {i + 3} = {2 * i + 6}.", "So the answer.",
                                                                                          "The answer is 6."], "label": lab}
          for i, lab in enumerate([-1, 0, 1, 2, -1])]
    (data_root / "processbench" / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pb))
    lake = Lakehouse(Paths.from_env(home).lakehouse)
    lake.append("tasks", [{"batch_id": "b1", "task_id": f"t{i}", "prompt": f"What is {i} + {i}?"} for i in range(4)])
    lake.append("rollouts", [{"batch_id": "b1", "rollout_id": f"r{i}", "task_id": f"t{i}", "steps": [f"{i} + {i} = {2 * i}.", f"The answer is {2 * i}."]}
                             for i in range(4)])
    lake.append("trajectories", [{"batch_id": "b1", "rollout_id": f"r{i}", "task_id": f"t{i}", "outcome_reward": float(i % 2)} for i in range(4)])

    out = CliRunner().invoke(app, ["prm", "eval", "--split", "gsm8k", "--model", str(tiny_model_dir)])
    assert out.exit_code == 0, out.output
    # By hand: the same head, its own rule, the same items and rollouts.
    scorer = PRMHeadScorer(home, tiny_model_dir)
    rule = scorer.checkpoint.rule
    preds = [rule.predict(s) for s in scorer.score([r["problem"] for r in pb], [r["steps"] for r in pb])]
    m = processbench_metrics([r["label"] for r in pb], preds)
    passes = [p == -1 for p in preds]
    people = [r["label"] == -1 for r in pb]
    rpreds = [rule.predict(s) for s in scorer.score([f"What is {i} + {i}?" for i in range(4)],
                                                     [[f"{i} + {i} = {2 * i}.", f"The answer is {2 * i}."] for i in range(4)])]
    rows = {(r["window_kind"], r["window_id"]): r for r in lake.read("judge_agreement").to_pylist()}
    assert set(rows) == {("processbench", "gsm8k"), ("verifier", "all")}
    p = rows[("processbench", "gsm8k")]
    assert p["judge"] == "prm_head:v0001" and p["n"] == 5
    assert (p["f1"], p["error_accuracy"], p["correct_accuracy"]) == pytest.approx((m.f1 or 0.0, m.error_accuracy, m.correct_accuracy)) \
        if m.f1 is not None else p["f1"] is None
    assert p["pass_agreement"] == pytest.approx(sum(a == b for a, b in zip(passes, people)) / 5)
    assert p["judge_mean"] == pytest.approx(sum(passes) / 5) and p["human_mean"] == pytest.approx(0.4)
    v = rows[("verifier", "all")]
    assert v["n"] == 4 and v["human_mean"] == pytest.approx(0.5)
    assert v["pass_agreement"] == pytest.approx(sum((q == -1) == bool(i % 2) for i, q in enumerate(rpreds)) / 4)
    # Evaluated again: the rows are replaced, not added; the judge_agreement stage carries them over.
    assert CliRunner().invoke(app, ["prm", "eval", "--split", "gsm8k", "--model", str(tiny_model_dir)]).exit_code == 0
    assert len(lake.read("judge_agreement").to_pylist()) == 2
    build_judge_agreement(lake)
    assert {(r["judge"], r["window_kind"]) for r in lake.read("judge_agreement").to_pylist()} == {
        ("prm_head:v0001", "processbench"), ("prm_head:v0001", "verifier")}
