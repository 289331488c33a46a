"""The batched decoder's pure parts (tentalis_pipelines/inference/batch_decoder.py), from their docstrings:
the request check at its exact bounds, ``common_prefix`` at every split, ``kv_position_bytes`` from a
config with and without its optional fields, ``DecodeRequest.cancel``, and the prefix cache's LRU, limits
and hit counters. Written from the mutmut target ``batch_decoder_parts``'s survivors
(tools/mutants/reports/batch_decoder_parts.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tentalis_pipelines.inference.batch_decoder import (
    DecodeRequest,
    PrefixCache,
    check_request,
    common_prefix,
    kv_position_bytes,
)


def test_the_request_check_at_its_exact_bounds():
    check_request(DecodeRequest([1], max_new_tokens=1, temperature=0.0, top_p=1.0))  # greedy, one token, no nucleus cut
    check_request(DecodeRequest([1], temperature=0.5, top_p=0.5))
    for req, says in ((DecodeRequest([]), "^the prompt is empty: give at least one prompt token$"),
                      (DecodeRequest([1], max_new_tokens=0), r"^max_new_tokens must be at least 1 \(got 0\)$"),
                      (DecodeRequest([1], temperature=-0.5), r"^temperature must be >= 0 \(got -0.5\)$"),
                      (DecodeRequest([1], top_p=1.5), r"^top_p must be in \(0, 1\] \(got 1.5\)$"),
                      (DecodeRequest([1], top_p=2.0), r"^top_p must be in \(0, 1\] \(got 2.0\)$")):
        with pytest.raises(ValueError, match=says):
            check_request(req)


def test_common_prefix_at_every_split():
    for n in range(0, 12):
        a = list(range(n))
        assert common_prefix(a, a) == n and common_prefix(a, a + [99]) == n
        for k in range(n):
            b = a[:k] + [-1] + a[k + 1:]
            assert common_prefix(a, b) == k, (n, k)
            assert common_prefix(a[: k + 1], b) == k


def _model(dtype=torch.bfloat16, **cfg):
    p = torch.zeros(1, dtype=dtype)
    return SimpleNamespace(config=SimpleNamespace(**cfg), parameters=lambda: iter([p]))


def test_kv_position_bytes_from_the_config_and_dtype():
    # keys and values (2) x layers x kv heads x head dim x bytes per element
    assert kv_position_bytes(_model(num_attention_heads=8, num_key_value_heads=2, head_dim=16, hidden_size=999,
                                    num_hidden_layers=3)) == 2 * 3 * 2 * 16 * 2
    assert kv_position_bytes(_model(torch.float32, num_attention_heads=8, num_key_value_heads=None, head_dim=None,
                                    hidden_size=64, num_hidden_layers=3)) == 2 * 3 * 8 * 8 * 4
    assert kv_position_bytes(_model(num_attention_heads=4, hidden_size=64, num_hidden_layers=5)) == 2 * 5 * 4 * 16 * 2
    inner = SimpleNamespace(num_attention_heads=4, num_key_value_heads=1, head_dim=32, num_hidden_layers=2)
    wrapped = _model(text_config=inner, num_attention_heads=99, num_hidden_layers=99)
    assert kv_position_bytes(wrapped) == 2 * 2 * 1 * 32 * 2  # a multimodal config: its text model's
    assert kv_position_bytes(_model(text_config=None, num_attention_heads=4, hidden_size=64, num_hidden_layers=1)) == 2 * 4 * 16 * 2


def test_cancel_marks_the_request():
    req = DecodeRequest([1])
    assert req.cancelled is False
    req.cancel()
    assert req.cancelled is True


def _kv(tag: float):
    return [(torch.full((1, 1, 1, 1), tag), torch.full((1, 1, 1, 1), -tag))]


def test_the_prefix_cache_defaults_and_counters():
    cache = PrefixCache()
    assert (cache.max_tokens, cache.min_tokens, cache.hits, cache.hit_tokens, cache.entries) == (4096, 16, 0, 0, [])
    cache.store(list(range(4096)), _kv(1))  # exactly the limit: kept
    assert len(cache.entries) == 1
    cache.store(list(range(4097)), _kv(2))  # one past it: not kept
    assert len(cache.entries) == 1 and cache.entries[0][1][0][0].item() == 1
    assert cache.lookup(list(range(20)) + [-1]) == (20, cache.entries[0][1])
    assert cache.lookup(list(range(30)) + [-1])[0] == 30
    assert (cache.hits, cache.hit_tokens) == (2, 50)


def test_the_prefix_cache_reuses_at_least_min_tokens_and_keeps_the_best_entry():
    cache = PrefixCache(max_tokens=100, min_tokens=4)
    cache.store([1, 2, 3], _kv(9))  # shorter than min_tokens: not kept
    assert cache.entries == []
    cache.store([1, 2, 3, 4], _kv(1))  # exactly min_tokens: kept
    cache.store([1, 2, 3, 4, 5, 6], _kv(2))
    assert [e[0] for e in cache.entries] == [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]
    assert cache.lookup([1, 2, 3, 9]) == (0, None)  # 3 shared: under min_tokens
    first = cache.entries[0][1]
    n, kv = cache.lookup([1, 2, 3, 4, 9])  # exactly min_tokens; both entries share 4: the first is kept
    assert n == 4 and kv is first
    n, kv = cache.lookup([1, 2, 3, 4, 5, 9])
    assert n == 5 and kv[0][0].item() == 2 and [e[0] for e in cache.entries][-1] == [1, 2, 3, 4, 5, 6]
    assert cache.lookup([1, 2, 3, 4, 5, 6])[0] == 5  # the whole prompt stored: its last token is computed anyway
    assert cache.lookup([7]) == (0, None) and (cache.hits, cache.hit_tokens) == (3, 14)


def test_the_prefix_cache_replaces_a_prompt_and_evicts_the_least_recently_used():
    cache = PrefixCache(max_tokens=10, min_tokens=2)
    cache.store([1, 2, 3], _kv(1))
    cache.store([4, 5, 6], _kv(2))
    cache.store([1, 2, 3], _kv(3))  # the same prompt again: replaced, now the most recent
    assert [(e[0], e[1][0][0].item()) for e in cache.entries] == [([4, 5, 6], 2), ([1, 2, 3], 3)]
    cache.store([7, 8, 9, 10], _kv(4))  # 10 tokens: exactly the limit, all kept
    assert [e[0] for e in cache.entries] == [[4, 5, 6], [1, 2, 3], [7, 8, 9, 10]]
    cache.lookup([4, 5, 6, 0])  # used: now the most recent
    cache.store([11, 12], _kv(5))  # 12 tokens: the least recently used ([1, 2, 3]) goes
    assert [e[0] for e in cache.entries] == [[7, 8, 9, 10], [4, 5, 6], [11, 12]]
    off = PrefixCache(max_tokens=0, min_tokens=0)
    off.store([], _kv(1))
    assert off.entries == []  # a zero limit keeps nothing
    one = PrefixCache(max_tokens=1, min_tokens=1)
    one.store([5], _kv(1))
    assert [e[0] for e in one.entries] == [[5]]


def test_kv_position_bytes_is_a_whole_number_of_bytes():
    got = kv_position_bytes(_model(num_attention_heads=4, hidden_size=64, num_hidden_layers=5))
    assert isinstance(got, int) and got == 2 * 5 * 4 * 16 * 2


def test_a_one_token_share_is_a_hit_when_min_tokens_allows_and_a_miss_leaves_the_order():
    cache = PrefixCache(max_tokens=100, min_tokens=1)
    cache.store([5, 6], _kv(1))
    cache.store([7, 8], _kv(2))
    n, kv = cache.lookup([5, 9])
    assert n == 1 and kv[0][0].item() == 1 and [e[0] for e in cache.entries] == [[7, 8], [5, 6]]
    keen = PrefixCache(max_tokens=100, min_tokens=0)
    for i, ids in enumerate(([1, 2], [3, 4], [5, 6])):
        keen.store(ids, _kv(i))
    assert keen.lookup([9, 9]) == (0, None) and [e[0] for e in keen.entries] == [[1, 2], [3, 4], [5, 6]]
