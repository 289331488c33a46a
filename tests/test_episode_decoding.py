"""Agent episodes through the continuous-batching decoder (``ChatPolicy`` over ``BatchDecoder`` in block
mode), on the tiny random Llama: the log-probs of an episode that shares its group's first prompt equal a
recomputation; outputs are the same bit for bit with and without sharing and whether a conversation's KV
was kept or evicted and recomputed; the KV budget is never exceeded; every turn's prompt extends the last
context exactly."""

from __future__ import annotations

import pytest
import torch

from tentalis_pipelines.envs.base import SUBMITTED, Environment, Observation, StepResult, Verdict
from tentalis_pipelines.envs.policies import ChatPolicy
from tentalis_pipelines.envs.runner import run_episodes
from tentalis_pipelines.inference.batch_decoder import SlabCache, kv_position_bytes
from tentalis_pipelines.inference.transformers_backend import load_policy

SYSTEM = "You run shell commands in a sandbox. Answer with one fenced bash block. " * 4


class GroupEnv(Environment):
    """A terminal-like episode: a long shared system text and a worked example, the task's instruction,
    then observations of different lengths per turn (so conversations of one group diverge)."""

    name = "group"

    def __init__(self, max_turns: int = 3):
        self.max_turns = max_turns

    def reset(self, task):
        self.n = 0
        return Observation([{"role": "system", "content": SYSTEM, "kind": "system"},
                            {"role": "user", "content": "list the files", "kind": "demonstration"},
                            {"role": "assistant", "content": "```bash\nls\n```", "kind": "demonstration"},
                            {"role": "user", "content": task["prompt"], "kind": "instruction"}])

    def step(self, action):
        self.n += 1
        done = self.n >= self.max_turns
        obs = f"output {self.n}: {len(action)} chars " + "x" * (len(action) % 7) + "\n[exit code 0]"
        return StepResult(Observation([{"role": "user", "content": obs, "kind": "observation"}]), 1.0 if done else 0.0, done,
                          {"end_reason": SUBMITTED} if done else {})

    def verify(self):
        return Verdict(True, 1.0, "group")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_policy(tiny_model_dir, device="cpu", dtype=torch.float32)


def _tasks(groups: int = 2, g: int = 3) -> list[dict]:
    return [{"task_id": f"t{k}", "prompt": f"count the lines of file {k} " * (k + 1)} for k in range(groups) for _ in range(g)]


def _run(policy: ChatPolicy, tasks: list[dict], turns: int = 3):
    eps = run_episodes(lambda: GroupEnv(turns), tasks, policy.generate_batch)
    return eps, [[(t.prompt_token_ids, t.token_ids, t.logprobs) for t in e.turns] for e in eps]


def _recomputed(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    logits = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_a_shared_prefix_episodes_logprobs_equal_a_recomputation(tiny):
    """Three episodes of one task (the same first prompt, prefilled once) sampled at 0.8: every turn's
    recorded log-probs equal one forward pass over its prompt + completion at that temperature."""
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=10, temperature=0.8, seed=4, prefill_block=16, min_shared_prefix=16)
    eps, _ = _run(policy, _tasks(groups=1, g=3), turns=2)
    first = [e.turns[0].prompt_token_ids for e in eps]
    assert first[0] == first[1] == first[2]
    assert len({tuple(e.turns[0].token_ids) for e in eps}) > 1  # each episode samples its own stream
    # the group's first prompt was prefilled once: the other two took it whole from the store
    assert policy.stats["reused_tokens"] >= 2 * len(first[0])
    for e in eps:
        for t in e.turns:
            expected = _recomputed(model, t.prompt_token_ids, t.token_ids, 0.8)
            assert torch.allclose(torch.tensor(t.logprobs), expected, atol=1e-4), (t.logprobs, expected.tolist())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_are_the_same_bit_for_bit_with_and_without_sharing(tiny, temperature):
    """Two tasks x three episodes, three turns: the same prompts, tokens and log-probs (exactly) whether
    the shared first prompts and kept contexts are reused or every prompt is prefilled from scratch;
    sharing prefilled fewer positions."""
    model, tok = tiny
    runs, stats = {}, {}
    for share in (True, False):
        policy = ChatPolicy(model, tok, max_new_tokens=8, temperature=temperature, seed=7, prefill_block=16,
                            min_shared_prefix=16, share_prefixes=share)
        if not share:
            policy.decoder.store.lookup = lambda ids, cuts=(): (0, None, None)  # nothing reused at all: every prompt from scratch
        _, runs[share] = _run(policy, _tasks())
        stats[share] = policy.stats
    assert runs[True] == runs[False]
    assert stats[True]["prefill_tokens"] < stats[False]["prefill_tokens"]
    assert stats[False]["reused_tokens"] == 0 and stats[True]["reused_tokens"] > 0


