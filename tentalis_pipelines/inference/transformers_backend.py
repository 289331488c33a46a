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
    """Batched sampling with a KV cache, on the continuous-batching decoder
    (``tentalis_pipelines.inference.batch_decoder``), because that is where the time goes on a CPU:

    * each prompt is prefilled once (reusing the KV of the prefix it shares with an earlier prompt:
      the system prompt) and its KV cache copied to its ``num_generations`` rows, so prefill costs
      prompts, not samples;
    * every row decodes in one batch under a KV token budget; prompts that do not fit yet join as soon
      as rows finish;
    * a row leaves the batch as soon as it emits EOS or a stop string (e.g. ``</answer>``), so finished
      samples cost nothing while the others keep decoding;
    * the KV cache is written in place (no copy of the cache per step);
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
        from tentalis_pipelines.inference.batch_decoder import BatchDecoder, DecodeRequest

        tok = self.tokenizer
        encoded = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        # A fresh decoder (and prefix cache) per call: the same call gives the same samples.
        rows, columns = len(prompts) * params.num_generations, max(map(len, encoded), default=0) + params.max_new_tokens + 1
        while rows > 1 and rows * columns > self.max_batch_tokens:  # what admission will let in at most
            rows //= 2
        decoder = BatchDecoder(self.model, tok, max_batch_tokens=self.max_batch_tokens, slab_hint=(rows, columns))
        requests = [
            DecodeRequest(encoded[i], n=params.num_generations, max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                          top_p=params.top_p, stop=tuple(params.stop), seed=params.seed + i, track_text=False)
            for i in range(len(prompts))
        ]
        # Longest first: similar lengths side by side (less padding), and every later prompt fits in the
        # first one's columns, so the slab is not re-laid out (copied) to grow left as each longer one joins.
        for i in sorted(range(len(prompts)), key=lambda i: len(encoded[i]), reverse=True):
            decoder.submit(requests[i])
        t0 = time.perf_counter()
        decoder.run()
        seconds = (time.perf_counter() - t0) / max(1, len(prompts) * params.num_generations)
        return [
            [Generation(text=tok.decode(c.token_ids, skip_special_tokens=True), token_ids=c.token_ids, finish_reason=c.finish_reason,
                        prompt_tokens=len(encoded[i]), seconds=seconds, logprobs=c.logprobs) for c in req.choices]
            for i, req in enumerate(requests)
        ]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> tuple[torch.Tensor, list[float]]:
    """One decoding step for every row: the next token (sampled at ``temperature`` with nucleus
    ``top_p``, or greedy at 0) and its log-prob under the distribution it was drawn from (the sampling
    log-prob the trainer uses as the old policy's), as a list (``sample_tokens`` keeps it a tensor)."""
    nxt, logp = sample_tokens(logits, temperature, top_p, gen)
    return nxt, logp.tolist()


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_next`` without leaving the device: (tokens, their sampling log-probs), both tensors on
    ``logits``' device, so a caller sampling several groups of rows reads them back in one transfer."""
    if temperature > 0:
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        probs = logp_all.exp()
        if top_p < 1.0:
            probs = _top_p_filter(probs, top_p)
        nxt = draw_categorical(probs, gen)
    else:
        logp_all = torch.log_softmax(logits, dim=-1)
        nxt = logits.argmax(-1)
    return nxt, logp_all.gather(1, nxt[:, None]).squeeze(1)


def draw_categorical(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` (``[rows, vocab]``, non-negative, rows need not sum to 1) by inverse
    transform sampling: one uniform ``u`` per row from ``gen``, the first token whose cumulative mass
    exceeds ``u`` times the row's total. A zero-probability token is never drawn (its cumulative mass
    equals its predecessor's, which is found first).

    Why not ``torch.multinomial``: for one sample it draws an exponential variate for every vocabulary
    entry (the exponential race, ``argmax(p / E)``), 49,152 logarithms per row per step for SmolLM2; on
    a CPU that was 15.6% of a 16 x 8 rollout's time against 0.5% for this cumulative sum (bench/README.md,
    "Sampling by inverse transform"). The draw is exact for the same distribution; the random stream
    differs, so a seed draws other tokens than it did with ``multinomial``."""
    cum = probs.cumsum(-1, dtype=torch.float64)
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=torch.float64, device=probs.device)
    idx = torch.searchsorted(cum, u * cum[:, -1:], right=True).squeeze(1)
    # u < 1 keeps u * total below the last cumulative mass; the clamp only guards a row of all zeros
    return idx.clamp_(max=probs.shape[-1] - 1)


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
