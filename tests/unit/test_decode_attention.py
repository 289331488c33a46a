"""The decode steps' attention (``inference.decode_attention``), from its contract: with a bias it equals
transformers' sdpa attention under the same mask (grouped heads, several rows, each its own padding), it
reads every column it is given and the bias masks what is not the row's, and without a bias it is sdpa."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tentalis_pipelines.inference.decode_attention import (
    NAME,
    decode_attention,
    decode_bias,
    enable_decode_attention,
)


def _module(heads: int, kv_heads: int) -> torch.nn.Module:
    m = torch.nn.Module()
    m.num_key_value_groups, m.is_causal, m.layer_idx = heads // kv_heads, True, 0
    return m


def _case(rows=4, heads=6, kv_heads=2, columns=7, dim=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, 1, dim, generator=g).to(dtype)
    k = torch.randn(rows, kv_heads, columns, dim, generator=g).to(dtype)
    v = torch.randn(rows, kv_heads, columns, dim, generator=g).to(dtype)
    mask = torch.ones(rows, columns, dtype=torch.long)
    for r in range(rows):  # row r: r columns of left padding (row 0 none, the last one all but one)
        mask[r, : min(r * 2, columns - 1)] = 0
    return q, k, v, mask


def _sdpa(q, k, v, mask, heads, kv_heads, scaling):
    return sdpa_attention_forward(_module(heads, kv_heads), q, k, v, mask[:, None, None, :].bool(), scaling=scaling)[0]


def test_with_a_bias_it_equals_sdpa_under_the_same_mask_grouped_heads_and_padded_rows():
    q, k, v, mask = _case()
    want = _sdpa(q, k, v, mask, 6, 2, 0.3)
    got, weights = decode_attention(_module(6, 2), q, k, v, None, scaling=0.3, decode_bias=decode_bias(mask))
    assert weights is None and got.shape == want.shape == (4, 1, 6, 8)
    assert torch.allclose(got, want, atol=1e-6)
    # the last row sees its one unpadded column only: its output is that column's value, for each head's kv head
    last = got[3, 0].view(2, 3, 8)
    assert torch.allclose(last, v[3, :, -1][:, None, :].expand(2, 3, 8), atol=1e-6)


def test_every_column_is_read_and_the_bias_masks_the_ones_outside_the_window():
    """A slab of 12 columns whose live window is [3, 10): columns outside it hold large finite values
    (another row's past, zeros of an unwritten column); the result equals attention over the window."""
    q, k, v, mask = _case(columns=7)
    big_k = torch.full((4, 2, 12, 8), 50.0)
    big_v = torch.full((4, 2, 12, 8), -80.0)
    big_k[:, :, 3:10], big_v[:, :, 3:10] = k, v
    got = decode_attention(_module(6, 2), q, big_k, big_v, None, scaling=None, decode_bias=decode_bias(mask, 3, 12))[0]
    want = _sdpa(q, k, v, mask, 6, 2, 8 ** -0.5)  # scaling None: 1/sqrt(dim)
    assert torch.allclose(got, want, atol=1e-6)


def test_bf16_stays_within_bf16s_rounding_of_float32_sdpa():
    q, k, v, mask = _case(rows=5, heads=9, kv_heads=3, columns=20, dim=16, dtype=torch.bfloat16)
    want = _sdpa(q.float(), k.float(), v.float(), mask, 9, 3, 0.25)
    got = decode_attention(_module(9, 3), q, k, v, None, scaling=0.25, decode_bias=decode_bias(mask))[0]
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() < 0.05  # a bf16 score's rounding (2^-9 relative) through softmax


def test_without_a_bias_or_with_more_than_one_query_it_is_sdpa_itself():
    q, k, v, mask = _case()
    m = _module(6, 2)
    bool_mask = mask[:, None, None, :].bool()
    assert torch.equal(decode_attention(m, q, k, v, bool_mask, scaling=0.3)[0], _sdpa(q, k, v, mask, 6, 2, 0.3))
    q2 = torch.cat([q, q], 2)  # two queries a row (a prefill): sdpa, the bias ignored
    want = sdpa_attention_forward(m, q2, k, v, None, scaling=0.3)[0]
    assert torch.equal(decode_attention(m, q2, k, v, None, scaling=0.3, decode_bias=decode_bias(mask))[0], want)
    # what it hands on, it hands on whole: a keyword sdpa reads (is_causal) and dropout, which the bias path refuses
    acausal = sdpa_attention_forward(m, q2, k, v, None, scaling=0.3, is_causal=False)[0]
    assert not torch.equal(acausal, want)
    assert torch.equal(decode_attention(m, q2, k, v, None, scaling=0.3, is_causal=False)[0], acausal)
    torch.manual_seed(0)
    dropped = sdpa_attention_forward(m, q, k, v, bool_mask, dropout=0.5, scaling=0.3)[0]
    torch.manual_seed(0)
    got = decode_attention(m, q, k, v, bool_mask, dropout=0.5, scaling=0.3, decode_bias=decode_bias(mask))[0]
    assert torch.equal(got, dropped) and not torch.allclose(got, _sdpa(q, k, v, mask, 6, 2, 0.3))


def test_a_bias_of_the_wrong_shape_is_refused_naming_both_shapes():
    q, k, v, mask = _case()
    with pytest.raises(ValueError, match=r"\(4, 1, 1, 6\).*\(4, 1, 1, 7\): one bias per row and key column"):
        decode_attention(_module(6, 2), q, k, v, None, decode_bias=decode_bias(mask[:, 1:]))


def test_decode_bias_masks_padding_and_every_column_outside_the_window_at_the_exact_bounds():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    inf = float("-inf")
    assert decode_bias(mask)[:, 0, 0].tolist() == [[inf, 0, 0], [0, 0, 0]]
    b = decode_bias(mask, 2, 6)[:, 0, 0].tolist()
    assert b == [[inf, inf, inf, 0, 0, inf], [inf, inf, 0, 0, 0, inf]]
    assert decode_bias(mask, 3, 6)[:, 0, 0, 3:].tolist() == [[inf, 0, 0], [0, 0, 0]]  # the window ends at the last column
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:  # float32 whatever torch's default: the scores it is added to are float32
        assert decode_bias(mask, 0, 3).dtype == torch.float32
    finally:
        torch.set_default_dtype(default)
    with pytest.raises(ValueError, match="do not fit"):
        decode_bias(mask, 4, 6)
    with pytest.raises(ValueError, match="do not fit"):
        decode_bias(mask, -1, 6)
    assert decode_bias(torch.zeros(0, 0, dtype=torch.long)).shape == (0, 1, 1, 0)


def _model(impl: str | None, device: str = "cpu", params: bool = True):
    m = torch.nn.Linear(2, 2) if params else torch.nn.Module()
    if device != "cpu":
        m = types.SimpleNamespace(config=None, parameters=lambda: iter([torch.empty(0, device="meta")]))
    m.config = types.SimpleNamespace(_attn_implementation=impl)
    return m


def test_only_a_cpu_model_on_sdpa_is_switched_and_switching_again_is_a_no_op():
    m = _model("sdpa")
    assert enable_decode_attention(m) and m.config._attn_implementation == NAME
    assert enable_decode_attention(m) and m.config._attn_implementation == NAME
    for impl in ("eager", "flash_attention_2", None):
        other = _model(impl)
        assert not enable_decode_attention(other) and other.config._attn_implementation == impl
    off_cpu = _model("sdpa", device="meta")
    assert not enable_decode_attention(off_cpu) and off_cpu.config._attn_implementation == "sdpa"
    bare = _model("sdpa", params=False)
    assert not enable_decode_attention(bare) and bare.config._attn_implementation == "sdpa"
    assert not enable_decode_attention(torch.nn.Linear(2, 2))  # no config at all
    no_attr = _model("sdpa")
    no_attr.config = types.SimpleNamespace()  # a config that names no attention implementation
    assert not enable_decode_attention(no_attr)


def test_switching_registers_the_function_and_sdpas_mask_under_its_name():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    for registry in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS):  # process-global: start from neither
        registry._global_mapping.pop(NAME, None)
    assert NAME not in ALL_ATTENTION_FUNCTIONS and NAME not in ALL_MASK_ATTENTION_FUNCTIONS
    assert enable_decode_attention(_model("sdpa"))
    assert ALL_ATTENTION_FUNCTIONS[NAME] is decode_attention
    assert ALL_MASK_ATTENTION_FUNCTIONS[NAME] is sdpa_mask
