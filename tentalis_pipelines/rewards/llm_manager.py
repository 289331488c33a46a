"""The ``llm`` manager: a rubric-prompted model writes the review (score, critique, hint).

The manager sees the task, the worker's answer and the reference, and must reply with one JSON object
``{"score": 0-10, "critique": "...", "hint": "..."}``. The parser is tolerant (the first JSON object, or
``Score: N`` lines); a reply that cannot be parsed falls back to the verifier's review, and the
critique says so, so no rollout is left unreviewed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tentalis_pipelines.inference.base import GenerationBackend, SamplingParams
from tentalis_pipelines.rewards.managers import Review, ReviewInput, VerifierManager

RUBRIC = (
    "You are a manager reviewing a worker's solution to a task. Grade it from 0 (useless) to 10 (correct, "
    "clearly reasoned, in the required format: steps in <step></step>, final answer in <answer></answer>). "
    "Reply with one JSON object: {\"score\": <0-10>, \"critique\": \"<one sentence>\", \"hint\": \"<one "
    "sentence the worker can act on>\"}."
)
_JSON = re.compile(r"\{[^{}]*\}", re.S)
_SCORE = re.compile(r"score\W{0,3}(\d+(?:\.\d+)?)", re.I)


def parse_review(text: str) -> tuple[float, str, str] | None:
    """(score in [0, 1], critique, hint) from a manager reply, or None."""
    for m in _JSON.finditer(text or ""):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "score" in obj:
            try:
                score = float(obj["score"])
            except (TypeError, ValueError):
                continue
            if 0 <= score <= 10:
                return score / 10, str(obj.get("critique", "")), str(obj.get("hint", ""))
    m = _SCORE.search(text or "")
    if m and 0 <= float(m.group(1)) <= 10:
        return float(m.group(1)) / 10, (text or "").strip().splitlines()[0][:200], ""
    return None


class LLMManager:
    name = "llm"

    def __init__(self, backend: GenerationBackend, *, max_new_tokens: int = 96, seed: int = 0):
        self.backend, self.max_new_tokens, self.seed = backend, max_new_tokens, seed
        self.fallback = VerifierManager()

    def prompt(self, task: str, completion: str, x: ReviewInput) -> str:
        user = f"Task: {task}\n\nReference answer: {x.reference}\n\nWorker's solution:\n{completion}\n\nYour review (JSON):"
        messages = [{"role": "system", "content": RUBRIC}, {"role": "user", "content": user}]
        tok = getattr(self.backend, "tokenizer", None)
        if tok is not None and getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + '{"score": '
        return RUBRIC + "\n\n" + user + '\n{"score": '

    def review_many(self, items: Sequence[tuple[str, str, ReviewInput]]) -> list[Review]:
        """One batched generate call for all rollouts (the reply is pre-filled up to the score)."""
        prompts = [self.prompt(t, c, x) for t, c, x in items]
        params = SamplingParams(num_generations=1, max_new_tokens=self.max_new_tokens, temperature=0.0, seed=self.seed, stop=("}",))
        out = []
        for (_, _, x), gens in zip(items, self.backend.generate(prompts, params) if prompts else []):
            text = '{"score": ' + gens[0].text
            parsed = parse_review(text if text.rstrip().endswith("}") else text + "}")
            if parsed is None:
                fb = self.fallback.review(x)
                out.append(Review(fb.score, f"(manager reply unparseable; verifier review) {fb.critique}", fb.hint))
            else:
                out.append(Review(*parsed))
        return out
