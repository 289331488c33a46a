"""The gateway's ``PolicyHolder`` against a real serving pointer (lakehouse, checkpoints, promote and
rollback). Only the model loader is replaced, by one that records what it was asked to load: loading
even the tiny model is the integration tier's job (tests/test_gateway.py)."""

from __future__ import annotations

import json
import logging
import shutil
import time

import pytest

from tentalis_pipelines.gateway import policy as gp
from tentalis_pipelines.inference import transformers_backend
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving


@pytest.fixture
def loads(monkeypatch):
    """Every model load as (model_dir, adapter_dir, device, dtype); the model is a fresh object per load."""
    calls: list[tuple] = []

    def fake_load_policy(model_dir, adapter_dir, *, device, dtype):
        calls.append((model_dir, adapter_dir, device, dtype))
        return object(), f"tokenizer-{len(calls)}"

    monkeypatch.setattr(transformers_backend, "load_policy", fake_load_policy)
    return calls


def _checkpoint(lake: Lakehouse, root, cid: str):
    folder = root / "adapters" / cid
    folder.mkdir(parents=True)
    (folder / ckpt.MARKER).write_text(json.dumps({"files": []}))
    ckpt.record_checkpoint(lake, {"checkpoint_id": cid, "parent_id": None, "base_model": "m", "adapter_uri": str(folder),
                                  "algorithm": "grpo", "config": {}, "trained_on": [], "trajectory_ids": [],
                                  "trajectory_count": 0, "metrics": {}, "promoted": False})
    return folder


def test_nothing_serves_before_the_first_load(tmp_path, loads):
    holder = gp.PolicyHolder(Lakehouse(tmp_path / "lake"), tmp_path / "model", poll_seconds=0)
    with pytest.raises(RuntimeError, match="no policy loaded yet"):
        holder.current()
    assert loads == [] and holder.switches == [] and holder.last_error is None


def test_load_takes_what_the_pointer_names_with_the_holders_settings(tmp_path, loads):
    lake = Lakehouse(tmp_path / "lake")
    holder = gp.PolicyHolder(lake, str(tmp_path / "model"), poll_seconds=0, device="cpu", dtype="float32", max_batch_rows=3)
    base = holder.load()
    assert holder.current() is base
    assert (base.version, base.adapter_dir, base.max_batch_rows, base.batcher) == ("base", None, 3, None)
    assert base.tokenizer == "tokenizer-1"
    assert loads == [(tmp_path / "model", None, "cpu", "float32")]  # the base model: no adapter
    folder = _checkpoint(lake, tmp_path, "c1")
    serving.promote(lake, "c1", actor="t", reason="r")
    c1 = holder.load()
    assert (c1.version, c1.adapter_dir, c1.max_batch_rows) == ("c1", folder.as_posix(), 3)
    assert loads[-1] == (tmp_path / "model", folder, "cpu", "float32")


def test_a_policy_made_by_hand_has_the_documented_defaults(tmp_path):
    p = gp.Policy(version="v", model=None, tokenizer=None)
    assert (p.adapter_dir, p.max_batch_rows, p.batcher) == (None, 64, None)
    assert p.lock.acquire(blocking=False)  # its own lock, free
    assert gp.Policy(version="w", model=None, tokenizer=None).lock is not p.lock
    holder = gp.PolicyHolder(Lakehouse(tmp_path / "lake"), "m")
    assert (holder.poll_seconds, holder.device, holder.dtype, holder.max_batch_rows) == (2.0, "auto", "auto", 64)


