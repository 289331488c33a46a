"""The default backend: Hugging Face transformers on CPU or GPU, with an optional LoRA adapter."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tentalis_pipelines.inference.base import Generation, SamplingParams


def load_policy(model_dir: Path, adapter_dir: Path | None = None, *, merge: bool = True, dtype=torch.float32):
    """Base model plus (optionally) a LoRA adapter, merged for fast inference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
        if merge:
            model = model.merge_and_unload()
    model.eval()
    return model, tokenizer


class TransformersBackend:
    """Batched sampling with a KV cache; prompts are grouped by length to limit padding and each
    prompt's ``num_generations`` samples are drawn in the same batch."""

    name = "transformers"

    def __init__(
        self,
        model_dir: Path | str,
        adapter_dir: Path | str | None = None,
        *,
        model_name: str | None = None,
        max_batch_tokens: int = 16384,
        model=None,
        tokenizer=None,
    ):
        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        if model is None:
            model, tokenizer = load_policy(self.model_dir, Path(adapter_dir) if adapter_dir else None)
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_tokens = max_batch_tokens

    @torch.inference_mode()
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        tok = self.tokenizer
        tok.padding_side = "left"
        encoded = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
        results: list[list[Generation]] = [[] for _ in prompts]
        eos_ids = _eos_ids(self.model, tok)
        n = params.num_generations
        # Rows per batch from a token budget: longer prompts -> fewer rows, same memory.
        start = 0
        batch_no = 0
        while start < len(order):
            longest = len(encoded[order[start]]) + params.max_new_tokens
            prompts_per_batch = max(1, self.max_batch_tokens // max(1, longest * n))
            chunk = order[start : start + prompts_per_batch]
            # chunk is sorted ascending; re-check the budget with its longest member
            while len(chunk) > 1 and (len(encoded[chunk[-1]]) + params.max_new_tokens) * n * len(chunk) > self.max_batch_tokens:
                chunk = chunk[:-1]
            start += len(chunk)
            t0 = time.perf_counter()
            ids = [encoded[i] for i in chunk for _ in range(n)]
            width = max(len(x) for x in ids)
            pad = tok.pad_token_id
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
            attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            torch.manual_seed(params.seed + batch_no)
            batch_no += 1
            do_sample = params.temperature > 0
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=params.max_new_tokens,
                do_sample=do_sample,
                temperature=params.temperature if do_sample else None,
                top_p=params.top_p if do_sample else None,
                top_k=None,
                stop_strings=list(params.stop) or None,
                tokenizer=tok,
                pad_token_id=pad,
                eos_token_id=sorted(eos_ids),
            )
            seconds = (time.perf_counter() - t0) / len(ids)
            # Sampling log-probs are not kept: storing full-vocabulary logits per step costs GBs; the
            # trainer recomputes old log-probs in one forward pass when num_iterations > 1.
            new_tokens = out[:, width:]
            for row, prompt_idx in enumerate(i for i in chunk for _ in range(n)):
                toks = new_tokens[row].tolist()
                gen = _trim(toks, eos_ids, pad, tok, params.stop)
                text = tok.decode(gen.token_ids, skip_special_tokens=True)
                results[prompt_idx].append(
                    Generation(
                        text=text,
                        token_ids=gen.token_ids,
                        finish_reason=gen.finish_reason,
                        prompt_tokens=len(encoded[prompt_idx]),
                        seconds=seconds,
                    )
                )
        return results


class _Trimmed:
    def __init__(self, token_ids: list[int], finish_reason: str):
        self.token_ids, self.finish_reason = token_ids, finish_reason


def _eos_ids(model, tok) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return ids


def _trim(toks: list[int], eos_ids: set[int], pad: int, tok, stop: tuple[str, ...]) -> _Trimmed:
    """Cut a generated row at its end: the EOS token is kept (the policy learns to stop); padding
    after a stop string is dropped."""
    for i, t in enumerate(toks):
        if t in eos_ids or t == pad:
            prefix = toks[:i]
            text = tok.decode(prefix, skip_special_tokens=True)
            if any(text.rstrip().endswith(s) for s in stop):
                return _Trimmed(prefix, "stop")
            if t in eos_ids:
                return _Trimmed(toks[: i + 1], "stop")
            return _Trimmed(prefix, "stop")
    text = tok.decode(toks, skip_special_tokens=True)
    if any(text.rstrip().endswith(s) for s in stop):
        return _Trimmed(toks, "stop")
    return _Trimmed(toks, "length")
