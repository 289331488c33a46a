"""The scorers behind the reward server under hostile input (issue 73): every pattern that reads model
output does work linear in its length (checked by how the work grows from one size to eight times it,
in tests/test_reward_hostile_integration.py, over the unit tier's CPU budget), what reaches exact arithmetic or sympy is capped, and the inputs
that gave 500s (deep JSON, a 5,000-digit number, a 3,000-term expression) give a 400 or a scored 0."""

from __future__ import annotations

import re

import pytest

from tentalis_pipelines.rewards import math_answers as ma
from tentalis_pipelines.rewards import process
from tentalis_pipelines.rewards import remote_reward as rr
from tentalis_pipelines.rewards.score_pool import Refused, parse_body
from tentalis_pipelines.rewards.steps import answer_tags, parse_completion

PROMPT = "Tom has 12 marbles and finds 7 more. How many marbles does he have?"


def test_equations_read_as_the_old_pattern_read_them():
    old = re.compile(r"((?:\(?\s*-?\d[\d,]*(?:\.\d+)?\s*\)?\s*[-+*/x×÷]\s*)+\(?\s*-?\d[\d,]*(?:\.\d+)?\s*\)?)\s*=\s*\$?(-?\d[\d,]*(?:\.\d+)?)")
    steps = ["12 + 7 = 19", "4 * 6 = 24 and 24 / 3 = 8", "(12 + 7) x 2 = 38", "1,200 - 200 = 1,000", "-3 + 5 = $2",
             "2.5 × 4 = 10.0", "He had 12 apples; 12 - 5 = 7 left, then 7 ÷ 7 = 1.", "5 = 5", "3x = 12", "1 + 2 + = 3",
             "2 + 3 = 5 + 1 = 6", "a12+3=15", "12 + 7 =19 and 6*7= 42", "no equation here", "12 +\n7 = 19"]
    for step in steps:
        assert process.equations(step) == [(m.group(1).strip(), m.group(2)) for m in old.finditer(step)], step


def test_answer_tags_pair_as_findall_did():
    old = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
    texts = ["<answer>19</answer>", "<answer>1</answer> <ANSWER>2</Answer>", "<answer><answer>3</answer>", "<answer>4",
             "x</answer><answer>5</answer>", "<answer>a\nb</answer><answer>", "", "<answer></answer>"]
    for text in texts:
        assert [a for _, a in answer_tags(text)] == old.findall(text), text
    # Several tags that disagree are no answer; the same answer twice is one.
    assert parse_completion("<answer>1</answer><answer>2</answer>").answer is None
    assert parse_completion("<answer>3</answer><answer>3</answer>" + "<answer>" * 1000).answer == "3"


def test_boxed_contents_nest_and_skip_unclosed_boxes():
    assert ma.boxed_contents("\\boxed{\\frac{\\sqrt{3}}{2}}") == ["\\frac{\\sqrt{3}}{2}"]
    assert ma.boxed_contents("\\boxed{1} and \\boxed{2}") == ["1", "2"]
    assert ma.boxed_contents("\\boxed{" * 3 + "\\boxed{7}") == ["7"]
    assert ma.boxed_contents("no box") == [] and ma.reference_answer("#### 42") == "42"


def test_equation_caps_at_their_boundaries():
    at_cap = "+".join(["1"] * process.MAX_EQUATION_TERMS)
    assert process.evaluate(at_cap) == process.MAX_EQUATION_TERMS
    with pytest.raises(ValueError, match="more than 64 numbers"):
        process.evaluate(at_cap + "+1")
    digits = "9" * process.MAX_OPERAND_DIGITS
    assert process.evaluate(f"{digits} + 1") == 10 ** process.MAX_OPERAND_DIGITS
    with pytest.raises(ValueError, match="more than 32 digits"):
        process.evaluate(f"9{digits} + 1")
    assert process.exact(digits) == int(digits) and process.exact("9" + digits) is None and process.exact("1,2") == 12
    # Only the first MAX_STEP_EQUATIONS equations of a step are read.
    many = " ".join(f"{i} + 1 = {i + 1}" for i in range(40))
    assert len(process.equations(many)) == process.MAX_STEP_EQUATIONS == 16


