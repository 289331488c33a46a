"""Multi-turn trajectories: the loss mask, the reward per assistant turn, and the trainer honouring both."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from tentalis_pipelines.training import multiturn
from tentalis_pipelines.training.losses import aggregate, per_token_loss
from tentalis_pipelines.training.trainer import (
    GRPOConfig,
    TrainSample,
    build_policy,
    completion_logps,
    pack,
    pack_samples,
    train_grpo,
    trained_tokens,
)
from tests.session_rows import CALL, session_turns, tool_session_script


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_mask_is_exactly_the_assistant_tokens_of_a_three_turn_tool_session(tok):
    turns = session_turns(tok, "sess-1", tool_session_script())
    [seg] = multiturn.build_segments("sess-1", turns)
    # The sample is the last call's full context: what the model saw, plus what it wrote last.
    assert seg.context == turns[-1]["prompt_token_ids"] + turns[-1]["completion_token_ids"]
    assert seg.prompt_ids == turns[0]["prompt_token_ids"]
    # Expected mask, from the rows alone: each call's completion sits right after its own prompt.
    p0 = len(turns[0]["prompt_token_ids"])
    expected = [0] * len(seg.completion_ids)
    for t in turns:
        at = len(t["prompt_token_ids"]) - p0
        expected[at: at + len(t["completion_token_ids"])] = [1] * len(t["completion_token_ids"])
    assert seg.assistant_mask == expected
    # Hand check with the tokenizer: the masked-in spans are the assistant's texts (and its <|im_end|>) ...
    spans = [tok.decode(seg.completion_ids[s.start: s.end]) for s in seg.spans]
    assert spans == [CALL + "<|im_end|>", "17 * 23 = 391.<|im_end|>", "391 + 9 = 400.<|im_end|>"]
    assert [s.turn_id for s in seg.spans] == [t["turn_id"] for t in turns]
    # ... and everything masked out is the system prompt, the tool's output, the user and the template.
    masked_out = tok.decode([i for i, m in zip(seg.completion_ids, seg.assistant_mask) if not m])
    assert masked_out == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n\n<|im_start|>user\nNow add 9.<|im_end|>\n<|im_start|>assistant\n"
    assert "careful calculator agent" in tok.decode(seg.prompt_ids)
    # Old log-probs: the sampled ones on assistant tokens, none on context tokens.
    assert [lp is None for lp in seg.old_logps] == [not m for m in seg.assistant_mask]


def test_a_prompt_that_does_not_extend_the_context_starts_a_new_segment(tok):
    turns = session_turns(tok, "sess-2", tool_session_script())
    # Call 2's prompt re-tokenised the first answer differently (one token differs), and the policy
    # changed at call 3: each starts a segment that reproduces exactly what the model saw.
    turns[1]["prompt_token_ids"][len(turns[0]["prompt_token_ids"]) + 1] = 42
    turns[2]["policy_version"] = "ckpt-1"
    segs = multiturn.build_segments("sess-2", turns)
    assert [(s.segment, s.policy_version, [x.turn_id for x in s.spans]) for s in segs] == [
        (0, "base", [turns[0]["turn_id"]]), (1, "base", [turns[1]["turn_id"]]), (2, "ckpt-1", [turns[2]["turn_id"]])]
    for s, t in zip(segs, turns):
        assert s.context == t["prompt_token_ids"] + t["completion_token_ids"] and s.assistant_mask == [1] * len(s.completion_ids)


def test_each_turn_gets_its_review_or_the_sessions_and_families_group():
    reviews = [{"rollout_id": "s1", "score": 0.8, "reviewer": "a", "created_at": 1},
               {"rollout_id": "t2", "score": 0.1, "reviewer": "a", "created_at": 1},
               {"rollout_id": "t2", "score": 0.3, "reviewer": "a", "created_at": 2},  # a's later review wins
               {"rollout_id": "t2", "score": 0.5, "reviewer": "b", "created_at": 1}]  # averaged over reviewers
    assert multiturn.turn_rewards("s1", ["t1", "t2"], reviews) == {"t1": (0.8, "session_review"), "t2": (0.4, "turn_review")}
    assert multiturn.turn_rewards("s9", ["t9"], reviews) == {}  # nothing to learn from: skipped
    # Family f has two sessions: their own group. Lone sessions x and y share the batch group.
    items = [("f", "s1", "a1", 1.0, "r"), ("f", "s2", "b1", 0.0, "r"), ("g", "x", "x1", 0.5, "r"), ("h", "y", "y1", 0.7, "r"),
             ("h", "y", "y2", 0.3, "r")]
    adv = multiturn.turn_advantages(items)
    assert adv["a1"].group == "f" and adv["x1"].group == adv["y1"].group == "batch"
    assert adv["a1"].advantage == pytest.approx(0.7071, abs=1e-3) and adv["b1"].advantage == pytest.approx(-0.7071, abs=1e-3)
    assert adv["y1"].advantage > 0 > adv["y2"].advantage and adv["x1"].advantage == pytest.approx(0.0, abs=1e-9)  # batch mean 0.5
    mask, token_adv = multiturn.segment_token_arrays(6, [{"turn_id": "y1", "start": 0, "end": 2}, {"turn_id": "zz", "start": 3, "end": 5}],
                                                     {"y1": 1.5})
    assert mask == [1, 1, 0, 0, 0, 0] and token_adv == [1.5, 1.5, 0, 0, 0, 0]  # an unrewarded turn is not trained on


def _loss_grad(model, rows: list[TrainSample], loss_type: str) -> tuple[torch.Tensor, dict]:
    """The trainer's loss on one micro-batch (old = current, beta 0) and d loss / d log-prob per token."""
    batch = pack(rows, 2, "cpu")
    logps = completion_logps(model, batch, 1.0)
    logps.retain_grad()
    mask = batch["loss_mask"]
    parts = per_token_loss(loss_type, logps, logps.detach(), batch["advantages"], mask)
    loss = aggregate(loss_type, parts.per_token, mask, rows_in_step=len(rows), tokens_in_step=sum(trained_tokens(r) for r in rows),
                     max_completion_length=16)
    loss.backward()
    return logps.grad, batch


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_masked_tokens_get_exactly_zero_gradient(tiny_model_dir, loss_type, shared):
    model = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4, dtype="float32", device="cpu"))
    prompt = [1, 520, 9531, 198]
    a = TrainSample(prompt, [30, 31, 32, 33, 34, 35], 0.0, token_advantages=[2.0, 2.0, 9.0, 9.0, -1.0, -1.0], loss_mask=[1, 1, 0, 0, 1, 1])
    b = TrainSample(prompt if shared else [1, 198], [40, 41, 42], 0.0, token_advantages=[0.5, 7.0, 0.5], loss_mask=[1, 0, 1])
    grad, batch = _loss_grad(model, [a, b], loss_type)
    assert bool(batch.get("shared")) == shared
    # Masked tokens: exactly zero, whatever advantage they carry.
    assert grad[0, 2].item() == 0.0 and grad[0, 3].item() == 0.0 and grad[1, 1].item() == 0.0
    # Hand check of the others (ratio 1, so d(-ratio * A)/d logp = -A): the normalisers count only
    # the unmasked tokens (grpo: 4 and 2 per row, 2 rows; dapo: 6 in the step).
    norm = {"grpo": [[4 * 2] * 6, [2 * 2] * 3], "dapo": [[6] * 6, [6] * 3]}[loss_type]
    for row, s in enumerate((a, b)):
        for j, (adv, m) in enumerate(zip(s.token_advantages, s.loss_mask)):
            if m:
                assert grad[row, j].item() == pytest.approx(-adv / norm[row][j], rel=1e-5)


