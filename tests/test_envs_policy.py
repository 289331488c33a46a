"""The transformers chat policy: exact token ids across turns, one training segment per episode, the KV
cache kept between turns giving what a fresh prefill gives (a tiny random Llama with the real tokenizer)."""

from __future__ import annotations

import pytest
import torch

from tentalis_pipelines.envs.base import SUBMITTED, Environment, Observation, StepResult, Verdict, end_kind
from tentalis_pipelines.envs.policies import ChatPolicy
from tentalis_pipelines.envs.runner import episode_to_turns, run_episode, run_episodes
from tentalis_pipelines.inference.transformers_backend import load_policy
from tentalis_pipelines.training import multiturn


class EchoEnv(Environment):
    name = "echo"

    def __init__(self, max_turns: int = 3):
        self.max_turns = max_turns

    def reset(self, task):
        self.n = 0
        return Observation([{"role": "system", "content": "You run shell commands.", "kind": "system"},
                            {"role": "user", "content": "list", "kind": "demonstration"},
                            {"role": "assistant", "content": "```bash\nls\n```", "kind": "demonstration"},
                            {"role": "user", "content": task["prompt"], "kind": "instruction"}])

    def step(self, action):
        self.n += 1
        done = self.n >= self.max_turns
        return StepResult(Observation([{"role": "user", "content": f"output {self.n}: {len(action)} chars\n[exit code 0]",
                                        "kind": "observation"}]), 1.0 if done else 0.0, done,
                          {"end_reason": SUBMITTED} if done else {})

    def verify(self):
        return Verdict(True, 1.0, "echo")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_policy(tiny_model_dir, device="cpu", dtype=torch.float32)


def test_each_prompt_extends_the_last_context_and_the_episode_is_one_segment(tiny):
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=12, temperature=1.0, seed=3)
    ep = run_episode(EchoEnv(), {"task_id": "t", "prompt": "count the lines"}, policy)
    assert ep.turns_used == 3
    for prev, cur in zip(ep.turns, ep.turns[1:]):
        context = prev.prompt_token_ids + prev.token_ids
        assert cur.prompt_token_ids[: len(context)] == context
        assert len(cur.prompt_token_ids) > len(context)  # the observation's tokens came in between
    for t in ep.turns:
        assert len(t.logprobs) == len(t.token_ids) and all(lp <= 0 for lp in t.logprobs)
        assert t.text == tok.decode(t.token_ids, skip_special_tokens=True)
    rows = episode_to_turns(ep, temperature=1.0)
    segments = multiturn.build_segments(rows[0]["session_id"], rows)
    assert len(segments) == 1
    seg = segments[0]
    assert seg.prompt_ids == ep.turns[0].prompt_token_ids
    assert seg.context == ep.turns[-1].prompt_token_ids + ep.turns[-1].token_ids
    for span, turn in zip(seg.spans, ep.turns):
        assert seg.completion_ids[span.start:span.end] == turn.token_ids
        assert seg.old_logps[span.start:span.end] == turn.logprobs
    assert sum(seg.assistant_mask) == sum(len(t.token_ids) for t in ep.turns)


def test_first_prompt_is_the_chat_template(tiny):
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=4)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert policy.prompt_ids(msgs) == tok(text, add_special_tokens=False)["input_ids"]


def test_kept_kv_cache_gives_what_a_fresh_prefill_gives(tiny):
    model, tok = tiny
    cached = ChatPolicy(model, tok, max_new_tokens=10)
    fresh = ChatPolicy(model, tok, max_new_tokens=10)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "count"}]
    for turn in range(3):
        a = cached(msgs)  # one conversation: the KV cache is kept
        b = fresh.generate_batch([msgs])[0]  # batch path: prefill from scratch
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3
        msgs = msgs + [{"role": "assistant", "content": a.text}, {"role": "user", "content": f"out {turn}"}]
    assert cached.kept_caches == 1


