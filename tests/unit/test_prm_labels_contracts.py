"""PRM labels: the contracts the first mutmut run of ``prm_labels`` left unchecked, by hand.

Each test states what a docstring (or a caller) promises and checks it on inputs chosen to hit it
exactly: the corruption generator's draws (a scripted ``Random``), the carry of a changed value through
annotations that are left alone, recomputed, unreadable or adjacent, the way a value is written, the
visible edit of ``x``/``×``/``÷``, and the contamination screen's hand-off to the ``quarantine`` table.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest

import tentalis_pipelines.reviewers.prm_labels as pl
from tentalis_pipelines.contamination import Match
from tentalis_pipelines.reviewers.prm_labels import (
    CORRECT,
    SOME_STEP,
    Corruption,
    LabelledSolution,
    Problem,
    Verdict,
    build_label_set,
    consensus,
    corrupt_solution,
    label_gsm8k_problem,
    latex_equation,
    load_gsm8k_train,
    processbench_items,
    processbench_style,
    reference_steps,
    render_solution,
    screen_problems,
)

F = Fraction
QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
ANSWER = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
          "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")


class Script(random.Random):
    """A Random whose draws are scripted: ``choice`` returns ``seq[i]`` for the next scripted index ``i``
    (and records ``seq``), ``random`` the next scripted float; an unscripted draw is an error."""

    def __init__(self, picks=(), draws=()):
        super().__init__(0)
        self.picks, self.draws, self.seen = list(picks), list(draws), []

    def choice(self, seq):
        self.seen.append(tuple(seq))
        return seq[self.picks.pop(0)]

    def random(self):
        return self.draws.pop(0)


# ------------------------------------------------------------------------------------------ writing a value
def test_a_value_is_written_as_a_solution_writes_it():
    assert pl.format_value(F(24)) == "24"
    assert pl.format_value(F(240)) == "240"  # trailing zeros of a whole number stay
    assert pl.format_value(F(5, 2)) == "2.5"
    assert pl.format_value(F(1, 4)) == "0.25"
    assert pl.format_value(F(1, 20)) == "0.05"
    assert pl.format_value(F(31, 10)) == "3.1"
    assert pl.format_value(F(1234567, 100)) == "12345.67"
    assert pl.format_value(F(-5, 2)) == "-2.5"
    assert pl.format_value(F(0)) == "0"
    # no plain writing: more than two decimal places, or no finite decimal at all
    assert pl.format_value(F(1, 8)) is None
    assert pl.format_value(F(1, 3)) is None
    assert pl.format_value(F(1, 101)) is None


def test_a_large_value_is_written_digit_for_digit():
    # a float keeps about 16 significant digits: the written value must still be the value
    assert pl.format_value(F(10**17) + F(1, 2)) == "100000000000000000.5"
    assert pl.format_value(F(123456789012345678)) == "123456789012345678"
    assert pl.format_value(F(10**15 + 1, 100)) == "10000000000000.01"


def test_a_written_number_is_read_without_separators_or_dollars():
    assert pl.parse_value("1,234") == 1234
    assert pl.parse_value("$5") == 5
    assert pl.parse_value(" $1,000.50 ") == F(2001, 2)
    assert pl.parse_value("1/4") == F(1, 4)
    assert pl.parse_value("five") is None
    assert pl.parse_value("1/0") is None


def test_substitute_rewrites_only_the_changed_whole_numbers():
    subst = {F(4): F(5), F(24): F(26)}
    assert pl.substitute_values("4 boxes of 24, 14 left, 4.5 kg, 240 g", subst) == "5 boxes of 26, 14 left, 4.5 kg, 240 g"
    assert pl.substitute_values("1,000 and 4", {F(1000): F(1001)}) == "1001 and 4"
    assert pl.substitute_values("no numbers", subst) == "no numbers"
    # a new value with no plain writing: None, not the old text and not a half-rewritten one
    assert pl.substitute_values("Each gets 4 apples", {F(4): F(1, 3)}) is None
    assert pl.substitute_values("7 and 4", {F(7): F(8), F(4): F(1, 3)}) is None


# ------------------------------------------------------------------------------------------ the slips
def test_a_small_whole_value_slips_by_a_listed_step_that_keeps_it_positive():
    rng = Script(picks=[0])
    assert pl.perturb_value(F(5), rng) == 2  # 5 - 3
    assert rng.seen == [(-3, -2, -1, 1, 2, 3, 4, 5, 10)]
    rng = Script(picks=[8])
    assert pl.perturb_value(F(5), rng) == 15
    rng = Script(picks=[0])
    assert pl.perturb_value(F(3), rng) == 1  # 3 - 3 = 0 is not positive: the smallest step is -2
    assert rng.seen == [(-2, -1, 1, 2, 3, 4, 5, 10)]
    rng = Script(picks=[0])
    assert pl.perturb_value(F(2), rng) == 1
    assert rng.seen == [(-1, 1, 2, 3, 4, 5, 10)]
    rng = Script(picks=[0])
    assert pl.perturb_value(F(1, 2), rng) == F(3, 2)
    assert rng.seen == [(1, 2, 3, 4, 5, 10)]
    rng = Script(picks=[0])
    assert pl.perturb_value(F(0), rng) == 1
    assert rng.seen == [(1, 2, 3, 4, 5, 10)]


def test_a_value_no_step_keeps_positive_slips_by_one():
    rng = Script(picks=[0])
    assert pl.perturb_value(F(-10), rng) == -9
    assert rng.seen == [(1,)]
    assert pl.perturb_value(F(-20), Script(picks=[0])) == -19


def test_a_whole_value_of_ten_or_more_slips_by_a_magnitude_three_times_in_ten():
    assert pl.perturb_value(F(20), Script(draws=[0.1, 0.1])) == 200
    assert pl.perturb_value(F(10), Script(draws=[0.29, 0.49])) == 100  # 10 itself is "at least 10"
    rng = Script(picks=[0], draws=[0.1, 0.7])
    assert pl.perturb_value(F(20), rng) == 10
    assert rng.seen == [(-1, 1)]
    assert pl.perturb_value(F(20), Script(picks=[1], draws=[0.1, 0.5])) == 30  # 0.5 is not below 0.5: ten more
    # a draw of 0.3 is not below 0.3: an ordinary slip
    rng = Script(picks=[0], draws=[0.3])
    assert pl.perturb_value(F(20), rng) == 17
    assert rng.seen == [(-3, -2, -1, 1, 2, 3, 4, 5, 10)]
    # not whole, or under 10: never a magnitude slip, and no draw is spent on one
    assert pl.perturb_value(F(41, 2), Script(picks=[3])) == F(43, 2)
    assert pl.perturb_value(F(9), Script(picks=[3])) == 10


# ------------------------------------------------------------------------------------------ the changed expression
def test_an_operand_change_reads_numbers_without_separators():
    rng = Script(picks=[0, 3], draws=[0.9])  # the first number, 1000; no magnitude slip; the step +1
    assert pl.corrupt_expression("1,000*2", "operand", rng) == ("1001*2", 2002, ("1000", "1001"))


@pytest.mark.parametrize(("expr", "expected"), [
    ("1,000*2", ("1000/2", 500, ("*", "/"))),
    ("48 + 24", ("48-24", 24, ("+", "-"))),
    ("3*4", ("3/4", F(3, 4), ("*", "/"))),  # an operator right after a one-digit operand
    ("-3+10", ("-3-10", -13, ("+", "-"))),  # a leading sign is no operator
])
def test_an_operator_change_flips_one_operator(expr, expected):
    assert pl.corrupt_expression(expr, "operator", Script(picks=[0])) == expected


# ------------------------------------------------------------------------------------------ the visible edit
@pytest.mark.parametrize(("segment", "change", "expected"), [
    ("He packs 3 x 4 extra = ", ("*", "/"), "He packs 3 / 4 extra = "),  # the operator x, not the letter
    ("2 x 3 x 4 = ", ("*", "/"), "2 x 3 / 4 = "),  # the last one
    ("3 × 4 = ", ("*", "/"), "3 / 4 = "),
    ("3*4 = ", ("*", "/"), "3/4 = "),
    ("*4 = ", ("*", "/"), "/4 = "),  # at the very start of the segment
    ("12 ÷ 4 = ", ("/", "*"), "12 * 4 = "),
    ("12/4 = ", ("/", "*"), "12*4 = "),
    ("9 - 4 - 2 = ", ("-", "+"), "9 - 4 + 2 = "),
    ("3+4+5 = ", ("+", "-"), "3+4-5 = "),
    ("no operator here ", ("+", "-"), "no operator here "),
])
def test_the_visible_operator_is_changed_at_its_last_occurrence(segment, change, expected):
    assert pl.edit_visible_operator(segment, "operator", change) == expected


def test_the_visible_operand_is_changed_at_its_last_occurrence():
    assert pl.edit_visible_operator("48 / 2 and 2 = ", "operand", ("2", "4")) == "48 / 2 and 4 = "
    assert pl.edit_visible_operator("1,000 / 2 = ", "operand", ("1000", "1001")) == "1001 / 2 = "
    assert pl.edit_visible_operator("48 / 3 = ", "operand", ("2", "4")) == "48 / 3 = "


# ------------------------------------------------------------------------------------------ the carry
def test_the_carry_recomputes_changed_calculations_and_keeps_the_others():
    subst = {F(24): F(26)}
    line = "First 2*3 = <<2*3=6>>6, then 48+24 = <<48+24=72>>72 clips."
    assert pl.carry_substitution(line, subst) == "First 2*3 = <<2*3=6>>6, then 48+26 = <<48+26=74>>74 clips."
    assert subst == {F(24): F(26), F(72): F(74)}
    # an unchanged result keeps its own writing
    assert pl.carry_substitution("Half: <<3/2=1.50>>1.50 kg", {F(9): F(8)}) == "Half: <<3/2=1.50>>1.50 kg"
    assert pl.carry_substitution("Sum <<1000+1000=2,000>>2,000 m", {}) == "Sum <<1000+1000=2,000>>2,000 m"
    # a spaced annotation is recomputed all the same (its spaces kept as written)
    subst = {F(3): F(4)}
    assert pl.carry_substitution("Area << 3 * 2=6>>6 m2", subst) == "Area << 4 * 2=8>>8 m2"
    assert subst[F(6)] == 8


def test_the_carry_leaves_an_unreadable_result_alone():
    subst: dict[Fraction, Fraction] = {}
    assert pl.carry_substitution("He eats <<1/3=a third>> of it", subst) == "He eats <<1/3=a third>> of it"
    assert pl.carry_substitution("Six: <<2*3=six>>", subst) == "Six: <<2*3=six>>"
    assert pl.carry_substitution("Then <<2-5=?>> apples", subst) == "Then <<2-5=?>> apples"
    assert subst == {}


def test_the_carry_allows_zero_and_fractions_but_not_negatives_or_unwritable_values():
    subst = {F(4): F(5)}
    assert pl.carry_substitution("Left: 5-4 = <<5-4=1>>1 apple.", subst) == "Left: 5-5 = <<5-5=0>>0 apple."
    assert subst[F(1)] == 0
    subst = {F(4): F(9, 2)}
    assert pl.carry_substitution("Left: 5-4 = <<5-4=1>>1 kg.", subst) == "Left: 5-4.5 = <<5-4.5=0.5>>0.5 kg."
    assert pl.carry_substitution("Left: <<5-4=1>> kg.", {F(4): F(6)}) is None  # 5 - 6 < 0
    # a recomputed result with no plain writing, even when nothing after it mentions it
    assert pl.carry_substitution("Share <<4/3=1>> each", {}) is None
    # the text before a calculation mentions a value that cannot be written: None, however the
    # calculation itself fares
    assert pl.carry_substitution("He has 5 pens <<2*3=6>>6", {F(5): F(1, 3)}) is None
    assert pl.carry_substitution("He has pens <<5*3=15>>15", {F(5): F(1, 3)}) is None
    assert pl.carry_substitution("<<2*3=6>>6 and 5 pens", {F(5): F(1, 3)}) is None


# ------------------------------------------------------------------------------------------ corruptions
def test_a_result_corruption_rewrites_the_annotation_and_carries_it():
    lines, final = reference_steps(ANSWER)
    # the first calculation; 24 slips by +2 (no magnitude slip: 0.9)
    c = corrupt_solution(lines, final, Script(picks=[0, 4], draws=[0.9]), kind="result")
    assert c == Corruption(("Natalia sold 48/2 = <<48/2=26>>26 clips in May.",
                            "Natalia sold 48+26 = <<48+26=74>>74 clips altogether in April and May."), "74", 0, "result")


def test_a_corruption_keeps_the_punctuation_after_a_changed_number():
    # a comma after a number is punctuation, not a thousands separator: "24, so" must become "26, so", or
    # every corrupted solution carries a tell (a lost comma) that its reference does not
    lines, final = reference_steps("She sold 48/2 = <<48/2=24>>24, so 48+24 = <<48+24=72>>72, in all.\n#### 72")
    c = corrupt_solution(lines, final, Script(picks=[0, 4], draws=[0.9]), kind="result")
    assert render_solution(c.lines, c.final) == ["She sold 48/2 = 26, so 48+26 = 74, in all. The answer is \\boxed{74}."]
    assert pl.edit_visible_operator("48 / 2, 2 = ", "operand", ("2", "4")) == "48 / 2, 4 = "
    assert pl.edit_visible_operator("1,000 / 2, = ", "operand", ("1000", "1001")) == "1001 / 2, = "


def test_an_operand_corruption_of_a_line_that_starts_with_it():
    c = corrupt_solution(["3*4 = <<3*4=12>>12 eggs."], "12", Script(picks=[0, 0, 2]), kind="operand")
    assert c == Corruption(("4*4 = <<4*4=16>>16 eggs.",), "16", 0, "operand")


def test_an_operator_corruption_beside_an_adjacent_annotation_leaves_that_one_alone():
    c = corrupt_solution(["Total <<2*3=6>><<6*4=24>>24 dollars."], "24", Script(picks=[1, 0]), kind="operator")
    assert c == Corruption(("Total <<2*3=6>><<6/4=1.5>>1.5 dollars.",), "1.5", 0, "operator")


def test_a_corruption_to_zero_is_kept_and_one_that_changes_nothing_is_not():
    c = corrupt_solution(["He had 3+3 = <<3+3=6>>6 apples."], "6", Script(picks=[0, 0]), kind="operator")
    assert c == Corruption(("He had 3-3 = <<3-3=0>>0 apples.",), "0", 0, "operator")
    # 5*1 -> 5/1 is still 5: no wrong step, no corruption
    assert corrupt_solution(["He has 5*1 = <<5*1=5>>5 toys."], "5", Script(picks=[0, 0]), kind="operator") is None
    # 4*3 -> 4/3 has no plain writing
    assert corrupt_solution(["He has 4*3 = <<4*3=12>>12 toys."], "12", Script(picks=[0, 0]), kind="operator") is None


def test_an_unknown_corruption_names_the_choices():
    with pytest.raises(ValueError, match=r"^unknown corruption 'typo': choose one of result, operand, operator$"):
        corrupt_solution(["a <<1+1=2>>2"], "2", random.Random(0), kind="typo")


# ------------------------------------------------------------------------------------------ one problem's labels
def _corruptions():
    lines, final = reference_steps(ANSWER)
    same = Corruption(tuple(lines), final, 0, "result")  # renders as the reference itself
    result = corrupt_solution(lines, final, Script(picks=[0, 4], draws=[0.9]), kind="result")
    operator = corrupt_solution(lines, final, Script(picks=[1, 0]), kind="operator")
    extra = corrupt_solution(lines, final, Script(picks=[1, 0, 0], draws=[0.9]), kind="operand")
    return same, result, operator, extra


def _scripted(monkeypatch, made):
    calls = []

    def fake(lines, final, rng, kind=None):
        calls.append((tuple(lines), final))
        return made.pop(0) if made else None

    monkeypatch.setattr(pl, "corrupt_solution", fake)
    return calls


def test_label_gsm8k_problem_skips_repeats_and_the_reference_itself(monkeypatch):
    same, result, operator, extra = _corruptions()
    calls = _scripted(monkeypatch, [same, result, result, None, operator, extra])
    out = label_gsm8k_problem("p1", QUESTION, ANSWER, random.Random(0))
    # the default of two corruptions: the reference's copy, a repeat and a failed draw are skipped; the
    # fifth draw makes the second corruption and the sixth is never drawn
    assert len(calls) == 5
    lines, final = reference_steps(ANSWER)
    assert calls[0] == (tuple(lines), "72")
    assert [s.as_row() for s in out] == [
        {"problem_id": "p1", "kind": "reference", "first_error": CORRECT,
         "steps": ["Natalia sold 48/2 = 24 clips in May.",
                   "Natalia sold 48+24 = 72 clips altogether in April and May. The answer is \\boxed{72}."],
         "labels": [1, 1], "verdicts": {"provenance": CORRECT, "calculator": None, "verifier": CORRECT}},
        {"problem_id": "p1", "kind": "corrupted:result", "first_error": 0,
         "steps": ["Natalia sold 48/2 = 26 clips in May.",
                   "Natalia sold 48+26 = 74 clips altogether in April and May. The answer is \\boxed{74}."],
         "labels": [0, 0], "verdicts": {"provenance": 0, "calculator": 0, "verifier": SOME_STEP}},
        {"problem_id": "p1", "kind": "corrupted:operator", "first_error": 1,
         "steps": ["Natalia sold 48/2 = 24 clips in May.",
                   "Natalia sold 48-24 = 24 clips altogether in April and May. The answer is \\boxed{24}."],
         "labels": [1, 0], "verdicts": {"provenance": 1, "calculator": None, "verifier": SOME_STEP}}]
    assert all(s.problem == QUESTION for s in out)


def test_label_gsm8k_problem_draws_at_most_tries_times(monkeypatch):
    calls = _scripted(monkeypatch, [])
    out = label_gsm8k_problem("p1", QUESTION, ANSWER, random.Random(0))
    assert len(calls) == 8 and [s.kind for s in out] == ["reference"]  # eight tries by default
    calls = _scripted(monkeypatch, [])
    label_gsm8k_problem("p1", QUESTION, ANSWER, random.Random(0), tries=3)
    assert len(calls) == 3
    same, result, operator, extra = _corruptions()
    calls = _scripted(monkeypatch, [result, operator, extra])
    out = label_gsm8k_problem("p1", QUESTION, ANSWER, random.Random(0), corruptions=3)
    assert [s.kind for s in out] == ["reference", "corrupted:result", "corrupted:operator", "corrupted:operand"]


def test_build_label_set_defaults_to_seed_0_and_two_corruptions():
    probs = [Problem("p1", QUESTION, ANSWER), Problem("p2", QUESTION, ANSWER), Problem("p3", QUESTION, ANSWER)]

    def rows(**kw):
        return [s.as_row() for s in build_label_set(probs, **kw)]

    default = rows()
    assert default == rows(seed=0, corruptions=2)
    assert default != rows(seed=1, corruptions=2)
    assert default != rows(seed=0, corruptions=3)


def test_load_gsm8k_train_reads_utf8_whatever_the_locale(tmp_path):
    import locale

    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"question": "Un café coûte 3 €", "answer": "3 ÷ 1 = 3\n#### 3"}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    was = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale: a file opened without an encoding fails to decode
    try:
        got = load_gsm8k_train(path)
    finally:
        locale.setlocale(locale.LC_CTYPE, was)
    assert got == [Problem("gsm8k-train-00001", "Un café coûte 3 €", "3 ÷ 1 = 3\n#### 3")]


def test_load_gsm8k_train_samples_with_seed_0_by_default(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"question": f"Q{i}", "answer": f"#### {i}"}) + "\n" for i in range(20)),
                    encoding="utf-8")
    ids = [p.problem_id for p in load_gsm8k_train(path, limit=5)]
    assert ids == [p.problem_id for p in load_gsm8k_train(path, limit=5, seed=0)]
    assert ids != [p.problem_id for p in load_gsm8k_train(path, limit=5, seed=1)]


# ------------------------------------------------------------------------------------------ small contracts
def test_consensus_checks_every_pair_of_four_verdicts():
    # 1 and 2 contradict; every other pair agrees ("some step" beside a located step or another "some step")
    verdicts = [Verdict("provenance", 1), Verdict("verifier", SOME_STEP), Verdict("mc", 2), Verdict("calculator", SOME_STEP)]
    assert consensus(verdicts, num_steps=4) is None
    assert consensus(verdicts[:2] + [Verdict("mc", 1), verdicts[3]], num_steps=4) == 1


def test_render_solution_appends_the_answer_to_the_last_of_several_steps():
    assert render_solution(["a <<1+1=2>>2", "b", "c <<2*2=4>>4"], "4") == ["a 2", "b", "c 4 The answer is \\boxed{4}."]


def test_latex_equation_times_x_and_chained_divisions():
    assert latex_equation("5 x 3 = 15") == r"\( 5 \times 3 = 15 \)"
    assert latex_equation("12/4/3 = 1 and 6+12/4 = 9") == r"\( 12 \div 4 \div 3 = 1 \) and \( 6 + 12 \div 4 = 9 \)"
    assert latex_equation("12 ÷ 4 = 3") == r"\( 12 \div 4 = 3 \)"


def test_processbench_style_keeps_the_problem_and_the_verdicts():
    verdicts = (Verdict("provenance", 1), Verdict("verifier", SOME_STEP))
    sol = LabelledSolution("p1", "Q?", ("a", "b", "c"), 1, (1, 0, 0), "corrupted:result", verdicts)
    out = processbench_style(sol, random.Random(0))
    assert (out.problem_id, out.problem, out.verdicts) == ("p1", "Q?", verdicts)


# ------------------------------------------------------------------------------------------ the screen
class _Index:
    """A contamination index that matches the questions it is told to, and records how it was asked."""

    def __init__(self, hits):
        self.hits, self.asked = hits, []

    def match(self, texts, *, use_embeddings):
        self.asked.append((list(texts), use_embeddings))
        return [self.hits.get(t) for t in texts]


def _match(item_id):
    return Match("processbench-gsm8k", item_id, "exact", 1.0, "Natalia sold clips ...")


def test_screen_problems_refuses_matched_questions_and_keeps_the_rest_in_order():
    probs = [Problem("a", "Qa", "#### 1"), Problem("b", "Qb", "#### 2"), Problem("c", "Qc", "#### 3"),
             Problem("d", "Qd", "#### 4")]
    index = _Index({"Qb": _match("7"), "Qd": _match("9")})
    out = screen_problems(probs, index)
    assert out.clean == [probs[0], probs[2]]
    assert out.refused == [(probs[1], _match("7")), (probs[3], _match("9"))]
    assert index.asked == [(["Qa", "Qb", "Qc", "Qd"], True)]  # embeddings by default
    screen_problems(probs, index, use_embeddings=False)
    assert index.asked[-1] == (["Qa", "Qb", "Qc", "Qd"], False)
    nothing = screen_problems(probs, _Index({}))
    assert (nothing.clean, nothing.refused) == (probs, [])


def test_quarantine_rows_name_the_problem_and_the_item():
    probs = [Problem("gsm8k-train-00003", "Qb", "#### 2"), Problem("gsm8k-train-00009", "Qd", "#### 4")]
    screened = screen_problems(probs, _Index({"Qb": _match("7"), "Qd": _match("9")}))
    rows = screened.quarantine_rows("batch-1")
    assert [r["error"] for r in rows] == [
        f"PRM label problem gsm8k-train-0000{n} matches the benchmark item processbench-gsm8k/{i} (exact, similarity "
        "1.000): training on it would contaminate the evaluation" for n, i in ((3, 7), (9, 9))]
    assert [(r["source"], r["batch_id"], r["stage"], r["line"]) for r in rows] == [("prm_labels", "batch-1", "tasks", None)] * 2
    raw = json.loads(rows[0]["raw"])
    assert raw == {"task_id": "gsm8k-train-00003", "prompt": "Qb", "source": "prm_labels",
                   "contamination": _match("7").as_dict()}
    assert screen_problems(probs, _Index({})).quarantine_rows("batch-1") == []


def test_processbench_items_index_every_split_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    for split, n in (("gsm8k", 2), ("math", 1)):
        rows = [{"id": f"{split}-{i}", "problem": f"{split} problem {i}", "steps": ["s"], "label": -1} for i in range(n)]
        (tmp_path / "processbench").mkdir(exist_ok=True)
        (tmp_path / "processbench" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                                  encoding="utf-8")
    items = processbench_items(tmp_path, ["gsm8k", "math"])
    assert [(i.benchmark, i.item_id, i.text) for i in items] == [
        ("processbench-gsm8k", "gsm8k-0", "gsm8k problem 0"), ("processbench-gsm8k", "gsm8k-1", "gsm8k problem 1"),
        ("processbench-math", "math-0", "math problem 0")]
    assert processbench_items(tmp_path, []) == []