def test_the_store_keeps_a_groups_first_prompt_once(tiny):
    """Two tasks x three episodes, three turns, no budget: the store holds each conversation's last
    context, and the KV its tensors hold (each storage once) is less than those contexts' positions:
    a group's first prompt and each conversation's earlier turns are kept once, not once per entry.
    Never below what the distinct prefixes need: at least the longest context of each task."""
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=8, temperature=0.9, seed=7, prefill_block=16, min_shared_prefix=16)
    eps, _ = _run(policy, _tasks(groups=2, g=3))  # sampled: the three episodes of a task part after the first prompt
    store, pb = policy.decoder.store, kv_position_bytes(model)
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in store.tensors()}.values())
    contexts = sum(len(key) for key in store.entries)
    assert len(store) == 6 and held == store.nbytes
    longest = {e.task_id: max(len(t.prompt_token_ids) for t in e.turns) for e in eps}
    assert sum(longest.values()) * pb <= held < contexts * pb
    first = {e.task_id: len(e.turns[0].prompt_token_ids) for e in eps}
    assert held <= (contexts - 2 * sum(first.values())) * pb  # each task's first prompt: once, not three times


def _budget_for(model, rows: int, prompt: int, max_new: int, spare_positions: int) -> int:
    """The bytes ``rows`` rows of ``prompt + max_new`` positions need beside a prefill of ``prompt`` (with
    the decoder's one-tensor copy slack), plus ``spare_positions`` for kept KV."""
    pb = kv_position_bytes(model)
    tensors = 2 * model.config.num_hidden_layers

    def slack(n: int) -> int:
        return n + -(-n // tensors)

    return slack(rows * (prompt + max_new) * pb) + slack(prompt * pb) + spare_positions * pb


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_an_episode_whose_kv_was_evicted_and_recomputed_writes_what_one_that_kept_it_writes(tiny, temperature):
    """The same episodes under a budget that keeps every context and under one that holds the batch's
    rows but little kept KV (so waiting conversations' KV is evicted and recomputed by prefill when they
    re-enter): the same rows decode together, and every token and log-prob is the same, bit for bit."""
    model, tok = tiny
    tasks = _tasks(groups=2, g=2)
    kept = ChatPolicy(model, tok, max_new_tokens=8, temperature=temperature, seed=3, prefill_block=16,
                      min_shared_prefix=16, max_rows=len(tasks), kv_budget_bytes=1 << 34)
    eps, out_kept = _run(kept, tasks)
    longest = max(len(t.prompt_token_ids) for e in eps for t in e.turns)
    budget = _budget_for(model, len(tasks), longest, 8, spare_positions=0)
    evicting = ChatPolicy(model, tok, max_new_tokens=8, temperature=temperature, seed=3, prefill_block=16,
                          min_shared_prefix=16, max_rows=len(tasks), kv_budget_bytes=budget)
    _, out_evicted = _run(evicting, tasks)
    s_kept, s_ev = kept.stats, evicting.stats
    assert s_kept["kv_evictions"] == 0 and s_ev["kv_evictions"] > 0
    assert s_ev["deferred_admissions"] == 0 and s_ev["max_rows"] == s_kept["max_rows"] == len(tasks)
    assert s_ev["prefill_tokens"] > s_kept["prefill_tokens"]  # the evicted contexts were prefilled again
    assert out_evicted == out_kept
    assert s_ev["kv_peak_bytes"] <= budget


def test_the_kv_budget_is_never_exceeded_and_fewer_rows_decode_at_once(tiny, monkeypatch):
    """A budget for about two rows: six episodes decode at most a few rows at a time, waiting
    conversations' KV is evicted, and the KV held (the slab's tensors, the store's, a prefill in flight;
    measured independently of the decoder's own count at every forward pass and slab allocation) never
    exceeds the budget; the episodes all finish with what an unbounded run gives (greedy)."""
    model, tok = tiny
    tasks = _tasks(groups=2, g=3)
    free = ChatPolicy(model, tok, max_new_tokens=8, prefill_block=16, min_shared_prefix=16, kv_budget_bytes=1 << 34)
    eps, _ = _run(free, tasks)
    longest = max(len(t.prompt_token_ids) for e in eps for t in e.turns)
    budget = _budget_for(model, 2, longest, 8, spare_positions=0)
    policy = ChatPolicy(model, tok, max_new_tokens=8, prefill_block=16, min_shared_prefix=16, kv_budget_bytes=budget)
    dec = policy.decoder
    seen: list[int] = []

    def held(extra: int = 0) -> int:  # what the tensors hold now, summed from the tensors themselves
        slab = sum(t.numel() * t.element_size() for t in (*dec.cache.k, *dec.cache.v)) if dec.cache is not None else 0
        store = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in dec.store.tensors()}.values())  # shared pieces once
        return slab + store + dec._inflight + extra

    forward = model.forward

    def watched(*args, **kwargs):
        seen.append(held())
        return forward(*args, **kwargs)

    real_relayout = vars(SlabCache)["_relayout"]

    def relayout(self, row_cap, col_cap, offset):
        # tensor by tensor: the peak is the old slab + one new tensor, or the new slab + one old tensor
        elem = self.k[0].element_size()
        old_one = self.k[0].numel() * elem
        seen.append(held(row_cap * self.kv_heads * col_cap * self.head_dim * elem))
        real_relayout(self, row_cap, col_cap, offset)
        seen.append(held(old_one))

    monkeypatch.setattr(SlabCache, "_relayout", relayout)
    model.forward = watched
    try:
        eps_b, _ = _run(policy, tasks)
    finally:
        model.forward = forward
    s = policy.stats
    assert seen and max(seen) <= budget and 0 < s["kv_peak_bytes"] <= budget
    assert s["max_rows"] < len(tasks) and s["deferred_admissions"] > 0 and s["kv_evictions"] > 0
    assert [e.end_reason for e in eps_b] == [SUBMITTED] * len(tasks)
    assert [[t.token_ids for t in e.turns] for e in eps_b] == [[t.token_ids for t in e.turns] for e in eps]


