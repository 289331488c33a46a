"""Linear layers with their bf16 weights packed once for oneDNN, for the batch decoder's forward passes on a CPU.

A bf16 ``torch.nn.functional.linear`` on a CPU runs oneDNN's matrix product with the weight in its plain
layout, so every call reorders the weight into oneDNN's blocked layout first; for a decode step (128 rows
x 576 inputs in SmolLM2-135M) that reorder is a large part of the product: the LM head ``[128, 576] x
[576, 49152]`` took 23.3 ms against 19.2 ms with the weight packed once, a gate projection 0.59 against
0.57 ms, 16 rows 0.155 against 0.106 ms (one host, two threads; ``bench/README.md``). Packed, a bf16
rollout of the bench's 16 x 8 samples took 0.87x the time, with every token and log-prob the same.

``PackedLinears(model)`` turns every plain ``nn.Linear`` of a CPU bf16 model into a ``PackedLinear`` (its
class swapped in place: the same parameters, state dict and ``isinstance``; ``copy.deepcopy`` works) and
holds the packed copies itself; a ``PackedLinear`` uses them only inside ``PackedLinears.active()`` on the
thread that entered it, with gradients off and a bf16 CPU input. Everywhere else (the trainer's forward
and backward, Hugging Face's ``generate``, another thread) it is ``nn.Linear.forward``. A weight changed
since it was packed (an optimiser step, a merged adapter, ``load_state_dict``: its ``_version`` or its
storage moves) is packed again before its next use, so a decoder never reads a stale weight.

Cost: one more copy of the linear weights (SmolLM2-135M: 0.27 GB in bf16) for as long as the
``PackedLinears`` lives; the batch decoder keeps one only outside block mode (rollouts and the gateway),
the agent episodes' memory bound was measured without it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

# The batch size oneDNN picks the packed layout for: the rollouts' usual rows (16 prompts x 8 samples). The
# product is exact for any number of rows (16 rows ran 1.5x faster than unpacked as well).
ROWS_HINT = 128

_state = threading.local()  # .packs: the PackedLinears active on this thread, or None


def packing_supported(model: nn.Module) -> bool:
    """Whether ``model`` is one whose linears ``PackedLinears`` packs: bf16 parameters on a CPU with
    oneDNN's bf16 kernels (``avx512_bf16`` or AMX; an AVX2-only CPU has none)."""
    p = next(model.parameters(), None)
    return (p is not None and p.device.type == "cpu" and p.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` that, inside ``PackedLinears.active()``, multiplies by its packed weight (module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packs: PackedLinears | None = getattr(_state, "packs", None)
        if packs is None or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.bfloat16 \
                or self.weight.dtype != torch.bfloat16:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, packs.weight(self), self.bias, "none", [], "")


class PackedLinears:
    """The packed weights of one model's linears (module doc). ``repacks`` counts the weights packed."""

    def __init__(self, model: nn.Module):
        if not packing_supported(model):
            raise ValueError("PackedLinears needs a bf16 model on a CPU with oneDNN's bf16 kernels "
                             "(check packing_supported(model) first; other models run nn.Linear as they are)")
        self.modules: list[PackedLinear] = []
        for m in model.modules():
            if type(m) is nn.Linear:  # not a subclass: an adapter's or a quantised layer's forward is its own
                m.__class__ = PackedLinear
            if isinstance(m, PackedLinear):
                self.modules.append(m)
        # id(module) -> (the weight packed: a weak reference, its storage, its version; the packed copy)
        self._packed: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}
        self.repacks = 0

    def weight(self, module: PackedLinear) -> torch.Tensor:
        """``module``'s packed weight, packed again if the weight changed since (its identity, storage or version)."""
        w = module.weight
        hit = self._packed.get(id(module))
        if hit is None or hit[0]() is not w or hit[1] != w.data_ptr() or hit[2] != w._version:
            hit = (weakref.ref(w), w.data_ptr(), w._version, torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT))
            self._packed[id(module)] = hit
            self.repacks += 1
        return hit[3]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The packed weights in use on this thread for the block's forward passes (without gradients)."""
        prev = getattr(_state, "packs", None)
        _state.packs = self
        try:
            yield
        finally:
            _state.packs = prev
