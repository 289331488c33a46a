"""A tiny lakehouse for the reward-version and judge-agreement tests: one arithmetic task, three
rollouts whose components are known by hand, run through the real step-score, review and trajectory
stages.

| rollout | completion | outcome | format | process | verifier review | reward (1, .2, .2, .5) |
|---|---|---|---|---|---|---|
| r0 | `<step>2 + 3 = 5</step><answer>5</answer>` | 1 | 1.0 | 1.0 | 1.0 | 1.9 |
| r1 | `<step>2 + 3 = 6</step><answer>6</answer>` | 0 | 1.0 | 0.0 | 0.1 | 0.25 |
| r2 | `He has 5 apples.` (untagged, right) | 1 | 0.0 | none | 0.7 | 1.35 |
"""

from __future__ import annotations

from datetime import datetime, timezone

from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.step_scores import build_step_scores
from tentalis_pipelines.stages.trajectories import build_trajectories

PROMPT = "Tom has 2 apples and buys 3 more. How many apples does he have?"
COMPLETIONS = [("<step>2 + 3 = 5</step><answer>5</answer>", ["2 + 3 = 5"]),
               ("<step>2 + 3 = 6</step><answer>6</answer>", ["2 + 3 = 6"]),
               ("He has 5 apples.", ["He has 5 apples."])]
COMPONENTS = {  # outcome, format, process, manager (verifier) — by hand, see the table above
    "r0": (1.0, 1.0, 1.0, 1.0),
    "r1": (0.0, 1.0, 0.0, 0.1),
    "r2": (1.0, 0.0, None, 0.7),
}


def rid(batch_id: str, i: int) -> str:
    return f"r{i}" if batch_id == "b1" else f"{batch_id}-r{i}"


def seed_batch(lake: Lakehouse, batch_id: str = "b1", *, manager: str = "verifier") -> None:
    """Tasks and rollouts of one batch, then the real step_scores, reviews and trajectories stages."""
    now = datetime.now(timezone.utc)
    lake.write_batch("tasks", batch_id, [{"batch_id": batch_id, "task_id": f"{batch_id}-t0", "source": "s", "environment": "math",
                                          "prompt": PROMPT, "reference": "5", "difficulty": 1, "metadata": "{}", "created_at": now}])
    lake.write_batch("rollouts", batch_id, [
        {"batch_id": batch_id, "rollout_id": rid(batch_id, i), "task_id": f"{batch_id}-t0", "group_index": i, "policy_version": "base",
         "backend": "x", "model": "m", "prompt_text": "p", "completion": c, "steps": steps, "answer": None, "parse_mode": "tagged",
         "prompt_tokens": 1, "completion_tokens": 1, "completion_token_ids": [1, 2], "sampling_logprobs": None, "finish_reason": "stop",
         "temperature": 0.8, "seconds": 0.1, "created_at": now}
        for i, (c, steps) in enumerate(COMPLETIONS)])
    build_step_scores(lake, batch_id)
    build_reviews(lake, batch_id, manager=manager)
    build_trajectories(lake, batch_id)


class ScriptedBackend:
    """A generation backend that answers every prompt with a fixed reply and keeps the prompts: the
    judge and manager code (prompting, parsing, voting, capping) runs for real on known replies."""

    name = "scripted"
    model_name = "scripted"
    tokenizer = None

    def __init__(self, reply: str):
        self.reply, self.prompts = reply, []

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        self.prompts += prompts
        return [[Generation(self.reply, [], "stop", 0, 0.0) for _ in range(params.num_generations)] for _ in prompts]
