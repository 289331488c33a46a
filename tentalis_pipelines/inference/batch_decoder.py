"""Continuous batching: every decoding request shares one forward pass per step.

One ``BatchDecoder`` holds a running batch of rows (one row per choice of every request being decoded)
and advances all of them one token per ``step``. A request submitted while others decode joins at the
next step boundary: its prompt is prefilled on its own (reusing the KV of the longest prompt prefix it
shares with a recent prompt: the system prompt, the earlier turns of a session), its first token is
sampled from that prefill, and its rows are spliced into the batch, right-aligned with left padding
masked out. A row leaves the batch as soon as it ends (EOS, a stop string, its own token limit, or its
request is cancelled), so finished rows cost nothing.

Why not transformers' own continuous batching (``generate_batch``, ``ContinuousBatchingManager``,
paged attention)? Measured on this CPU (SmolLM2-135M, fp32, 4 x 4 x 24 tokens, one thread) it ran at
11 tokens/s against 80 for this module's predecessor, its log-probs are taken after top-p
renormalisation (not the temperature-scaled distribution the trainer recomputes), and it has no
per-request seed or stop strings.

The KV cache is a ``SlabCache``: one preallocated tensor per layer, ``[rows, heads, columns, dim]``,
written in place, so a step costs no copy of the cache (transformers' ``DynamicCache`` concatenates
the whole cache at every step: 43% of a step's time at 128 rows x 200 tokens here). Rows are compacted
when some leave, the last rows moving into the holes (``fill_holes``: only as many rows are copied as
left, so a request's rows need not stay contiguous), columns that are padding for every row are dropped
from the left, and the slab grows (doubling) when it is full. On a bf16 CPU model the linear weights are
packed once for oneDNN (``inference.packed_linear``) outside block mode.

Sampling is per request: its own temperature, top-p, seed (a ``torch.Generator`` per request) and
token limit. The log-prob recorded with every token is the one its sampler drew it from:
``sample_next``'s (the temperature-scaled log-softmax, the raw one when greedy), the old-policy
log-prob the trainer uses.

A step talks to the host once: every request's rows are sampled on the device (its own generator and
settings, so its tokens do not depend on who else is in the batch), then all rows' token ids and
log-probs come back in one transfer, and the Python bookkeeping (EOS, stop strings, limits, callbacks)
runs on those lists. On a GPU each ``.tolist()`` is a synchronisation that stalls the queue of kernels,
so the per-request ``.tolist()`` calls of a 16-request batch cost more than its sampling.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from tentalis_pipelines.hardware import freed_memory_returned
from tentalis_pipelines.inference.decode_attention import decode_bias, enable_decode_attention
from tentalis_pipelines.inference.packed_linear import PackedLinears, packing_supported
from tentalis_pipelines.inference.transformers_backend import eos_ids, sample_tokens


@dataclass
class Choice:
    """One choice being decoded: its tokens, their sampling log-probs, the text so far and its finish."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


@dataclass
class Step:
    """What one decoding step added to one request: (choice index, token id, log-prob) per live choice,
    the choices that finished at this step, and each of those choices' text after it (a snapshot: the
    decoding thread goes on writing the ``Choice`` objects while a consumer reads the step)."""

    tokens: list[tuple[int, int, float]]
    finished: list[int]
    texts: dict[int, str] = field(default_factory=dict)


@dataclass
class DecodeRequest:
    """One prompt to continue ``n`` times, with its own sampling settings.

    A choice ends at EOS ("stop"), when its text contains a ``stop`` string ("stop"; with
    ``track_text`` the text is cut before it, the tokens are kept), or after ``max_new_tokens``
    ("length"), or once ``stop_when(token_ids)`` is true ("stop": an agent turn that holds its closed
    action block). ``on_step`` gets every ``Step`` and ``on_done`` the end (None, or the error that ended
    the request), both called on the decoding thread. ``track_text`` keeps ``Choice.text`` decoded at
    every step (for streaming); without it only stop strings are looked for, in the last tokens.
    """

    prompt_ids: list[int]
    n: int = 1
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    track_text: bool = True
    on_step: Callable[[Step], None] | None = None
    on_done: Callable[[BaseException | None], None] | None = None
    stop_when: Callable[[list[int]], bool] | None = None  # ends a choice ("stop") once true of its token ids
    choices: list[Choice] = field(default_factory=list)
    error: BaseException | None = None
    done: bool = False
    cancelled: bool = False
    admitted_at: float | None = None
    finished_at: float | None = None
    generator: torch.Generator | None = field(default=None, repr=False)
    live: int = 0  # rows still decoding
    arrived: int = 0  # the KV store's clock when submitted (block mode: which kept KV to evict first)
    cuts: tuple[int, ...] = ()  # block mode: positions where the prefill also ends a chunk (``KVStore``)

    def cancel(self) -> None:
        """Stop decoding this request at the next step boundary (its rows leave the batch)."""
        self.cancelled = True


def check_request(req: DecodeRequest) -> None:
    """Reject a request the decoder cannot run, naming the field and the fix."""
    if not req.prompt_ids:
        raise ValueError("the prompt is empty: give at least one prompt token")
    if req.n < 1:
        raise ValueError(f"n must be at least 1 (got {req.n})")
    if req.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1 (got {req.max_new_tokens})")
    if req.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (got {req.temperature})")
    if not 0 < req.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (got {req.top_p})")


# --------------------------------------------------------------------------- the KV slab
class _SlabLayer(DynamicLayer):
    """One layer's view of the slab: ``update`` writes the new keys and values in place at the slab's
    end column and returns the live window ``[:rows, :, start:end + q]`` (a view, no copy), or with the
    slab's ``whole_columns`` every column ``[:rows]`` (the caller's mask then covers the capacity)."""

    def __init__(self, slab: SlabCache, idx: int):
        super().__init__()
        self.slab, self.idx = slab, idx
        self.is_initialized = True
        self.dtype, self.device = slab.dtype, slab.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.slab
        q = key_states.shape[-2]
        bk, bv = s.k[self.idx], s.v[self.idx]
        bk[: s.rows, :, s.end : s.end + q] = key_states
        bv[: s.rows, :, s.end : s.end + q] = value_states
        if s.whole_columns:  # contiguous: a batched product over it copies nothing (``decode_attention``)
            self.keys, self.values = bk[: s.rows], bv[: s.rows]
        else:
            self.keys, self.values = bk[: s.rows, :, s.start : s.end + q], bv[: s.rows, :, s.start : s.end + q]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.slab.end - self.slab.start

    def batch_select_indices(self, indices: torch.Tensor) -> None:  # the slab compacts all layers at once
        raise NotImplementedError("select rows with SlabCache.select_rows")