def test_train_grpo_ignores_what_masked_tokens_carry(tiny_model_dir):
    """One update through train_grpo: the adapter moves the same whatever advantage and old log-prob
    the masked (user/tool) tokens carry, and the KL sees only the trained tokens."""
    prompt, comp = [1, 520, 9531, 198], [30, 31, 32, 33, 34, 35, 36]
    mask = [1, 1, 0, 0, 0, 1, 1]

    def step(masked_adv: float, masked_old: float | None):
        model = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4, dtype="float32", device="cpu", seed=3))
        adv = [1.0 if m else masked_adv for m in mask]
        old = [-1.0 if m else masked_old for m in mask]
        rows = [TrainSample(prompt, comp, 0.5, token_advantages=adv, loss_mask=mask, old_logps=old, temperature=1.0),
                TrainSample(prompt, comp[:3], -0.5, loss_mask=[1, 1, 0], old_logps=[-2.0, -2.0, masked_old], temperature=1.0)]
        cfg = GRPOConfig(lora_r=4, dtype="float32", device="cpu", seed=3, learning_rate=1e-2, beta=0.04, old_logprobs="sampling")
        train_grpo(model, tok_stub, rows, cfg)
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    tok_stub = type("T", (), {"pad_token_id": 2, "eos_token_id": 2})()
    base = step(0.0, None)
    other = step(50.0, -30.0)
    assert all(torch.equal(base[n], other[n]) for n in base)