def test_batched_episodes_and_a_context_that_no_longer_fits(tiny):
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=6)
    eps = run_episodes(lambda: EchoEnv(max_turns=2), [{"task_id": f"t{i}", "prompt": "go " * i} for i in range(3)],
                       policy.generate_batch)
    assert [e.turns_used for e in eps] == [2, 2, 2] and all(e.end_reason == SUBMITTED for e in eps)
    small = ChatPolicy(model, tok, max_new_tokens=6, max_context_tokens=40)
    ep = run_episode(EchoEnv(), {"task_id": "long", "prompt": "word " * 50}, small)
    assert end_kind(ep.end_reason) == "error" and "exceed" in ep.end_reason


def test_a_new_conversation_reuses_the_kv_of_a_shared_prefix_with_the_same_greedy_output(tiny):
    """Two episodes opening with the same long system prompt (BFCL items over the same tools): the second
    prefills only what follows the shared prefix, and writes what a policy that shares nothing writes."""
    model, tok = tiny
    fed: list[int] = []
    forward = model.forward

    def counting(*args, **kwargs):
        fed.append(int(kwargs["input_ids"].shape[1]))
        return forward(*args, **kwargs)

    system = "You call tools. " + " ".join(f"tool_{i}(x: int) returns x plus {i}." for i in range(40))

    class DocsEnv(EchoEnv):
        def reset(self, task):
            self.n = 0
            return Observation([{"role": "system", "content": system, "kind": "system"},
                                {"role": "user", "content": task["prompt"], "kind": "instruction"}])

    tasks = [{"task_id": "a", "prompt": "add one to 3"}, {"task_id": "b", "prompt": "add two to 5 then print it"}]
    outs = {}
    for share in (False, True):
        policy = ChatPolicy(model, tok, max_new_tokens=6, share_prefixes=share, prefill_block=32)
        model.forward = counting
        try:
            fed.clear()
            first = run_episode(DocsEnv(max_turns=2), tasks[0], policy)
            n_first = len(fed)
            second = run_episode(DocsEnv(max_turns=2), tasks[1], policy)
        finally:
            model.forward = forward
        outs[share] = ([t.token_ids for t in first.turns], [t.token_ids for t in second.turns],
                       [t.prompt_token_ids for t in second.turns], fed[n_first:], [t.logprobs for t in second.turns])
    # The same prompts, the same greedy tokens and, bit for bit, the same log-probs (blocks of 32 positions).
    assert outs[True][:3] == outs[False][:3] and outs[True][4] == outs[False][4]
    prompt_b = outs[True][2][0]
    shared = next(i for i, (x, y) in enumerate(zip(prompt_b, first.turns[0].prompt_token_ids)) if x != y)
    assert shared > 300  # the system prompt's tokens
    def blocks(n):  # the prefill calls of n tokens from a block boundary: blocks of 32, the rest last
        return [32] * (n // 32) + ([n % 32] if n % 32 else [])

    n = len(prompt_b)
    assert outs[False][3][:len(blocks(n))] == blocks(n)  # without sharing: the whole prompt
    cut = shared - shared % 32  # with it: only the blocks after the shared prefix's last whole block
    assert cut >= 288 and outs[True][3][:len(blocks(n - cut))] == blocks(n - cut)
    assert outs[True][3][len(blocks(n - cut))] == 1  # then decoding


def test_the_same_opening_twice_reuses_all_but_its_last_token(tiny):
    """A conversation asked again (a second episode of the same task) lies wholly inside the first one's
    cache: its last prompt token is fed again for the logits, and the greedy reply is the same."""
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=5, min_shared_prefix=4, prefill_block=1)
    msgs = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "add one to 3"}]
    first, again = policy(msgs), policy(msgs)
    assert again.token_ids == first.token_ids and again.prompt_token_ids == first.prompt_token_ids
    assert max(abs(x - y) for x, y in zip(first.logprobs, again.logprobs)) < 1e-4
