"""The parts of episode decoding that need no model: the block-mode KV store (what it reuses, where it
cuts, what it drops), the slab's capacity under a cap, the rollout engine's choice."""

from __future__ import annotations

import logging

import pytest
import torch

from tentalis_pipelines.inference.batch_decoder import KVStore, SlabCache, common_prefix
from tentalis_pipelines.inference.factory import choose_rollout_engine


def _kv(p: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    k = torch.arange(p, dtype=torch.float32)[None, None, :, None].expand(1, 1, p, 2).clone()
    return [(k.clone(), -k.clone()) for _ in range(layers)]


def _put(store: KVStore, ids: list[int]) -> None:
    store.put(ids, _kv(len(ids)), torch.full((1, 3), float(len(ids))))


@pytest.mark.parametrize(("a", "b", "n"), [([], [], 0), ([1], [], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2], 2),
                                           ([1, 2, 3], [9, 2, 3], 0), ([1, 2, 3, 4, 5], [1, 2, 3, 9, 5], 3),
                                           ((1, 2, 3), [1, 2, 4], 2), (list(range(1000)), [*range(999), -1], 999)])
def test_common_prefix_at_every_boundary(a, b, n):
    assert common_prefix(a, b) == n == common_prefix(b, a)


def test_a_lookup_cuts_the_shared_prefix_to_a_block_boundary_and_keeps_a_token_to_compute():
    store = KVStore(4, min_tokens=4)
    _put(store, list(range(10)))
    assert store.lookup([*range(9), 99])[0] == 8  # 9 shared -> the boundary at 8
    assert store.lookup([*range(8), 99])[0] == 8  # exactly on a boundary
    assert store.lookup([*range(7), 99])[0] == 4
    assert store.lookup([*range(3), 99]) == (0, None, None)  # under min_tokens after the cut
    n, kv, logits = store.lookup([*range(10), 5])  # the whole entry begins the prompt: still cut to the boundary
    assert (n, logits) == (8, None) and kv is not None
    assert store.lookup(list(range(8)))[0] == 4  # a prompt inside the entry: its last token is computed


def test_the_whole_prompt_stored_gives_its_kv_and_logits_without_a_forward_pass():
    store = KVStore(4, min_tokens=1)
    _put(store, [5, 6, 7])
    n, kv, logits = store.lookup([5, 6, 7])
    assert n == 3 and logits is not None and logits[0, 0].item() == 3.0 and kv[0][0].shape[-2] == 3


def test_without_sharing_only_an_entry_that_begins_the_prompt_is_used():
    store = KVStore(2, share=False, min_tokens=2)
    _put(store, [1, 2, 3, 4, 5, 6])  # another conversation sharing four tokens
    assert store.lookup([1, 2, 3, 4, 9, 9]) == (0, None, None)
    _put(store, [1, 2, 3, 4])
    assert store.lookup([1, 2, 3, 4, 9, 9])[0] == 4
    shared = KVStore(2, share=True, min_tokens=2)
    _put(shared, [1, 2, 3, 4, 5, 6])
    assert shared.lookup([1, 2, 3, 4, 9, 9])[0] == 4


def test_put_replaces_the_entries_it_extends_and_evict_drops_the_least_recently_used():
    store = KVStore(1, min_tokens=1)
    _put(store, [1, 2])
    _put(store, [7, 8, 9])
    _put(store, [1, 2, 3])  # the next turn of [1, 2]: the old entry goes
    assert list(store.entries) == [(7, 8, 9), (1, 2, 3)]
    per_position = 2 * 2 * 2 * 4  # layers x (k, v) x dim x float32
    assert store.nbytes == 6 * per_position
    store.lookup([7, 8, 9, 1])  # used: now the most recent
    assert store.evict() and list(store.entries) == [(7, 8, 9)] and store.nbytes == 3 * per_position
    assert store.evict() and not store.evict() and store.nbytes == 0 and store.evicted == 2