def _turn_logp(model, context: list[int], span: multiturn.AssistantSpan, prompt_len: int) -> float:
    batch = pack_samples([TrainSample(context[: prompt_len + span.start], context[prompt_len + span.start: prompt_len + span.end], 0.0)], 2, "cpu")
    with torch.inference_mode():
        return float(completion_logps(model, batch, 1.0).sum())


def test_rewarded_assistant_turn_gains_probability_over_the_other(tiny_model_dir, tok):
    """A 2-turn session whose turn A is rewarded over turn B: after a few updates log pi(A) - log pi(B)
    rises, and the user/template tokens between them get exactly zero gradient."""
    script = [([{"role": "user", "content": "What is 2 + 3?"}], "<answer>5</answer>", None),
              ([{"role": "user", "content": "And 4 + 4?"}], "I think it is 7", None)]
    turns = session_turns(tok, "sess-d", script, temperature=1.0)
    [seg] = multiturn.build_segments("sess-d", turns)
    rewards = multiturn.turn_rewards("sess-d", [s.turn_id for s in seg.spans],
                                     [{"rollout_id": turns[0]["turn_id"], "score": 1.0}, {"rollout_id": turns[1]["turn_id"], "score": 0.0}])
    adv = multiturn.turn_advantages([("f", "sess-d", t, r, src) for t, (r, src) in rewards.items()])
    mask, token_adv = multiturn.segment_token_arrays(len(seg.completion_ids), seg.spans, {t: a.advantage for t, a in adv.items()})
    assert mask == seg.assistant_mask and 0 in mask
    sample = multiturn.train_sample(seg.prompt_ids, seg.completion_ids, mask, token_adv, advantage=0.0, old_logps=seg.old_logps,
                                    temperature=1.0)
    model = build_policy(tiny_model_dir, None, GRPOConfig())
    span_a, span_b = seg.spans
    P = len(seg.prompt_ids)

    def margin():
        return _turn_logp(model, seg.context, span_a, P) - _turn_logp(model, seg.context, span_b, P)

    grad, _ = _loss_grad(model, [sample], "grpo")
    between = [j for j, m in enumerate(mask) if not m]
    assert between and all(grad[0, j].item() == 0.0 for j in between)
    assert all(grad[0, j].item() < 0 for j in range(span_a.start, span_a.end))  # descending the loss raises A
    model.zero_grad(set_to_none=True)
    before = margin()
    cfg = GRPOConfig(learning_rate=5e-3, beta=0.04, temperature=1.0)
    for _ in range(4):
        train_grpo(model, tok, [sample], cfg)
    after = margin()
    assert after > before + 0.5, (before, after)


def test_the_token_normaliser_counts_only_trained_tokens(tiny_model_dir):
    """dapo, beta 0, one on-policy step: the step's loss is minus the mean advantage over the trained
    tokens only (2 of 5 here), not over every completion token."""
    model = build_policy(tiny_model_dir, None, GRPOConfig(lora_r=4, dtype="float32", device="cpu"))
    row = TrainSample([1, 520, 9531, 198], [30, 31, 32, 33, 34], 0.0, token_advantages=[1.0, 0.0, 0.0, 0.0, 3.0],
                      loss_mask=[1, 0, 0, 0, 1], temperature=1.0)
    tok_stub = type("T", (), {"pad_token_id": 2, "eos_token_id": 2})()
    result = train_grpo(model, tok_stub, [row], GRPOConfig(loss_type="dapo", beta=0.0, lora_r=4, dtype="float32", device="cpu"))
    assert result.history[0]["loss"] == pytest.approx(-(1.0 + 3.0) / 2, rel=1e-5)
    assert result.metrics["trained_tokens"] == 2 and result.metrics["completion_tokens"] == 5
