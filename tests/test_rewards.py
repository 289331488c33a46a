import pytest

from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.rewards.managers import ReviewInput, VerifierManager
from tentalis_pipelines.rewards.process import check_step
from tentalis_pipelines.rewards.scoring import RewardWeights, combine, format_score
from tentalis_pipelines.rewards.steps import parse_completion


def test_parse_tagged_and_fallback():
    p = parse_completion("<step>3 * 4 = 12</step>\n<step>12 + 1 = 13</step>\n<answer>13</answer>")
    assert p.steps == ["3 * 4 = 12", "12 + 1 = 13"] and p.answer == "13" and p.parse_mode == "tagged"
    assert format_score(p, "stop") == 1.0
    q = parse_completion("First 3 x 4 = 12.\nThen add 1 to get 13.")
    assert q.steps == ["First 3 x 4 = 12.", "Then add 1 to get 13."] and q.answer == "13" and q.parse_mode == "fallback"
    assert format_score(q, "stop") == 0.0
    assert parse_completion("no numbers at all").answer is None


def test_calculator_checks_equations():
    assert check_step("4 * 6 = 24 and 24 - 3 = 21").score == 1.0
    bad = check_step("3 × 4 = 13")
    assert bad.score == 0.0 and "is 12" in bad.rationale
    assert check_step("She buys some more apples.").score is None
    assert check_step("1,200 / 4 = 300").score == 1.0


def test_verifier_manager_reviews():
    base = dict(reference="21", steps=["4 * 6 = 24", "24 - 3 = 20"], finish_reason="stop")
    good = VerifierManager().review(ReviewInput(answer="21", correct=True, answer_tagged=True, format_score=1.0,
                                                step_scores=[1.0, 1.0], step_rationales=["", ""], **base))
    bad = VerifierManager().review(ReviewInput(answer="20", correct=False, answer_tagged=True, format_score=1.0,
                                               step_scores=[1.0, 0.0], step_rationales=["ok", "24 - 3 = 20 is wrong (it is 21)"], **base))
    assert good.score == 1.0 and bad.score < good.score
    assert "step 2" in bad.critique and "step 2" in bad.hint


def test_reward_combination_includes_the_manager():
    w = RewardWeights(outcome=1.0, format=0.2, process=0.2, manager=0.5)
    assert combine(w, outcome=1.0, format=1.0, process=None, manager=1.0) == pytest.approx(1.7)
    assert combine(w, outcome=0.0, format=0.0, process=0.0, manager=0.6) == pytest.approx(0.3)


def test_group_advantages():
    adv, signal = group_advantages(["a", "a", "b", "b"], [1.0, 0.0, 0.5, 0.5])
    assert adv[0] > 0 > adv[1] and adv[2] == adv[3] == 0.0
    assert signal == [True, True, False, False]
    raw, _ = group_advantages(["a", "a"], [1.0, 0.0], scale_rewards="none")
    assert raw == [0.5, -0.5]


def test_process_advantages_follow_deepseekmath():
    from tentalis_pipelines.rewards.advantages import process_advantages

    adv = process_advantages(["g", "g"], [[1.0, 0.0], [1.0, 1.0]])
    # pool {1, 0, 1, 1}: mean .75, std .5 -> normalised 0.5 / -1.5 ; suffix sums per sample
    assert adv[0] == pytest.approx([0.5 - 1.5, -1.5], abs=1e-3)
    assert adv[1] == pytest.approx([1.0, 0.5], abs=1e-3)
    assert process_advantages(["g"], [[None, 1.0]])[0] == [0.0, 0.0]


def test_token_step_index(embedded_model_dir):
    from transformers import AutoTokenizer

    from tentalis_pipelines.rewards.advantages import token_step_index

    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    text = "<step>2 + 3 = 5</step>\n<step>5 * 2 = 10</step>\n<answer>10</answer>"
    steps = parse_completion(text).steps
    ids = tok(text, add_special_tokens=False)["input_ids"]
    idx = token_step_index(tok, ids, text, steps)
    assert idx[0] == 0 and idx[-1] is None and 1 in idx
    assert idx == sorted(idx, key=lambda v: (v is None, v))  # steps in order, then the answer