class SlabCache(DynamicCache):
    """A KV cache of preallocated per-layer tensors ``[row_capacity, kv_heads, column_capacity, head_dim]``.

    Live rows are ``[:rows]``, live columns ``[start:end]``; every row's tokens end at column ``end``
    (left padding before a row's first token is masked by the caller's attention mask). Call
    ``reserve(q)`` before a forward pass of ``q`` new tokens per row and ``advance(q)`` after it.
    """

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.rows = self.start = self.end = 0
        # A KV budget (``BatchDecoder(kv_budget_bytes=...)``): the most row x column cells the slab may hold
        # (None: no cap), and a callback told every allocation's bytes before the tensor it replaces is freed.
        self.max_cells: int | None = None
        self.meter: Callable[[int], None] | None = None
        # How much a full slab grows: doubling keeps growth amortised O(1) per step; under a KV budget the
        # decoder asks for less (``BatchDecoder``), so the allocation stays near the live block.
        self.growth = 2.0
        # ``whole_columns``: layers hand attention every column, not the live window (the decoder's bias then
        # masks the rest), and ``zero_fill``: what a relayout does not copy is zeroed, so the columns outside
        # the window are finite (a masked score is -inf only if its key is finite, and 0 x value only if the value is).
        self.whole_columns = False
        self.zero_fill = False
        self.k: list[torch.Tensor] = [torch.zeros(0, kv_heads, 0, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v: list[torch.Tensor] = [torch.zeros(0, kv_heads, 0, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        Cache.__init__(self, layers=[_SlabLayer(self, i) for i in range(num_layers)])

    @property
    def width(self) -> int:
        return self.end - self.start

    def _capacity(self) -> tuple[int, int]:
        return self.k[0].shape[0], self.k[0].shape[2]

    def nbytes(self) -> int:
        """Bytes the slab's tensors hold (its capacity, not only the live block)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def _fit(self, want_rows: int, want_cols: int, need_rows: int, need_cols: int) -> tuple[int, int]:
        """The capacity to allocate: ``want_*`` (the doubling policy) cut to ``max_cells``, never below
        ``need_*`` (what the live block needs); columns take the headroom first, so that the rows in the
        batch decode to their limit without another copy."""
        cap = self.max_cells
        if cap is None or want_rows * want_cols <= cap:
            return want_rows, want_cols
        cols = max(need_cols, min(want_cols, cap // max(need_rows, 1)))
        rows = max(need_rows, min(want_rows, cap // cols))
        if rows * cols > cap:
            raise RuntimeError(f"the KV slab needs {need_rows} rows x {need_cols} columns, more than its budget of {cap} "
                               "cells: the decoder admitted more than its KV budget holds")
        return rows, cols

    def compact(self) -> None:
        """Shrink the allocation to the live block (rows x width + 1), or free it when no row is left."""
        if self.rows == 0:
            self.start = self.end = 0
            for buf in (self.k, self.v):
                for i in range(len(buf)):
                    buf[i] = buf[i][:0, :, :0].clone()
            self._forget_views()
            return
        if self._capacity() != (self.rows, self.width + 1):
            self._relayout(self.rows, self.width + 1, 0)

    def _forget_views(self) -> None:
        # A layer's last window is a view of its old tensor: dropped, so that a replaced tensor is freed
        # at once (the next ``update`` sets the window again).
        for layer in self.layers:
            layer.keys = layer.values = None

    def _relayout(self, row_cap: int, col_cap: int, offset: int) -> None:
        """Copy the live block into new tensors, its columns starting at ``offset``. The rest is left
        uninitialised: no column outside the live block is read before it is written (``update`` writes a
        step's columns before returning the window; ``append_rows`` zeroes every padding column it adds to
        the window), and zero-filling a grown slab was 11.7% of a 16 x 8 x 96-token rollout."""
        w = self.width
        self._forget_views()
        for i in range(len(self.k)):
            for buf in (self.k, self.v):
                new = torch.empty(row_cap, self.kv_heads, col_cap, self.head_dim, dtype=self.dtype, device=self.device)
                if self.meter is not None:  # the old tensor is still held: both count until the swap
                    self.meter(new.numel() * new.element_size())
                new[: self.rows, :, offset : offset + w] = buf[i][: self.rows, :, self.start : self.end]
                if self.zero_fill:  # everything but the block just copied
                    new[self.rows :].zero_()
                    new[: self.rows, :, :offset].zero_()
                    new[: self.rows, :, offset + w :].zero_()
                buf[i] = new
        self.start, self.end = offset, offset + w

    def reserve(self, q: int) -> None:
        """Room for ``q`` more columns at the end: slide the block left if half the slab is free
        padding, otherwise grow it (doubling, so growth costs amortised O(1) per step)."""
        row_cap, col_cap = self._capacity()
        if self.end + q <= col_cap:
            return
        if self.width + q <= col_cap // 2:
            self._relayout(*self._fit(row_cap, col_cap, self.rows, self.width + q), 0)
        else:
            self._relayout(*self._fit(row_cap, max(int(self.growth * col_cap), self.width + q + 64), self.rows, self.width + q), 0)

    def advance(self, q: int) -> None:
        self.end += q

    def append_rows(self, kv: list[tuple[torch.Tensor, torch.Tensor]], n: int, reserve: int = 1) -> None:
        """Add ``n`` rows holding one prompt's keys and values (``[1, heads, p, dim]`` per layer),
        right-aligned so their last token sits at the end column like every other row's."""
        p = kv[0][0].shape[-2]
        row_cap, col_cap = self._capacity()
        need_rows = self.rows + n
        if self.rows == 0 and need_rows <= row_cap and p + reserve <= col_cap:
            self.start, self.end = 0, p
        else:
            if self.rows == 0:
                self.start = self.end = 0
            width = max(self.width, p)
            grow_left = width - self.width  # columns the block gains on its left
            if need_rows > row_cap or width + reserve > col_cap or self.start < grow_left:
                new_rows = max(need_rows, int(self.growth * row_cap)) if need_rows > row_cap else row_cap
                new_cols = max(int(self.growth * col_cap), width + reserve + 64) if width + reserve > col_cap else col_cap
                self._relayout(*self._fit(new_rows, new_cols, need_rows, width + reserve), grow_left)
            for buf in (*self.k, *self.v):  # the new left columns of the old rows: padding, no stale values
                buf[: self.rows, :, self.start - grow_left : self.start] = 0
            self.start -= grow_left
        r0, r1 = self.rows, need_rows
        for i, (k, v) in enumerate(kv):
            for buf, src in ((self.k, k), (self.v, v)):
                buf[i][r0:r1, :, self.start : self.end - p] = 0  # no stale values under the mask
                buf[i][r0:r1, :, self.end - p : self.end] = src.to(self.dtype)
        self.rows = r1

    def select_rows(self, keep: torch.Tensor | list[int]) -> None:
        """Keep only rows ``keep`` (row ``j`` becomes the old row ``keep[j]``), compacted to the front. A row
        already in place (``keep[j] == j``) is not copied: with ``fill_holes``' order, when a few rows leave
        only as many rows move (the copy of every layer's keys and values is most of a compaction's cost)."""
        keep = keep.tolist() if isinstance(keep, torch.Tensor) else list(keep)
        m = len(keep)
        dst = [j for j, k in enumerate(keep) if k != j]
        if dst:
            src = torch.tensor([keep[j] for j in dst], dtype=torch.long, device=self.device)
            # rows [a, b) in one slice where the moved rows are contiguous (a leading block or a single row)
            at = slice(dst[0], dst[-1] + 1) if dst[-1] - dst[0] + 1 == len(dst) else torch.tensor(dst, dtype=torch.long, device=self.device)
            for buf in (self.k, self.v):
                for i in range(len(buf)):
                    # the right side is gathered into a new tensor first: a source row that is also a destination is read before it is overwritten
                    buf[i][at, :, self.start : self.end] = buf[i][src, :, self.start : self.end]
        self.rows = m

    def drop_left(self, columns: int) -> None:
        """Forget the first ``columns`` live columns (padding for every row)."""
        self.start += columns


def fill_holes(keep: list[int]) -> list[int]:
    """The order a compaction puts the surviving rows ``keep`` (their old positions, ascending) in: each
    one already among the first ``len(keep)`` positions stays where it is, and the holes there are filled
    by the survivors beyond, in order. Only those move (``SlabCache.select_rows`` copies their keys and
    values), not every row after the first one gone: in a 16 x 8 rollout that was 2,536 row copies over
    54 compactions, about a tenth of the run (``bench/README.md``)."""
    m = len(keep)
    kept = set(keep)
    tail = iter(k for k in keep if k >= m)
    return [j if j in kept else next(tail) for j in range(m)]


def step_reads_whole_slab(cache: SlabCache) -> bool:
    """Whether a decode step's attention reads every column of the slab rather than its live window.
    A product over the window (rows strided by the capacity) makes torch's bf16/fp16 batched product on a
    CPU copy the keys and values first (fp32's MKL path reads them in place): every column, contiguous,
    costs less while the capacity is at most four windows (``decode_attention``'s module doc). Only a
    slab whose unwritten columns are zeroed (``zero_fill``: a bf16/fp16 slab outside block mode) is read
    whole."""
    return cache.zero_fill and cache._capacity()[1] <= 4 * (cache.width + 1)


# --------------------------------------------------------------------------- the prefix cache
class PrefixCache:
    """The prefill KV of recent prompts, for reuse by a prompt that shares a prefix with one (a system
    prompt, a session's earlier turns). At most ``max_tokens`` prompt tokens are held (LRU); a prefix
    shorter than ``min_tokens`` is not worth a lookup hit."""

    def __init__(self, max_tokens: int = 4096, min_tokens: int = 16):
        self.max_tokens, self.min_tokens = max_tokens, min_tokens
        self.entries: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.hits = self.hit_tokens = 0

    def lookup(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(tokens reusable, the entry's KV) for the entry sharing the longest prefix with ``ids``; at
        most ``len(ids) - 1`` tokens, so the prompt's last token is always computed (its logits)."""
        best, best_kv, best_i = 0, None, -1
        for i, (stored, kv) in enumerate(self.entries):
            k = common_prefix(stored, ids)
            if k > best:
                best, best_kv, best_i = k, kv, i
        best = min(best, len(ids) - 1)
        if best < self.min_tokens:
            return 0, None
        self.entries.append(self.entries.pop(best_i))  # most recently used last
        self.hits += 1
        self.hit_tokens += best
        return best, best_kv

    def store(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.max_tokens <= 0 or len(ids) < self.min_tokens or len(ids) > self.max_tokens:
            return
        self.entries = [e for e in self.entries if e[0] != ids]
        self.entries.append((list(ids), kv))
        while sum(len(e[0]) for e in self.entries) > self.max_tokens:
            self.entries.pop(0)


class KVStore:
    """The prefill KV of prompts in block mode (``BatchDecoder(prefill_block=B)``): a conversation's
    context waiting between its turns, a group's shared first prompt. Least recently used first out.

    Every entry was prefilled in chunks ending at multiples of ``block`` positions and at its request's
    ``cuts`` (a conversation's earlier turns' prompt ends, ``DecodeRequest.cuts``), so its KV up to any
    of those positions is what a prefill from scratch with the same cuts computes, bit for bit: a lookup
    reuses the longest shared prefix cut to a position where both the entry and the new prompt end a
    chunk and below which they cut at the same places (and a prompt equal to an entry's whole prompt,
    with the same cuts, reuses its KV and its last position's logits, no forward pass at all). A
    conversation's next turn, whose cuts hold the previous prompt's end, so reuses that prompt's KV whole
    and prefills only the tokens sampled since and the observation, not the rest of a block. With
    ``share=False`` only an entry whose whole prompt begins the new one is used (a conversation's own
    earlier turn), never a prefix shared with another conversation.

    Which entry goes when the budget needs room (``evict``): given the prompts waiting to be admitted,
    in order, the store drops first what no waiting prompt extends and was last used before the oldest
    of them arrived (a finished conversation's context), least recently used first; then what no waiting
    prompt extends but was used since (a context an earlier request of the same call left for its next
    turn), most recently used first; last what a waiting prompt extends, the one whose first such prompt
    waits longest first. An episode batch's turns visit the same conversations in the same order every
    call, a cycle over more contexts than the budget keeps, where least-recently-used drops exactly the
    context the next request is about to reuse and never hits; this order is Belady's (drop what is
    needed furthest ahead) for that cycle, as far as the queue shows it. Which entry goes never changes
    an output, only how much is prefilled again.

    **One copy of a shared prefix.** An entry's KV is a chain of pieces: the leading positions it shares
    with an entry already kept are that entry's pieces (views of the same tensors), only the rest is its
    own copy. The G conversations of a group all open with the same first prompt and a conversation's next
    turn extends its last one, so each conversation keeps only what it added. ``put`` shares a prefix only
    where the two entries' keys and values are equal, compared element for element (the positions where
    both prompts cut alike are equal by construction; the check makes sharing unable to change an
    output). ``nbytes`` counts each tensor storage once, however many entries hold it: evicting an entry
    frees only what no other entry still holds.
    """

    def __init__(self, block: int, *, share: bool = True, min_tokens: int = 16):
        if block < 1:
            raise ValueError(f"prefill_block must be at least 1 (got {block})")
        self.block, self.share, self.min_tokens = block, share, min_tokens
        # each entry: its pieces (per piece, every layer's keys and values over consecutive positions) and
        # its last position's logits
        self.entries: OrderedDict[tuple[int, ...], tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor]] = OrderedDict()
        self._storages: dict[int, list[int]] = {}  # a tensor storage's address -> [entries holding it, its bytes]
        self.used: dict[tuple[int, ...], int] = {}  # each entry's last use, on ``clock``
        self.cuts: dict[tuple[int, ...], tuple[int, ...]] = {}  # each entry's chunk ends off the block grid
        self.clock = 0  # ticks at every put and every hit
        self.nbytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.entries)

    @staticmethod
    def _piece_storages(pieces) -> dict[int, int]:
        """The distinct storages under ``pieces``: address -> bytes."""
        out: dict[int, int] = {}
        for piece in pieces:
            for k, v in piece:
                for t in (k, v):
                    st = t.untyped_storage()
                    out[st.data_ptr()] = st.nbytes()
        return out

    def _hold(self, pieces) -> None:
        for ptr, size in self._piece_storages(pieces).items():
            ref = self._storages.setdefault(ptr, [0, size])
            if ref[0] == 0:
                self.nbytes += size
            ref[0] += 1

    def _release(self, pieces) -> None:
        for ptr in self._piece_storages(pieces):
            ref = self._storages[ptr]
            ref[0] -= 1
            if ref[0] == 0:
                self.nbytes -= ref[1]
                del self._storages[ptr]

    def tensors(self):
        """Every key and value tensor the entries hold (a shared piece once per entry holding it)."""
        for pieces, _ in self.entries.values():
            for piece in pieces:
                for k, v in piece:
                    yield k
                    yield v

    def holds(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """True when every tensor of ``kv`` lies in a storage the store holds (no copy of its own)."""
        return all(t.untyped_storage().data_ptr() in self._storages for k, v in kv for t in (k, v))

    @staticmethod
    def _split(pieces, n: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """The pieces over the first ``n`` positions (the last one a view cut at ``n``)."""
        out, left = [], n
        for piece in pieces:
            if left <= 0:
                break
            width = piece[0][0].shape[-2]
            out.append(piece if width <= left else [(k[:, :, :left], v[:, :, :left]) for k, v in piece])
            left -= width
        return out

    @classmethod
    def _gather(cls, pieces, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values over the first ``n`` positions of ``pieces``: views when one
        piece holds them, else one concatenation per tensor."""
        parts = cls._split(pieces, n)
        if len(parts) == 1:
            return parts[0]
        return [(torch.cat([p[i][0] for p in parts], dim=-2), torch.cat([p[i][1] for p in parts], dim=-2))
                for i in range(len(parts[0]))]

    def _equal_prefix(self, pieces, kv, n: int) -> bool:
        """Whether ``pieces`` and ``kv`` hold the same keys and values over the first ``n`` positions."""
        start = 0
        for piece in self._split(pieces, n):
            width = piece[0][0].shape[-2]
            for (pk, pv), (k, v) in zip(piece, kv):
                if not (torch.equal(pk, k[:, :, start:start + width]) and torch.equal(pv, v[:, :, start:start + width])):
                    return False
            start += width
        return True

    def _shared_base(self, key: tuple[int, ...], kv, mine: tuple[int, ...]) -> tuple[int, list]:
        """(positions, pieces): a prefix of ``kv`` an entry already holds, equal element for element
        (class doc); (0, []) when none. Per entry two lengths are tried, as far as the tokens agree and
        else the last chunk end both prompts share (equal by construction), not every length between:
        a shorter equal prefix in between would only save memory, never change an output."""
        best, best_pieces = 0, []
        for other, (pieces, _) in self.entries.items():
            k = min(common_prefix(other, key), len(key))
            if k <= best or k < max(self.min_tokens, 1):
                continue
            theirs = self.cuts.get(other, ())
            for n in dict.fromkeys((k, self._usable(k, mine, theirs, len(other)))):  # as far as the tokens go, else where both cut alike
                if n > best and n >= max(self.min_tokens, 1) and self._equal_prefix(pieces, kv, n):
                    best, best_pieces = n, self._split(pieces, n)
                    break
        return best, best_pieces

    def extra_cuts(self, n: int, cuts: tuple[int, ...] | list[int]) -> tuple[int, ...]:
        """The chunk ends of an ``n``-position prompt off the block grid: ``cuts`` inside it, sorted."""
        return tuple(sorted({c for c in cuts if 0 < c < n and c % self.block}))

    def _usable(self, limit: int, mine: tuple[int, ...], theirs: tuple[int, ...], their_len: int) -> int:
        """The last position at most ``limit`` that ends a chunk both for a prompt cut at ``mine`` and for
        an entry of ``their_len`` positions cut at ``theirs`` (the block grid, a cut both have, or the
        entry's end that the prompt cuts at), below which they cut at the same places; 0 when none."""
        top = limit
        for a, b in zip([*mine, None], [*theirs, None]):  # the first cut one has and the other does not
            if a != b:
                top = min(top, *(c for c in (a, b) if c is not None))
                break
        ends = [c for c in mine if c <= top and (c in theirs or c == their_len)]
        return max([top - top % self.block, *ends])

    def lookup(self, ids: list[int], cuts: tuple[int, ...] | list[int] = ()) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None, torch.Tensor | None]:
        """(positions reusable, the entry's KV, its last logits when the whole prompt is that entry's,
        with the same cuts) for a prompt prefilled with ``cuts`` (class doc)."""
        mine = self.extra_cuts(len(ids), cuts)
        best, best_key, whole = 0, None, False
        for key in self.entries:
            k = common_prefix(key, ids)
            if not self.share and k < len(key):
                continue
            theirs = self.cuts.get(key, ())
            if k == len(ids) == len(key) and theirs == mine:
                best, best_key, whole = k, key, True
                break
            u = self._usable(min(k, len(ids) - 1), mine, theirs, len(key))
            if u > best:
                best, best_key = u, key
        if best_key is None or (not whole and best < max(self.min_tokens, 1)):
            return 0, None, None
        self._touch(best_key)
        pieces, logits = self.entries[best_key]
        return best, self._gather(pieces, best), logits if whole else None

    def _touch(self, key: tuple[int, ...]) -> None:
        self.entries.move_to_end(key)
        self.clock += 1
        self.used[key] = self.clock

    def put(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], logits: torch.Tensor,
            cuts: tuple[int, ...] | list[int] = ()) -> None:
        """Keep ``ids``' KV, prefilled with ``cuts``, as the most recently used entry; an entry whose
        prompt begins ``ids`` is dropped (the new one holds all it could give). The leading positions an
        entry already holds are shared, not copied (class doc): the store takes ``kv`` over, and each
        layer's tensors beyond the shared prefix are copied out one at a time, the full ones dropped from
        ``kv`` as it goes, so the copy never holds more than one layer beside them."""
        key = tuple(ids)
        mine = self.extra_cuts(len(key), cuts)
        shared, pieces = self._shared_base(key, kv, mine)
        if 0 < shared < len(key):
            own = []
            for i, (k, v) in enumerate(kv):
                own.append((k[:, :, shared:].clone(), v[:, :, shared:].clone()))
                kv[i] = own[-1]  # the caller's full tensors of this layer go now, not after every layer is copied
            pieces = [*pieces, own]
        elif shared == 0:
            pieces = [list(kv)]
        for old in [e for e in self.entries if len(e) <= len(key) and key[: len(e)] == e]:
            self._release(self.entries.pop(old)[0])
            self.used.pop(old, None)
            self.cuts.pop(old, None)
        self._hold(pieces)
        self.entries[key] = (pieces, logits)
        self.cuts[key] = mine
        self._touch(key)

    def evict(self, victim: tuple[int, ...] | None = None) -> bool:
        """Drop ``victim`` (an entry's key, as ``eviction_order`` gives them), or the least recently used
        entry; False when there is none (or ``victim`` is gone)."""
        if victim is None:
            victim = next(iter(self.entries), None)
        if victim is None or victim not in self.entries:
            return False
        pieces, _ = self.entries.pop(victim)
        self.used.pop(victim, None)
        self.cuts.pop(victim, None)
        self._release(pieces)
        self.evicted += 1
        return True

    def eviction_order(self, waiting: list[list[int]], since: int) -> list[tuple[int, ...]]:
        """Every entry's key, the first to drop first (class doc): given the prompts ``waiting`` to be
        admitted, in order, and ``since``, the ``clock`` when the oldest of them arrived: those no waiting
        prompt extends and unused since ``since``, earliest used first; then those no waiting prompt
        extends, latest used first; then the rest, the one whose first extending prompt waits longest
        first."""
        first_use: dict[tuple[int, ...], int] = {}
        lengths = {len(k) for k in self.entries}
        for i, ids in enumerate(waiting):
            for n in lengths:
                if n <= len(ids):
                    first_use.setdefault(tuple(ids[:n]), i)
        last = self.used.get
        idle = [k for k in self.entries if k not in first_use]  # least recently used first
        stale = [k for k in idle if last(k, 0) <= since]
        fresh = sorted((k for k in idle if last(k, 0) > since), key=lambda k: -last(k, 0))
        wanted = sorted((k for k in self.entries if k in first_use), key=lambda k: (-first_use[k], last(k, 0)))
        return stale + fresh + wanted


def kv_position_bytes(model) -> int:
    """Bytes of keys and values one position takes over all layers (the model's config and dtype)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    elem = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * elem


def common_prefix(a, b) -> int:
    """How many leading items ``a`` and ``b`` share (sequences compared by slices, in C: an episode's
    prompts are thousands of tokens and every admission compares against every stored one)."""
    n = min(len(a), len(b))
    a, b = list(a[:n]), list(b[:n])
    if a == b:
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------- the decoder
SLAB_GROWTH_UNDER_BUDGET = 1.25  # a budgeted slab grows by a quarter: its allocation, what the budget counts, stays near its need
UNBUDGETED_STORE_PROMPTS = 1024  # block mode without a KV budget: the most prompts whose KV the store keeps
@dataclass
class _Row:
    req: DecodeRequest
    choice: Choice
    bound: int = 0  # the most columns this row can need: its prompt plus its token limit
    joined: int = 0  # its request's place in the order requests joined the batch (``BatchDecoder._groups``)


class BatchDecoder:
    """A running batch: ``submit`` requests (any time between steps), ``step`` advances every live row
    by one token, ``run`` steps until nothing is left. Not thread-safe: one thread drives it (see
    ``tentalis_pipelines.gateway.sampler.Batcher`` for the gateway's scheduler thread).

    Admission is first come, first served, while the batch stays under ``max_rows`` rows (a request's
    ``n`` rows join together; an empty batch always admits the next request, so ``max_rows=1`` serves
    one request at a time) and ``max_batch_tokens`` KV positions (rows x (width + the request's token
    limit)).

    **Block mode** (``prefill_block=B > 0``, the agent episodes' mode, ``envs.policies.ChatPolicy``): a
    prompt is prefilled in chunks ending at multiples of ``B`` positions and at the request's ``cuts``
    (its conversation's earlier prompt ends) and its KV kept in a ``KVStore`` (not the ``PrefixCache``),
    so a conversation that leaves at the end of its turn re-enters with its observation reusing its own
    last prompt's KV whole, and the G episodes of one task prefill their shared first prompt once. Reuse
    stops only where both prompts end a chunk, so every token and log-prob is the same, bit for bit, with
    or without sharing and whether a conversation's KV was kept or recomputed (``KVStore``). What is kept
    is prefill KV: the tokens a turn sampled are prefilled again with the next prompt (their KV from the
    decoding steps was computed in other shapes, so reusing it would change the last bits).

    **KV budget** (``kv_budget_bytes``, block mode only): the bytes of keys and values the decoder holds,
    the slab's allocation + the store + a prefill in flight (and the copy a slab relayout makes, tensor
    by tensor), never exceed it. A request joins only when the slab can hold every row to its token limit
    (rows x the longest prompt + limit) beside its prefill; to make room the decoder first shrinks the
    slab to its live block, then evicts stored KV in ``KVStore.eviction_order`` (a waiting conversation's
    context is then recomputed by prefill when it re-enters, with the same outputs); if there is still no
    room the request waits for rows to leave (fewer rows decode at once). A request that could not fit
    even alone ends with a ``ValueError`` naming the budget. ``kv_peak_bytes`` is the most held at once.
    Admission never depends on what the store holds (it is always evictable), so the batch's make-up,
    hence every output, is the same with and without sharing.
    """

    def __init__(self, model, tokenizer, *, max_rows: int | None = None, max_batch_tokens: int = 65536,
                 prefix_cache_tokens: int = 4096, slab_hint: tuple[int, int] | None = None, prefill_block: int = 0,
                 kv_budget_bytes: int | None = None, share_prefixes: bool = True, min_shared_prefix: int = 16,
                 decode_attention: bool = True, packed_linears: bool = True):
        """``slab_hint`` (rows, columns): the KV slab's first size, for a caller that knows its workload
        (all of a rollout batch's rows, its longest prompt plus the token limit), so the slab is allocated
        once instead of doubling its way there (each growth copies every layer into fresh memory).
        ``prefill_block``, ``kv_budget_bytes``, ``share_prefixes``, ``min_shared_prefix``: block mode and
        its budget (class doc). ``decode_attention``: a bf16/fp16 CPU model on ``sdpa`` runs its decode steps
        outside block mode through ``inference.decode_attention`` over the whole slab (two batched products,
        not the flash kernel; ``step_reads_whole_slab``); the model is switched to it, every other call
        (prefill, a step whose slab is mostly headroom) still runs ``sdpa``. Not in fp32 (MKL reads the live
        window in place, and sdpa was as fast) nor in block mode (zeroing the slab's headroom cost a bf16
        episode cycle 0.46 GB of peak RSS for 3% less CPU a token; a strided window costs a copy of K and V
        a layer; ``bench/README.md``). False keeps the model's own everywhere. ``packed_linears``: a bf16 CPU
        model's linear weights are packed once for oneDNN and used packed in this decoder's forward passes
        outside block mode (``inference.packed_linear``: 0.87x a bf16 rollout's time, the same tokens, one
        more copy of the weights); False, or another model, multiplies as the model does."""
        if kv_budget_bytes is not None and prefill_block <= 0:
            raise ValueError("kv_budget_bytes needs block mode: give prefill_block > 0 as well")
        if kv_budget_bytes is not None and kv_budget_bytes <= 0:
            raise ValueError(f"kv_budget_bytes must be positive (got {kv_budget_bytes}); leave it None for no budget")
        self.model, self.tokenizer = model, tokenizer
        self.prefill_block = int(prefill_block)
        low_precision = getattr(model, "dtype", torch.float32) in (torch.bfloat16, torch.float16)
        self.decode_attention = bool(decode_attention) and low_precision and self.prefill_block <= 0 and enable_decode_attention(model)
        self.packed = PackedLinears(model) if packed_linears and self.prefill_block <= 0 and packing_supported(model) else None
        self.store = KVStore(self.prefill_block, share=share_prefixes, min_tokens=min_shared_prefix) if prefill_block > 0 else None
        self.kv_budget_bytes = kv_budget_bytes
        self.position_bytes = kv_position_bytes(model) if prefill_block > 0 else 0
        cfg = getattr(model.config, "text_config", None) or model.config
        self._tensors = 2 * int(getattr(cfg, "num_hidden_layers", 1))  # keys and values of every layer
        self.kv_peak_bytes = 0  # the most KV bytes held at once (block mode)
        self.prefill_tokens = self.reused_tokens = 0  # positions prefilled / taken from the store (block mode)
        self.deferred = 0  # steps at which the next request waited for the KV budget
        self.max_live_rows = 0
        self._inflight = 0  # bytes of a prefill's KV not yet in the store or the slab
        self.slab_hint = slab_hint
        self.max_rows, self.max_batch_tokens = max_rows, max_batch_tokens
        self.prefixes = PrefixCache(prefix_cache_tokens)
        self.device = model.device
        self.eos = frozenset(eos_ids(model, tokenizer))  # looked up on the host, where the token ids are read anyway
        self.pending: deque[DecodeRequest] = deque()
        self.rows: list[_Row] = []
        self.cache: SlabCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self.nxt = torch.zeros(0, dtype=torch.long, device=self.device)
        self.steps = 0  # forward passes over the batch, for tests and /health
        self._joined = 0  # requests that have joined the batch
        self._tails: dict[tuple[str, ...], int] = {}

    # ---- public
    def submit(self, req: DecodeRequest) -> DecodeRequest:
        check_request(req)
        req.choices[:] = [Choice(i) for i in range(req.n)]
        seed = req.seed if req.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        req.generator = torch.Generator(device=self.device).manual_seed(seed)
        if self.store is not None:
            req.arrived = self.store.clock
        self.pending.append(req)
        return req

    def busy(self) -> bool:
        return bool(self.rows or self.pending)

    @torch.inference_mode()
    def step(self) -> None:
        """Admit what fits, then one forward pass for every live row; a failure ends every request in
        the batch with that error (and leaves the decoder empty, ready for the next)."""
        try:
            with self.packed.active() if self.packed is not None else contextlib.nullcontext():
                self._drop_cancelled()
                self._admit()
                if self.rows:
                    self._forward_and_sample()
        except Exception as exc:  # noqa: BLE001 - handed to every request it ended
            failed = {id(r.req): r.req for r in self.rows}
            self._reset()
            for req in failed.values():
                self._end(req, exc)
            raise

    def run(self) -> None:
        """Step until nothing is left; under a KV budget, freed KV goes back to the OS meanwhile, so the
        budget bounds the process too (``hardware.freed_memory_returned``)."""
        with freed_memory_returned() if self.kv_budget_bytes is not None else contextlib.nullcontext():
            while self.busy():
                self.step()

    # ---- admission
    def _admit(self) -> None:
        while self.pending:
            req = self.pending[0]
            if req.cancelled:
                self.pending.popleft()
                self._end(req, None)
                continue
            if self.rows:
                rows = len(self.rows) + req.n
                width = max(self.cache.width, len(req.prompt_ids))
                if self.max_rows is not None and rows > self.max_rows:
                    return
                if rows * (width + req.max_new_tokens) > self.max_batch_tokens:
                    return
            if self.kv_budget_bytes is not None:
                room = self._make_room(req)
                if room is None:
                    self.deferred += 1
                    return
                if not room:
                    self.pending.popleft()
                    self._end(req, ValueError(
                        f"a prompt of {len(req.prompt_ids)} tokens with a limit of {req.max_new_tokens} new ones ({req.n} rows) "
                        f"needs more KV than kv_budget_bytes={self.kv_budget_bytes} holds ({self.position_bytes} bytes a "
                        "position): raise the budget or lower max_new_tokens"))
                    continue
            self.pending.popleft()
            self._add(req)

    # ---- the KV budget (block mode)
    def _held(self) -> int:
        return (self.cache.nbytes() if self.cache is not None else 0) + self.store.nbytes + self._inflight

    def _note(self, extra: int = 0) -> None:
        """Record the bytes held now (plus ``extra``: a tensor allocated beside the one it replaces)."""
        if self.store is not None:
            self.kv_peak_bytes = max(self.kv_peak_bytes, self._held() + extra)

    def _slack(self, nbytes: int) -> int:
        """``nbytes`` plus the copy a relayout (or a prefill's concatenation) holds beside it: one layer's
        keys or values at a time."""
        return nbytes + -(-nbytes // self._tensors)

    def _slab_cells(self, extra_rows: int = 0, extra_bound: int = 0) -> int:
        bound = max([r.bound for r in self.rows] + [extra_bound])
        return (len(self.rows) + extra_rows) * bound

    def _make_room(self, req: DecodeRequest) -> bool | None:
        """True when ``req`` fits the budget now (after shrinking the slab and evicting stored KV as
        needed), None when it must wait for rows to leave, False when it could never fit."""
        pb, budget = self.position_bytes, self.kv_budget_bytes
        slab = self._slack(self._slab_cells(req.n, len(req.prompt_ids) + req.max_new_tokens) * pb)
        prefill = self._slack(len(req.prompt_ids) * pb)
        if slab + prefill > budget:
            return False if not self.rows else None
        cache = self.cache
        if cache is not None and self._slack(cache.nbytes()) + self.store.nbytes + prefill > budget:
            cache.compact()
        order: list[tuple[int, ...]] | None = None
        while max(slab, self._slack(cache.nbytes()) if cache is not None else 0) + self.store.nbytes + prefill > budget:
            if order is None:  # the waiting prompts (this one first) decide what goes (KVStore's doc)
                order = self.store.eviction_order([r.prompt_ids for r in self.pending], self.pending[0].arrived)
            if not order or not self.store.evict(order.pop(0)):
                break
        return True

    def _slab_cap(self) -> int:
        """The cells the slab may hold now: the budget less the store and a prefill in flight, less the
        relayout's copy."""
        room = self.kv_budget_bytes - self.store.nbytes - self._inflight
        return max(0, room * self._tensors // ((self._tensors + 1) * self.position_bytes))

    def _add(self, req: DecodeRequest) -> None:
        req.admitted_at = time.perf_counter()
        ids = req.prompt_ids
        if self.store is not None:
            self._add_blocks(req)
            return
        logits, kv = self._prefill(ids)
        logits = logits.repeat(req.n, 1) if req.n > 1 else logits
        joined = self._join()
        rows = [_Row(req, c, joined=joined) for c in req.choices]
        req.live = req.n
        nxt, logps = sample_tokens(logits, req.temperature, req.top_p, req.generator)
        keep = self._record(req, rows, *_to_host(nxt, logps))
        if not keep:
            return
        n = len(keep)
        if self.cache is None:
            heads = kv[0][0].shape[1]
            self.cache = SlabCache(len(kv), heads, kv[0][0].shape[-1], dtype=kv[0][0].dtype, device=self.device)
            # With the decode steps' attention (bf16/fp16, not block mode: ``__init__``) a step reads the whole
            # slab, so what is not written must be finite.
            self.cache.zero_fill = self.decode_attention
            if self.slab_hint is not None:
                self.cache._relayout(*self.slab_hint, 0)
        old_width = self.cache.width if self.rows else 0
        self.cache.append_rows(kv, n)
        width = self.cache.width
        if width > old_width and self.rows:
            self.mask = torch.cat([torch.zeros(len(self.rows), width - old_width, dtype=torch.long, device=self.device), self.mask], 1)
        if not self.rows:
            self.mask = torch.zeros(0, width, dtype=torch.long, device=self.device)
        new_mask = torch.zeros(n, width, dtype=torch.long, device=self.device)
        new_mask[:, width - len(ids):] = 1
        self.mask = torch.cat([self.mask, new_mask], 0)
        self.pos = torch.cat([self.pos, torch.full((n,), len(ids), dtype=torch.long, device=self.device)])
        self.nxt = torch.cat([self.nxt, nxt[keep] if n < len(rows) else nxt])
        self.rows += [rows[j] for j in keep]

    def _add_blocks(self, req: DecodeRequest) -> None:
        """``_add`` in block mode: the prompt's KV from the store and block prefills, the store updated,
        the budget kept (class doc)."""
        ids = req.prompt_ids
        logits, kv, fresh = self._prefill_blocks(ids, req.cuts)
        self._inflight = self._kv_bytes(kv) if fresh or not self.store.holds(kv) else 0  # computed, or gathered from pieces
        self._note()
        try:
            logits = logits.repeat(req.n, 1) if req.n > 1 else logits
            joined = self._join()
            rows = [_Row(req, c, len(ids) + req.max_new_tokens, joined) for c in req.choices]
            req.live = req.n
            nxt, logps = sample_tokens(logits, req.temperature, req.top_p, req.generator)
            keep = self._record(req, rows, *_to_host(nxt, logps))
            if keep:
                self._splice(req, rows, keep, kv, nxt)
        finally:
            self._inflight = 0
        if fresh:
            self.store.put(ids, kv, logits[:1], req.cuts)
            while self.kv_budget_bytes is None and len(self.store) > UNBUDGETED_STORE_PROMPTS:
                self.store.evict()
        self._note()

    def _splice(self, req: DecodeRequest, rows: list[_Row], keep: list[int], kv, nxt: torch.Tensor) -> None:
        """Rows ``keep`` of a just-prefilled request join the slab (``_add``'s second half, block mode)."""
        ids, n = req.prompt_ids, len(keep)
        if self.cache is None:
            heads = kv[0][0].shape[1]
            self.cache = SlabCache(len(kv), heads, kv[0][0].shape[-1], dtype=kv[0][0].dtype, device=self.device)
            self.cache.meter = self._note
            if self.kv_budget_bytes is not None:
                self.cache.growth = SLAB_GROWTH_UNDER_BUDGET
        if self.kv_budget_bytes is not None:
            self.cache.max_cells = self._slab_cap()
        old_width = self.cache.width if self.rows else 0
        self.cache.append_rows(kv, n)
        width = self.cache.width
        if width > old_width and self.rows:
            self.mask = torch.cat([torch.zeros(len(self.rows), width - old_width, dtype=torch.long, device=self.device), self.mask], 1)
        if not self.rows:
            self.mask = torch.zeros(0, width, dtype=torch.long, device=self.device)
        new_mask = torch.zeros(n, width, dtype=torch.long, device=self.device)
        new_mask[:, width - len(ids):] = 1
        self.mask = torch.cat([self.mask, new_mask], 0)
        self.pos = torch.cat([self.pos, torch.full((n,), len(ids), dtype=torch.long, device=self.device)])
        self.nxt = torch.cat([self.nxt, nxt[keep] if n < len(rows) else nxt])
        self.rows += [rows[j] for j in keep]
        self.max_live_rows = max(self.max_live_rows, len(self.rows))

    @staticmethod
    def _kv_bytes(kv) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)

    def _prefill_blocks(self, ids: list[int], cuts: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], bool]:
        """(last logits, KV, whether it was computed) for ``ids`` in block mode: the store's longest usable
        prefix, then chunks ending at multiples of ``prefill_block`` and at ``cuts`` (``KVStore``)."""
        reuse, stored, logits = self.store.lookup(ids, cuts)
        if logits is not None:  # the whole prompt is stored: its KV and logits as they were computed
            self.reused_tokens += reuse
            return logits, stored, False
        cache = DynamicCache()
        if stored is not None:
            for i, (k, v) in enumerate(stored):
                cache.update(k[:, :, :reuse], v[:, :, :reuse], i)
        self.reused_tokens += reuse
        self.prefill_tokens += len(ids) - reuse
        block = self.prefill_block
        ends = sorted({*range((reuse // block + 1) * block, len(ids), block), *(c for c in cuts if reuse < c < len(ids)), len(ids)})
        start, out = reuse, None
        for end in ends:
            out = self.model(input_ids=torch.tensor([ids[start:end]], device=self.device),
                             attention_mask=torch.ones(1, end, dtype=torch.long, device=self.device),
                             position_ids=torch.arange(start, end, device=self.device)[None, :], past_key_values=cache,
                             use_cache=True, logits_to_keep=1)
            cache, start = out.past_key_values, end
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        return out.logits[:, -1, :].float(), kv, True

    def _prefill(self, ids: list[int]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The last position's logits and every layer's keys and values for ``ids`` (batch of one),
        reusing the longest cached prefix."""
        reuse, stored = self.prefixes.lookup(ids)
        cache = DynamicCache()
        if stored is not None:
            for i, (k, v) in enumerate(stored):
                cache.update(k[:, :, :reuse], v[:, :, :reuse], i)
        x = torch.tensor([ids[reuse:]], device=self.device)
        positions = torch.arange(reuse, len(ids), device=self.device)[None]
        out = self.model(input_ids=x, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.prefixes.store(ids, kv)
        return out.logits[:, -1, :].float(), kv

    # ---- one step
    def _forward_and_sample(self) -> None:
        cache = self.cache
        if self.kv_budget_bytes is not None:
            cache.max_cells = self._slab_cap()
        cache.reserve(1)
        mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long, device=self.device)], 1)
        if self.decode_attention and step_reads_whole_slab(cache):  # the bias is the whole mask: transformers builds none
            cache.whole_columns = True
            try:
                out = self.model(input_ids=self.nxt[:, None], position_ids=self.pos[:, None], past_key_values=cache,
                                 use_cache=True, decode_bias=decode_bias(mask, cache.start, cache._capacity()[1]))
            finally:
                cache.whole_columns = False
        else:  # the model's own attention (sdpa) over the live window
            out = self.model(input_ids=self.nxt[:, None], attention_mask=mask, position_ids=self.pos[:, None],
                             past_key_values=cache, use_cache=True)
        cache.advance(1)
        self.steps += 1
        self.mask, self.pos = mask, self.pos + 1
        logits = out.logits[:, -1, :].float()
        # Each request samples its rows in choice order from its own generator, wherever compaction put them
        # (``fill_holes``): the same draws as when a request's rows stayed contiguous and in order.
        groups = self._groups()
        sampled = [sample_tokens(take_rows(logits, idx), req.temperature, req.top_p, req.generator) for req, idx in groups]
        nxt = torch.cat([t for t, _ in sampled]) if len(sampled) > 1 else sampled[0][0]
        ids, chosen = _to_host(nxt, torch.cat([lp for _, lp in sampled]) if len(sampled) > 1 else sampled[0][1])
        keep: list[int] = []
        order: list[int] = []  # the batch position of each sampled token
        for req, idx in groups:
            a, b = len(order), len(order) + len(idx)
            keep += [idx[j] for j in self._record(req, [self.rows[i] for i in idx], ids[a:b], chosen[a:b])]
            order += idx
        if order != list(range(len(order))):  # back to batch order for the next step's input
            inverse = [0] * len(order)
            for i, j in enumerate(order):
                inverse[j] = i
            nxt = nxt[torch.tensor(inverse, dtype=torch.long, device=self.device)]
        self.nxt = nxt
        if len(keep) < len(self.rows):
            self._select(fill_holes(sorted(keep)))

    def _join(self) -> int:
        self._joined += 1
        return self._joined

    def _groups(self) -> list[tuple[DecodeRequest, list[int]]]:
        """(request, the batch positions of its rows in choice order) for each request in the batch, in the
        order they joined. Compaction moves rows from the end into the holes (``fill_holes``), so a
        request's rows need not be contiguous or in order."""
        groups: dict[int, tuple[DecodeRequest, list[int]]] = {}
        for j, row in enumerate(self.rows):
            g = groups.get(row.joined)
            if g is None:
                groups[row.joined] = g = (row.req, [])
            g[1].append(j)
        out = []
        for key in sorted(groups):
            req, idx = groups[key]
            if any(self.rows[x].choice.index > self.rows[y].choice.index for x, y in zip(idx, idx[1:])):
                idx.sort(key=lambda j: self.rows[j].choice.index)
            out.append((req, idx))
        return out

    def _record(self, req: DecodeRequest, rows: list[_Row], ids: list[int], chosen: list[float]) -> list[int]:
        """Record one sampled token per row of ``req`` (host values), end the rows that finished, tell
        the request; the indices (into ``rows``) of the rows that go on."""
        tok = self.tokenizer
        stops = tuple(s for s in req.stop if s)
        emitted, finished, texts, keep = [], [], {}, []
        for j, row in enumerate(rows):
            c = row.choice
            c.token_ids.append(ids[j])
            c.logprobs.append(chosen[j])
            emitted.append((c.index, ids[j], chosen[j]))
            hit = False
            if req.track_text:
                text = tok.decode(c.token_ids, skip_special_tokens=True)
                cut = min((text.find(s) for s in stops if s in text), default=-1)
                if cut >= 0:
                    text, hit = text[:cut], True
                c.text = text
                texts[c.index] = text
            elif stops:
                tail = tok.decode(c.token_ids[-self._tail(stops):], skip_special_tokens=True)
                hit = any(s in tail for s in stops)
            if not hit and req.stop_when is not None:
                hit = bool(req.stop_when(c.token_ids))
            if ids[j] in self.eos or hit:
                c.finish_reason = "stop"
                finished.append(c.index)
            elif len(c.token_ids) >= req.max_new_tokens:
                c.finish_reason = "length"
                finished.append(c.index)
            else:
                keep.append(j)
        req.live -= len(finished)
        if req.on_step is not None:
            req.on_step(Step(emitted, finished, texts))
        if req.live == 0:
            self._end(req, None)
        return keep

    def _tail(self, stops: tuple[str, ...]) -> int:
        """Tokens at the end of a row that can hold a stop string (its token count, plus slack)."""
        if stops not in self._tails:
            self._tails[stops] = max(len(self.tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stops) + 2
        return self._tails[stops]

    # ---- leaving
    def _drop_cancelled(self) -> None:
        if not any(r.req.cancelled for r in self.rows):
            return
        gone = {id(r.req): r.req for r in self.rows if r.req.cancelled}
        self._select(fill_holes([j for j, r in enumerate(self.rows) if not r.req.cancelled]))
        for req in gone.values():
            self._end(req, None)

    def _select(self, keep: list[int]) -> None:
        """Go on with the rows ``keep`` (new row ``j`` is old row ``keep[j]``; ``fill_holes`` gives the order
        that moves the fewest)."""
        if not keep:  # the batch is empty: keep the slab's memory for the next request
            self.rows = []
            self.cache.rows = self.cache.start = self.cache.end = 0
            self.mask = self.mask[:0, :0]
            self.pos, self.nxt = self.pos[:0], self.nxt[:0]
            return
        self.cache.select_rows(keep)
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.mask, self.pos, self.nxt = self.mask[idx], self.pos[idx], self.nxt[idx]
        self.rows = [self.rows[j] for j in keep]
        used = self.mask.any(0)
        first = int(used.int().argmax()) if bool(used.any()) else 0
        if first > 0:  # columns that are padding for every remaining row
            self.cache.drop_left(first)
            self.mask = self.mask[:, first:]

    def _reset(self) -> None:
        self.rows = []
        self.cache = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self.nxt = torch.zeros(0, dtype=torch.long, device=self.device)

    def _end(self, req: DecodeRequest, error: BaseException | None) -> None:
        if req.done:
            return
        req.done, req.error, req.finished_at = True, error, time.perf_counter()
        if req.on_done is not None:
            req.on_done(error)


def take_rows(x: torch.Tensor, idx: list[int]) -> torch.Tensor:
    """Rows ``idx`` of ``x``: a view when they are consecutive and ascending, else a gathered copy."""
    if idx[-1] - idx[0] + 1 == len(idx) and all(b == a + 1 for a, b in zip(idx, idx[1:])):
        return x[idx[0] : idx[-1] + 1]
    return x[torch.tensor(idx, dtype=torch.long, device=x.device)]


def _to_host(tokens: torch.Tensor, logps: torch.Tensor) -> tuple[list[int], list[float]]:
    """Token ids and their log-probs as Python lists, in one device-to-host transfer (float64 holds
    every token id and every float32 log-prob exactly)."""
    host = torch.stack([tokens.to(torch.float64), logps.to(torch.float64)]).cpu()
    return host[0].long().tolist(), host[1].tolist()
