"""``inference.packed_linear``: a bf16 linear multiplied by its oneDNN-packed weight gives the plain
product bit for bit, only where it is asked to (inside ``active()``, this thread, no gradients), and never
from a weight that changed since it was packed."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from tentalis_pipelines.inference.packed_linear import PackedLinear, PackedLinears, packing_supported

BF16_KERNELS = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
needs_bf16 = pytest.mark.skipif(not BF16_KERNELS, reason="this CPU has no oneDNN bf16 kernels (avx512_bf16 or AMX): nothing is packed")


class Custom(nn.Linear):  # a subclass with its own forward (an adapter's, a quantised layer's): left alone
    def forward(self, x):
        return super().forward(x) * 2


def _model(dtype=torch.bfloat16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.SiLU(), nn.Linear(48, 40, bias=False), Custom(40, 8)).to(dtype)


def test_packing_is_for_bf16_cpu_models_only():
    assert not packing_supported(_model(torch.float32))
    assert not packing_supported(_model(torch.float16))
    assert not packing_supported(nn.SiLU())  # no parameters
    with torch.device("meta"):
        meta = nn.Linear(4, 4, dtype=torch.bfloat16)
    assert not packing_supported(meta)
    assert packing_supported(_model()) == BF16_KERNELS
    with pytest.raises(ValueError) as err:
        PackedLinears(_model(torch.float32))
    assert str(err.value) == ("PackedLinears needs a bf16 model on a CPU with oneDNN's bf16 kernels (check "
                              "packing_supported(model) first; other models run nn.Linear as they are)")


@needs_bf16
@pytest.mark.parametrize("shape", [(1, 32), (7, 32), (128, 32), (129, 32), (5, 1, 32)])
def test_the_packed_product_is_the_plain_one_bit_for_bit(shape):
    model = _model()
    x = torch.randn(*shape).to(torch.bfloat16)
    with torch.inference_mode():
        want = model(x)
        packs = PackedLinears(model)
        with packs.active():
            got = model(x)
    assert torch.equal(got, want)
    assert packs.repacks == 2  # the two plain linears; the subclass is not packed
    assert [type(m) for m in model] == [PackedLinear, nn.SiLU, PackedLinear, Custom]
    assert packs.modules == [model[0], model[2]]


@needs_bf16
def test_outside_active_with_gradients_or_on_another_thread_it_is_nn_linear():
    model = _model()
    packs = PackedLinears(model)
    x = torch.randn(3, 32).to(torch.bfloat16)
    with torch.no_grad():
        model(x)  # not active: nothing packed
    assert packs.repacks == 0
    with packs.active():
        y = model(x)  # gradients on: the trainer's forward, differentiable
        y.float().sum().backward()
        assert packs.repacks == 0 and model[0].weight.grad is not None
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.no_grad()(model)(x)))
        t.start()
        t.join()
        assert packs.repacks == 0 and len(seen) == 1  # another thread is not inside this block
        with torch.no_grad():
            model(x)
        assert packs.repacks == 2
    with packs.active():
        with packs.active():  # nested: the outer one is back after the inner one
            pass
        with torch.no_grad():
            model(x)
    assert packs.repacks == 2  # the same weights: packed once


@needs_bf16
def test_a_weight_changed_since_packing_is_packed_again():
    """An optimiser step (in place), a new parameter, a state dict loaded: the next product uses the new
    weight. A stale packed copy would decode with the old policy."""
    model = _model()
    packs = PackedLinears(model)
    x = torch.randn(4, 32).to(torch.bfloat16)

    def packed():
        with torch.no_grad(), packs.active():
            return model(x)

    packed()
    assert packs.repacks == 2
    with torch.no_grad():
        model[0].weight.add_(0.5)  # in place: its version moves
    got = packed()
    with torch.no_grad():
        assert torch.equal(got, model(x))
    assert packs.repacks == 3
    model[2].weight = nn.Parameter(torch.randn(40, 48).to(torch.bfloat16))  # a new tensor
    got = packed()
    with torch.no_grad():
        assert torch.equal(got, model(x))
    assert packs.repacks == 4
    keep = model[2].weight  # still alive: same storage, same version counter as the view below
    model[2].weight = nn.Parameter(keep.detach().view(48, 40).t())  # another tensor over the same memory, other values
    assert model[2].weight.data_ptr() == keep.data_ptr() and model[2].weight._version == keep._version
    got = packed()
    with torch.no_grad():
        assert torch.equal(got, model(x))
    assert packs.repacks == 5
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    got = packed()
    with torch.no_grad():
        assert torch.equal(got, model(x))
    assert packs.repacks == 7


@needs_bf16
def test_an_input_or_weight_of_another_dtype_fails_as_nn_linear_does():
    """Inside ``active()`` a float32 input, or a layer whose weight is float32 (a mixed-precision head),
    is not multiplied by a packed bf16 weight: it gets nn.Linear's own error naming the two dtypes."""
    model = _model()
    packs = PackedLinears(model)
    model[2].float()
    with torch.no_grad(), packs.active():
        with pytest.raises(RuntimeError, match="same dtype"):
            model[0](torch.randn(3, 32))
        with pytest.raises(RuntimeError, match="same dtype"):
            model[2](torch.randn(3, 48).to(torch.bfloat16))
        x32 = torch.randn(3, 48)
        assert torch.equal(model[2](x32), x32 @ model[2].weight.t())  # float32 throughout: the plain product
    assert packs.repacks == 0


@needs_bf16
def test_a_packed_model_copies_and_saves_as_before():
    model = _model()
    keys = list(model.state_dict())
    packs = PackedLinears(model)
    with torch.no_grad(), packs.active():
        model(torch.randn(2, 32).to(torch.bfloat16))
    twin = copy.deepcopy(model)  # the packed copies (opaque oneDNN tensors) are the PackedLinears', not the model's
    assert list(twin.state_dict()) == keys and isinstance(twin[0], nn.Linear)
    for a, b in zip(model.state_dict().values(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b)
