"""Token-by-token sampling for the gateway: one prompt (exact token ids), ``n`` choices, with a KV cache.

``decode`` is a generator that yields each step's new tokens, so a streamed reply goes out as the
model writes it. The sampled token's log-probability is taken at the sampling temperature (the
greedy one's from the raw logits), as ``TransformersBackend`` records it for rollouts, so live turns
carry the same old-policy log-probs the trainer uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from tentalis_pipelines.inference.transformers_backend import eos_ids, sample_next


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
    """What one decoding step added: (choice index, token id, log-prob) per live choice, and the
    choices that finished at this step."""

    tokens: list[tuple[int, int, float]]
    finished: list[int]


@torch.inference_mode()
def decode(model, tokenizer, prompt_ids: list[int], *, n: int = 1, max_new_tokens: int = 128, temperature: float = 1.0,
           top_p: float = 1.0, stop: tuple[str, ...] = (), seed: int | None = None, choices: list[Choice] | None = None,
           ) -> Iterator[Step]:
    """Sample ``n`` continuations of ``prompt_ids``, yielding one ``Step`` per generated position.

    ``choices`` (filled in place: tokens, log-probs, decoded text, finish reason) lets the caller
    read the state after the last step. A choice ends at EOS ("stop"), when its text contains a
    ``stop`` string ("stop"; the text is cut before it, the tokens are kept), or at ``max_new_tokens``
    ("length").
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    choices = choices if choices is not None else []
    choices[:] = [Choice(i) for i in range(n)]
    dev = model.device
    eos = torch.tensor(sorted(eos_ids(model, tokenizer)), dtype=torch.long, device=dev)
    input_ids = torch.tensor([prompt_ids], device=dev)
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    logits = out.logits[:, -1, :].float()
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
    length = len(prompt_ids)
    attention = torch.ones(n, length, dtype=torch.long, device=dev)
    alive = list(range(n))
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    for step in range(max_new_tokens):
        nxt, chosen = sample_next(logits, temperature, top_p, gen)  # the pipeline backend's step, so log-probs match
        ids = nxt.tolist()
        is_eos = torch.isin(nxt, eos).tolist()
        emitted, finished, keep = [], [], []
        for j, row in enumerate(alive):
            c = choices[row]
            c.token_ids.append(ids[j])
            c.logprobs.append(chosen[j])
            emitted.append((row, ids[j], chosen[j]))
            c.text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            cut = min((c.text.find(s) for s in stop if s and s in c.text), default=-1)
            if is_eos[j] or cut >= 0:
                c.finish_reason = "stop"
                if cut >= 0:
                    c.text = c.text[:cut]
                finished.append(row)
            elif step == max_new_tokens - 1:
                c.finish_reason = "length"
                finished.append(row)
            else:
                keep.append(j)
        yield Step(emitted, finished)
        if not keep:
            return
        if len(keep) < len(alive):
            idx = torch.tensor(keep, device=dev)
            cache.batch_select_indices(idx)
            attention, nxt = attention[idx], nxt[idx]
            alive = [alive[j] for j in keep]
        attention = torch.cat([attention, torch.ones(len(alive), 1, dtype=attention.dtype, device=dev)], dim=1)
        positions = torch.full((len(alive), 1), length + step, dtype=torch.long, device=dev)
        out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :].float()
