"""Scripted agents: policies that need no model (tests, the overhead benchmark, sanity checks).

* :func:`oracle_agent` replays a task's known solution (for a terminal task: its level's commands, one
  per turn, then ``submit``): every generated task must be solved by it;
* :func:`do_nothing_agent` submits at once without doing anything (an empty answer): every generated task
  must fail it, or the check cannot fail;
* :func:`scripted_agent` replays any list of commands (hostile ones in the tests).

Each is a ``generate(messages) -> text`` callable for :func:`~tentalis_pipelines.envs.runner.run_episode`
(text only: no token ids, as from a policy that does not expose them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bash_block(command: str) -> str:
    return f"```bash\n{command}\n```"


class ScriptedAgent:
    """Replies with ``texts`` in turn, one per call, then ``then`` for ever. One agent per episode (it
    counts its calls: the conversation it is shown may hold demonstration turns too)."""

    def __init__(self, texts: Sequence[str], then: str):
        self.texts = list(texts)
        self.then = then
        self.calls = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        turn = self.calls
        self.calls += 1
        return self.texts[turn] if turn < len(self.texts) else self.then


def scripted_agent(commands: Sequence[str], *, then: str = "submit") -> ScriptedAgent:
    """Reply with ``commands`` in turn (each in one bash block), then ``then`` for ever."""
    return ScriptedAgent([bash_block(c) for c in commands], bash_block(then))


def raw_agent(texts: Sequence[str]) -> ScriptedAgent:
    """Reply with ``texts`` verbatim (format errors in the tests), the last one repeated."""
    return ScriptedAgent(texts[:-1], texts[-1])


def oracle_agent(task: Any) -> ScriptedAgent:
    """The task's own solution, one command per turn (its last command is the submission)."""
    solution = task["solution"] if isinstance(task, dict) else task.solution
    return scripted_agent(list(solution))


def do_nothing_agent() -> ScriptedAgent:
    """Submits straight away: an empty answer, the initial tree unchanged."""
    return scripted_agent([], then="submit")
