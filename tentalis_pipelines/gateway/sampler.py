"""Token-by-token sampling for the gateway, continuously batched: concurrent calls share each forward pass.

Every policy has one ``Batcher``: a scheduler thread driving a ``BatchDecoder``
(``tentalis_pipelines.inference.batch_decoder``). A call submits its prompt (exact token ids), ``n``
and sampling settings, and ``batched_decode`` yields each step's new tokens as the batch produces
them, so a streamed reply goes out as the model writes it while other calls decode beside it. The
thread runs only while there is work (a policy no request holds any more is freed with it) and holds
the policy's lock for each step, so other users of the model (prompt scoring) interleave between steps.

The sampled token's log-probability is taken at the sampling temperature (the greedy one's from the
raw logits), as ``TransformersBackend`` records it for rollouts, so live turns carry the same
old-policy log-probs the trainer uses.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

from tentalis_pipelines.inference.batch_decoder import (
    BatchDecoder,
    Choice,
    DecodeRequest,
    Step,
    check_request,
)

__all__ = ["Batcher", "Choice", "Step", "batched_decode", "batcher_for", "decode"]

log = logging.getLogger(__name__)

# Rows one batch holds at most (choices of all calls together): beyond it calls wait for rows to end.
DEFAULT_MAX_BATCH_ROWS = 64


class Batcher:
    """The scheduler thread of one policy: takes submitted requests at every step boundary and steps
    the batch while anything is left. ``max_rows=1`` serves one call at a time (the baseline the
    gateway bench compares batching with)."""

    def __init__(self, model, tokenizer, lock: threading.Lock | None = None, *, max_rows: int = DEFAULT_MAX_BATCH_ROWS,
                 prefix_cache_tokens: int = 4096):
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1 (got {max_rows})")
        self.decoder = BatchDecoder(model, tokenizer, max_rows=max_rows, prefix_cache_tokens=prefix_cache_tokens)
        self.lock = lock or threading.Lock()
        self._cond = threading.Condition()
        self._incoming: list[DecodeRequest] = []
        self._thread: threading.Thread | None = None
        self.peak_rows = 0  # the most rows one step decoded together (for /health and the tests)

    def submit(self, req: DecodeRequest) -> DecodeRequest:
        check_request(req)  # a bad request fails in the caller's thread, before it joins anything
        with self._cond:
            self._incoming.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tentalis-batcher", daemon=True)
                self._thread.start()
        return req

    def _run(self) -> None:
        dec = self.decoder
        while True:
            with self._cond:
                incoming, self._incoming = self._incoming, []
                if not incoming and not dec.busy():
                    self._thread = None  # the next submit starts a new thread
                    return
            for req in incoming:
                try:
                    dec.submit(req)
                except Exception as exc:  # noqa: BLE001 - checked at submit; reported to its caller if it still fails
                    req.done, req.error = True, exc
                    if req.on_done is not None:
                        req.on_done(exc)
            try:
                with self.lock:
                    dec.step()
                self.peak_rows = max(self.peak_rows, len(dec.rows))
            except Exception:  # noqa: BLE001 - every request of the failed batch got the error; keep serving
                log.exception("a decoding step failed; its requests were ended with the error")


def batcher_for(policy) -> Batcher:
    """The policy's batcher, created on first use (``policy.max_batch_rows`` rows at most), once even when
    calls race for it; a policy that has its batcher never waits while another policy's is built."""
    b = getattr(policy, "batcher", None)
    if b is None:
        with _create_lock:
            b = getattr(policy, "batcher", None)
            if b is None:
                b = Batcher(policy.model, policy.tokenizer, policy.lock,
                            max_rows=getattr(policy, "max_batch_rows", DEFAULT_MAX_BATCH_ROWS))
                policy.batcher = b
    return b


_create_lock = threading.Lock()
_DONE = object()


def batched_decode(policy, prompt_ids: list[int], *, n: int = 1, max_new_tokens: int = 128, temperature: float = 1.0,
                   top_p: float = 1.0, stop: tuple[str, ...] = (), seed: int | None = None, choices: list[Choice] | None = None,
                   ) -> Iterator[Step]:
    """Sample ``n`` continuations of ``prompt_ids`` on ``policy``'s batch, yielding this call's ``Step``
    per generated position. ``choices`` is filled in place (tokens, log-probs, text cut before a stop
    string, finish reason); read it after the last step. Closing the generator early cancels the call
    (its rows leave the batch at the next step)."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    req = DecodeRequest(list(prompt_ids), n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        stop=tuple(stop), seed=seed, on_step=events.put, on_done=lambda err: events.put((_DONE, err)))
    if choices is not None:
        req.choices = choices
    batcher_for(policy).submit(req)
    try:
        while True:
            item = events.get()
            if isinstance(item, tuple) and item[0] is _DONE:
                if item[1] is not None:
                    raise item[1]
                return
            yield item
    finally:
        req.cancel()


def decode(model, tokenizer, prompt_ids: list[int], *, n: int = 1, max_new_tokens: int = 128, temperature: float = 1.0,
           top_p: float = 1.0, stop: tuple[str, ...] = (), seed: int | None = None, choices: list[Choice] | None = None,
           ) -> Iterator[Step]:
    """One call decoded alone in the caller's thread (the same decoder as the batch, a batch of one):
    yields one ``Step`` per generated position; ``choices`` as in ``batched_decode``."""
    steps: list[Step] = []
    req = DecodeRequest(list(prompt_ids), n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        stop=tuple(stop), seed=seed, on_step=steps.append)
    if choices is not None:
        req.choices = choices
    dec = BatchDecoder(model, tokenizer, prefix_cache_tokens=0)
    dec.submit(req)
    while dec.busy():
        dec.step()
        yield from steps
        steps.clear()
