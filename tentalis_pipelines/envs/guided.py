"""An environment with help in its first observation: the manager's hint, an expert prefix, or both.

:class:`GuidedEnv` wraps any :class:`~tentalis_pipelines.envs.base.Environment` for the episodes that
rescue an all-fail group (``--method guide`` on environment batches; ``training/episode_guide.py`` says
why the help goes where it goes). ``reset`` starts the wrapped environment, plays the expert prefix's
turns in it (each an assistant message of kind ``prefix``, then the observation the environment gave
back), and puts the hint after the task's instruction; the runner then sees all of it as the first
observation, so the policy's first turn is written in that context and continues from the state the
prefix left. ``plain_messages`` keeps the same first observation without the hint: what the student is
trained on. Held-out tasks are refused (``episode_guide.check_trainable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tentalis_pipelines.envs.agents import bash_block
from tentalis_pipelines.envs.base import Environment, Observation, StepResult, Verdict
from tentalis_pipelines.training import episode_guide


def demonstration(task: Any) -> tuple[str, list[str]]:
    """``(source, assistant replies)``: the task's scripted oracle in the model's action format, one reply
    per turn (terminal and mini-SWE: each command in a ```bash block, the last one the submission;
    BFCL: ``bfcl.oracle_replies``, the calls of each user turn then a reply that ends it)."""
    from tentalis_pipelines.envs.bfcl import BfclTask, oracle_replies

    if isinstance(task, BfclTask):
        return "oracle:bfcl", oracle_replies(task)
    solution = getattr(task, "solution", None)
    if solution is None:
        raise ValueError(f"task {getattr(task, 'task_id', '?')!r} ({type(task).__name__}) has no scripted solution to demonstrate")
    return "oracle:" + type(task).__name__.removesuffix("Task").lower(), [bash_block(c) for c in solution]


class GuidedEnv(Environment):
    """``env`` with ``hint`` after the instruction and the replies of ``prefix`` played first (module doc)."""

    def __init__(self, env: Environment, *, hint: str = "", prefix: Sequence[str] = ()):
        self.env = env
        self.hint = hint.strip()
        self.prefix = list(prefix)
        self.plain_messages: list[dict[str, Any]] = []
        self.name = env.name

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return self.env.max_turns

    def reset(self, task: Any) -> Observation:
        if self.hint or self.prefix:
            episode_guide.check_trainable(task)
        obs = self.env.reset(task)
        first = len(obs.messages)
        plain = [dict(m) for m in obs.messages]
        for reply in self.prefix:
            plain.append({"role": "assistant", "content": reply, "kind": episode_guide.PREFIX_KIND})
            res = self.env.step(reply)
            if res.done:
                raise RuntimeError("the expert prefix ended the episode before the policy's first turn "
                                   f"({res.info.get('end_reason') or 'done'}): give fewer demonstrated turns")
            plain.extend(dict(m) for m in res.observation.messages)
        self.plain_messages = plain
        return Observation(episode_guide.hinted_messages(plain, self.hint, within=first) if self.hint else [dict(m) for m in plain])

    def step(self, action: str) -> StepResult:
        return self.env.step(action)

    def verify(self) -> Verdict:
        return self.env.verify()

    def close(self) -> None:
        self.env.close()
