"""PRM labels and decisions, checked against hand computations: the consensus filter, the corruption
generator's first wrong step, first-error prediction from scores, and ProcessBench's F1 on it."""

from __future__ import annotations

import random
import re

import pytest

from tentalis_pipelines.evaluation.processbench import processbench_metrics
from tentalis_pipelines.reviewers.prm_head import (
    choose_threshold,
    first_error,
    first_error_with_flags,
    plain_arithmetic,
)
from tentalis_pipelines.reviewers.prm_labels import (
    CORRECT,
    SOME_STEP,
    Verdict,
    calculator_verdict,
    consensus,
    corrupt_solution,
    label_gsm8k_problem,
    label_rollout,
    mc_verdict,
    reference_steps,
    render_solution,
    step_labels_from,
    verifier_verdict,
)

QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
ANSWER = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
          "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


def v(source, first):
    return Verdict(source, first)


@pytest.mark.parametrize(("verdicts", "expected"), [
    # provenance says step 1, the calculator flags step 1, the verifier says wrong somewhere: all agree -> 1
    ([v("provenance", 1), v("calculator", 1), v("verifier", SOME_STEP)], 1),
    # the calculator abstains: provenance and verifier are two sources that agree -> 1
    ([v("provenance", 1), v("calculator", None), v("verifier", SOME_STEP)], 1),
    # the corruption did not change the answer: the verifier says correct, provenance says step 1 -> dropped
    ([v("provenance", 1), v("calculator", None), v("verifier", CORRECT)], None),
    # the calculator flags an earlier step than provenance -> contradiction, dropped
    ([v("provenance", 2), v("calculator", 0), v("verifier", SOME_STEP)], None),
    # a "reference" whose final answer does not match: verifier wrong-somewhere against provenance -1 -> dropped
    ([v("provenance", CORRECT), v("calculator", None), v("verifier", SOME_STEP)], None),
    # a clean reference: provenance -1, calculator abstains, verifier -1 -> all correct
    ([v("provenance", CORRECT), v("calculator", None), v("verifier", CORRECT)], CORRECT),
    # a reference with a false equation at step 0: calculator 0 against provenance -1 -> dropped
    ([v("provenance", CORRECT), v("calculator", 0), v("verifier", CORRECT)], None),
    # only one source speaks -> dropped
    ([v("provenance", 1), v("calculator", None), v("mc", None)], None),
    # a rollout: wrong answer, calculator flags step 2 -> 2
    ([v("calculator", 2), v("verifier", SOME_STEP), v("mc", None)], 2),
    # a rollout: wrong answer, nobody locates the error -> dropped
    ([v("calculator", None), v("verifier", SOME_STEP), v("mc", None)], None),
    # MC says the first hopeless prefix is step 1, the calculator agrees -> 1; it says step 3 -> dropped
    ([v("calculator", 1), v("verifier", SOME_STEP), v("mc", 1)], 1),
    ([v("calculator", 1), v("verifier", SOME_STEP), v("mc", 3)], None),
])
def test_consensus_by_hand(verdicts, expected):
    assert consensus(verdicts, num_steps=4) == expected


def test_consensus_refuses_a_verdict_outside_the_solution():
    with pytest.raises(ValueError, match="outside the solution's 3 steps"):
        consensus([v("provenance", 3), v("verifier", SOME_STEP)], num_steps=3)


def test_step_labels_from_first_error():
    assert step_labels_from(CORRECT, 3) == (1, 1, 1)
    assert step_labels_from(0, 3) == (0, 0, 0)
    assert step_labels_from(1, 4) == (1, 0, 0, 0)
    with pytest.raises(ValueError):
        step_labels_from(4, 4)


def test_source_verdicts():
    assert calculator_verdict("12 apples", ["12 * 2 = 24", "24 + 1 = 26"]) == v("calculator", 1)
    assert calculator_verdict("12 apples", ["12 * 2 = 24"]) == v("calculator", None)
    assert verifier_verdict("72", "72") == v("verifier", CORRECT)
    assert verifier_verdict("70", "72") == v("verifier", SOME_STEP)
    assert mc_verdict([0.75, 0.25, 0.0]) == v("mc", 2)
    assert mc_verdict([0.5, 1.0]) == v("mc", CORRECT)
    assert mc_verdict([0.5, None]) == v("mc", None)
    assert mc_verdict(None) == v("mc", None)


