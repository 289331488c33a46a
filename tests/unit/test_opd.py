"""Hinted on-policy distillation: the signal against a hand computation, the hint filter, the weights,
the pipeline rows, and (on the real SmolLM2) the direction of learning from a hint, both ways."""

from __future__ import annotations

import math

import pytest
import torch

from tentalis_pipelines.training import opd
from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

PROMPT_TEXT = "<|im_start|>user\nAva has 12 apples and gets 7 more. How many apples does Ava have now?<|im_end|>\n<|im_start|>assistant\n"
TASK = "Ava has 12 apples and gets 7 more. How many apples does Ava have now?"


def _tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _hand_logps(model, prompt_ids, completion_ids, temperature):
    """log softmax(logits / T) of each completion token, from one plain forward pass over prompt + completion."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    P = len(prompt_ids)
    return [float(logp[P - 1 + i, t]) for i, t in enumerate(completion_ids)]


def test_hinted_prompt_appends_to_the_task_message_and_is_the_prompt_without_a_hint():
    hinted = opd.hinted_prompt(PROMPT_TEXT, TASK, "  add 7 to 12  ")
    assert hinted == PROMPT_TEXT.replace(TASK, TASK + "\n\nHint from your manager: add 7 to 12")
    assert opd.hinted_prompt(PROMPT_TEXT, TASK, "") == PROMPT_TEXT
    assert opd.hinted_prompt(PROMPT_TEXT, TASK, "   ") == PROMPT_TEXT
    with pytest.raises(ValueError, match="does not occur"):
        opd.hinted_prompt(PROMPT_TEXT, "another question", "a hint")






def test_signal_masks_context_tokens_and_refuses_mismatches():
    assert opd.opd_signal([-1.0, -2.0, -0.5], [-1.5, -1.0, -0.5], clip=None, mask=[1, 0, 1]) == [0.5, 0.0, 0.0]
    assert opd.opd_signal([-1.0, -3.0], [-2.5, -1.0]) == [1.0, -1.0]  # clipped to +-1 (the default)
    with pytest.raises(ValueError, match="teacher has 1 log-probs for 2"):
        opd.opd_signal([-1.0], [-1.0, -2.0])
    with pytest.raises(ValueError, match="non-finite"):
        opd.opd_signal([-math.inf], [-1.0])


def test_hint_filter_decisions():
    assert opd.screen_hint("", "19")[0] == opd.NO_HINT
    assert opd.screen_hint(None, "19")[0] == opd.NO_HINT
    assert opd.screen_hint("Try again!", "19")[0] == opd.TRIVIAL
    assert opd.screen_hint("be careful", "19")[0] == opd.TRIVIAL
    assert opd.screen_hint("add them", "19")[0] == opd.TRIVIAL  # shorter than MIN_HINT_CHARS
    decision, reason = opd.screen_hint("The total is 19, write that.", "19")
    assert decision == opd.LEAKS_ANSWER and "19" in reason
    assert opd.screen_hint("The total is 19.0 apples.", "19")[0] == opd.LEAKS_ANSWER
    assert opd.screen_hint("Add 7 to 12: write 12 + 7 = ... as a step.", "19")[0] == opd.USED
    assert opd.screen_hint("Count 119 marbles first, then add.", "19")[0] == opd.USED  # 119 is not 19
    assert opd.screen_hint("Use the boxed value x^2 here", "x^2")[0] == opd.LEAKS_ANSWER  # non-numeric reference


def test_combined_advantage_weights():
    rl = [0.5, 0.5, 0.5]
    sig = [0.2, -0.4, 0.0]
    assert opd.combine_advantages(rl, sig, w_rl=1.0, w_opd=1.0) == pytest.approx([0.7, 0.1, 0.5])
    assert opd.combine_advantages(rl, sig, w_rl=0.0, w_opd=2.0) == pytest.approx([0.4, -0.8, 0.0])
    assert opd.combine_advantages(rl, sig, w_rl=1.0, w_opd=0.0) == pytest.approx(rl)
    assert opd.combine_advantages(rl, None, w_rl=0.5, w_opd=1.0) == pytest.approx([0.25] * 3)
    with pytest.raises(ValueError, match="2 entries for 3"):
        opd.combine_advantages(rl, [0.1, 0.2], w_rl=1.0, w_opd=1.0)


def test_a_row_is_kept_exactly_when_a_weighted_signal_remains():
    sig = (0.3,)
    # (RL signal in the group, used hint, w_rl, w_opd) -> kept
    table = {(True, None, 1.0, 0.0): True, (False, None, 1.0, 0.0): False,
             (True, None, 0.0, 1.0): False,  # OPD only: an unhinted row of a varied group has nothing to learn
             (False, sig, 0.0, 1.0): True, (True, sig, 0.0, 1.0): True,
             (False, sig, 1.0, 1.0): True,  # equal rewards, but the hint still teaches
             (False, sig, 1.0, 0.0): False, (True, None, 1.0, 1.0): True, (False, None, 1.0, 1.0): False}
    for (rl, opd_sig, w_rl, w_opd), kept in table.items():
        assert opd.keeps(rl, opd_sig, w_rl=w_rl, w_opd=w_opd) is kept, (rl, opd_sig, w_rl, w_opd)


def test_config_refuses_no_weight_at_all():
    with pytest.raises(ValueError, match="w_rl and w_opd"):
        GRPOConfig(w_rl=0.0, w_opd=0.0)
    with pytest.raises(ValueError, match="w_rl and w_opd"):
        GRPOConfig(w_opd=-1.0)
    assert GRPOConfig(w_rl=0.0, w_opd=1.0).trajectory_settings()["w_opd"] == 1.0


# --------------------------------------------------------------------------- direction, on SmolLM2


def _answer_logp(model, student_ids, answer_ids) -> float:
    """log pi(answer | s): the answer's tokens after the prompt (which ends with '<answer>')."""
    return sum(_hand_logps(model, student_ids, answer_ids, 1.0))


