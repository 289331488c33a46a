"""Skills written by the llm manager's model: one imperative lesson per failed review."""

from __future__ import annotations

from collections.abc import Sequence

from tentalis_pipelines.inference.base import GenerationBackend, SamplingParams
from tentalis_pipelines.skills.library import Failure

INSTRUCTION = (
    "A manager reviewed a worker's wrong answer to a math word problem. Turn the review into one short lesson for "
    "the worker: a single imperative sentence of at most 25 words that applies to similar problems. Do not state "
    "the answer or any number of this problem."
)


class LLMDistiller:
    """Callable for :func:`~tentalis_pipelines.skills.library.distil`: failures -> one sentence each
    (greedy, one batched generate call); the caller falls back to a template where a reply is unusable."""

    def __init__(self, backend: GenerationBackend, *, max_new_tokens: int = 48):
        self.backend, self.max_new_tokens = backend, max_new_tokens

    def prompt(self, f: Failure) -> str:
        user = f"Problem: {f.task_prompt}\nCritique: {f.critique}\nHint: {f.hint}\n\nLesson:"
        messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": user}]
        tok = getattr(self.backend, "tokenizer", None)
        if tok is not None and getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return INSTRUCTION + "\n\n" + user + " "

    def __call__(self, failures: Sequence[Failure]) -> list[str | None]:
        if not failures:
            return []
        params = SamplingParams(num_generations=1, max_new_tokens=self.max_new_tokens, temperature=0.0, stop=("\n",))
        gens = self.backend.generate([self.prompt(f) for f in failures], params)
        return [g[0].text.strip() or None for g in gens]