def test_the_500s_of_the_issue_are_scored_or_refused():
    # A 3,000-term expression: RecursionError in ast construction before; now not checked (no process credit).
    terms = "<step>" + "+".join(["2"] * 3000) + " = 6000</step><answer>6000</answer>"
    s = rr.score_query(terms, PROMPT, "6000")
    assert s.outcome == 1.0 and s.checked_steps == 0 and s.reason is None
    # 3,000 factors of 9999: a 12,000-digit product Python would not print; now past the caps, unchecked.
    assert process.check_step("*".join(["9999"] * 3000) + " = 1").score is None
    # A wrong equation whose value no float holds: the rationale says so instead of raising OverflowError.
    big = "*".join(["9" * 32] * 20)
    wrong = process.check_step(f"{big} / 7 = 1")
    assert wrong.score == 0.0 and "a number too large to show" in wrong.rationale
    # A 5,000-digit stated result next to a good equation: check_steps raised ValueError (int-digit limit).
    huge = "9" * 5000
    checks = process.check_steps(PROMPT, [f"12 + 7 = 19 and 19 + 1 = {huge}"])
    assert [c.score for c in checks] == [1.0]
    assert ma.to_number(huge) is None and ma.to_number("9" * ma.MAX_NUMBER_DIGITS) == int("9" * ma.MAX_NUMBER_DIGITS)
    s = rr.score_query(f"<answer>{huge}</answer>", PROMPT, huge[:4000])
    assert s.outcome == 0.0 and s.reason is None


def test_sympy_never_sees_what_it_would_evaluate_for_minutes():
    # 9^(9^(9^9)) has 370 million digits: math-verify (sympy) computed it for minutes, holding the worker.
    for costly in ("9^{9^{9^{9}}}", "2^{99999999}", "10000!", "x" * (ma.MAX_SYMBOLIC_CHARS + 1)):
        assert ma.symbolic_match(costly, "x+1") is False, costly
    assert ma.answers_match("x" * (ma.MAX_ANSWER_CHARS + 1), "x") is False


def test_a_query_past_the_cap_scores_zero_with_its_reason():
    at_cap = "1" * (rr.MAX_QUERY_CHARS - 20) + "<answer>19</answer>"
    assert len(at_cap) <= rr.MAX_QUERY_CHARS and rr.score_query(at_cap, "", "19").outcome == 1.0
    s = rr.score_query("x" * (rr.MAX_QUERY_CHARS + 1), "", "19")
    assert s.reward == 0.0 and s.answer is None and f"at most {rr.MAX_QUERY_CHARS}" in s.reason
    assert "at most" in rr.score_query("<answer>19</answer>", "p" * (rr.MAX_QUERY_CHARS + 1), "19").reason
    steps = "".join(f"<step>{i} + 1 = {i + 1}</step>" for i in range(rr.MAX_CHECKED_STEPS + 50)) + "<answer>19</answer>"
    assert rr.score_query(steps, PROMPT, "19").checked_steps <= rr.MAX_CHECKED_STEPS


@pytest.mark.parametrize(("raw", "status", "says"), [
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    (b'{"query": [' * 5000, 400, "nested too deeply"),
    (b'{"query": ["q"], "prompts": ["p"], "labels": [' + b"9" * 5000 + b"]}", 400, "number too long to read"),
    (b"\xff\xfe{", 400, "not JSON"),
    (b"{not json", 400, "not JSON"),
    (b'{"query": ["q"], "prompts": ["p"]}', 422, "'labels' is missing"),
])
def test_bodies_the_server_refuses(raw, status, says):
    refused = parse_body(raw)
    assert isinstance(refused, Refused) and refused.status == status and says in refused.message, refused


def test_a_long_number_label_within_pythons_limit_is_scored():
    label = 9 * 10 ** 999  # a 1,000-digit JSON number: read, compared exactly
    queries, prompts, labels = parse_body(f'{{"query": ["<answer>{label}</answer>"], "prompts": [""], "labels": [{label}]}}'.encode())
    assert labels == [label] and rr.score_query(queries[0], prompts[0], str(labels[0])).outcome == 1.0
