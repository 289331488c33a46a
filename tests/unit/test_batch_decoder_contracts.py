"""The batched decoder's pure parts (tentalis_pipelines/inference/batch_decoder.py), from their docstrings:
the request check at its exact bounds, ``common_prefix`` at every split, ``kv_position_bytes`` from a
config with and without its optional fields, ``DecodeRequest.cancel``, and the prefix cache's LRU, limits
and hit counters; the KV slab at its exact capacities (growth, slide, cap, compact, dtype, device, metering)
and the block-mode KV store (pieces shared between entries, ``nbytes`` against the distinct storages under
``tensors()``, ``holds``, cuts, eviction ties). Written from the mutmut target ``batch_decoder_parts``'s
survivors (tools/mutants/reports/batch_decoder_parts.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tentalis_pipelines.inference.batch_decoder import (
    DecodeRequest,
    KVStore,
    PrefixCache,
    SlabCache,
    check_request,
    common_prefix,
    fill_holes,
    kv_position_bytes,
    take_rows,
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


# --------------------------------------------------------------------------- the KV slab, from its contract
def _slab_kv(p: int, layers: int = 2, heads: int = 3, dim: int = 4, base: float = 1.0, device: str = "cpu"):
    """One prompt's keys and values, ``[1, heads, p, dim]`` per layer, every element distinct."""
    n = heads * p * dim
    return [(torch.arange(n, dtype=torch.float32, device=device).reshape(1, heads, p, dim) + base + 1000 * i,
             -torch.arange(n, dtype=torch.float32, device=device).reshape(1, heads, p, dim) - base - 1000 * i)
            for i in range(layers)]


def _slab(layers: int = 2, dtype=torch.float64, device: str = "cpu") -> tuple[SlabCache, list[int]]:
    """heads 3 and head_dim 4, so no capacity is mistaken for another dimension; a float64 slab fed
    float32 prompts, so every allocation's dtype shows; every allocation's bytes metered."""
    slab = SlabCache(layers, 3, 4, dtype=dtype, device=torch.device(device))
    seen: list[int] = []
    slab.meter = seen.append
    return slab, seen


def _cap(slab: SlabCache) -> tuple[int, int]:
    return slab.k[0].shape[0], slab.k[0].shape[2]


