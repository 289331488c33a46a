"""`tentalis prm eval` on the tiny model: the head's agreement with ProcessBench's human labels and with the
verifier lands in judge_agreement, by hand, replaced on a rerun and carried over by the stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.reviewers.prm_reviewer import PRMHeadScorer
from tentalis_pipelines.settings import Paths
from tests.prm_data import train_tiny_head, write_data_root


@pytest.fixture()
def data_root(tmp_path: Path) -> Path:
    return write_data_root(tmp_path)


_train = train_tiny_head


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