def test_a_prompt_that_cannot_fit_the_budget_even_alone_is_that_conversations_error(tiny):
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=8, prefill_block=16, kv_budget_bytes=kv_position_bytes(model) * 100)
    msgs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "word " * 60}]]
    short, long = policy.generate_batch(msgs)
    assert not isinstance(short, BaseException) and len(short.token_ids) >= 1
    assert isinstance(long, ValueError) and "kv_budget_bytes" in str(long) and "raise the budget" in str(long)
    assert policy.stats["kv_peak_bytes"] <= kv_position_bytes(model) * 100


def test_each_turns_prompt_extends_the_last_context_exactly_in_a_batch(tiny):
    """Six episodes decoded together, three turns: each turn's prompt is the previous prompt + the tokens
    it sampled + the tokenizer's ids of the template text that follows (no re-tokenisation of the whole
    conversation), and the policy returns that prompt for the turn."""
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=8, temperature=1.0, seed=2, prefill_block=16, min_shared_prefix=16)
    eps, _ = _run(policy, _tasks())
    for e in eps:
        assert e.turns_used == 3
        for prev, cur in zip(e.turns, e.turns[1:]):
            context = prev.prompt_token_ids + prev.token_ids
            assert cur.prompt_token_ids[: len(context)] == context
            rest_text = tok.decode(cur.prompt_token_ids[len(context):], skip_special_tokens=False)
            assert tok(rest_text, add_special_tokens=False)["input_ids"] == cur.prompt_token_ids[len(context):]
            assert "output" in rest_text  # the observation came in between


