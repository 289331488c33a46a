"""The default backend: Hugging Face transformers on CPU or GPU, with an optional LoRA adapter."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tentalis_pipelines.inference.base import Generation, SamplingParams


def load_policy(model_dir: Path, adapter_dir: Path | None = None, *, merge: bool = True, device="cpu", dtype=torch.float32):
    """Base model plus (optionally) a LoRA adapter, merged for fast inference, then placed on ``device``
    in ``dtype`` (``auto`` for either: see ``tentalis_pipelines.hardware``). The merge happens in fp32,
    so a bf16 policy carries one rounding of the merged weights, not of the adapter's delta."""
    from tentalis_pipelines.hardware import resolve_device, resolve_dtype

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
        if merge:
            model = model.merge_and_unload()
    model = model.to(device=device, dtype=dtype)
    model.eval()
    return model, tokenizer


class TransformersBackend:
    """Batched sampling with a KV cache, written as its own decode loop because that is where the time
    goes on a CPU:

    * each prompt is prefilled once and its KV cache copied to its ``num_generations`` rows (the samples
      share the prompt prefix), so prefill costs prompts, not samples;
    * prompts are grouped by length (less left padding) into chunks under a KV token budget;
    * a row leaves the batch as soon as it emits EOS or a stop string (e.g. ``</answer>``), so finished
      samples cost nothing while the others keep decoding;
    * the log-probability of every sampled token (at the sampling temperature) is returned, so the
      trainer can use it as the old policy's log-prob.
    """

    name = "transformers"

    def __init__(
        self,
        model_dir: Path | str,
        adapter_dir: Path | str | None = None,
        *,
        model_name: str | None = None,
        max_batch_tokens: int = 65536,
        model=None,
        tokenizer=None,
        device: str = "auto",
        dtype: str = "auto",
    ):
        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        if model is None:
            model, tokenizer = load_policy(self.model_dir, Path(adapter_dir) if adapter_dir else None, device=device, dtype=dtype)
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_tokens = max_batch_tokens

    @torch.inference_mode()
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        tok = self.tokenizer
        encoded = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        results: list[list[Generation]] = [[] for _ in prompts]
        n = params.num_generations
        start = 0
        chunk_no = 0
        while start < len(order):
            # Rows per chunk from a KV-cache token budget: longer prompts -> fewer rows, same memory.
            chunk = [order[start]]
            while start + len(chunk) < len(order):
                longest = len(encoded[order[start + len(chunk)]]) + params.max_new_tokens
                if longest * n * (len(chunk) + 1) > self.max_batch_tokens:
                    break
                chunk.append(order[start + len(chunk)])
            start += len(chunk)
            t0 = time.perf_counter()
            rows = self._sample([encoded[i] for i in chunk], params, seed=params.seed + chunk_no)
            chunk_no += 1
            seconds = (time.perf_counter() - t0) / max(1, len(rows))
            for r, (toks, logps, finish) in enumerate(rows):
                prompt_idx = chunk[r // n]
                results[prompt_idx].append(
                    Generation(
                        text=tok.decode(toks, skip_special_tokens=True),
                        token_ids=toks,
                        finish_reason=finish,
                        prompt_tokens=len(encoded[prompt_idx]),
                        seconds=seconds,
                        logprobs=logps,
                    )
                )
        return results

    def _sample(self, prompt_ids: list[list[int]], params: SamplingParams, *, seed: int) -> list[tuple[list[int], list[float], str]]:
        """(tokens, sampled-token log-probs, finish reason) for ``num_generations`` rows per prompt, in
        prompt order."""
        tok, model = self.tokenizer, self.model
        n, temperature = params.num_generations, params.temperature
        dev = model.device  # every tensor of the loop lives where the model does (CPU or GPU)
        eos = torch.tensor(sorted(eos_ids(model, tok)), dtype=torch.long, device=dev)
        pad = tok.pad_token_id if tok.pad_token_id is not None else int(eos[0])
        width = max(len(x) for x in prompt_ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in prompt_ids], device=dev)
        attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompt_ids], device=dev)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attention = attention.repeat_interleave(n, dim=0)
        next_pos = attention.sum(-1, keepdim=True)
        total = logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(total)]
        logps: list[list[float]] = [[] for _ in range(total)]
        finish = ["length"] * total
        alive = list(range(total))  # batch position -> output row
        gen = torch.Generator(device=dev).manual_seed(seed)
        stops = tuple(s for s in params.stop if s)
        tail = max((len(tok(s, add_special_tokens=False)["input_ids"]) for s in stops), default=0) + 2
        for step in range(params.max_new_tokens):
            nxt, chosen = sample_next(logits, temperature, params.top_p, gen)
            nxt_list = nxt.tolist()
            is_eos = torch.isin(nxt, eos).tolist()
            keep = []
            for j, row in enumerate(alive):
                tokens[row].append(nxt_list[j])
                logps[row].append(chosen[j])
                if is_eos[j] or (stops and any(s in tok.decode(tokens[row][-tail:], skip_special_tokens=True) for s in stops)):
                    finish[row] = "stop"
                else:
                    keep.append(j)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(alive):
                # Finished rows leave the batch (and the KV cache): decoding cost follows live rows only.
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                attention, next_pos, nxt = attention[idx], next_pos[idx], nxt[idx]
                alive = [alive[j] for j in keep]
            attention = torch.cat([attention, torch.ones(len(alive), 1, dtype=attention.dtype, device=dev)], dim=1)
            out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=next_pos, past_key_values=cache, use_cache=True)
            next_pos = next_pos + 1
            logits = out.logits[:, -1, :].float()
        return [(tokens[r], logps[r], finish[r]) for r in range(total)]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> tuple[torch.Tensor, list[float]]:
    """One decoding step for every row: the next token (sampled at ``temperature`` with nucleus
    ``top_p``, or greedy at 0) and its log-prob under the distribution it was drawn from (the sampling
    log-prob the trainer uses as the old policy's)."""
    if temperature > 0:
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        probs = logp_all.exp()
        if top_p < 1.0:
            probs = _top_p_filter(probs, top_p)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    else:
        logp_all = torch.log_softmax(logits, dim=-1)
        nxt = logits.argmax(-1)
    return nxt, logp_all.gather(1, nxt[:, None]).squeeze(1).tolist()


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus sampling: keep the smallest set of tokens whose probability mass reaches ``top_p``."""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    sorted_p[(cum - sorted_p) > top_p] = 0.0
    return torch.zeros_like(probs).scatter_(-1, idx, sorted_p)


def eos_ids(model, tok) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return ids
