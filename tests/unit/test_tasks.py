import functools
import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.tasks.arithmetic import generate_arithmetic
from tentalis_pipelines.tasks.batches import (
    BatchNotRegistered,
    load_batch,
    next_generator_seed,
    register_file_batch,
    register_generated_batch,
)
from tentalis_pipelines.tasks.jsonl import load_jsonl_tasks

NOW = datetime.now(timezone.utc)


def test_generator_is_seeded_and_answers_are_right():
    a, b = generate_arithmetic(20, seed=7, levels=(1, 2, 3, 4)), generate_arithmetic(20, seed=7, levels=(1, 2, 3, 4))
    assert a == b
    assert a != generate_arithmetic(20, seed=8, levels=(1, 2, 3, 4))
    for t in a:
        assert eval(t.expression) == t.answer  # the expression is the ground truth's derivation
    assert {t.level for t in a} == {1, 2, 3, 4}
    with pytest.raises(ValueError, match="levels"):
        generate_arithmetic(3, seed=1, levels=(9,))


def test_jsonl_loader_reads_gsm8k_math_and_generic_rows_and_quarantines_bad_lines(tmp_path):
    f = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\n#### 5"}),
        "{not json",
        json.dumps({"prompt": "What is 6*7?", "reference": "42", "id": "p1"}),
        json.dumps({"question": "no final answer", "answer": "just text"}),
        "",
        json.dumps({"problem": "Simplify 2/4", "answer": "\\frac{1}{2}", "level": 2}),
        json.dumps(["a", "list"]),
        json.dumps({"prompt": "dup", "reference": "1", "id": "p1"}),
    ]
    f.write_text("\n".join(lines) + "\n")
    out = load_jsonl_tasks(f, "b1", NOW)
    assert [t["reference"] for t in out.tasks] == ["5", "42", "\\frac{1}{2}"]
    assert [r["line"] for r in out.rejects] == [2, 4, 7, 8]
    errors = {r["line"]: r["error"] for r in out.rejects}
    assert "invalid JSON" in errors[2] and "####" in errors[4] and "JSON object" in errors[7] and "duplicate" in errors[8]
    assert all(r["source"] == str(f) and r["batch_id"] == "b1" for r in out.rejects)


def test_batches_are_snapshots(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "1+1?", "reference": "2"}) + "\n")
    bid = register_file_batch(tmp_path / "batches", src)
    src.write_text("changed\n")
    assert load_batch(tmp_path / "batches", bid, NOW).tasks[0]["reference"] == "2"
    with pytest.raises(BatchNotRegistered, match="not registered"):
        load_batch(tmp_path / "batches", "missing", NOW)


def test_generated_batches_and_next_seed(tmp_path):
    d = tmp_path / "batches"
    assert next_generator_seed(d) == 1
    bid = register_generated_batch(d, seed=1, num_tasks=4)
    assert register_generated_batch(d, seed=1, num_tasks=4) == bid  # idempotent
    assert next_generator_seed(d) == 2
    assert len(load_batch(d, bid, NOW).tasks) == 4


@pytest.mark.parametrize(
    "pred,ref,ok",
    [("42", "42", True), ("$1,200", "#### 1200", True), ("41", "42", False), ("0.5", "\\frac{1}{2}", True),
     ("The total is 18 apples", "18", True), (None, "3", False), ("\\left(3, \\pi\\right)", "(3,\\pi)", True),
     ("\\frac{\\pi}{2}", "\\pi/2", True), ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
     ("x^2+2x+1", "(x+1)^2", True), ("\\sqrt{2}", "\\sqrt{3}", False)],
)
def test_answers_match(pred, ref, ok):
    assert answers_match(pred, ref) is ok


def test_training_batches_refuse_the_held_out_seeds(tmp_path):
    """Seed 1,000,000 generates the held-out gate set: a training batch on it would train on the gate."""
    import pytest

    from tentalis_pipelines.tasks.batches import HELD_OUT_SEED_BASE, ReservedSeedError

    for seed in (HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + 7):
        with pytest.raises(ReservedSeedError, match=f"seed {seed} is reserved"):
            register_generated_batch(tmp_path, seed=seed, num_tasks=16)
    with pytest.raises(ValueError, match="non-negative"):
        register_generated_batch(tmp_path, seed=-1, num_tasks=16)
    assert list(tmp_path.iterdir()) == []  # nothing registered
    register_generated_batch(tmp_path, seed=HELD_OUT_SEED_BASE - 1, num_tasks=1)


def _gsm8k_train(data: Path, n: int) -> list[str]:
    """A GSM8K-shaped train split of ``n`` questions under ``data``; returns its lines."""
    (data / "gsm8k").mkdir(parents=True)
    lines = [json.dumps({"question": f"q{i}?", "answer": f"#### {i}"}) for i in range(n)]
    (data / "gsm8k" / "train.jsonl").write_text("\n".join(lines) + "\n")
    return lines