def test_a_zero_block_is_refused():
    with pytest.raises(ValueError, match="prefill_block"):
        KVStore(0)


def test_a_capped_slab_grows_only_within_its_cells_and_compact_frees_it():
    slab = SlabCache(1, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    seen = []
    slab.meter = seen.append
    slab.max_cells = 3 * 12
    slab.append_rows(_kv(5, layers=1), n=3)
    rows, cols = slab.k[0].shape[0], slab.k[0].shape[2]
    assert rows * cols <= 36 and rows >= 3 and cols >= 6
    for _ in range(6):  # decode to 11 columns: within the cap
        slab.reserve(1)
        slab.advance(1)
    assert slab.k[0].shape[0] * slab.k[0].shape[2] <= 36 and slab.width == 11
    assert seen and all(b <= 36 * 2 * 4 for b in seen)  # every allocation metered, none over the cap
    with pytest.raises(RuntimeError, match="budget"):
        slab.reserve(2)  # 13 columns x 3 rows: more than the cap holds
    slab.compact()
    assert (slab.k[0].shape[0], slab.k[0].shape[2]) == (3, 12) and slab.width == 11
    slab.rows = 0
    slab.compact()
    assert slab.nbytes() == 0


@pytest.mark.parametrize(("device", "vllm", "engine", "why"), [
    ("cpu", True, "batch_decoder", "not CUDA"),
    ("cuda", True, "vllm", "vLLM installed"),
    ("cuda:1", False, "batch_decoder", "pip install"),
    (torch.device("cpu"), False, "batch_decoder", "not CUDA"),
    ("mps", True, "batch_decoder", "not CUDA"),
])
def test_the_rollout_engine_is_vllm_on_cuda_when_installed_and_the_choice_is_logged(device, vllm, engine, why, caplog):
    with caplog.at_level(logging.INFO, logger="tentalis_pipelines.inference.factory"):
        choice = choose_rollout_engine(device, vllm_installed=vllm)
    assert choice.engine == engine and why in choice.reason
    assert f"rollout engine: {engine}" in caplog.text and choice.reason in caplog.text


def test_without_vllm_here_the_engine_on_cuda_is_the_batch_decoder():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    assert choose_rollout_engine("cuda").engine == "batch_decoder"


def test_the_default_kv_budget_is_the_env_var_else_an_eighth_of_the_host_clamped():
    """$TENTALIS_KV_BUDGET_MB, else an eighth of the host between 1 GiB and 1.5 GiB (the ceiling that keeps a
    level-0 cycle's process under 3 GB)."""
    from tentalis_pipelines.envs.policies import (
        DEFAULT_KV_BUDGET_BYTES,
        MAX_AUTO_KV_BUDGET_BYTES,
        default_kv_budget_bytes,
    )

    gib = 1 << 30
    assert default_kv_budget_bytes({}, 10 * gib) == 5 * gib // 4  # between the bounds: an eighth
    assert default_kv_budget_bytes({}, 8 * gib) == DEFAULT_KV_BUDGET_BYTES == gib  # exactly at the floor
    assert default_kv_budget_bytes({}, 4 * gib) == gib  # below: the floor
    assert default_kv_budget_bytes({}, 0) == gib  # an unknown host size: the floor
    assert default_kv_budget_bytes({}, 12 * gib) == MAX_AUTO_KV_BUDGET_BYTES == 3 * gib // 2  # exactly at the ceiling
    assert default_kv_budget_bytes({}, 12 * gib + 8) == 3 * gib // 2  # just above: the ceiling
    assert default_kv_budget_bytes({}, 24 * gib) == 3 * gib // 2  # this machine: above, the ceiling
    assert default_kv_budget_bytes({}, 512 * gib) == 3 * gib // 2
    # the variable wins over the host, in MiB, fractions allowed; empty or blank means unset
    assert default_kv_budget_bytes({"TENTALIS_KV_BUDGET_MB": "512"}, 512 * gib) == 512 << 20
    assert default_kv_budget_bytes({"TENTALIS_KV_BUDGET_MB": "0.5"}, gib) == 1 << 19
    assert default_kv_budget_bytes({"TENTALIS_KV_BUDGET_MB": " "}, 10 * gib) == 5 * gib // 4
    assert default_kv_budget_bytes({"TENTALIS_KV_BUDGET_MB": "8192"}, 4 * gib) == 8 * gib  # above the ceiling: given
    for bad in ("0", "-1", "nan", "inf", "4GB"):
        with pytest.raises(ValueError, match="TENTALIS_KV_BUDGET_MB"):
            default_kv_budget_bytes({"TENTALIS_KV_BUDGET_MB": bad}, gib)


def _put_cut(store: KVStore, ids: list[int], cuts: tuple[int, ...]) -> None:
    store.put(ids, _kv(len(ids)), torch.full((1, 3), float(len(ids))), cuts)


def test_a_turn_cut_at_the_last_prompts_end_reuses_that_prompt_whole():
    """A conversation's next prompt, cut where its previous prompt ended, reuses all of that prompt's
    KV (10 positions), not only up to the block grid (8); without the cut, the grid."""
    store = KVStore(4, min_tokens=1)
    _put_cut(store, list(range(10)), ())
    nxt = [*range(10), 50, 51, 52]
    assert store.lookup(nxt, (10,))[0] == 10
    assert store.lookup(nxt)[0] == 8
    assert store.lookup(nxt, (10, 0, -3, 13, 99))[0] == 10  # cuts outside (0, len) are not chunk ends


@pytest.mark.parametrize(("cuts", "reusable"), [
    ((6,), 12),     # the same cuts: every chunk end up to the entry's end
    ((5,), 4),      # the request ends a chunk at 5, the entry did not: back to the last common end, 4
    ((7,), 4),      # the entry ends one at 6, the request does not: 6 is no reuse point for it
    ((6, 9), 8),    # they agree below 9: the grid point 8 ends a chunk for both
    ((), 4),        # the entry's extra cut at 6 is below 8 and not the request's: 4
    ((2,), 0),      # a cut the entry lacks below the first grid point: no common chunk end at all
])
def test_a_lookup_reuses_only_up_to_a_chunk_end_both_share_with_the_same_cuts_below(cuts, reusable):
    """Entry: 12 positions cut at 6 (chunk ends 4, 6, 8, 12). Request: the same 12 tokens then others."""
    store = KVStore(4, min_tokens=1)
    _put_cut(store, list(range(12)), (6,))
    n, kv, logits = store.lookup([*range(12), *[99] * 8], cuts)
    assert n == reusable and logits is None
    assert (kv is None) == (reusable == 0)


def test_the_whole_prompt_with_other_cuts_is_no_logits_hit():
    store = KVStore(4, min_tokens=1)
    _put_cut(store, [5, 6, 7, 8, 9, 10], (2,))
    n, _, logits = store.lookup([5, 6, 7, 8, 9, 10], (2,))
    assert n == 6 and logits is not None
    n, _, logits = store.lookup([5, 6, 7, 8, 9, 10], (3,))  # other chunks: the cuts part at 2, before the grid's 4
    assert (n, logits) == (0, None)
    n, _, logits = store.lookup([5, 6, 7, 8, 9, 10])  # no cut: the same, the entry's cut at 2 is not the request's
    assert (n, logits) == (0, None)


def test_the_eviction_order_drops_the_finished_then_the_next_turns_latest_then_the_waiting_furthest():
    """What goes first under the budget, given the waiting prompts: a context no waiting prompt extends
    and unused since they arrived (a finished conversation), then the contexts left since for their next
    turn, latest first (the next call needs the earliest first), then the waiting prompts' own contexts,
    the one needed last first."""
    store = KVStore(1, min_tokens=1)
    _put(store, [1, 1])        # finished
    _put(store, [3, 3])        # extended by the second waiting prompt
    _put(store, [4, 4])        # extended by the first waiting prompt
    since = store.clock        # the waiting prompts arrive
    _put(store, [5, 5])        # left for its next turn, earlier
    _put(store, [6, 6])        # left for its next turn, later
    waiting = [[4, 4, 9], [3, 3, 9, 9]]
    order = store.eviction_order(waiting, since)
    assert order == [(1, 1), (6, 6), (5, 5), (3, 3), (4, 4)]
    assert store.evict(order[0]) and not store.evict(order[0])  # gone once; a missing victim is no eviction
    assert list(store.entries) == [(3, 3), (4, 4), (5, 5), (6, 6)] and store.evicted == 1
    assert store.eviction_order([], store.clock) == [(3, 3), (4, 4), (5, 5), (6, 6)]  # nothing waits: LRU first
    assert store.eviction_order([], 0) == [(6, 6), (5, 5), (4, 4), (3, 3)]  # all used since: latest first


def test_an_entry_used_since_is_not_finished_and_a_shorter_waiting_prompt_wants_nothing_longer():
    store = KVStore(2, min_tokens=1)
    _put(store, [1, 2, 3, 4])
    _put(store, [7, 7])
    since = store.clock
    store.lookup([7, 7, 8])  # used after the waiting prompts arrived
    assert store.eviction_order([[1, 2]], since) == [(1, 2, 3, 4), (7, 7)]  # [1, 2] does not extend [1, 2, 3, 4]
    assert store.eviction_order([[1, 2, 3, 4, 5]], since) == [(7, 7), (1, 2, 3, 4)]


@pytest.mark.parametrize(("growth", "row_caps"), [(2.0, [1, 2, 4, 4, 8]), (1.25, [1, 2, 3, 4, 5])])
def test_a_budgeted_slab_grows_by_a_quarter_where_an_unbudgeted_one_doubles(growth, row_caps):
    """Rows joining one at a time: doubling (rollouts, the gateway) allocates up to twice the live rows;
    a budgeted decoder's slab (``SLAB_GROWTH_UNDER_BUDGET``) grows by a quarter, at least to what it needs."""
    slab = SlabCache(1, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    slab.growth = growth
    caps = []
    for _ in range(5):
        slab.append_rows(_kv(3, layers=1), 1)
        caps.append(slab.k[0].shape[0])
    assert caps == row_caps and slab.rows == 5


def test_a_budgeted_decoder_returns_freed_memory_to_the_os_while_it_runs_only(monkeypatch):
    """Inside ``freed_memory_returned`` glibc maps every block of 128 kB or more on its own (freed KV
    leaves the process); leaving it sets the threshold back to 32 MiB, even after an error, so the rest of
    the process (a training step) does not pay an mmap per allocation."""
    from tentalis_pipelines import hardware
    from tentalis_pipelines.inference.batch_decoder import SLAB_GROWTH_UNDER_BUDGET

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(hardware, "_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    with hardware.freed_memory_returned() as done:
        assert done is True and calls == [(-3, 128 << 10)]
    assert calls[-1] == (-3, 32 << 20)
    with pytest.raises(KeyError), hardware.freed_memory_returned():
        raise KeyError("x")
    assert calls[-1] == (-3, 32 << 20) and len(calls) == 4
    monkeypatch.setattr(hardware, "_mallopt", lambda: None)  # no glibc: nothing set, says so
    with hardware.freed_memory_returned() as done:
        assert done is False
    assert len(calls) == 4
    assert 1 < SLAB_GROWTH_UNDER_BUDGET < 2


def _kv_rows(rows: list[float], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """KV whose position ``i`` holds ``rows[i]`` (keys) and ``-rows[i]`` (values), in every layer."""
    k = torch.tensor(rows, dtype=torch.float32)[None, None, :, None].expand(1, 1, len(rows), 2).clone()
    return [(k.clone(), -k.clone()) for _ in range(layers)]


PER_POSITION = 2 * 2 * 2 * 4  # layers x (k, v) x dim x float32


def test_a_group_shares_its_first_prompt_once_and_frees_it_with_the_last_holder():
    """Three conversations open with the same eight positions, equal keys and values: the store holds
    those once (8 + 3 x 2 positions, not 3 x 10), every conversation's KV reads back as what was put,
    and the shared part is freed only when the last entry that holds it goes (the first conversation's
    own positions are in the same tensors: they go with it)."""
    store = KVStore(4, min_tokens=4)
    first = [float(i) for i in range(8)]
    tails = {c: [100.0 + 10 * c, 101.0 + 10 * c] for c in range(3)}
    for c in range(3):
        store.put([*range(8), 50 + c, 60 + c], _kv_rows(first + tails[c]), torch.zeros(1, 3), (8,))
    assert len(store) == 3 and store.nbytes == (8 + 3 * 2) * PER_POSITION
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in store.tensors()}
    assert sum(held.values()) == store.nbytes  # the count is what the tensors hold, each storage once
    for c in range(3):
        n, kv, logits = store.lookup([*range(8), 50 + c, 60 + c], (8,))
        assert n == 10 and logits is not None
        assert len(kv) == 2 and all(torch.equal(k, e[0]) and torch.equal(v, e[1]) for (k, v), e in zip(kv, _kv_rows(first + tails[c])))
        # the first put kept its tensors as one piece (views); the others gather two pieces: a copy, in flight
        assert store.holds(kv) == (c == 0)
    store.evict((*range(8), 51, 61))
    assert store.nbytes == (8 + 2 + 2) * PER_POSITION  # its own two positions
    store.evict((*range(8), 50, 60))  # the first holder: its tensors are the shared prefix's, still held
    assert store.nbytes == (8 + 2 + 2) * PER_POSITION and len(store) == 1
    store.evict((*range(8), 52, 62))
    assert store.nbytes == 0 and len(store) == 0


def test_equal_tokens_with_other_values_are_not_shared():
    """The same tokens prefilled in other chunks can differ in their last bits: where the values differ,
    the new entry keeps its own copy and reads back its own values."""
    store = KVStore(4, min_tokens=4)
    store.put([*range(8), 50], _kv_rows([float(i) for i in range(9)]), torch.zeros(1, 3))
    other = [float(i) for i in range(8)]
    other[5] += 1e-6  # one element differs
    store.put([*range(8), 51], _kv_rows([*other, 7.0]), torch.zeros(1, 3))
    assert store.nbytes == 18 * PER_POSITION
    _, kv, _ = store.lookup([*range(8), 51])
    assert kv[0][0][0, 0, 5, 0].item() == torch.tensor(other[5]).item() != 5.0
    assert store.holds(kv)  # one piece: the entry's own tensors, no copy


def test_a_next_turn_shares_its_last_turns_context_and_a_prompt_inside_an_entry_copies_nothing():
    """A conversation's next turn keeps only its new positions (the last turn's entry is replaced, its
    KV shared); a prompt that an entry already covers whole adds no bytes at all."""
    store = KVStore(4, min_tokens=1)
    store.put(list(range(6)), _kv_rows([float(i) for i in range(6)]), torch.zeros(1, 3))
    store.put(list(range(9)), _kv_rows([float(i) for i in range(9)]), torch.zeros(1, 3), (6,))
    assert list(store.entries) == [tuple(range(9))] and store.nbytes == 9 * PER_POSITION
    store.put([0, 1, 2, 3], _kv_rows([0.0, 1.0, 2.0, 3.0]), torch.zeros(1, 3))  # a different prompt inside it
    assert len(store) == 2 and store.nbytes == 9 * PER_POSITION
    _, kv, _ = store.lookup([0, 1, 2, 3])
    assert kv[1][1][0, 0, :, 0].tolist() == [-0.0, -1.0, -2.0, -3.0]