def test_reference_steps_render_without_annotations():
    lines, final = reference_steps(ANSWER)
    assert final == "72"
    assert render_solution(lines, final) == [
        "Natalia sold 48/2 = 24 clips in May.",
        "Natalia sold 48+24 = 72 clips altogether in April and May. The answer is \\boxed{72}."]
    with pytest.raises(ValueError, match="no '#### answer'"):
        reference_steps("no final line")


class _Fixed(random.Random):
    """A Random whose choices are scripted (first element), and whose draws are fixed."""

    def __init__(self, picks):
        super().__init__(0)
        self.picks = list(picks)

    def choice(self, seq):
        want = self.picks.pop(0)
        return seq[want] if isinstance(want, int) and not isinstance(seq[0], int) else want

    def random(self):
        return 0.99


def test_result_corruption_is_carried_to_the_answer():
    lines, final = reference_steps(ANSWER)
    # the first annotation (48/2), result 24 -> 24 + 2 = 26; carried: 48 + 26 = 74
    c = corrupt_solution(lines, final, _Fixed([0, 2]), kind="result")
    assert c.first_wrong == 0 and c.kind == "result" and c.final == "74"
    assert render_solution(c.lines, c.final) == [
        "Natalia sold 48/2 = 26 clips in May.",
        "Natalia sold 48+26 = 74 clips altogether in April and May. The answer is \\boxed{74}."]


def test_operator_corruption_keeps_the_arithmetic_true():
    lines, final = reference_steps(ANSWER)
    # the second annotation (48+24) with + -> -: 48 - 24 = 24, the first wrong step is step 1
    c = corrupt_solution(lines, final, _Fixed([1, 2]), kind="operator")
    assert c.first_wrong == 1 and c.final == "24"
    steps = render_solution(c.lines, c.final)
    assert steps[1].startswith("Natalia sold 48-24 = 24 clips")
    assert calculator_verdict(QUESTION, steps).first_error is None  # nothing false to find: a reasoning error


def test_operand_corruption_changes_the_written_operand_too():
    lines, final = reference_steps(ANSWER)
    # 48/2 with the operand 2 -> 2 + 2 = 4: 48/4 = 12, then 48 + 12 = 60
    c = corrupt_solution(lines, final, _Fixed([0, 1, 2]), kind="operand")
    assert c.first_wrong == 0 and c.final == "60"
    assert render_solution(c.lines, c.final)[0] == "Natalia sold 48/4 = 12 clips in May."


def test_a_corruption_that_misses_the_answer_is_not_made():
    lines = ["He buys 3*2 = <<3*2=6>>6 pens.", "He has 10 pencils."]
    assert corrupt_solution(lines, "10", _Fixed([0, 1]), kind="result") is None
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt_solution(lines, "10", random.Random(0), kind="typo")


def test_label_gsm8k_problem_keeps_the_reference_and_labels_corruptions():
    out = label_gsm8k_problem("p1", QUESTION, ANSWER, random.Random(3), corruptions=3, tries=30)
    ref = out[0]
    assert ref.kind == "reference" and ref.first_error == CORRECT and ref.labels == (1, 1)
    assert len(out) > 1
    for s in out[1:]:
        assert s.kind.startswith("corrupted:")
        assert s.labels == step_labels_from(s.first_error, len(s.steps))
        assert "\\boxed{72}" not in s.steps[-1]  # the corruption reached the answer


def test_label_rollout_needs_two_agreeing_sources():
    # right answer, every checked equation true: the calculator vouches for a rollout, the verifier agrees
    right = label_rollout("r", "48 clips", ["48 / 2 = 24", "48 + 24 = 72"], "72", "72")
    assert right.first_error == CORRECT and right.labels == (1, 1)
    assert label_rollout("r", "48 clips", ["Half of them.", "48 + 24 = 72"], "72", "72").labels == (1, 1)
    # right answer, no equation checked: the calculator abstains -> only the verifier: dropped
    assert label_rollout("r", "48 clips", ["Half of them, then all of them."], "72", "72") is None
    # wrong answer with true arithmetic: the calculator's "correct" contradicts the verifier: dropped
    assert label_rollout("r", "48 clips", ["48 / 2 = 24", "48 - 24 = 24"], "24", "72") is None
    # on GSM8K labels the calculator never vouches (an operand corruption keeps the arithmetic true)
    assert calculator_verdict("48 clips", ["48 / 2 = 24"]).first_error is None
    # with MC labels all positive, MC and verifier agree -> all correct
    ok = label_rollout("r", "48 clips", ["48 / 2 = 24", "48 + 24 = 72"], "72", "72", mc_labels=[1.0, 1.0])
    assert ok.first_error == CORRECT and ok.labels == (1, 1)
    # wrong answer, the calculator flags step 1 -> step 0 right, step 1 wrong
    bad = label_rollout("r", "48 clips", ["48 / 2 = 24", "48 + 24 = 70"], "70", "72")
    assert bad.first_error == 1 and bad.labels == (1, 0)