def test_dataset_batches_are_consecutive_slices_of_a_fixed_order(tmp_path):
    from tentalis_pipelines.tasks.batches import register_dataset_batch

    data = tmp_path / "data"
    lines = _gsm8k_train(data, 10)
    batches = tmp_path / "batches"
    ids = [register_dataset_batch(batches, data, "gsm8k", num_tasks=4) for _ in range(2)]
    assert ids == ["gsm8k-train-p0-n4-0000", "gsm8k-train-p0-n4-0001"]
    got = [(batches / b / "tasks.jsonl").read_text().splitlines() for b in ids]
    assert len(got[0]) == len(got[1]) == 4 and not set(got[0]) & set(got[1])  # no question twice
    assert set(got[0]) | set(got[1]) <= set(lines) and got[0] != lines[:4]  # shuffled, from the train file only
    again = tmp_path / "again"  # the same seed gives the same slices in the same order
    assert [(again / register_dataset_batch(again, data, "gsm8k", num_tasks=4) / "tasks.jsonl").read_text().splitlines()
            for _ in range(2)] == got
    with pytest.raises(ValueError, match="used them all"):
        register_dataset_batch(batches, data, "gsm8k", num_tasks=4)
    with pytest.raises(FileNotFoundError, match="TENTALIS_DATA_DIR"):
        register_dataset_batch(batches, tmp_path / "nowhere", "gsm8k", num_tasks=4)


def test_a_datasets_reserved_tail_is_the_skills_validation_set_and_never_a_batch(tmp_path):
    from tentalis_pipelines.tasks.batches import dataset_validation_lines, register_dataset_batch

    data = tmp_path / "data"
    lines = _gsm8k_train(data, 40)
    batches = tmp_path / "batches"
    # 40 questions: a quarter (10) reserved, so 30 can be trained on: three batches of 8, not a fourth.
    trained = [q for _ in range(3) for q in (batches / register_dataset_batch(batches, data, "gsm8k", num_tasks=8) / "tasks.jsonl").read_text().splitlines()]
    with pytest.raises(ValueError, match="10 of them the skills' validation set: 3 batches of 8 used them all"):
        register_dataset_batch(batches, data, "gsm8k", num_tasks=8)
    held = dataset_validation_lines(data, "gsm8k", 10)
    assert len(held) == len(set(held)) == 10 and set(held) <= set(lines) and not set(held) & set(trained)
    assert dataset_validation_lines(data, "gsm8k", 4) == held[:4]  # a smaller set is a prefix: the same items stay
    with pytest.raises(ValueError, match="reserves 10 training questions for validation .* ask for 1 to 10, not 11"):
        dataset_validation_lines(data, "gsm8k", 11)


@pytest.mark.skipif(not os.environ.get("TENTALIS_DATA_DIR") or not Path(os.environ["TENTALIS_DATA_DIR"], "gsm8k").exists(),
                    reason="needs TENTALIS_DATA_DIR with gsm8k/train.jsonl (make test sets it)")
def test_the_reserve_leaves_gsm8k_training_slices_where_they_were(tmp_path):
    """Runs recorded before the reserve existed continue on the same questions: the first GSM8K batch is
    still the question about Marion's and Ella's statistics exam (what every earlier run trained on first)."""
    from tentalis_pipelines.settings import data_dir
    from tentalis_pipelines.tasks.batches import (
        DATASET_VALIDATION_ROWS,
        dataset_validation_lines,
        register_dataset_batch,
    )

    first = register_dataset_batch(tmp_path, data_dir(), "gsm8k", num_tasks=8)
    rows = [json.loads(x) for x in (tmp_path / first / "tasks.jsonl").read_text().splitlines()]
    assert rows[0]["question"].startswith("The result from the 40-item Statistics exam Marion and Ella took")
    held = [json.loads(x)["question"] for x in dataset_validation_lines(data_dir(), "gsm8k", DATASET_VALIDATION_ROWS)]
    assert len(set(held)) == 256 and not {r["question"] for r in rows} & set(held)


def test_the_batch_an_interrupted_cycle_left_is_the_next_cycles_batch(tmp_path):
    """A cycle killed between registering its batch and writing its trajectories leaves that batch; the
    next cycle of the same shape resumes it, and only it (the newest of its sequence, not yet settled)."""
    from tentalis_pipelines.tasks.batches import (
        interrupted_cycle_batch,
        register_dataset_batch,
        register_generated_batch,
        register_nightly_batch,
    )

    data = tmp_path / "data"
    _gsm8k_train(data, 40)
    batches = tmp_path / "batches"
    b0, b1, b2 = (register_dataset_batch(batches, data, "gsm8k", num_tasks=4) for _ in range(3))
    find = functools.partial(interrupted_cycle_batch, batches, task_source="gsm8k", num_tasks=4, levels=(1,))
    assert find(settled={b0, b1}) == b2  # b2 was registered and never reached its trajectories
    assert find(settled={b0, b1, b2}) is None  # every batch settled: register the next one
    assert find(settled={b0, b2}) is None  # b1 is an old gap, not the cycle in progress
    assert interrupted_cycle_batch(batches, task_source="gsm8k", num_tasks=8, levels=(1,), settled=set()) is None  # other shape

    arith = tmp_path / "arith"
    s1, s2 = (register_generated_batch(arith, seed=s, num_tasks=8, levels=(1,)) for s in (1, 2))
    find = functools.partial(interrupted_cycle_batch, arith, task_source="arithmetic", num_tasks=8, levels=(1,))
    assert (s2, find(settled={s1})) == ("arith-s2-n8-l1", "arith-s2-n8-l1")
    assert find(settled={s1, s2}) is None
    assert interrupted_cycle_batch(arith, task_source="arithmetic", num_tasks=8, levels=(1, 2), settled={s1}) is None
    register_nightly_batch(arith, day="20261123", num_tasks=8, levels=(1,))  # seed 3: the schedule's, not a cycle's
    assert find(settled={s1}) is None