def test_a_turn_ends_at_its_closed_action_block_and_only_that_row_stops(tiny):
    """``stop_when`` (the policy's closed-fenced-block rule) ends a row with "stop" at the token that makes
    it true; the other rows of the batch decode on to their limit. The policy's rule: a closed block, not
    an open one."""
    from tentalis_pipelines.inference.batch_decoder import BatchDecoder, DecodeRequest

    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=8)
    ids = tok("Run it:\n```bash\nls -la\n```", add_special_tokens=False)["input_ids"]
    assert policy._closed_block(ids) and not policy._closed_block(ids[:-1])
    dec = BatchDecoder(model, tok, prefill_block=16)
    prompt = tok("count the lines", add_special_tokens=False)["input_ids"]
    stopped = dec.submit(DecodeRequest(prompt, max_new_tokens=10, temperature=0.0, track_text=False,
                                       stop_when=lambda toks: len(toks) >= 3))
    free = dec.submit(DecodeRequest(prompt, max_new_tokens=10, temperature=0.0, track_text=False))
    dec.run()
    assert stopped.choices[0].finish_reason == "stop" and len(stopped.choices[0].token_ids) == 3
    assert free.choices[0].finish_reason == "length" and len(free.choices[0].token_ids) == 10
    assert free.choices[0].token_ids[:3] == stopped.choices[0].token_ids


def test_a_special_token_sampled_mid_reply_keeps_the_next_prompt_an_exact_extension(tiny, monkeypatch):
    """The model samples a special token (``<issue_comment>``) in the middle of a reply: the reply's text
    drops it, the context keeps it, and the next turn's prompt still extends that context exactly (it
    used to be tokenised again from the conversation's text, so the episode split in two segments). The
    sampler is scripted on top of the real model's log-probs."""
    import tentalis_pipelines.envs.policies as policies
    import tentalis_pipelines.inference.batch_decoder as bd

    model, tok = tiny
    special = tok.convert_tokens_to_ids("<issue_comment>")
    word = tok(" hello", add_special_tokens=False)["input_ids"][0]
    script, drawn = [word, special, word, word], []

    def scripted(logits, temperature, top_p, gen):
        nxt = torch.full((logits.shape[0],), script[min(len(drawn), len(script) - 1)], dtype=torch.long)
        drawn.append(int(nxt[0]))
        return nxt, torch.log_softmax(logits, -1).gather(1, nxt[:, None]).squeeze(1)

    monkeypatch.setattr(bd, "sample_tokens", scripted)
    monkeypatch.setattr(policies, "sample_next", lambda *a: (lambda t, lp: (t, lp.tolist()))(*scripted(*a)), raising=False)
    policy = ChatPolicy(model, tok, max_new_tokens=4, temperature=1.0)
    msgs = [{"role": "system", "content": "You run shell commands."}, {"role": "user", "content": "count the lines"}]
    first = policy(msgs)
    assert first.token_ids == script and "<issue_comment>" not in first.text
    drawn.clear()
    msgs = msgs + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "output: 3\n[exit code 0]"}]
    second = policy(msgs)
    context = first.prompt_token_ids + first.token_ids
    assert second.prompt_token_ids[: len(context)] == context


