"""A transformers chat policy for episodes that keeps the exact token ids the model saw and sampled.

``ChatPolicy(model, tokenizer)`` is a ``generate(messages)`` (and ``generate_batch(conversations)``) for
the runner. It renders the first prompt with the tokenizer's chat template; for every later turn of the
same conversation the prompt is the previous turn's prompt + the tokens it sampled + the template's
tokens for what came after (the observation and the next assistant header), not a re-rendering of the
whole conversation. So each turn's ``prompt_token_ids`` extends the previous context exactly, with no
re-tokenisation drift, and the episode becomes one training segment with an assistant-only mask
(``training/multiturn.build_segments``). Per turn it returns the sampled tokens' log-probabilities (at
the sampling temperature; for greedy, under the model's distribution): exactly the ones its sampler used.

Decoding is the continuous-batching decoder's (``inference/batch_decoder.BatchDecoder`` in block mode,
the one rollouts and the gateway use): each conversation of a call is a request that leaves the batch
at the end of its turn (EOS, ``max_new_tokens``, or with ``stop_after_block`` once its text holds a
closed fenced code block, the action, as an agent loop's stop string would end it, so the model does not
go on to imagine the command's output) and re-enters with its observation at the next call. Its
prompt's KV is kept between turns in the decoder's store, so a turn prefills only what is new (the
tokens it sampled and the observation); the G episodes of one task, which share their whole first
prompt, prefill it once; a new conversation that opens like a stored one (BFCL items over the same
tools share 4-8k tokens of function docs) reuses that prefix (``min_shared_prefix`` tokens at least;
``share_prefixes=False`` turns sharing across conversations off). Prompts are prefilled in chunks
ending at multiples of ``prefill_block`` positions and at the conversation's earlier turns' prompt ends
(``DecodeRequest.cuts``), and reuse stops only at a position where both the stored prompt and the new
one end a chunk, so every chunk is computed on the same tokens, past and shapes with or without
sharing, and whether a conversation's KV was kept or evicted and recomputed: the outputs are the same
bit for bit (a bf16 prefill of 4,300 tokens in one go and of 4,250 + 50 differ in the last bits, enough
to flip a greedy choice of the 135M model). The tokens a turn sampled are prefilled again with its
observation: their KV from the decoding steps was computed in the batch's shapes, which a recomputation
after an eviction could not repeat.

Memory is bounded by ``kv_budget_bytes`` (default ``"auto"``: ``$TENTALIS_KV_BUDGET_MB``, else an eighth
of the host's memory between 1 GiB and 1.5 GiB, :func:`default_kv_budget_bytes`; a level-0 terminal
cycle of the 135M model in fp32, 46 kB of keys and values a position, stays under 3 GB RSS with the
model at 1.5 GiB, ``bench.episode_bench``): the decoder admits fewer rows rather
than exceed it, and evicts kept KV in the order ``KVStore`` documents (what no waiting conversation
needs, then what is needed furthest ahead), recomputing it by prefill when its conversation re-enters.
``stats`` reports the peak KV bytes for the run's metadata.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tentalis_pipelines.envs.runner import PolicyOutput, model_messages
from tentalis_pipelines.inference.batch_decoder import BatchDecoder, DecodeRequest
from tentalis_pipelines.inference.factory import choose_rollout_engine
from tentalis_pipelines.inference.transformers_backend import load_policy

log = logging.getLogger(__name__)

DEFAULT_KV_BUDGET_BYTES = 1 << 30  # module doc: a terminal learning cycle of the 135M model under ~3 GB
MAX_AUTO_KV_BUDGET_BYTES = 3 << 29  # the default's ceiling, 1.5 GiB: a level-0 cycle's process stays under 3 GB (issue 74)
KV_BUDGET_ENV = "TENTALIS_KV_BUDGET_MB"


def default_kv_budget_bytes(environ: dict[str, str] | None = None, physical_bytes: int | None = None) -> int:
    """The KV budget a ``ChatPolicy`` gets when none is given: ``$TENTALIS_KV_BUDGET_MB`` when set, else
    one eighth of the host's memory, between 1 GiB (``DEFAULT_KV_BUDGET_BYTES``) and 1.5 GiB
    (``MAX_AUTO_KV_BUDGET_BYTES``). Under the budget the decoder evicts kept KV and recomputes it by
    prefill when its conversation re-enters: memory is traded for time. The store keeps a group's shared
    first prompt and each conversation's earlier turns once (``KVStore``), so a level-0 terminal cycle (64
    episodes, ``bench.episode_bench``) keeps most of its contexts under 1.5 GiB, its process under 3 GB
    (docs/performance.md has the figures); a level-1 batch (up to 8 turns, ~1,500 positions an episode)
    re-prefills more under the default: give a host with memory to spare more with
    ``$TENTALIS_KV_BUDGET_MB``."""
    env = os.environ if environ is None else environ
    raw = env.get(KV_BUDGET_ENV, "").strip()
    if raw:
        try:
            mb = float(raw)
        except ValueError:
            mb = -1.0
        if not mb > 0 or mb != mb or mb == float("inf"):
            raise ValueError(f"${KV_BUDGET_ENV}={raw!r}: give the KV budget in MiB as a positive number (e.g. 4096), or unset it")
        return int(mb * 2**20)
    if physical_bytes is None:
        try:
            physical_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not a POSIX host: the fixed default
            physical_bytes = 0
    return max(DEFAULT_KV_BUDGET_BYTES, min(MAX_AUTO_KV_BUDGET_BYTES, physical_bytes // 8))

CLOSED_BLOCK = re.compile(r"```[\w+-]*[ \t]*\n.*?```", re.DOTALL)


class ContextTooLong(RuntimeError):
    """The conversation no longer fits the model's context."""


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _key(messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


def _seed(seed: int, call: int, row: int) -> int:
    """Row ``row`` of call ``call``'s sampling seed: its own stream, whoever else is in the batch."""
    digest = hashlib.sha256(f"{seed}:{call}:{row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


class ChatPolicy:
    """Greedy (``temperature=0``) or sampled chat turns from a causal LM; see the module doc."""

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop_after_block: bool = True,
                 max_context_tokens: int | None = None, cache_size: int = 4096, share_prefixes: bool = True,
                 min_shared_prefix: int = 64, prefill_block: int = 128,
                 kv_budget_bytes: int | None | str = "auto", max_rows: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.stop_after_block = stop_after_block
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_context_tokens = int(max_context_tokens or limit or 2048)
        self._contexts: OrderedDict[str, tuple[list[int], str, tuple[int, ...]]] = OrderedDict()
        self._cache_size = cache_size
        self._calls = 0
        self.share_prefixes = share_prefixes
        self.min_shared_prefix = int(min_shared_prefix)
        self.prefill_block = int(prefill_block)
        if kv_budget_bytes == "auto":  # $TENTALIS_KV_BUDGET_MB, else an eighth of the host's memory (1-1.5 GiB)
            kv_budget_bytes = default_kv_budget_bytes()
        self.decoder = BatchDecoder(model, tokenizer, max_rows=max_rows, max_batch_tokens=1 << 62, prefix_cache_tokens=0,
                                    prefill_block=self.prefill_block, kv_budget_bytes=kv_budget_bytes,
                                    share_prefixes=share_prefixes, min_shared_prefix=self.min_shared_prefix)
        self.decode_seconds = 0.0
        self.engine = choose_rollout_engine(getattr(model, "device", "cpu"))
        if self.engine.engine != "batch_decoder":
            log.info("episodes decode with the batch decoder all the same: they need every turn's exact token ids "
                     "and KV kept between turns, which the %s path does not give yet", self.engine.engine)

    @property
    def kept_caches(self) -> int:
        """How many prompts' KV caches are kept (a conversation's latest turn, a shared first prompt)."""
        return len(self.decoder.store)

    @property
    def stats(self) -> dict[str, Any]:
        """What decoding cost so far, for a run's metadata: the KV budget and the peak held under it
        (bytes), positions prefilled and taken from kept KV, evictions, the steps at which the next request
        waited for the budget (``deferred_admissions``), the most rows decoded at once, decoding steps and
        seconds."""
        d = self.decoder
        return {"kv_budget_bytes": d.kv_budget_bytes, "kv_peak_bytes": d.kv_peak_bytes, "prefill_tokens": d.prefill_tokens,
                "reused_tokens": d.reused_tokens, "kv_evictions": d.store.evicted, "deferred_admissions": d.deferred,
                "max_rows": d.max_live_rows, "decode_steps": d.steps, "decode_seconds": round(self.decode_seconds, 3)}

    @classmethod
    def load(cls, model_dir: Path | str, adapter_dir: Path | str | None = None, *, device: str = "auto",
             dtype: str = "auto", **kwargs: Any) -> ChatPolicy:
        model, tokenizer = load_policy(Path(model_dir), Path(adapter_dir) if adapter_dir else None, device=device, dtype=dtype)
        return cls(model, tokenizer, **kwargs)

    # -- prompts -------------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The context for the next assistant turn: the previous turn's context extended (module doc),
        or the chat template's rendering for a conversation this policy has not seen."""
        return self._prompt(messages)[0]

    def _prompt(self, messages: list[dict[str, str]]) -> tuple[list[int], str, tuple[int, ...]]:
        """(``prompt_ids``, the template's rendering of the conversation they stand for, the earlier
        turns' prompt ends in them: where the decoder's prefill ends a chunk, so that the previous turn's
        kept KV is reused whole, ``DecodeRequest.cuts``)."""
        msgs = model_messages(messages)
        full = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        for k in range(len(msgs) - 1, 0, -1):
            if msgs[k - 1]["role"] != "assistant":
                continue
            key = _key(msgs[:k])
            hit = self._contexts.get(key)
            if hit is not None:
                self._contexts.move_to_end(key)
                ids, text, cuts = hit
                if full.startswith(text):
                    return ids + list(self.tokenizer(full[len(text):], add_special_tokens=False)["input_ids"]), full, cuts
            break
        return list(self.tokenizer(full, add_special_tokens=False)["input_ids"]), full, ()

    def _remember(self, messages: list[dict[str, str]], text: str, prompt: list[int], prompt_text: str,
                  sampled: list[int], cuts: tuple[int, ...]) -> None:
        """Keep a turn's context (prompt + sampled ids) under the conversation it ends, with the text the
        chat template renders for it: the prompt's rendering + the reply's text (+ its EOS). Not a decoding
        of the ids: a special token sampled mid-reply is in the ids but not in the reply's text (decoded
        without special tokens, as the conversation holds it), so the next turn's rendering would not
        begin with such a decoding and the whole conversation would be tokenised again."""
        key = _key([*model_messages(messages), {"role": "assistant", "content": text}])
        eos = self.tokenizer.decode(sampled[-1:], skip_special_tokens=False) if sampled and sampled[-1] in self.decoder.eos else ""
        self._contexts[key] = (prompt + sampled, prompt_text + text + eos, (*cuts, len(prompt)))
        while len(self._contexts) > self._cache_size:
            self._contexts.popitem(last=False)

    # -- generation ----------------------------------------------------------------------------------
    def __call__(self, messages: list[dict[str, str]]) -> PolicyOutput:
        out = self.generate_batch([messages])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def generate(self, messages: list[dict[str, str]]) -> PolicyOutput:
        """One turn of one conversation (``__call__``)."""
        return self(messages)

    def generate_batch(self, conversations: list[list[dict[str, str]]], *,
                       reuse_cache: bool = True) -> list[PolicyOutput | BaseException]:
        """One turn of every conversation, decoded together (module doc); an output or the error that
        ended that conversation's turn (``ContextTooLong``, a prompt over the KV budget), in order.
        ``reuse_cache`` is accepted for callers of the earlier interface: KV is always kept."""
        del reuse_cache
        call = self._calls
        self._calls += 1
        results: list[PolicyOutput | BaseException | None] = [None] * len(conversations)
        requests: dict[int, tuple[list[int], DecodeRequest]] = {}
        rendered: dict[int, str] = {}
        cuts: dict[int, tuple[int, ...]] = {}
        for i, msgs in enumerate(conversations):
            ids, rendered[i], cuts[i] = self._prompt(msgs)
            if len(ids) + self.max_new_tokens > self.max_context_tokens:
                results[i] = ContextTooLong(f"{len(ids)} prompt tokens + {self.max_new_tokens} new exceed "
                                            f"{self.max_context_tokens}")
                continue
            req = DecodeRequest(ids, n=1, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                seed=_seed(self.seed, call, i), track_text=False, cuts=cuts[i],
                                stop_when=self._closed_block if self.stop_after_block else None)
            requests[i] = (ids, self.decoder.submit(req))
        if requests:
            t0 = time.perf_counter()
            try:
                self.decoder.run()
            except Exception:
                self.decoder.pending.clear()  # this call's requests not yet admitted: none may run in the next call
                raise
            elapsed = time.perf_counter() - t0
            self.decode_seconds += elapsed
            seconds = elapsed / len(requests)
            for i, (ids, req) in requests.items():
                if req.error is not None:
                    results[i] = req.error
                    continue
                c = req.choices[0]
                text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
                self._remember(conversations[i], text, ids, rendered[i], c.token_ids, cuts[i])
                results[i] = PolicyOutput(text, list(c.token_ids), list(c.logprobs), ids, c.finish_reason or "length",
                                          {"seconds": seconds})
        return [r for r in results if r is not None]

    def _closed_block(self, toks: list[int]) -> bool:
        if "`" not in self.tokenizer.decode(toks[-3:], skip_special_tokens=True):
            return False
        return CLOSED_BLOCK.search(self.tokenizer.decode(toks, skip_special_tokens=True)) is not None
