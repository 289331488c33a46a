"""How far a training pass runs after a request arrives: the abort latency, counted in decoder layers.

A stack of toy decoder layers (``ToyDecoderLayer``: ``install_hooks`` finds layers by that name suffix)
stands in for the model. The gateway's request is the activity stamp moving while layer ``k`` computes;
the window must raise ``Preempted`` before layer ``k + 1`` computes anything, in the forward pass and in
the backward pass. Latency is then at most one layer's compute (SmolLM2-135M has 30 layers; see
``docs/gateway.md``), with no wall-clock timing in the test.
"""

from __future__ import annotations

import pytest
import torch

from tentalis_pipelines import activity
from tentalis_pipelines.stages.idle_window import WindowRun
from tentalis_pipelines.training.progress import Preempted, ProgressStore

LAYERS = 8


class ToyDecoderLayer(torch.nn.Module):
    def __init__(self, index: int, log: list):
        super().__init__()
        self.index, self.log = index, log
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.log.append(("forward", self.index))
        return torch.tanh(self.lin(x))


def _window(tmp_path):
    """A window's checkpointing with run_window's defaults, yielding when the activity stamp moves."""
    marker = activity.activity_path(tmp_path)
    activity.touch(marker)
    baseline = activity.last_activity_ns(marker)
    window = WindowRun(ProgressStore(tmp_path / "p.pt"), 1, lambda: activity.last_activity_ns(marker) != baseline)
    return marker, window.checkpointing()


def _request(marker):
    ns = activity.last_activity_ns(marker) + 1_000_000  # a later stamp, as the gateway's touch writes
    marker.touch()
    import os

    os.utime(marker, ns=(ns, ns))


@pytest.mark.parametrize("k", [0, 3, LAYERS - 2])
def test_a_request_during_layer_k_forward_stops_the_pass_before_layer_k_plus_1(tmp_path, k):
    log: list = []
    layers = torch.nn.Sequential(*[ToyDecoderLayer(i, log) for i in range(LAYERS)])
    marker, cp = _window(tmp_path)
    handles = cp.install_hooks(layers)
    layers[k].register_forward_hook(lambda *_: _request(marker))
    with pytest.raises(Preempted):
        layers(torch.ones(2, 4, requires_grad=True))
    for h in handles:
        h.remove()
    assert log == [("forward", i) for i in range(k + 1)]  # layer k finished; layer k + 1 never started


@pytest.mark.parametrize("k", [LAYERS - 1, 4, 1])
def test_a_request_during_layer_k_backward_stops_the_pass_before_the_layer_below(tmp_path, k):
    log: list = []
    layers = torch.nn.Sequential(*[ToyDecoderLayer(i, log) for i in range(LAYERS)])
    marker, cp = _window(tmp_path)
    handles = cp.install_hooks(layers)
    loss = layers(torch.ones(2, 4, requires_grad=True)).sum()
    log.clear()
    for i, layer in enumerate(layers):  # a layer's weight gradient: that layer's backward computed
        layer.lin.weight.register_hook(lambda g, i=i: log.append(("backward", i)))
    layers[k].lin.weight.register_hook(lambda g: _request(marker))
    with pytest.raises(Preempted):
        loss.backward()
    for h in handles:
        h.remove()
    # Backward runs from the last layer down. The request lands while layer k's backward computes; the
    # check on the gradient of layer k - 1's output raises before layer k - 1's backward.
    ran = [i for what, i in log if what == "backward"]
    assert ran == list(range(LAYERS - 1, k - 1, -1)), ran
