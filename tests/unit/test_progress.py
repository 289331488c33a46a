"""A training run's saved progress, by hand and without a model: the file is replaced atomically (a save
that fails keeps the previous progress), a foreign or unreadable file is refused with the fix, the yield
poll's throttling, and what a progress's fingerprint is valid for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tentalis_pipelines.training.progress import (
    FORMAT,
    Checkpointing,
    Preempted,
    Progress,
    ProgressStore,
    fingerprint,
)


def _progress(**kw) -> Progress:
    raw = dict(fingerprint="fp-1", iteration=1, step=2, micro=3, params={"lora_A": torch.arange(4.0)}, optimizer={"state": {}},
               grads={"lora_A": torch.ones(4)}, totals={"loss": 0.25}, history=[{"step": 0, "loss": 0.5}],
               fixed={(0, 0): {"old": torch.zeros(2), "ref": None}}, rng=torch.get_rng_state(), micro_steps=7, meta={"policy": "c1"})
    return Progress(**{**raw, **kw})


def test_a_progress_round_trips_and_a_failed_save_keeps_the_previous_one(tmp_path):
    store = ProgressStore(tmp_path / "run" / "progress.pt")
    assert store.load() is None and not store.exists()
    store.save(_progress())
    got = store.load()
    assert got.position == (1, 2, 3) and got.micro_steps == 7 and got.meta == {"policy": "c1"}
    assert torch.equal(got.params["lora_A"], torch.arange(4.0)) and torch.equal(got.grads["lora_A"], torch.ones(4))
    assert got.history == [{"step": 0, "loss": 0.5}] and torch.equal(got.fixed[(0, 0)]["old"], torch.zeros(2))
    # A save that fails half-way (a value torch cannot serialise) leaves the previous progress whole, and no temporary file.
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
        store.save(_progress(step=5, meta={"callback": lambda: None}))
    assert store.load().position == (1, 2, 3)
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["progress.pt"]
    store.clear()
    assert store.load() is None


def test_a_foreign_or_unreadable_progress_is_refused_with_the_fix(tmp_path):
    store = ProgressStore(tmp_path / "progress.pt")
    torch.save({**_progress().__dict__, "format": FORMAT + 1}, store.path)
    with pytest.raises(ValueError, match=f"has format {FORMAT + 1}, expected {FORMAT}: delete it"):
        store.load()
    store.path.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="(?s)progress.pt cannot be read .*delete it to start the run over"):
        store.load()


def test_checkpointing_settings_are_checked():
    with pytest.raises(ValueError, match="every must be >= 0 micro-steps, got -1"):
        Checkpointing(store=None, every=-1)
    with pytest.raises(ValueError, match="needs a store"):
        Checkpointing(store=None, every=2)
    assert Checkpointing(store=None, every=0).every == 0


def test_a_forced_poll_is_never_throttled_and_a_yield_names_the_last_save():
    calls = []
    answers = iter([False, True])

    def should_yield():
        calls.append(1)
        return next(answers)

    cp = Checkpointing(store=None, every=0, should_yield=should_yield, poll_s=3600.0)
    cp.check(force=True)  # polls: no
    cp.check(force=False)  # within poll_s of the last poll: not polled
    assert len(calls) == 1
    cp.micro_steps, cp.steps, cp.saved = 9, 2, (0, 1, 0)
    with pytest.raises(Preempted) as err:
        cp.check(force=True)  # a micro-step boundary polls whatever the time
    assert len(calls) == 2 and (err.value.micro_steps, err.value.steps, err.value.saved) == (9, 2, (0, 1, 0))
    Checkpointing(store=None, every=0).check()  # no predicate: never yields


def _row(**kw):
    raw = dict(prompt_ids=[1, 2], completion_ids=[3, 4], advantage=1.0, token_advantages=None, old_logps=[-0.5, -0.25],
               temperature=1.0, loss_mask=None)
    return SimpleNamespace(**{**raw, **kw})


def test_the_fingerprint_names_the_rows_config_starting_step_parameters_and_step_plan():
    rows, config, names = [_row(), _row(advantage=-1.0)], {"beta": 0.0, "lr": 1e-5}, ["a.lora_A", "a.lora_B"]
    base = fingerprint(rows, config, 4, names, [1, 1])
    assert fingerprint([_row(), _row(advantage=-1.0)], dict(config), 4, list(names), [1, 1]) == base  # the same run: the same fingerprint
    changed = {
        "row order": fingerprint(rows[::-1], config, 4, names, [1, 1]),
        "advantage": fingerprint([_row(advantage=0.5), rows[1]], config, 4, names, [1, 1]),
        "old log-probs": fingerprint([_row(old_logps=[-0.5, -0.3]), rows[1]], config, 4, names, [1, 1]),
        "temperature": fingerprint([_row(temperature=0.7), rows[1]], config, 4, names, [1, 1]),
        "loss mask": fingerprint([_row(loss_mask=[1, 0]), rows[1]], config, 4, names, [1, 1]),
        "config": fingerprint(rows, {**config, "beta": 0.04}, 4, names, [1, 1]),
        "parent's step": fingerprint(rows, config, 5, names, [1, 1]),
        "parameters": fingerprint(rows, config, 4, names[:1], [1, 1]),
        "step plan": fingerprint(rows, config, 4, names, [2]),
    }
    assert [k for k, v in changed.items() if v == base] == []


class ToyDecoderLayer(torch.nn.Linear):
    """Named like a transformer block: ``install_hooks`` hooks modules whose class ends in DecoderLayer."""


def test_the_poll_runs_inside_each_layers_forward_and_backward_until_the_hooks_are_removed():
    polls = []
    cp = Checkpointing(store=None, every=0, should_yield=lambda: polls.append(1) is not None, poll_s=0.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(ToyDecoderLayer(3, 3), torch.nn.ReLU(), ToyDecoderLayer(3, 2))
    handles = cp.install_hooks(model)
    assert len(handles) == 4  # a pre-hook and a forward hook on each of the two layers
    out = model(torch.ones(1, 3, requires_grad=True)).sum()
    assert len(polls) == 2  # before each layer's forward
    out.backward()
    assert len(polls) == 4  # and once in each layer's backward
    for h in handles:
        h.remove()
    model(torch.ones(1, 3, requires_grad=True)).sum().backward()
    assert len(polls) == 4
    assert Checkpointing(store=None, every=0).install_hooks(model) == []  # nothing to poll: no hooks