def _distil(embedded_model_dir, hint: str, updates: int = 3) -> tuple[float, float]:
    """log pi(answer 19 | s) before and after ``updates`` OPD-only updates (w_rl = 0, Adam state carried)
    on the student's own candidate answers, the teacher being the same policy given ``hint``."""
    from transformers import AutoTokenizer

    from tentalis_pipelines.inference.prompts import render_prompt

    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    cfg = GRPOConfig(learning_rate=5e-4, dtype="float32", device="cpu", per_step_rows=8, w_rl=0.0, w_opd=1.0, seed=0)
    model = build_policy(embedded_model_dir, None, cfg)
    # The student has started its answer tag: what follows is the number it answers.
    prompt_text = render_prompt(tok, TASK) + "<answer>"
    student = tok(prompt_text, add_special_tokens=False)["input_ids"]
    teacher = tok(opd.hinted_prompt(prompt_text, TASK, hint), add_special_tokens=False)["input_ids"]
    comps = [tok(str(n), add_special_tokens=False)["input_ids"] for n in (19, 17, 21, 20, 18, 23)]
    model.eval()
    before = _answer_logp(model, student, comps[0])
    state = None
    for _ in range(updates):
        scored = opd.teacher_student_logprobs(model, tok, [opd.OPDItem(student, teacher, c, 1.0) for c in comps], dtype="float32")
        samples = [TrainSample(student, c, 0.0, temperature=1.0,
                               token_advantages=opd.combine_advantages([0.0] * len(c), opd.opd_signal(t, s), w_rl=0.0, w_opd=1.0))
                   for c, (t, s) in zip(comps, scored)]
        state = train_grpo(model, tok, samples, cfg, state=state).state
    model.eval()
    return before, _answer_logp(model, student, comps[0])


