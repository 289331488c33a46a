"""The continuous-batching KV slab: rows join right-aligned, leave compacted, padding columns go, and
the slab grows without moving anyone's keys out of place (checked against hand-built layouts)."""

from __future__ import annotations

import pytest
import torch

from tentalis_pipelines.inference.batch_decoder import DecodeRequest, PrefixCache, SlabCache, check_request


def _kv(tag: float, p: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A prompt's keys/values: value ``tag + position`` everywhere (values negated), so every column
    says which prompt and position it holds."""
    pos = torch.arange(p, dtype=torch.float32)
    k = (tag + pos)[None, None, :, None].expand(1, 1, p, 2).clone()
    return [(k.clone(), -k.clone()) for _ in range(layers)]


def _live(slab: SlabCache, layer: int = 0) -> torch.Tensor:
    """The live window of the keys, one row per batch row, the first head and dim."""
    return slab.k[layer][: slab.rows, 0, slab.start : slab.end, 0]


def test_rows_join_right_aligned_and_grow_the_window_to_the_left():
    slab = SlabCache(2, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    slab.append_rows(_kv(100, 3), n=2)
    assert (slab.rows, slab.width) == (2, 3)
    assert _live(slab).tolist() == [[100, 101, 102]] * 2
    slab.append_rows(_kv(200, 5), n=1)  # longer than the window: everyone gains two padding columns on the left
    assert (slab.rows, slab.width) == (3, 5)
    assert _live(slab).tolist() == [[0, 0, 100, 101, 102], [0, 0, 100, 101, 102], [200, 201, 202, 203, 204]]
    slab.append_rows(_kv(300, 1), n=1)  # shorter: padded on its own left
    assert _live(slab)[3].tolist() == [0, 0, 0, 0, 300]
    assert torch.equal(slab.v[1][: slab.rows, 0, slab.start : slab.end, 0], -_live(slab, 1))  # values too, every layer


def test_a_step_writes_in_place_at_the_end_column_and_the_slab_grows_when_full():
    slab = SlabCache(1, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    slab.append_rows(_kv(10, 2, layers=1), n=2)
    layer = slab.layers[0]
    for t in range(200):  # far past the first capacity: the slab doubles and keeps every column
        slab.reserve(1)
        new = torch.full((2, 1, 1, 2), 1000.0 + t)
        keys, values = layer.update(new, -new)
        assert keys.shape == (2, 1, 2 + t + 1, 2)
        slab.advance(1)
    assert _live(slab)[0].tolist() == [10, 11, *[1000.0 + t for t in range(200)]]
    assert layer.get_seq_length() == 202


def test_leaving_rows_are_compacted_and_all_padding_columns_dropped():
    slab = SlabCache(2, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    slab.append_rows(_kv(100, 2), n=1)
    slab.append_rows(_kv(200, 4), n=1)
    slab.append_rows(_kv(300, 3), n=1)
    slab.select_rows(torch.tensor([2, 0]))
    assert _live(slab).tolist() == [[0, 300, 301, 302], [0, 0, 100, 101]]
    slab.drop_left(1)
    assert _live(slab).tolist() == [[300, 301, 302], [0, 100, 101]]
    slab.append_rows(_kv(400, 3), n=1)  # the freed left columns are reused, no stale keys show through
    assert _live(slab)[2].tolist() == [400, 401, 402]


def test_the_prefix_cache_reuses_the_longest_shared_prefix_but_never_the_last_token():
    cache = PrefixCache(max_tokens=100, min_tokens=3)
    system = list(range(50, 70))
    cache.store(system + [1, 2, 3], _kv(0, 23, layers=1))
    cache.store(system + [1, 2, 9, 9], _kv(0, 24, layers=1))
    assert cache.lookup(system + [1, 2, 9, 9, 5])[0] == 24
    assert cache.lookup(system + [1, 2, 3])[0] == 22  # the whole stored prompt, less its last token (its logits)
    assert cache.lookup([7, 7, 7, 7])[0] == 0 and cache.lookup(list(range(50, 52)) + [0])[0] == 0  # under min_tokens
    for i in range(10):  # LRU under the token budget
        cache.store([1000 + i] * 20, _kv(0, 20, layers=1))
    assert sum(len(ids) for ids, _ in cache.entries) <= 100


@pytest.mark.parametrize(("field", "value", "message"), [
    ("prompt_ids", [], "prompt is empty"), ("n", 0, "n must be at least 1"), ("max_new_tokens", 0, "max_new_tokens"),
    ("temperature", -1.0, "temperature"), ("top_p", 0.0, "top_p"),
])
def test_a_bad_request_is_refused_naming_the_field(field, value, message):
    req = DecodeRequest([1, 2])
    setattr(req, field, value)
    with pytest.raises(ValueError, match=message):
        check_request(req)


def test_rows_already_in_place_stay_and_the_rest_move_up():
    """Rows 1 and 3 of five leave: row 0 is not copied, rows 2 and 4 move up to 1 and 2."""
    slab = SlabCache(2, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    for tag in (100, 200, 300, 400, 500):
        slab.append_rows(_kv(tag, 2), n=1)
    slab.select_rows([0, 2, 4])
    assert slab.rows == 3
    for layer in (0, 1):
        assert _live(slab, layer).tolist() == [[100, 101], [300, 301], [500, 501]]
        assert (-slab.v[layer][:3, 0, slab.start : slab.end, 0]).tolist() == [[100, 101], [300, 301], [500, 501]]
    slab.select_rows(torch.tensor([0, 1, 2]))  # nobody leaves: nothing moves
    assert _live(slab).tolist() == [[100, 101], [300, 301], [500, 501]]


def test_select_rows_takes_any_order_and_copies_only_the_rows_that_move(monkeypatch):
    """``keep`` in any order (``fill_holes``' order, or a swap where a source is also a destination):
    row ``j`` becomes old row ``keep[j]`` in every layer's keys and values, and a row in place is not
    copied, so the rows beyond the live window keep whatever they held."""
    slab = SlabCache(2, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    for tag in (100, 200, 300, 400, 500, 600):
        slab.append_rows(_kv(tag, 2), n=1)
    for layer in (0, 1):  # a column outside the window, which no copy may touch
        slab.k[layer][:6, 0, slab.end, 0] = torch.arange(6, dtype=torch.float32)
    slab.select_rows([5, 1, 4, 3])  # rows 0 and 2 left: 5 and 4 fill their places
    assert slab.rows == 4
    for layer in (0, 1):
        assert _live(slab, layer).tolist() == [[600, 601], [200, 201], [500, 501], [400, 401]]
        assert (-slab.v[layer][:4, 0, slab.start : slab.end, 0]).tolist() == [[600, 601], [200, 201], [500, 501], [400, 401]]
        assert slab.k[layer][:6, 0, slab.end, 0].tolist() == [0, 1, 2, 3, 4, 5]  # only the window is copied
    slab.select_rows([1, 0, 3, 2])  # swaps: every source is a destination too
    assert _live(slab).tolist() == [[200, 201], [600, 601], [400, 401], [500, 501]]
    for tag in (700, 800, 900, 1000):
        slab.append_rows(_kv(tag, 2), n=1)
    slab.select_rows([7, 1, 2, 6, 5])  # rows 0, 3, 4 take rows 7, 6, 5: three moved rows spanning five
    assert _live(slab).tolist() == [[1000, 1001], [600, 601], [400, 401], [900, 901], [800, 801]]
    slab.select_rows([2])  # one row, moved to the front
    assert slab.rows == 1 and _live(slab).tolist() == [[400, 401]]
    copies = []
    real = torch.Tensor.__setitem__
    monkeypatch.setattr(torch.Tensor, "__setitem__", lambda t, i, v: copies.append(i) or real(t, i, v))
    slab.select_rows([0])
    assert copies == []  # in place: nothing copied


@pytest.fixture
def poisoned_empty(monkeypatch):
    """``torch.empty`` in the slab's module returns NaN-filled tensors: what uninitialised memory may
    hold. A padding column the attention reads (masked or not: NaN times a zero weight is NaN) shows."""
    import tentalis_pipelines.inference.batch_decoder as bd

    real = torch.empty
    monkeypatch.setattr(bd.torch, "empty", lambda *a, **k: real(*a, **k).fill_(float("nan")))


def test_a_grown_slab_shows_no_uninitialised_column_to_anyone(poisoned_empty):
    """Every path that relays the slab out (rows joining past the capacity, a longer prompt widening the
    window to the left, columns running out, the block sliding left after rows left) leaves only written
    values inside the live window: the hand-built layouts of the tests above, with no NaN."""
    slab = SlabCache(2, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    slab._relayout(3, 4, 0)  # a caller's size hint: fresh memory, nothing live yet
    slab.append_rows(_kv(100, 3), n=2)
    slab.append_rows(_kv(200, 5), n=2)  # more rows than the hint and a wider window
    assert _live(slab).tolist() == [[0, 0, 100, 101, 102]] * 2 + [[200, 201, 202, 203, 204]] * 2
    for t in range(40):  # the columns run out twice: grown
        slab.reserve(1)
        for layer in slab.layers:  # a forward pass writes every layer's new column
            keys, values = layer.update(torch.full((4, 1, 1, 2), 1000.0 + t), torch.full((4, 1, 1, 2), -1000.0 - t))
            assert not keys.isnan().any() and not values.isnan().any()
        slab.advance(1)
    slab.select_rows([3])
    slab.drop_left(2)
    slab.reserve(200)  # slides left into memory nobody wrote since the last growth, then grows
    slab.append_rows(_kv(300, 2), n=3)
    for buf in (slab.k, slab.v):
        for layer_buf in buf:
            assert not layer_buf[: slab.rows, :, slab.start : slab.end].isnan().any()
    assert _live(slab)[0].tolist()[-41:] == [204.0, *[1000.0 + t for t in range(40)]]
    assert _live(slab)[1].tolist() == [0.0] * (slab.width - 2) + [300, 301]


def test_with_zero_fill_a_relayout_zeroes_everything_but_the_block_it_copies(monkeypatch):
    """``zero_fill`` (the bf16 decode steps read every column): after a relayout into NaN-filled memory,
    the rows and columns outside the live block are 0, the block holds the rows' keys and values at
    the new offset; without it the rest is left as memory held it (NaN here)."""
    import tentalis_pipelines.inference.batch_decoder as bd

    real_empty = torch.empty
    monkeypatch.setattr(bd.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    for zero_fill in (True, False):
        slab = SlabCache(2, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
        slab.zero_fill = zero_fill
        slab.append_rows(_kv(100, 3), n=2)
        slab._relayout(5, 9, 4)  # 5 rows (2 live), 9 columns, the block at columns 4-6
        assert (slab.start, slab.end, slab.rows) == (4, 7, 2)
        for layer in range(2):
            for buf, sign in ((slab.k, 1), (slab.v, -1)):
                t = buf[layer]
                assert torch.equal(t[:2, :, 4:7, 0], sign * torch.tensor([[[100.0, 101, 102]]] * 2))
                outside = torch.cat([t[2:].flatten(), t[:2, :, :4].flatten(), t[:2, :, 7:].flatten()])
                assert outside.numel() == 5 * 9 * 2 - 2 * 3 * 2
                if zero_fill:
                    assert torch.equal(outside, torch.zeros_like(outside))
                else:
                    assert torch.isnan(outside).all()


def test_a_new_slab_hands_attention_its_window_and_zeroes_nothing_until_asked():
    slab = SlabCache(1, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    assert slab.whole_columns is False and slab.zero_fill is False
    slab.append_rows(_kv(10, 2, layers=1), n=2)
    slab._relayout(3, 8, 1)  # 3 rows of room (2 live), the block at columns 1-2
    slab.reserve(1)
    keys, values = slab.layers[0].update(torch.full((2, 1, 1, 2), 7.0), torch.full((2, 1, 1, 2), -7.0))
    assert keys.shape == values.shape == (2, 1, 3, 2)  # the live window and the new column
    assert keys[0, 0, :, 0].tolist() == [10, 11, 7] and values[1, 0, :, 0].tolist() == [-10, -11, -7]


def test_with_whole_columns_attention_gets_every_column_of_the_live_rows_after_the_write():
    slab = SlabCache(1, 1, 2, dtype=torch.float32, device=torch.device("cpu"))
    slab.zero_fill = True
    slab.append_rows(_kv(10, 2, layers=1), n=2)
    slab._relayout(3, 8, 1)
    slab.reserve(1)
    slab.whole_columns = True
    keys, values = slab.layers[0].update(torch.full((2, 1, 1, 2), 7.0), torch.full((2, 1, 1, 2), -7.0))
    assert keys.shape == values.shape == (2, 1, 8, 2)  # live rows only, all 8 columns
    assert keys.is_contiguous() and values.is_contiguous()
    assert keys[0, 0, :, 0].tolist() == [0, 10, 11, 7, 0, 0, 0, 0]
    assert values[1, 0, :, 0].tolist() == [0, -10, -11, -7, 0, 0, 0, 0]


def test_the_whole_slab_is_read_only_when_zeroed_and_at_most_four_windows_wide():
    from tentalis_pipelines.inference.batch_decoder import step_reads_whole_slab

    for zero_fill, capacity, whole in ((True, 16, True), (True, 17, False), (False, 16, False), (True, 4, True)):
        slab = SlabCache(1, 1, 2, dtype=torch.bfloat16, device=torch.device("cpu"))
        slab.zero_fill = zero_fill
        slab.append_rows(_kv(10, 3, layers=1), n=2)  # width 3: a step's window is 4 columns, four of them 16
        slab._relayout(2, capacity, 0)
        assert step_reads_whole_slab(slab) is whole, (zero_fill, capacity)