def test_first_error_from_scores_by_hand():
    assert first_error([0.9, 0.4, 0.2], 0.5) == 1
    assert first_error([0.9, 0.6, 0.7], 0.5) == -1
    assert first_error([None, 0.3], 0.5) == 1
    assert first_error([0.5, 0.3], 0.5) == 1  # strictly below
    assert first_error_with_flags([0.9, 0.8, 0.1], 0.5, [False, True, False]) == 1
    assert first_error_with_flags([0.9, 0.8], 0.5, [False, False]) == -1


def test_f1_of_first_errors_from_scores_via_the_metric():
    scores = [[0.9, 0.2], [0.8, 0.9], [0.3, 0.9], [0.9, 0.9, 0.1]]
    labels = [1, -1, 1, -1]
    preds = [first_error(s, 0.5) for s in scores]
    assert preds == [1, -1, 0, 2]
    m = processbench_metrics(labels, preds)
    # erroneous: 1 of 2 right; correct: 1 of 2 right; F1 = 2 * .5 * .5 / 1 = 0.5
    assert (m.error_accuracy, m.correct_accuracy, m.f1) == (0.5, 0.5, 0.5)


def test_choose_threshold_maximises_f1_on_held_out_labels():
    scores = [[0.9, 0.2], [0.8, 0.9], [0.3, 0.9]]
    labels = [1, -1, 0]
    t, f1 = choose_threshold(scores, labels)
    # any threshold in (0.3, 0.8] predicts 1, -1, 0: all right
    assert 0.3 < t <= 0.8 and f1 == 1.0


def test_plain_arithmetic_for_the_calculator():
    assert plain_arithmetic("\\(3 \\times 4 = 12\\)") == " 3 × 4 = 12 "
    assert plain_arithmetic("\\frac{12}{4} = 3") == "(12)/(4) = 3"


# --------------------------------------------------------------------------- contracts the mutation run asked for
def _rows_file(tmp_path, lines):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_gsm8k_train_names_rows_by_file_line_and_samples_in_file_order(tmp_path):
    import json

    rows = [json.dumps({"question": f"Q{i} café ÷", "answer": f"A{i}\n#### {i}"}) for i in range(6)]
    path = _rows_file(tmp_path, rows[:2] + [""] + rows[2:])  # a blank line: skipped, numbering continues
    from tentalis_pipelines.reviewers.prm_labels import Problem, load_gsm8k_train

    got = load_gsm8k_train(path)
    assert [p.problem_id for p in got] == ["gsm8k-train-00001", "gsm8k-train-00002"] + [f"gsm8k-train-{n:05d}" for n in range(4, 8)]
    assert got[0] == Problem("gsm8k-train-00001", "Q0 café ÷", "A0\n#### 0")
    assert load_gsm8k_train(str(path), limit=6) == got  # a limit of all rows keeps all, in order
    some = load_gsm8k_train(path, limit=3, seed=1)
    assert len(some) == 3 and [got.index(p) for p in some] == sorted(got.index(p) for p in some)
    assert load_gsm8k_train(path, limit=3, seed=1) == some  # seeded
    assert {tuple(p.problem_id for p in load_gsm8k_train(path, limit=3, seed=s)) for s in range(6)} != {
        tuple(p.problem_id for p in some)}  # and the seed matters
    assert load_gsm8k_train(path, limit=0) == []


