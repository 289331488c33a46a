"""Hint-guided resampling's pure parts: which groups, which hint, the ids, the shaped loss, the config."""

from __future__ import annotations

import re

import pytest
import torch

from tentalis_pipelines.rewards.hint_reward import (
    HintQuery,
    answer_text,
    hint_rewards,
    scored_continuation,
    solution_steps,
)
from tentalis_pipelines.training import guide, opd
from tentalis_pipelines.training.losses import shaped_guided_loss
from tentalis_pipelines.training.trainer import GRPOConfig


def test_only_groups_where_no_sample_is_correct_are_resampled():
    rows = [("t1", "base", False), ("t1", "base", False), ("t2", "base", False), ("t2", "base", True),
            ("t1", "c1", False), ("t3", "base", False)]
    # t2 has a success; (t1, c1) is another group than (t1, base) (a group is task x policy version)
    assert guide.all_fail_groups(rows) == [("t1", "base"), ("t1", "c1"), ("t3", "base")]
    assert guide.all_fail_groups([]) == []


def _review(i, hint, manager="verifier"):
    return {"rollout_id": f"r{i}", "group_index": i, "manager": manager, "hint": hint}


def test_the_most_frequent_usable_hint_wins_and_a_tie_goes_to_the_lowest_group_index():
    plan = "Plan: compute 12 + 7 first, then give that number."
    step = "Step 1 is wrong: 3 * 4 is not 13. Redo that calculation."
    h, why = guide.choose_hint("t", "base", [_review(3, step), _review(0, plan), _review(1, step), _review(2, plan)], "19")
    assert why == "" and (h.hint, h.source_rollout_id, h.votes) == (plan, "r0", 2)  # 2 votes each: r0 comes first
    h, _ = guide.choose_hint("t", "base", [_review(0, plan), _review(1, step), _review(2, step)], "19")
    assert (h.hint, h.source_rollout_id, h.votes, h.hint_source) == (step, "r1", 2, "verifier")


def test_leaking_generic_and_empty_hints_are_never_used():
    reviews = [_review(0, "The answer is 19, write it."), _review(1, "try again"), _review(2, "")]
    h, why = guide.choose_hint("t", "base", reviews, "19")
    assert h is None and why == "no usable hint (leaks_answer: 1, no_hint: 1, trivial: 1)"
    # the leak is on the value, however it is written; another number is fine
    h, _ = guide.choose_hint("t", "base", [_review(0, "Add the 19.0 you found to the rest."), _review(1, "Add 7 to the 12 you had.")], "19")
    assert h.hint == "Add 7 to the 12 you had." and h.source_rollout_id == "r1"


def test_guided_ids_are_stable_distinct_and_marked():
    a = guide.guided_rollout_id("b", "t", "base", "h-1", 0)
    assert a == guide.guided_rollout_id("b", "t", "base", "h-1", 0) and a.startswith("g-") and guide.is_guided(a)
    others = {guide.guided_rollout_id(*args) for args in [("b2", "t", "base", "h-1", 0), ("b", "t2", "base", "h-1", 0),
                                                           ("b", "t", "c1", "h-1", 0), ("b", "t", "base", "h-2", 0), ("b", "t", "base", "h-1", 1)]}
    assert len(others) == 5 and a not in others and not guide.is_guided("r-0123")


def test_the_shaped_loss_and_its_gradient_by_hand():
    logp = torch.tensor([[-2.0, -0.1]], requires_grad=True)
    behaviour = torch.tensor([[-0.5, -0.1]])
    adv = torch.tensor([[1.5, -1.0]])
    loss = shaped_guided_loss(logp, behaviour, adv, gamma=0.2)
    import math

    r = [math.exp(-1.5), 1.0]
    expect = [-(r[0] / (r[0] + 0.2)) * 1.5, (1.0 / 1.2) * 1.0]
    assert loss.detach()[0].tolist() == pytest.approx(expect, rel=1e-6)
    loss.sum().backward()
    # d/dlogp of -A * r/(r+g) = -A * g * r / (r+g)^2
    grads = [-1.5 * 0.2 * r[0] / (r[0] + 0.2) ** 2, 1.0 * 0.2 * 1.0 / 1.2 ** 2]
    assert logp.grad[0].tolist() == pytest.approx(grads, rel=1e-5)
    with pytest.raises(ValueError, match="gamma"):
        shaped_guided_loss(logp, behaviour, adv, gamma=0.0)


def test_guide_settings_are_validated():
    assert GRPOConfig().guide is False and GRPOConfig().guide_importance == "clip"
    with pytest.raises(ValueError, match="guide_generations"):
        GRPOConfig(guide_generations=0)
    with pytest.raises(ValueError, match="guide_importance"):
        GRPOConfig(guide_importance="luffy")
    with pytest.raises(ValueError, match="guide_shaping_gamma"):
        GRPOConfig(guide_shaping_gamma=-1.0)


