"""Hinted on-policy distillation: the signal against a hand computation, the hint filter, the weights,
the pipeline rows, and (on the real SmolLM2) the direction of learning from a hint, both ways."""

from __future__ import annotations

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




def test_signal_equals_a_hand_computation_on_a_toy_model(tiny_model_dir):
    model, tok = _tiny(tiny_model_dir)
    hint = "The question asks you to add 7 to 12."
    student = tok(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
    teacher = tok(opd.hinted_prompt(PROMPT_TEXT, TASK, hint), add_special_tokens=False)["input_ids"]
    completions = [tok(c, add_special_tokens=False)["input_ids"] for c in ("<answer>19</answer>", "12 + 7 is 20, so 20")]
    items = [opd.OPDItem(student, teacher, c, temperature=0.8) for c in completions]
    got = opd.teacher_student_logprobs(model, tok, items, dtype="float32")
    for (t, s), c in zip(got, completions):
        hand_t = _hand_logps(model, teacher, c, 0.8)
        hand_s = _hand_logps(model, student, c, 0.8)
        assert t == pytest.approx(hand_t, abs=1e-4)
        assert s == pytest.approx(hand_s, abs=1e-4)
        # The signal is the clipped difference, token by token.
        assert opd.opd_signal(t, s, clip=None) == pytest.approx([a - b for a, b in zip(hand_t, hand_s)], abs=2e-4)
        clipped = opd.opd_signal(t, s, clip=0.01)
        assert clipped == pytest.approx([max(-0.01, min(0.01, a - b)) for a, b in zip(hand_t, hand_s)], abs=1e-6)
    # A random model still reacts to the hint: some tokens move by more than the clip.
    assert any(abs(a - b) > 0.01 for a, b in zip(*got[0]))


def test_signal_is_exactly_zero_for_an_identical_context(tiny_model_dir):
    model, tok = _tiny(tiny_model_dir)
    student = tok(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
    same = tok(opd.hinted_prompt(PROMPT_TEXT, TASK, ""), add_special_tokens=False)["input_ids"]
    c = tok("<answer>19</answer>", add_special_tokens=False)["input_ids"]
    [(t, s)] = opd.teacher_student_logprobs(model, tok, [opd.OPDItem(student, same, c, 0.8)], dtype="float32")
    assert opd.opd_signal(t, s) == [0.0] * len(c)
    assert not opd.has_effect(opd.opd_signal(t, s), 1e-9)












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


def test_a_hint_naming_the_answer_raises_it_and_a_misleading_hint_lowers_it(embedded_model_dir):
    before, after = _distil(embedded_model_dir, "The correct answer is 19.")
    assert after > before + 0.3, (before, after)
    before_m, after_m = _distil(embedded_model_dir, "The correct answer is 23.")
    assert before_m == pytest.approx(before, abs=1e-4)
    assert after_m < before_m - 0.3, (before_m, after_m)
