"""The episode policy as it was before episodes moved to the continuous-batching decoder (issue 74), kept
frozen for ``bench/episode_bench.py``'s side-by-side run: left-padded lock-step decoding of a batch of
conversations with one KV cache, a single conversation's cache kept between turns. The lab's copy, not
the product's: do not fix or extend it (``tentalis_pipelines/envs/policies.py`` is the product's).

Its original module doc follows.

A transformers chat policy for episodes that keeps the exact token ids the model saw and sampled.

``ChatPolicy(model, tokenizer)`` is a ``generate(messages)`` (and ``generate_batch(conversations)``) for
the runner. It renders the first prompt with the tokenizer's chat template; for every later turn of the
same conversation the prompt is the previous turn's prompt + the tokens it sampled + the template's
tokens for what came after (the observation and the next assistant header), not a re-rendering of the
whole conversation. So each turn's ``prompt_token_ids`` extends the previous context exactly, with no
re-tokenisation drift, and the episode becomes one training segment with an assistant-only mask
(``training/multiturn.build_segments``). Per turn it returns the sampled tokens' log-probabilities (at
the sampling temperature; for greedy, under the model's distribution).

A single conversation (``policy(messages)``) keeps its KV cache from one turn to the next, so a turn
costs the new tokens only (the observation and what the model writes), not the whole conversation
again; on a CPU that is most of an episode's time. A new conversation that opens like one kept in
the cache (BFCL items over the same tools share a system prompt of 4-8k tokens of function docs) starts
from a copy of that cache cut to the shared prefix, so only its own tokens are prefilled
(``min_shared_prefix`` tokens at least; ``share_prefixes=False`` turns it off). So that this changes no
output, a single conversation's prompt is prefilled in blocks that end at multiples of ``prefill_block``
positions, and a shared prefix is cut at a block boundary: every block is then computed on the same
tokens, past and shapes with or without sharing, bit for bit (a bf16 prefill of 4,300 tokens in one go
and of 4,250 + 50 differ in the last bits, enough to flip a greedy choice of the 135M model). Conversations of a batch (``generate_batch``) decode
together instead (left padding, one KV cache, a row leaves when it ends). With
``stop_after_block`` a turn also ends once it holds a closed fenced code block (the action), as an
agent loop's stop string would, so the model does not go on to imagine the command's output.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from tentalis_pipelines.envs.runner import PolicyOutput, model_messages
from tentalis_pipelines.inference.transformers_backend import load_policy, sample_next

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


class ChatPolicy:
    """Greedy (``temperature=0``) or sampled chat turns from a causal LM; see the module doc."""

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, stop_after_block: bool = True,
                 max_context_tokens: int | None = None, cache_size: int = 4096, share_prefixes: bool = True,
                 min_shared_prefix: int = 64, prefill_block: int = 512):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.stop_after_block = stop_after_block
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_context_tokens = int(max_context_tokens or limit or 2048)
        self._contexts: OrderedDict[str, tuple[list[int], str]] = OrderedDict()
        self._cache_size = cache_size
        self._calls = 0
        self._kv: OrderedDict[str, tuple[list[int], Any]] = OrderedDict()  # context ids (all but the last) -> KV cache
        self.kv_conversations = 4
        self.share_prefixes = share_prefixes
        self.min_shared_prefix = int(min_shared_prefix)
        self.prefill_block = int(prefill_block)
        eos = getattr(model.generation_config, "eos_token_id", None)
        self._eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            self._eos.add(int(tokenizer.eos_token_id))

    @property
    def kept_caches(self) -> int:
        """How many conversations' KV caches are kept for their next turn."""
        return len(self._kv)

    @classmethod
    def load(cls, model_dir: Path | str, adapter_dir: Path | str | None = None, *, device: str = "auto",
             dtype: str = "auto", **kwargs: Any) -> ChatPolicy:
        model, tokenizer = load_policy(Path(model_dir), Path(adapter_dir) if adapter_dir else None, device=device, dtype=dtype)
        return cls(model, tokenizer, **kwargs)

    # -- prompts -------------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The context for the next assistant turn: the previous turn's context extended (module doc),
        or the chat template's rendering for a conversation this policy has not seen."""
        msgs = model_messages(messages)
        full = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        for k in range(len(msgs) - 1, 0, -1):
            if msgs[k - 1]["role"] != "assistant":
                continue
            key = _key(msgs[:k])
            hit = self._contexts.get(key)
            if hit is not None:
                self._contexts.move_to_end(key)
                ids, text = hit
                if full.startswith(text):
                    return ids + list(self.tokenizer(full[len(text):], add_special_tokens=False)["input_ids"])
            break
        return list(self.tokenizer(full, add_special_tokens=False)["input_ids"])

    def _remember(self, messages: list[dict[str, str]], text: str, context: list[int]) -> None:
        key = _key([*model_messages(messages), {"role": "assistant", "content": text}])
        self._contexts[key] = (context, self.tokenizer.decode(context, skip_special_tokens=False))
        while len(self._contexts) > self._cache_size:
            self._contexts.popitem(last=False)

    # -- generation ----------------------------------------------------------------------------------
    def __call__(self, messages: list[dict[str, str]]) -> PolicyOutput:
        out = self.generate_batch([messages], reuse_cache=True)[0]
        if isinstance(out, BaseException):
            raise out
        return out

    @torch.inference_mode()
    def generate_batch(self, conversations: list[list[dict[str, str]]], *,
                       reuse_cache: bool = False) -> list[PolicyOutput | BaseException]:
        prompts: list[list[int] | None] = []
        results: list[PolicyOutput | BaseException | None] = [None] * len(conversations)
        for i, msgs in enumerate(conversations):
            ids = self.prompt_ids(msgs)
            if len(ids) + self.max_new_tokens > self.max_context_tokens:
                results[i] = ContextTooLong(f"{len(ids)} prompt tokens + {self.max_new_tokens} new exceed "
                                            f"{self.max_context_tokens}")
                prompts.append(None)
            else:
                prompts.append(ids)
        rows = [i for i, p in enumerate(prompts) if p is not None]
        if rows:
            t0 = time.perf_counter()
            sampled = self._decode([prompts[i] for i in rows], reuse_cache=reuse_cache and len(rows) == 1)
            seconds = (time.perf_counter() - t0) / len(rows)
            for i, (toks, lps, finish) in zip(rows, sampled):
                text = self.tokenizer.decode(toks, skip_special_tokens=True)
                prompt = prompts[i]
                assert prompt is not None
                self._remember(conversations[i], text, prompt + toks)
                results[i] = PolicyOutput(text, toks, lps, prompt, finish, {"seconds": seconds})
        return [r for r in results if r is not None]

    def _cached(self, prompt: list[int]) -> tuple[int, Any]:
        """(how many leading tokens of ``prompt`` a KV cache holds, that cache) or (0, None).

        The next turn of a kept conversation takes its cache (it is extended in place). Otherwise, with
        ``share_prefixes``, the kept cache sharing the longest prefix with ``prompt`` (at least
        ``min_shared_prefix`` tokens) is copied and cut to that prefix; the kept one stays for the next
        conversation that shares it."""
        for key, (ids, cache) in reversed(self._kv.items()):
            if len(ids) < len(prompt) and prompt[: len(ids)] == ids:
                del self._kv[key]
                return len(ids), cache
        if not self.share_prefixes:
            return 0, None
        best_n, best = 0, None
        for ids, cache in self._kv.values():
            n = shared_prefix(ids, prompt)
            if n > best_n:
                best_n, best = n, (ids, cache)
        best_n = min(best_n, len(prompt) - 1)  # at least one token of the prompt is fed, for the logits
        best_n -= best_n % self.prefill_block  # a block boundary: the blocks after it are computed as without sharing
        if best is None or best_n < self.min_shared_prefix:
            return 0, None
        ids, cache = best
        shared = copy.deepcopy(cache)
        if len(ids) > best_n:
            shared.crop(best_n - len(ids))  # a negative count: drop that many tokens from the end
        return best_n, shared

    def _decode(self, prompt_ids: list[list[int]], *, reuse_cache: bool = False) -> list[tuple[list[int], list[float], str]]:
        model, tok = self.model, self.tokenizer
        dev = model.device
        pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(self._eos), 0)
        done_n, cache = self._cached(prompt_ids[0]) if reuse_cache else (0, None)
        if reuse_cache and len(prompt_ids) == 1:
            # One conversation: feed only what is new since its last turn (or the shared prefix), in blocks
            # ending at multiples of prefill_block (module doc).
            p = prompt_ids[0]
            block = max(self.prefill_block, 1)
            ends = [*range((done_n // block + 1) * block, len(p), block), len(p)]
            start = done_n
            for end in ends:
                out = model(input_ids=torch.tensor([p[start:end]], device=dev),
                            attention_mask=torch.ones(1, end, dtype=torch.long, device=dev),
                            position_ids=torch.arange(start, end, device=dev)[None, :], past_key_values=cache,
                            use_cache=True, logits_to_keep=1)
                cache, start = out.past_key_values, end
            attention = torch.ones(1, len(p), dtype=torch.long, device=dev)
        else:
            width = max(len(p) for p in prompt_ids)
            input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=dev)
            attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=dev)
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                        logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
        next_pos = attention.sum(-1, keepdim=True)
        n = len(prompt_ids)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        alive = list(range(n))
        gen = torch.Generator(device=dev).manual_seed(self.seed + self._calls)
        self._calls += 1
        eos = torch.tensor(sorted(self._eos), dtype=torch.long, device=dev)
        for step in range(self.max_new_tokens):
            nxt, chosen = sample_next(logits, self.temperature, self.top_p, gen)
            nxt_list = nxt.tolist()
            is_eos = torch.isin(nxt, eos).tolist()
            keep = []
            for j, row in enumerate(alive):
                tokens[row].append(nxt_list[j])
                logps[row].append(chosen[j])
                if is_eos[j] or (self.stop_after_block and self._closed_block(tokens[row])):
                    finish[row] = "stop"
                else:
                    keep.append(j)
            if not keep or step == self.max_new_tokens - 1:
                break
            if len(keep) < len(alive):
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                attention, next_pos, nxt = attention[idx], next_pos[idx], nxt[idx]
                alive = [alive[j] for j in keep]
            attention = torch.cat([attention, torch.ones(len(alive), 1, dtype=attention.dtype, device=dev)], dim=1)
            out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=next_pos, past_key_values=cache,
                        use_cache=True)
            next_pos = next_pos + 1
            logits = out.logits[:, -1, :].float()
        if reuse_cache and n == 1:
            # The cache now holds the prompt and every sampled token but the last (never fed back).
            self._kv[str(self._calls)] = (prompt_ids[0] + tokens[0][:-1], cache)
            while len(self._kv) > self.kv_conversations:
                self._kv.popitem(last=False)
        return [(tokens[r], logps[r], finish[r]) for r in range(n)]

    def _closed_block(self, toks: list[int]) -> bool:
        if "`" not in self.tokenizer.decode(toks[-3:], skip_special_tokens=True):
            return False
        return CLOSED_BLOCK.search(self.tokenizer.decode(toks, skip_special_tokens=True)) is not None