def test_a_hint_that_leaks_or_says_nothing_earns_no_dense_reward_without_touching_a_model():
    q = lambda hint: HintQuery("<user>What is 12 + 7?</user>", "What is 12 + 7?", hint, "19")  # noqa: E731
    out = hint_rewards(None, None, [q("The total you want is 19."), q("try again"), q("")])  # model None: never called
    assert [(o.reward, o.decision, o.with_hint) for o in out] == [(0.0, opd.LEAKS_ANSWER, None), (0.0, opd.TRIVIAL, None),
                                                                  (0.0, opd.NO_HINT, None)]
    assert answer_text(" 19 ") == "19"


class CharTokenizer:
    """One id per character: the scored mask can be read against the text by hand."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_a_tasks_solution_steps_come_from_its_expression():
    assert solution_steps({"reference": "19", "metadata": '{"expression": "12 + 7"}'}) == ("12 + 7 = 19",)
    assert solution_steps({"reference": " 19 ", "metadata": None}) == ()
    assert solution_steps({"reference": "19", "metadata": "not json"}) == ()
    assert solution_steps({"reference": "19", "metadata": '{"level": 1}'}) == ()


def test_the_scored_continuation_scores_the_steps_and_the_value_not_the_tags():
    tok = CharTokenizer()
    # without steps (v2): "<answer>" is context, the value alone is scored
    prefix, cont, mask = scored_continuation(tok, "19")
    assert "".join(map(chr, prefix)) == "<answer>" and "".join(map(chr, cont)) == "19" and mask == [True, True]
    # with steps: "<step>" is context; the continuation is the solution in the worker's format
    prefix, cont, mask = scored_continuation(tok, "19", ("12 + 7 = 19",))
    assert "".join(map(chr, prefix)) == "<step>"
    assert "".join(map(chr, cont)) == "12 + 7 = 19</step><answer>19"
    assert "".join(chr(c) for c, m in zip(cont, mask) if m) == "12 + 7 = 1919"  # the tags are never scored
    # two steps: the tag between them is context too
    _, cont, mask = scored_continuation(tok, "5", ("2 + 1 = 3", "3 + 2 = 5"))
    assert "".join(map(chr, cont)) == "2 + 1 = 3</step><step>3 + 2 = 5</step><answer>5"
    assert "".join(chr(c) for c, m in zip(cont, mask) if m) == "2 + 1 = 33 + 2 = 55"


# --------------------------------------------------------------------------- choose_hint's contract at its edges
def _rev(i, hint, manager="verifier"):
    return {"rollout_id": f"r{i}", "group_index": i, "manager": manager, "hint": hint}


def test_choose_hint_screens_against_every_reference_of_several():
    from tentalis_pipelines.training.guide import choose_hint

    hint = "Count the lines and submit 42 as the answer"
    reviews = [_rev(0, hint)]
    assert choose_hint("t", "v", reviews, ["7", "42"])[0] is None  # leaks the second reference
    assert choose_hint("t", "v", reviews, ("7", "42"))[1] == "no usable hint (leaks_answer: 1)"
    chosen, why = choose_hint("t", "v", reviews, ["7", "8"])
    assert why == "" and chosen.hint == hint
    # no reference at all (an empty list, None): still screened for empty and trivial hints
    for ref in ([], None):
        assert choose_hint("t", "v", [_rev(0, ""), _rev(1, "ok")], ref) == (None, "no usable hint (no_hint: 1, trivial: 1)")


def test_choose_hint_counts_every_refusal_and_says_when_there_are_no_reviews():
    from tentalis_pipelines.training.guide import choose_hint

    assert choose_hint("t", "v", [_rev(0, ""), _rev(1, "  "), _rev(2, "")], "3") == (None, "no usable hint (no_hint: 3)")
    assert choose_hint("t", "v", [], "3") == (None, "no usable hint (no reviews)")


def test_the_chosen_hint_names_its_group():
    from tentalis_pipelines.training.guide import choose_hint

    h = "Add the two prices before you subtract the discount"
    chosen, _ = choose_hint("task-9", "ckpt-2", [_rev(1, "Read the question twice before you answer"), _rev(0, h), _rev(2, h)], "12")
    assert (chosen.task_id, chosen.policy_version, chosen.hint, chosen.votes, chosen.source_rollout_id) == ("task-9", "ckpt-2", h, 2, "r0")


def test_a_guided_rollout_id_is_g_and_sixteen_hex_digits():
    from tentalis_pipelines.training.guide import guided_rollout_id, is_guided

    a = guided_rollout_id("b", "t", "v", "h", 0)
    assert re.fullmatch(r"g-[0-9a-f]{16}", a) and is_guided(a)
    assert len({a, guided_rollout_id("b", "t", "v", "h", 1), guided_rollout_id("b", "t", "v2", "h", 0)}) == 3