def _window(slab: SlabCache, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return (slab.k[layer][: slab.rows, :, slab.start: slab.end], slab.v[layer][: slab.rows, :, slab.start: slab.end])


def test_a_new_slab_is_empty_in_its_dtype_and_device_with_a_layer_per_model_layer():
    slab = SlabCache(3, 2, 5, dtype=torch.bfloat16, device=torch.device("meta"))
    assert (slab.rows, slab.start, slab.end, slab.width, slab.nbytes()) == (0, 0, 0, 0, 0)
    assert slab.max_cells is None and slab.meter is None and slab.growth == 2.0
    assert len(slab.k) == len(slab.v) == len(slab.layers) == 3
    for t in (*slab.k, *slab.v):
        assert tuple(t.shape) == (0, 2, 0, 5) and t.dtype == torch.bfloat16 and t.device.type == "meta"
    assert all(layer.is_initialized and layer.get_seq_length() == 0 for layer in slab.layers)
    with pytest.raises(NotImplementedError, match=r"^select rows with SlabCache\.select_rows$"):
        slab.layers[0].batch_select_indices(torch.tensor([0]))


def test_rows_join_at_exact_capacities_and_every_allocation_is_metered_in_the_slabs_dtype():
    slab, seen = _slab()
    slab.append_rows(_slab_kv(5), n=3)  # empty slab: rows to 3, columns to the prompt + 1 + 64 headroom
    assert _cap(slab) == (3, 70) and (slab.rows, slab.start, slab.end) == (3, 0, 5)
    per_tensor = 3 * 3 * 70 * 4 * 8
    assert seen == [per_tensor] * 4 and slab.nbytes() == 4 * per_tensor
    assert all(t.dtype == torch.float64 for t in (*slab.k, *slab.v))
    for layer, (k, v) in enumerate(_slab_kv(5)):
        wk, wv = _window(slab, layer)
        assert torch.equal(wk, k.double().expand(3, -1, -1, -1)) and torch.equal(wv, v.double().expand(3, -1, -1, -1))
    slab.compact()  # to the live block: rows x width + 1
    assert _cap(slab) == (3, 6) and (slab.start, slab.end) == (0, 5)
    seen.clear()
    slab.compact()  # already the live block: no copy
    assert seen == [] and _cap(slab) == (3, 6)


def test_an_emptied_slab_reuses_its_tensors_when_the_prompt_and_one_column_fit_exactly():
    slab, seen = _slab()
    slab.append_rows(_slab_kv(5), n=3)
    slab.select_rows([])
    seen.clear()
    slab.append_rows(_slab_kv(69, base=7.0), n=3)  # 3 rows x (69 + 1) columns: exactly the capacity
    assert seen == [] and _cap(slab) == (3, 70) and (slab.start, slab.end) == (0, 69)
    assert torch.equal(_window(slab)[0][2:3], _slab_kv(69, base=7.0)[0][0].double())
    slab.select_rows([])
    slab.append_rows(_slab_kv(70), n=3)  # one column more than fits with the step's column: grows (doubling)
    assert _cap(slab) == (3, 140) and (slab.start, slab.end) == (0, 70)


def test_joining_rows_grow_only_the_dimension_that_is_full():
    slab, seen = _slab()
    slab.append_rows(_slab_kv(5), n=3)
    slab.compact()  # (3, 6), width 5
    slab.select_rows([0, 1])  # 2 live rows in 3
    seen.clear()
    slab.append_rows(_slab_kv(5, base=3.0), n=1)  # fills the third row exactly, the width + 1 column fits exactly
    assert seen == [] and _cap(slab) == (3, 6)
    slab.append_rows(_slab_kv(5, base=4.0), n=1)  # a fourth row: rows double, the columns stay
    assert _cap(slab) == (6, 6) and slab.rows == 4
    slab.reserve(1)
    slab.advance(1)  # width 6: the slab's columns are full
    slab.select_rows([0, 1, 2, 3])
    slab.append_rows(_slab_kv(3, base=5.0), n=2)  # rows fit exactly (6 of 6), the columns do not: only they grow
    assert _cap(slab) == (6, 71) and slab.rows == 6 and slab.width == 6
    k = _window(slab)[0]
    assert torch.equal(k[4:6, :, :3], torch.zeros(2, 3, 3, 4, dtype=torch.float64))  # left padding of a short prompt
    assert torch.equal(k[4:5, :, 3:], _slab_kv(3, base=5.0)[0][0].double())


def test_a_longer_prompt_uses_the_free_columns_on_the_left_without_a_copy():
    slab, seen = _slab()
    slab.append_rows(_slab_kv(5), n=3)
    slab.select_rows([0, 1])  # a row free
    slab.drop_left(1)
    slab.drop_left(1)  # two padding columns forgotten: start 2, width 3
    assert (slab.start, slab.end, slab.width) == (2, 5, 3)
    assert slab.layers[1].get_seq_length() == 3
    seen.clear()
    slab.append_rows(_slab_kv(5, base=9.0), n=1)  # 2 columns more on the left: exactly the free ones
    assert seen == [] and (slab.start, slab.end) == (0, 5) and slab.rows == 3
    k = _window(slab)[0]
    assert torch.equal(k[:2, :, :2], torch.zeros(2, 3, 2, 4, dtype=torch.float64))  # the old rows' new padding
    assert torch.equal(k[:2, :, 2:], _slab_kv(5)[0][0][:, :, 2:].double().expand(2, -1, -1, -1))


def test_reserve_keeps_slides_or_grows_at_its_exact_bounds():
    slab, seen = _slab()
    slab.append_rows(_slab_kv(5), n=1)  # (1, 70), width 5
    seen.clear()
    slab.reserve(65)  # end + q == capacity: room already
    assert seen == [] and _cap(slab) == (1, 70)
    slab.drop_left(1)
    slab.drop_left(1)  # start 2, width 3
    slab.reserve(68)  # 2 + 3 + 68 > 70 and 3 + 68 > 70 // 2: grows, doubling (more than 3 + 68 + 64)
    assert _cap(slab) == (1, 140) and (slab.start, slab.end) == (0, 3)
    assert torch.equal(_window(slab)[0], _slab_kv(5)[0][0][:, :, 2:].double())
    slab.start, slab.end = 137, 139  # a narrow block at the far right (width 2)
    for t in (*slab.k, *slab.v):
        t[:, :, 137:139] = 2.5
    seen.clear()
    slab.reserve(68)  # width + q = 70 == 140 // 2: half the slab is free padding, slide left, same size
    assert seen == [140 * 3 * 4 * 8] * 4 and _cap(slab) == (1, 140) and (slab.start, slab.end) == (0, 2)
    assert all(bool((t[:, :, :2] == 2.5).all()) for t in (*slab.k, *slab.v))
    slab.start, slab.end = 137, 139
    slab.reserve(69)  # width + q = 71 > 70: grows
    assert _cap(slab) == (1, 280) and (slab.start, slab.end) == (0, 2)


def test_reserve_grows_by_the_headroom_when_doubling_is_less():
    slab, _ = _slab()
    slab.append_rows(_slab_kv(5), n=2)
    slab.compact()  # (2, 6), width 5
    slab.reserve(2)  # max(2 x 6, 5 + 2 + 64)
    assert _cap(slab) == (2, 71) and (slab.start, slab.end) == (0, 5)
    key = torch.zeros(2, 3, 2, 4, dtype=torch.float64) + 0.5
    keys, values = slab.layers[0].update(key, -key)  # the step's two columns, in place at the end
    assert tuple(keys.shape) == tuple(values.shape) == (2, 3, 7, 4)
    assert torch.equal(values[:, :, 5:], -key) and torch.equal(slab.k[0][:2, :, 5:7], key)
    slab.advance(2)
    assert slab.width == 7 and slab.layers[0].get_seq_length() == 7


def test_a_capped_slab_fits_its_allocation_to_the_cells_columns_first():
    slab, _ = _slab(layers=1)
    slab.max_cells = 20
    slab.append_rows(_slab_kv(5, layers=1), n=1)  # wants 1 x 70: one row takes every column the cap allows
    assert _cap(slab) == (1, 20)
    slab.max_cells = 20
    slab.append_rows(_slab_kv(5, layers=1), n=1)  # 2 rows wanted x 20: 2 x 10
    assert _cap(slab) == (2, 10)
    slab.compact()  # (2, 6)
    slab.append_rows(_slab_kv(5, layers=1), n=1)  # wants 4 x 6 = 24 > 20: the rows it needs, 3, no fraction
    assert _cap(slab) == (3, 6)


def test_a_slab_over_its_cells_says_what_it_needed():
    slab, _ = _slab(layers=1)
    slab.max_cells = 3 * 6 - 1
    with pytest.raises(RuntimeError, match=r"^the KV slab needs 3 rows x 6 columns, more than its budget of 17 cells: "
                                           r"the decoder admitted more than its KV budget holds$"):
        slab.append_rows(_slab_kv(5, layers=1), n=3)
    slab.max_cells = 3 * 6
    slab.append_rows(_slab_kv(5, layers=1), n=3)
    assert _cap(slab) == (3, 6)
    slab.reserve(1)  # width + 1 = 6: the column fits exactly
    slab.advance(1)
    slab.max_cells = 3 * 8 - 1
    with pytest.raises(RuntimeError, match="3 rows x 8 columns"):
        slab.reserve(2)  # the slide-or-grow path: it needs width + q columns


def test_compact_keeps_one_row_and_frees_an_empty_slab():
    slab, _ = _slab()
    slab.append_rows(_slab_kv(5), n=1)
    slab.drop_left(2)
    slab.compact()  # one row: shrunk to 1 x (3 + 1), its block at column 0
    assert _cap(slab) == (1, 4) and (slab.start, slab.end) == (0, 3)
    assert torch.equal(_window(slab, 1)[1], _slab_kv(5)[1][1][:, :, 2:].double())
    slab.select_rows([])
    slab.compact()
    assert slab.nbytes() == 0 and (slab.start, slab.end, slab.width) == (0, 0, 0)
    assert all(tuple(t.shape) == (0, 3, 0, 4) and t.dtype == torch.float64 for t in (*slab.k, *slab.v))


def test_a_slab_on_another_device_allocates_there():
    slab = SlabCache(2, 3, 4, dtype=torch.float16, device=torch.device("meta"))
    slab.append_rows(_slab_kv(5, device="meta"), n=2)
    slab.reserve(200)
    slab.select_rows(torch.tensor([1]))
    slab.compact()
    assert slab.rows == 1 and _cap(slab) == (1, 6)
    assert all(t.device.type == "meta" and t.dtype == torch.float16 for t in (*slab.k, *slab.v))


# --------------------------------------------------------------------------- the block-mode KV store, from its contract
def _rows_kv(values: list[float], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """KV whose position ``i`` holds ``values[i]`` in its keys and ``-values[i] - 0.5`` in its values, per layer
    (layer ``j`` adds ``100 j``), ``[1, 3 heads, p, 2]``."""
    out = []
    for j in range(layers):
        k = torch.tensor(values, dtype=torch.float32)[None, None, :, None].expand(1, 3, len(values), 2).clone() + 100 * j
        out.append((k, -k - 0.5))
    return out


def _distinct_bytes(store: KVStore) -> int:
    """The bytes of the distinct storages under ``store.tensors()``, counted here, not by the store."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in store.tensors()}.values())


def _consistent(store: KVStore) -> None:
    assert store.nbytes == _distinct_bytes(store)
    assert set(store.used) == set(store.cuts) == set(store.entries)  # bookkeeping for the entries kept, no other


def _pos(layers: int = 2) -> int:
    return layers * 2 * 3 * 2 * 4  # layers x (k, v) x heads x dim x float32


def test_a_new_store_defaults_and_its_clock_ticks_once_per_put_and_per_hit():
    store = KVStore(4)
    assert (store.min_tokens, store.share, store.clock, store.nbytes, store.evicted, len(store)) == (16, True, 0, 0, 0, 0)
    store.put(list(range(20)), _rows_kv([float(i) for i in range(20)]), torch.zeros(1, 3))
    assert store.clock == 1 and store.used == {tuple(range(20)): 1}
    assert store.lookup([*range(16), 99, 99])[0] == 16  # exactly the default min_tokens shared: a hit
    assert store.clock == 2 and store.lookup([*range(15), 99, 99]) == (0, None, None) and store.clock == 2
    _consistent(store)


def test_extra_cuts_are_the_chunk_ends_strictly_inside_off_the_block_grid():
    store = KVStore(4)
    assert store.extra_cuts(10, (1, 4, 6, 8, 10, 0, -2, 6)) == (1, 6)
    assert store.extra_cuts(10, ()) == () and KVStore(1).extra_cuts(10, (1, 5, 9)) == ()


def test_a_whole_prompt_is_a_hit_even_under_min_tokens_and_a_short_prefix_is_not():
    store = KVStore(4, min_tokens=8)
    store.put([1, 2, 3], _rows_kv([1.0, 2.0, 3.0]), torch.ones(1, 3))
    n, kv, logits = store.lookup([1, 2, 3])
    assert n == 3 and logits is not None and kv[0][0].shape[-2] == 3
    store.put(list(range(10, 20)), _rows_kv([float(i) for i in range(10)]), torch.ones(1, 3))
    assert store.lookup([*range(10, 15), 99, 99, 99]) == (0, None, None)  # 4 reusable (the grid), under 8
    assert store.lookup([*range(10, 19), 99])[0] == 8  # exactly min_tokens


def test_a_single_shared_position_counts_when_min_tokens_allows_it():
    for min_tokens in (0, 1):
        store = KVStore(1, min_tokens=min_tokens)
        store.put([5, 6], _rows_kv([5.0, 6.0]), torch.ones(1, 3))
        n, kv, logits = store.lookup([5, 9])
        assert n == 1 and logits is None and torch.equal(kv[1][0], _rows_kv([5.0])[1][0])
        assert store.lookup([7, 9]) == (0, None, None)
        store.put([5, 8, 8], _rows_kv([5.0, 8.0, 8.0]), torch.ones(1, 3))  # shares its first position with [5, 6]
        assert store.nbytes == (2 + 2) * _pos() and len(store) == 2
        _, kv, _ = store.lookup([5, 8, 8])
        assert torch.equal(kv[0][1], _rows_kv([5.0, 8.0, 8.0])[0][1]) and torch.equal(kv[1][0], _rows_kv([5.0, 8.0, 8.0])[1][0])
        _consistent(store)


def test_put_shares_exactly_min_tokens_positions_and_passes_over_entries_that_share_none():
    store = KVStore(4, min_tokens=4)
    store.put([7, 7, 7, 7, 7], _rows_kv([7.0] * 5), torch.ones(1, 3))  # shares nothing with what follows
    store.put([1, 2, 3, 4, 5, 6], _rows_kv([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), torch.ones(1, 3))
    store.put([1, 2, 3, 4, 9, 9], _rows_kv([1.0, 2.0, 3.0, 4.0, 9.0, 9.0]), torch.ones(1, 3))  # 4 shared: min_tokens
    assert store.nbytes == (5 + 6 + 2) * _pos()
    _consistent(store)
    for ids, values in (([1, 2, 3, 4, 9, 9], [1.0, 2.0, 3.0, 4.0, 9.0, 9.0]), ([1, 2, 3, 4, 5, 6], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])):
        _, kv, logits = store.lookup(ids)
        assert logits is not None and all(torch.equal(a, b) for x, y in zip(kv, _rows_kv(values)) for a, b in zip(x, y))


def test_equal_keys_with_other_values_in_any_layer_are_not_shared():
    store = KVStore(4, min_tokens=4)
    store.put([*range(8), 40], _rows_kv([float(i) for i in range(8)] + [40.0]), torch.ones(1, 3))
    other = _rows_kv([float(i) for i in range(8)] + [50.0])
    other[1] = (other[1][0], other[1][1].clone())
    other[1][1][0, 2, 1, 0] += 1.0  # the second layer's values, one element: the keys all equal
    store.put([*range(8), 50], other, torch.ones(1, 3))
    assert store.nbytes == (9 + 9) * _pos()
    _, kv, _ = store.lookup([*range(8), 50])
    assert kv[1][1][0, 2, 1, 0].item() == -101.5 + 1.0  # its own values, the changed element included
    _consistent(store)


def test_a_conversation_of_three_turns_is_three_pieces_read_back_whole_or_cut_at_any_position():
    """One layer (no second layer to stand in for the first), three turns prefilled at the block grid:
    the entry is a chain of three pieces (4 + 4 + 2 positions); another conversation sharing 9 of them,
    equal element for element, holds those 9 through all three pieces and keeps one position of its own.
    A lookup up to the end of a first piece exactly gives views of the store's tensors; across pieces, a
    copy of the right positions."""
    store = KVStore(4, min_tokens=1)
    values = [float(10 + i) for i in range(10)]

    def rows(v):
        return _rows_kv(v, layers=1)

    for n in (4, 8, 10):
        store.put(list(range(n)), rows(values[:n]), torch.full((1, 3), float(n)))
        _consistent(store)
    assert list(store.entries) == [tuple(range(10))] and store.nbytes == 10 * _pos(1)
    assert len(list(store.tensors())) == 3 * 2  # three pieces, one layer, keys and values
    other = [*range(9), 77]
    store.put(other, rows([*values[:9], 7.0]), torch.ones(1, 3))
    assert store.nbytes == (10 + 1) * _pos(1) and len(list(store.tensors())) == (3 + 4) * 2
    _consistent(store)
    for ids, n, want, viewed, whole in (([*range(4), 99], 4, values[:4], True, False),
                                        ([*range(8), 99], 8, values[:8], False, False),
                                        (list(range(10)), 10, values, False, True),
                                        (other, 10, [*values[:9], 7.0], False, True)):
        got, kv, logits = store.lookup(ids)
        assert got == n and (logits is not None) == whole
        assert torch.equal(kv[0][0], rows(want)[0][0]) and torch.equal(kv[0][1], rows(want)[0][1])
        assert store.holds(kv) == viewed


def test_holds_is_true_only_when_every_tensor_is_the_stores():
    store = KVStore(4, min_tokens=1)
    kv = _rows_kv([1.0, 2.0, 3.0])
    given = list(kv)
    store.put([1, 2, 3], kv, torch.ones(1, 3))  # nothing to share: the store takes the tensors themselves
    assert store.holds(given) and store.nbytes == 3 * _pos()
    mixed = [given[0], _rows_kv([1.0, 2.0, 3.0])[1]]
    assert not store.holds(mixed) and store.holds([]) and not store.holds(_rows_kv([1.0]))


def test_a_prompt_put_again_replaces_its_entry_and_frees_the_old_copy():
    store = KVStore(4, min_tokens=4)
    store.put(list(range(6)), _rows_kv([1.0] * 6), torch.ones(1, 3))
    store.put(list(range(6)), _rows_kv([2.0] * 6), torch.full((1, 3), 2.0))  # other values: nothing shared
    assert len(store) == 1 and store.nbytes == 6 * _pos()
    _, kv, logits = store.lookup(list(range(6)))
    assert logits[0, 0].item() == 2.0 and kv[0][0][0, 0, 0, 0].item() == 2.0
    store.put(list(range(4)), _rows_kv([2.0] * 4), torch.ones(1, 3))  # inside the entry: its pieces, no copy
    assert len(store) == 2 and store.nbytes == 6 * _pos() and len(list(store.tensors())) == (1 + 1) * 2 * 2
    _consistent(store)
    assert store.evict((0, 1, 2, 3, 4, 5)) and store.nbytes == 6 * _pos()  # the shorter entry still holds the storage
    _consistent(store)
    assert store.evict() and store.nbytes == 0 and store.evicted == 2
    _consistent(store)


def test_a_share_found_at_the_common_chunk_end_depends_on_the_entrys_own_cuts():
    """Entry: 10 positions cut at 6; a new prompt cut at 6 shares 9 tokens, its KV differs from the entry's
    at position 8: it shares up to 8, the last chunk end both have below 9 (the grid), 6 + the grid point."""
    store = KVStore(4, min_tokens=1)
    base = [float(i) for i in range(10)]
    store.put(list(range(10)), _rows_kv(base), torch.ones(1, 3), (6,))
    mine = [*base[:8], 80.0, 90.0]
    store.put([*range(9), 99], _rows_kv(mine), torch.ones(1, 3), (6,))
    assert store.nbytes == (10 + 2) * _pos()
    _consistent(store)


def test_the_eviction_order_of_waiting_contexts_and_ties():
    store = KVStore(1, min_tokens=1)
    for ids in ([3, 3], [4, 4], [1, 2], [1]):  # [1] after [1, 2]: both kept, both begin the same waiting prompt
        store.put(ids, _rows_kv([float(i) for i in ids]), torch.ones(1, 3))
    since = store.clock
    # the first waiting prompt is [4, 4] itself (a whole hit still wants its entry), the second extends [3, 3]
    order = store.eviction_order([[4, 4], [3, 3, 9], [1, 2, 5]], since)
    assert order == [(1, 2), (1,), (3, 3), (4, 4)]  # the last needed first; [1, 2] and [1]: least recently used first
    assert store.eviction_order([[3, 3, 9], [4, 4, 9]], since) == [(1, 2), (1,), (4, 4), (3, 3)]


def test_a_slide_under_a_lowered_cap_fits_the_cells_but_never_below_the_live_block():
    slab, _ = _slab()
    slab.append_rows(_slab_kv(5), n=1)
    slab.reserve(68)  # (1, 140)
    slab.start, slab.end = 137, 139  # a narrow block at the far right (width 2)
    slab.max_cells = 100  # the budget shrank since the slab was allocated
    slab.reserve(68)  # slides: 1 x 140 wanted, 100 cells allowed, 70 columns needed
    assert _cap(slab) == (1, 100) and (slab.start, slab.end) == (0, 2)
    slab.start, slab.end = 97, 99
    slab.max_cells = 40
    with pytest.raises(RuntimeError, match=r"needs 1 rows x 50 columns, more than its budget of 40 cells"):
        slab.reserve(48)  # 2 + 48 = 100 // 2: a slide, to 50 columns the lowered cap does not hold


def test_fill_holes_moves_only_the_survivors_beyond_the_holes():
    assert fill_holes([]) == []
    assert fill_holes([0, 1, 2]) == [0, 1, 2]  # nobody left: nothing moves
    assert fill_holes([0, 1]) == [0, 1]  # the last rows left
    assert fill_holes([5]) == [5]
    assert fill_holes([0]) == [0]
    assert fill_holes([1]) == [1]  # the row before it left: it moves up one place
    assert fill_holes([1, 2, 3]) == [3, 1, 2]  # the first row left: the last one takes its place
    assert fill_holes([0, 2, 4, 5, 6, 7]) == [0, 6, 2, 7, 4, 5]  # holes 1 and 3, filled by 6 and 7 in order
    for keep in ([0, 2, 4, 5, 6, 7], [3, 4, 5, 6], [1, 3, 5, 7, 9], list(range(1, 40, 3)), [2, 3]):
        got = fill_holes(keep)
        m = len(keep)
        assert sorted(got) == keep  # the same rows, each once
        assert all(got[j] == j for j in range(m) if j in keep)  # a row in place stays
        assert sum(got[j] != j for j in range(m)) == sum(k >= m for k in keep)  # only as many move as there are holes
        assert [k for k in got if k >= m] == sorted(k for k in keep if k >= m)  # the movers keep their order


def test_take_rows_is_a_view_for_consecutive_rows_and_a_copy_otherwise():
    x = torch.arange(24.0).reshape(6, 4)
    for idx in ([0], [5], [2, 3, 4], [0, 1, 2, 3, 4, 5]):
        got = take_rows(x, idx)
        assert torch.equal(got, x[idx]) and got.data_ptr() == x[idx[0]].data_ptr()  # a view: no copy
    for idx in ([3, 2, 1], [0, 2], [4, 5, 0], [1, 1], [0, 2, 1], [0, 2, 1, 3], [2, 3, 5, 4]):  # the last two span as many rows as they name
        got = take_rows(x, idx)
        assert torch.equal(got, x[idx])
        assert got.data_ptr() != x.data_ptr() or idx[0] != 0