def test_a_failed_call_leaves_no_request_behind_for_the_next(tiny):
    """The model fails mid-call: that call raises, and the next call decodes only its own conversations
    (none of the failed call's requests still queued), as a fresh policy would."""
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=4, max_rows=1, prefill_block=16)
    convs = [[{"role": "user", "content": f"task {i}"}] for i in range(3)]
    forward, calls = model.forward, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return forward(*args, **kwargs)

    model.forward = failing
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            policy.generate_batch(convs)
    finally:
        model.forward = forward
    assert not policy.decoder.busy()
    again = policy.generate_batch(convs[:1])
    fresh = ChatPolicy(model, tok, max_new_tokens=4, max_rows=1, prefill_block=16).generate_batch(convs[:1])
    assert len(again) == 1 and again[0].token_ids == fresh[0].token_ids


def test_a_conversations_next_turn_prefills_only_what_came_after_its_last_prompt(tiny):
    """Each later turn's request is cut where the previous turn's prompt ended, so its prefill is the
    tokens sampled since and the observation, exactly: len(prompt_k) - len(prompt_k-1), never the rest
    of a block before them (with 16-position blocks and prompts that end off the grid)."""
    model, tok = tiny
    policy = ChatPolicy(model, tok, max_new_tokens=8, prefill_block=16, min_shared_prefix=16, kv_budget_bytes=1 << 34)
    counts: list[int] = []

    def generate(conversations):
        out = policy.generate_batch(conversations)
        counts.append(policy.decoder.prefill_tokens)
        return out

    eps = run_episodes(lambda: GroupEnv(4), _tasks(groups=1, g=1), generate)
    prompts = [len(t.prompt_token_ids) for t in eps[0].turns]
    assert len(prompts) == 4 and any(p % 16 for p in prompts[:-1])  # off the grid, where a block cut would show
    assert counts[0] == prompts[0]
    assert [b - a for a, b in zip(counts, counts[1:])] == [b - a for a, b in zip(prompts, prompts[1:])]


def test_the_eviction_order_prefills_less_than_least_recently_used_and_changes_no_output(tiny):
    """Under a budget that holds the batch's rows and a few kept contexts, turns that visit every
    conversation in the same order make least-recently-used drop the very context the next request
    reuses; the store's order (``KVStore.eviction_order``) keeps those and prefills less, with the same
    tokens and log-probs bit for bit. Six conversations with no first prompt in common: groups would
    share their prefix's KV and need fewer evictions to show an order."""
    model, tok = tiny
    tasks = _tasks(groups=6, g=1)
    free = ChatPolicy(model, tok, max_new_tokens=8, prefill_block=16, min_shared_prefix=16, kv_budget_bytes=1 << 34)
    eps, out_free = _run(free, tasks, turns=4)
    longest = max(len(t.prompt_token_ids) for e in eps for t in e.turns)
    budget = _budget_for(model, len(tasks), longest, 8, spare_positions=longest)
    runs, stats = {}, {}
    for order in ("store", "lru"):
        policy = ChatPolicy(model, tok, max_new_tokens=8, prefill_block=16, min_shared_prefix=16, kv_budget_bytes=budget)
        if order == "lru":
            store = policy.decoder.store
            store.eviction_order = lambda waiting, since, store=store: list(store.entries)
        _, runs[order] = _run(policy, tasks, turns=4)
        stats[order] = policy.stats
    assert runs["store"] == runs["lru"] == out_free
    assert stats["store"]["kv_evictions"] > 0 and stats["lru"]["kv_evictions"] > 0
    assert stats["store"]["prefill_tokens"] < stats["lru"]["prefill_tokens"]
    assert stats["store"]["kv_peak_bytes"] <= budget
