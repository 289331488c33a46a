"""The gateway's sampler (tentalis_pipelines/gateway/sampler.py), from its docstrings, over a stand-in
for ``BatchDecoder`` (a unit test builds no model; the decoder has its own tests): every sampling setting
reaches the decoder, a call yields each step and fills its choices, calls share a batch (``peak_rows``)
or are served one at a time (``max_rows=1``), each step holds the policy's lock, a bad request is refused
in the caller's thread, a failed step or a refused request ends its calls with the error while the
batcher keeps serving, an early close cancels the call, the scheduler thread lives only while there is
work, and each policy has one batcher. Written from the mutmut target ``gateway_sampler``'s survivors
(tools/mutants/reports/gateway_sampler.md)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from tentalis_pipelines.gateway import sampler
from tentalis_pipelines.inference.batch_decoder import Choice, DecodeRequest, Step, check_request


class StandInDecoder:
    """``BatchDecoder``'s public surface: choice ``c`` of a request writes token ``10 * step + c`` (its text
    one letter a step), admission is first come first served under ``max_rows`` (an empty batch admits the
    next request), a choice ends at its token limit ("length") or once its text holds a stop string."""

    made: list[StandInDecoder] = []

    def __init__(self, model, tokenizer, *, max_rows=None, prefix_cache_tokens=4096):
        self.model, self.tokenizer, self.max_rows, self.prefix_cache_tokens = model, tokenizer, max_rows, prefix_cache_tokens
        self.pending: list[DecodeRequest] = []
        self.rows: list[tuple[DecodeRequest, int]] = []
        self.seen: list[DecodeRequest] = []
        self.lock = None  # the lock the batcher must hold while stepping (set by a test)
        self.locked_steps: list[bool] = []
        self.fail: Exception | None = None
        StandInDecoder.made.append(self)

    def submit(self, req):
        check_request(req)
        req.choices[:] = [Choice(i) for i in range(req.n)]
        self.seen.append(req)
        self.pending.append(req)
        return req

    def busy(self):
        return bool(self.rows or self.pending)

    def _end(self, req, err):
        if not req.done:
            req.done, req.error = True, err
            if req.on_done is not None:
                req.on_done(err)

    def step(self):
        if self.lock is not None:
            self.locked_steps.append(self.lock.locked())
        for req in {id(r): r for r, _ in self.rows if r.cancelled}.values():
            self.rows = [(r, c) for r, c in self.rows if r is not req]
            self._end(req, None)
        while self.pending and (not self.rows or self.max_rows is None or len(self.rows) + self.pending[0].n <= self.max_rows):
            req = self.pending.pop(0)
            self.rows += [(req, c) for c in range(req.n)]
        if self.fail is not None:
            failed = {id(r): r for r, _ in self.rows}.values()
            self.rows = []
            for req in failed:
                self._end(req, self.fail)
            raise self.fail
        steps: dict[int, Step] = {}
        for req, c in self.rows:
            ch = req.choices[c]
            t = 10 * len(ch.token_ids) + c
            ch.token_ids.append(t)
            ch.logprobs.append(-0.5)
            ch.text += chr(ord("a") + (len(ch.token_ids) - 1) % 26)
            s = steps.setdefault(id(req), Step([], []))
            s.tokens.append((c, t, -0.5))
            hit = [x for x in req.stop if x in ch.text]
            if hit or len(ch.token_ids) >= req.max_new_tokens:
                ch.finish_reason = "stop" if hit else "length"
                if hit:
                    ch.text = ch.text[: ch.text.index(hit[0])]
                s.finished.append(c)
                s.texts[c] = ch.text
        left = []
        for req, c in self.rows:
            if req.choices[c].finish_reason is None:
                left.append((req, c))
        ended = {id(r): r for r, _ in self.rows}
        for req in ended.values():
            if req.on_step is not None:
                req.on_step(steps[id(req)])
        live = {id(r) for r, _ in left}
        self.rows = left
        for req in ended.values():
            if id(req) not in live:
                self._end(req, None)


@pytest.fixture(autouse=True)
def stand_in(monkeypatch):
    monkeypatch.setattr(sampler, "BatchDecoder", StandInDecoder)
    StandInDecoder.made.clear()


def _policy(**extra):
    return SimpleNamespace(model="model", tokenizer="tok", lock=threading.Lock(), **extra)


def _batcher_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "tentalis-batcher")


def _wait(pred) -> None:
    deadline = time.monotonic() + 5
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert pred()


SETTINGS = dict(n=2, max_new_tokens=3, temperature=0.25, top_p=0.5, stop=["zz"], seed=11)


def test_every_setting_reaches_the_decoder_and_a_call_yields_each_step_and_fills_its_choices():
    before = _batcher_threads()
    for run in ("batched", "alone"):
        choices: list = []
        prompt = (5, 6, 7)
        if run == "batched":
            steps = list(sampler.batched_decode(_policy(), prompt, choices=choices, **SETTINGS))
        else:
            steps = list(sampler.decode("model", "tok", prompt, choices=choices, **SETTINGS))
        dec = StandInDecoder.made[-1]
        (req,) = dec.seen
        assert (req.prompt_ids, req.n, req.max_new_tokens, req.temperature, req.top_p, req.stop, req.seed) == (
            [5, 6, 7], 2, 3, 0.25, 0.5, ("zz",), 11)
        assert req.choices is choices and [c.token_ids for c in choices] == [[0, 10, 20], [1, 11, 21]]
        assert [s.tokens for s in steps] == [[(0, 0, -0.5), (1, 1, -0.5)], [(0, 10, -0.5), (1, 11, -0.5)],
                                             [(0, 20, -0.5), (1, 21, -0.5)]]
        assert steps[-1].finished == [0, 1] and choices[0].finish_reason == "length"
        if run == "alone":
            assert (dec.model, dec.tokenizer, dec.prefix_cache_tokens) == ("model", "tok", 0)
    _wait(lambda: _batcher_threads() == before)  # the thread runs only while there is work


def test_the_defaults_of_a_call():
    for run in (lambda: sampler.batched_decode(_policy(), [1]), lambda: sampler.decode("m", "t", [1])):
        steps = list(run())
        (req,) = StandInDecoder.made[-1].seen
        assert (req.n, req.max_new_tokens, req.temperature, req.top_p, req.stop, req.seed) == (1, 128, 1.0, 1.0, (), None)
        assert len(steps) == 128 and req.choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_call_early():
    for run in (lambda ch: sampler.batched_decode(_policy(), [1], stop=("cd",), choices=ch),
                lambda ch: sampler.decode("m", "t", [1], stop=("cd",), choices=ch)):
        ch: list = []
        assert len(list(run(ch))) == 4 and ch[0].text == "ab" and ch[0].finish_reason == "stop"


def test_calls_share_a_batch_unless_max_rows_is_one_and_each_step_holds_the_lock():
    for max_rows, peak in ((4, 3), (1, 2)):
        lock = threading.Lock()
        b = sampler.Batcher("model", "tok", lock, max_rows=max_rows, prefix_cache_tokens=9)
        assert b.lock is lock and b.peak_rows == 0
        assert (b.decoder.max_rows, b.decoder.prefix_cache_tokens) == (max_rows, 9)
        b.decoder.lock = lock
        done = [threading.Event(), threading.Event()]
        reqs = [DecodeRequest([1], n=2, max_new_tokens=4, on_done=lambda err, e=done[0]: e.set()),
                DecodeRequest([1], n=1, max_new_tokens=4, on_done=lambda err, e=done[1]: e.set())]
        with lock:  # both arrive before the first step
            assert b.submit(reqs[0]) is reqs[0]
            b.submit(reqs[1])
        assert all(e.wait(5) for e in done)
        assert b.peak_rows == peak and all(b.decoder.locked_steps) and b.decoder.locked_steps
        assert [c.token_ids for r in reqs for c in r.choices] == [[0, 10, 20, 30], [1, 11, 21, 31], [0, 10, 20, 30]]
    b = sampler.Batcher("model", "tok")
    assert b.decoder.max_rows == sampler.DEFAULT_MAX_BATCH_ROWS and b.decoder.prefix_cache_tokens == 4096
    assert b.lock.acquire(blocking=False)  # a lock of its own


def test_a_bad_request_fails_in_the_callers_thread_and_starts_nothing():
    with pytest.raises(ValueError, match=r"max_rows must be at least 1 \(got 0\)"):
        sampler.Batcher("model", "tok", max_rows=0)
    sampler.Batcher("model", "tok", max_rows=1)
    b = sampler.Batcher("model", "tok")
    before = _batcher_threads()
    for bad in (DecodeRequest([]), DecodeRequest([1], n=0), DecodeRequest([1], top_p=0.0)):
        with pytest.raises(ValueError):
            b.submit(bad)
    assert _batcher_threads() == before and b.decoder.seen == []
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        next(sampler.batched_decode(_policy(), [1], temperature=-1.0))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_failed_step_ends_its_calls_with_the_error_and_the_batcher_keeps_serving():
    policy = _policy()
    b = sampler.batcher_for(policy)
    b.decoder.fail = RuntimeError("the device fell over")
    seen = _Records()
    sampler.log.addHandler(seen)
    try:
        with pytest.raises(RuntimeError, match="the device fell over"):
            list(sampler.batched_decode(policy, [1], max_new_tokens=3))
        _wait(lambda: seen.messages)  # logged on the batcher's thread, after the call was ended
    finally:
        sampler.log.removeHandler(seen)
    assert seen.messages == ["a decoding step failed; its requests were ended with the error"]
    b.decoder.fail = None
    ch: list = []
    assert len(list(sampler.batched_decode(policy, [1], max_new_tokens=3, choices=ch))) == 3 and ch[0].token_ids == [0, 10, 20]


def test_a_request_the_decoder_refuses_ends_with_its_error_and_the_batcher_keeps_serving(monkeypatch):
    policy = _policy()
    b = sampler.batcher_for(policy)
    real = b.decoder.submit

    def refuse(req):
        raise ValueError("the decoder refused it")

    monkeypatch.setattr(b.decoder, "submit", refuse)
    with pytest.raises(ValueError, match="the decoder refused it"):
        list(sampler.batched_decode(policy, [1], max_new_tokens=3))
    plain = DecodeRequest([1])  # no on_done: ended all the same
    b.submit(plain)
    _wait(lambda: plain.done)
    assert str(plain.error) == "the decoder refused it"
    monkeypatch.setattr(b.decoder, "submit", real)
    assert len(list(sampler.batched_decode(policy, [1], max_new_tokens=2))) == 2


def test_closing_a_call_early_cancels_it_and_the_thread_ends():
    before = _batcher_threads()
    policy = _policy()
    ch: list = []
    gen = sampler.batched_decode(policy, [1], max_new_tokens=100_000, choices=ch)
    next(gen)
    running = [t for t in threading.enumerate() if t.name == "tentalis-batcher"]
    assert len(running) == before + 1 and all(t.daemon for t in running)  # never keeps the gateway alive
    gen.close()
    (req,) = policy.batcher.decoder.seen
    assert req.cancelled
    _wait(lambda: _batcher_threads() == before)
    assert ch[0].finish_reason is None and len(ch[0].token_ids) < 100_000
    ch2: list = []
    list(sampler.batched_decode(policy, [1], max_new_tokens=2, choices=ch2))  # a later call starts a new thread
    assert ch2[0].token_ids == [0, 10]


def test_one_batcher_per_policy_with_its_row_limit_and_lock():
    policy = _policy(max_batch_rows=3)
    b = sampler.batcher_for(policy)
    assert policy.batcher is b and sampler.batcher_for(policy) is b and len(StandInDecoder.made) == 1
    assert b.decoder.max_rows == 3 and b.lock is policy.lock and (b.decoder.model, b.decoder.tokenizer) == ("model", "tok")
    assert sampler.batcher_for(_policy()).decoder.max_rows == sampler.DEFAULT_MAX_BATCH_ROWS


class _RacedPolicy:
    """A policy whose batcher another call builds between this call's first look and its look under the lock."""

    def __init__(self, winner):
        self.model, self.tokenizer, self.lock = "model", "tok", threading.Lock()
        self.winner, self.reads, self.stored = winner, 0, None

    @property
    def batcher(self):
        self.reads += 1
        return None if self.reads == 1 else (self.stored or self.winner)

    @batcher.setter
    def batcher(self, b):
        self.stored = b


def test_calls_racing_for_a_policys_batcher_get_the_one_built_first():
    winner = sampler.Batcher("model", "tok")
    policy = _RacedPolicy(winner)
    assert sampler.batcher_for(policy) is winner and policy.stored is None


def test_a_policy_with_its_batcher_never_waits_while_another_is_built(monkeypatch):
    ready = sampler.batcher_for(_policy())
    has_one = _policy()
    has_one.batcher = ready
    building, release = threading.Event(), threading.Event()

    class SlowDecoder(StandInDecoder):
        def __init__(self, *a, **kw):
            building.set()
            release.wait(5)
            super().__init__(*a, **kw)

    monkeypatch.setattr(sampler, "BatchDecoder", SlowDecoder)
    other = threading.Thread(target=sampler.batcher_for, args=(_policy(),))
    other.start()
    try:
        assert building.wait(5)
        got = []
        looker = threading.Thread(target=lambda: got.append(sampler.batcher_for(has_one)))
        looker.start()
        looker.join(1.0)
        assert got == [ready]
    finally:
        release.set()
        other.join(5)
