"""The offline vLLM engine on a GPU, with the policy's LoRA checkpoint applied per request.

Needs ``pip install 'tentalis[vllm]'`` and a CUDA machine; ``make_backend('vllm')`` checks the import
first and says so when it is missing. Written against vLLM >= 0.8 (``LLM.generate(prompts,
sampling_params, lora_request=...)``); it is not exercised by the CPU test suite.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from tentalis_pipelines.inference.base import Generation, SamplingParams


class VLLMBackend:
    """``vllm.LLM`` with ``enable_lora`` and prefix caching. One request per prompt with
    ``n=num_generations``, so a prompt's samples share its prefill and KV-cache prefix."""

    name = "vllm"

    def __init__(
        self,
        model_dir: Path | str,
        adapter_dir: Path | str | None = None,
        *,
        model_name: str | None = None,
        max_lora_rank: int | None = None,
        gpu_memory_utilization: float = 0.85,
        seed: int = 0,
        **engine_kwargs: Any,
    ):
        from transformers import AutoTokenizer
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        self.adapter_dir = Path(adapter_dir) if adapter_dir else None
        # Prompts are rendered with the same Hugging Face tokenizer the other backends use.
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        if max_lora_rank is None:
            max_lora_rank = max(16, _adapter_rank(self.adapter_dir) or 0)
        engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
        # The trainer's old log-probs are at the sampling temperature; vLLM's default logprobs are the
        # raw (temperature 1) ones. "processed_logprobs" exists from vLLM 0.10.2 on.
        if "logprobs_mode" in engine_fields:
            engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.llm = LLM(
            model=str(self.model_dir),
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            **engine_kwargs,
        )
        self._lora_ids: dict[str, int] = {}

    def _lora_request(self):
        if self.adapter_dir is None:
            return None
        from vllm.lora.request import LoRARequest

        path = str(self.adapter_dir.resolve())
        # vLLM caches adapters by integer id: one id per adapter folder, never reused for another.
        lora_id = self._lora_ids.setdefault(path, len(self._lora_ids) + 1)
        return LoRARequest(self.adapter_dir.name, lora_id, path)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        """``num_generations`` samples per prompt, with the sampled tokens' log-probs."""
        from vllm import SamplingParams as VLLMSamplingParams

        sampling = VLLMSamplingParams(
            n=params.num_generations,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            # Keep "</answer>" in the text like the transformers backend (the answer parser needs it).
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token only
        )
        t0 = time.perf_counter()
        outputs = self.llm.generate(prompts, sampling, lora_request=self._lora_request(), use_tqdm=False)
        seconds = (time.perf_counter() - t0) / max(1, len(prompts) * params.num_generations)
        results: list[list[Generation]] = []
        for out in outputs:  # same order as ``prompts``
            prompt_tokens = len(out.prompt_token_ids or [])
            gens = []
            for c in out.outputs:
                token_ids = list(c.token_ids)
                logprobs = None
                if c.logprobs is not None:
                    logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs, token_ids)]
                gens.append(
                    Generation(
                        text=c.text,
                        token_ids=token_ids,
                        finish_reason="length" if c.finish_reason == "length" else "stop",
                        prompt_tokens=prompt_tokens,
                        seconds=seconds,
                        logprobs=logprobs,
                    )
                )
            results.append(gens)
        return results


def _adapter_rank(adapter_dir: Path | None) -> int | None:
    if adapter_dir is None or not (adapter_dir / "adapter_config.json").exists():
        return None
    return json.loads((adapter_dir / "adapter_config.json").read_text()).get("r")