def test_refresh_switches_only_when_the_pointer_moves_and_keeps_the_old_policy_for_requests_in_flight(tmp_path, loads, caplog):
    caplog.set_level(logging.INFO, logger=gp.log.name)
    lake = Lakehouse(tmp_path / "lake")
    holder = gp.PolicyHolder(lake, tmp_path / "model", poll_seconds=0, device="cpu", dtype="bfloat16", max_batch_rows=5)
    assert holder.refresh() is True  # nothing loaded yet: the first refresh loads the base model
    assert holder.switches == [("", "base")]
    first = holder.current()
    assert holder.refresh() is False and holder.current() is first and len(loads) == 1  # unmoved: no reload
    folder = _checkpoint(lake, tmp_path, "c1")
    serving.promote(lake, "c1", actor="t", reason="r")
    assert holder.refresh() is True
    new = holder.current()
    assert (new.version, new.adapter_dir, new.max_batch_rows) == ("c1", folder.as_posix(), 5)
    assert loads[-1] == (tmp_path / "model", folder, "cpu", "bfloat16")
    assert first.version == "base"  # a request holding the old policy keeps it
    serving.rollback(lake, actor="t", reason="back")
    assert holder.refresh() is True and holder.current().version == "base"
    assert holder.switches == [("", "base"), ("base", "c1"), ("c1", "base")]
    assert [r.getMessage() for r in caplog.records] == ["serving policy switched: None -> base", "serving policy switched: base -> c1",
                                                        "serving policy switched: c1 -> base"]


def test_an_unloadable_pointer_keeps_the_current_policy_and_says_why_until_a_good_one_serves(tmp_path, loads, caplog):
    lake = Lakehouse(tmp_path / "lake")
    holder = gp.PolicyHolder(lake, tmp_path / "model", poll_seconds=0)
    serving_now = holder.load()
    folder = _checkpoint(lake, tmp_path, "c1")
    serving.promote(lake, "c1", actor="t", reason="r")
    shutil.rmtree(folder)  # the adapter is gone
    assert holder.refresh() is False
    assert holder.current() is serving_now and holder.switches == []
    assert "c1" in holder.last_error and "rollback" in holder.last_error
    [rec] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert rec.getMessage() == f"serving pointer cannot be loaded, still serving base: {holder.last_error}"
    serving.rollback(lake, actor="t", reason="back")  # base serves again: same version as loaded
    assert holder.refresh() is False and "c1" in holder.last_error
    _checkpoint(lake, tmp_path, "c2")
    serving.promote(lake, "c2", actor="t", reason="r")
    assert holder.refresh() is True and holder.current().version == "c2"
    assert holder.last_error is None  # a successful switch clears the error


def _wait(cond, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_watch_thread_polls_the_pointer_and_stops(tmp_path, loads):
    lake = Lakehouse(tmp_path / "lake")
    holder = gp.PolicyHolder(lake, tmp_path / "model", poll_seconds=0.02)
    holder.load()
    holder.start()
    thread = holder._thread
    assert thread is not None and thread.is_alive() and thread.daemon and thread.name == "tentalis-policy-watch"
    holder.start()  # a second start keeps the one watcher
    assert holder._thread is thread
    _checkpoint(lake, tmp_path, "c1")
    serving.promote(lake, "c1", actor="t", reason="r")
    _wait(lambda: holder.current().version == "c1")
    holder.stop()
    assert not thread.is_alive()


def test_the_watch_thread_keeps_watching_after_a_load_fails(tmp_path, loads, monkeypatch, caplog):
    lake = Lakehouse(tmp_path / "lake")
    holder = gp.PolicyHolder(lake, tmp_path / "model", poll_seconds=0.02)
    holder.load()
    real = transformers_backend.load_policy
    broken = [True]

    def flaky(model_dir, adapter_dir, *, device, dtype):
        if broken[0]:
            raise OSError("disk hiccup while reading the adapter")
        return real(model_dir, adapter_dir, device=device, dtype=dtype)

    monkeypatch.setattr(transformers_backend, "load_policy", flaky)
    _checkpoint(lake, tmp_path, "c1")
    serving.promote(lake, "c1", actor="t", reason="r")
    holder.start()
    try:
        _wait(lambda: holder.last_error == "disk hiccup while reading the adapter")
        _wait(lambda: any(r.getMessage() == "policy refresh failed" and r.exc_info for r in caplog.records))
        assert holder.current().version == "base"
        broken[0] = False
        _wait(lambda: holder.current().version == "c1")  # a later poll loads it: the watcher lived on
    finally:
        holder.stop()
    assert holder.last_error is None


def test_a_poll_interval_of_zero_starts_no_watcher(tmp_path, loads):
    holder = gp.PolicyHolder(Lakehouse(tmp_path / "lake"), tmp_path / "model", poll_seconds=0)
    holder.start()
    assert holder._thread is None
    holder.stop()  # nothing to join