def test_load_gsm8k_train_refuses_a_bad_line_or_file_by_name(tmp_path):
    from tentalis_pipelines.reviewers.prm_labels import load_gsm8k_train

    for bad in ['{"question": "Q"}', "not json", '["question", "answer"]']:
        path = _rows_file(tmp_path, ['{"question": "Q", "answer": "A"}', "", bad])
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: not a GSM8K row with 'question' and 'answer' \("):
            load_gsm8k_train(path)
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=rf"^GSM8K train file {re.escape(str(missing))} not found: set "
                                                r"TENTALIS_DATA_DIR to the folder holding gsm8k/train.jsonl "
                                                r"\(tentalis data fetch --only gsm8k\)$"):
        load_gsm8k_train(missing)


def test_a_labelled_solution_as_a_row():
    from tentalis_pipelines.reviewers.prm_labels import label_solution

    s = label_solution("p9", "Q?", ["a", "b"], [v("provenance", 1), v("calculator", None), v("verifier", SOME_STEP)],
                       "corrupted:result")
    assert (s.problem_id, s.problem, s.steps) == ("p9", "Q?", ("a", "b"))
    assert s.as_row() == {"problem_id": "p9", "kind": "corrupted:result", "first_error": 1, "steps": ["a", "b"],
                          "labels": [1, 0], "verdicts": {"provenance": 1, "calculator": None, "verifier": SOME_STEP}}
    r = label_rollout("r7", "48 clips", ["48 / 2 = 24", "48 + 24 = 72"], "72", "72", mc_labels=[1.0, 1.0])
    assert (r.problem_id, r.problem, r.kind) == ("r7", "48 clips", "rollout")
    assert r.as_row()["verdicts"] == {"calculator": CORRECT, "verifier": CORRECT, "mc": CORRECT}
    # MC labels count: with the calculator abstaining, MC's step 0 and the verifier agree
    mc = label_rollout("r8", "48 clips", ["Half of them.", "Then all."], "70", "72", mc_labels=[0.0, 0.0])
    assert mc.first_error == 0 and mc.labels == (0, 0)


def test_reference_steps_edges():
    lines, final = reference_steps("Step one 1+1=<<1+1=2>>2\n\n  Step two  \n#### 1,234")
    assert (lines, final) == (["Step one 1+1=<<1+1=2>>2", "Step two"], "1234")
    # the last #### line is the answer: an earlier #### belongs to the steps
    assert reference_steps("Use #### as a marker\n#### 5") == (["Use #### as a marker"], "5")
    with pytest.raises(ValueError, match=r"^not a GSM8K reference solution: no '#### answer' line$"):
        reference_steps("just text")
    with pytest.raises(ValueError, match=r"^GSM8K reference solution without steps$"):
        reference_steps("  \n#### 4")
    assert render_solution(["a <<1+1=2>>2", "b"], "2") == ["a 2", "b The answer is \\boxed{2}."]
    with pytest.raises(ValueError, match=r"^first error 4 is outside the solution's 4 steps$"):
        step_labels_from(4, 4)


def test_consensus_needs_every_pair_to_agree_and_a_located_error():
    # the second and third verdicts contradict (1 vs 2) though each agrees with the first ("some step")
    assert consensus([v("verifier", SOME_STEP), v("calculator", 1), v("mc", 2)], num_steps=4) is None
    assert consensus([v("verifier", SOME_STEP), v("mc", SOME_STEP)], num_steps=4) is None


def test_the_calculator_vouches_by_its_own_name():
    assert calculator_verdict("48 clips", ["48 / 2 = 24"], vouch=True) == v("calculator", CORRECT)


def test_build_label_set_is_seeded_and_skips_rows_that_are_no_reference():
    from tentalis_pipelines.reviewers.prm_labels import Problem, build_label_set

    probs = [Problem("bad", "Q", "no answer line"), Problem("p1", QUESTION, ANSWER), Problem("p2", QUESTION, ANSWER)]
    out = build_label_set(probs, seed=3, corruptions=1)
    assert [s.problem_id for s in out if s.kind == "reference"] == ["p1", "p2"]
    assert all(s.problem == QUESTION for s in out)
    assert sum(1 for s in out if s.problem_id == "p1") <= 2  # the reference and at most one corruption
    assert [s.as_row() for s in build_label_set(probs, seed=3, corruptions=1)] == [s.as_row() for s in out]
    more = build_label_set(probs, seed=3, corruptions=3)
    assert len(more) > len(out)
    expected = []
    rng = random.Random(3)
    for p in probs[1:]:
        expected += label_gsm8k_problem(p.problem_id, p.question, p.answer, rng, corruptions=1)
    assert [s.as_row() for s in out] == [s.as_row() for s in expected]
