"""The LLM-judge PRM: tolerant parsing, majority with the pessimistic tie rule, batching, and the real
transformers backend end to end (tiny random model)."""

from __future__ import annotations

import re
from collections.abc import Callable

from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.rewards.judge import (
    JudgeConfig,
    JudgePRM,
    JudgeRequest,
    render_messages,
)


class ScriptedBackend:
    """A GenerationBackend that answers from a script: ``script(prompt)`` gives the replies for one
    prompt (cycled to ``num_generations``). It records every call."""

    name = "scripted"
    model_name = "scripted-judge"
    tokenizer = None

    def __init__(self, script: Callable[[str], list[str]]):
        self.script = script
        self.calls: list[tuple[list[str], SamplingParams]] = []

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append((list(prompts), params))
        out = []
        for p in prompts:
            replies = self.script(p)
            texts = [replies[i % len(replies)] for i in range(params.num_generations)]
            out.append([Generation(text=t, token_ids=[], finish_reason="stop", prompt_tokens=0, seconds=0.0) for t in texts])
        return out








def _step_script(prompt: str) -> list[str]:
    # Replies depend on which step is under review; the "bad" step gets a split vote with one garbled reply.
    step = re.search(r"Step under review \(step (\d+)\)", prompt)
    assert step, prompt
    if "BAD" in prompt.split("Step under review")[1]:
        return ["6 + 7 is 13, not 14. \\boxed{-1}", "Looks fine \\boxed{1}", "blah blah"]
    return ["Correct arithmetic. \\boxed{1}", "\\boxed{1}", "???"]










def test_real_backend_end_to_end(tiny_model_dir) -> None:
    """The tiny random model writes garbage, so votes are mostly None: this checks the plumbing."""
    from tentalis_pipelines.inference.transformers_backend import TransformersBackend

    backend = TransformersBackend(model_dir=tiny_model_dir)
    prompt = render_messages(backend.tokenizer, [{"role": "user", "content": "hi"}])
    assert "<|im_start|>user" in prompt and prompt.rstrip().endswith("assistant")
    judge = JudgePRM(backend, JudgeConfig(num_votes=2, max_new_tokens=6, temperature=0.7))
    requests = [JudgeRequest("What is 2 + 3?", ["2 + 3 = 5", "So the answer is 5."]), JudgeRequest("1 + 1?", ["1 + 1 = 3"])]
    steps = judge.score_steps(requests)
    assert [len(r) for r in steps] == [2, 1]
    for j in (j for r in steps for j in r):
        assert len(j.votes) == 2 and all(v in (None, -1.0, 0.0, 1.0) for v in j.votes)
    first = judge.first_errors(requests)
    assert len(first) == 2 and all(len(f.votes) == 2 for f in first)
    assert all(f.prediction is None or -1 <= f.prediction < len(r.steps) for f, r in zip(first, requests))
