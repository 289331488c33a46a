"""The ``terminal`` family: agent episodes in the sandbox (``envs/terminal.py``, ``envs/terminal_tasks.py``)."""

from __future__ import annotations

from tentalis_pipelines.envs import terminal_tasks
from tentalis_pipelines.tasks.families import Recipe, TaskFamily

DEFAULT_TERMINAL_MAX_TURNS = 8
# Level 0 names the command: run it, submit its output. Two turns do it; four leave room for one
# mistake, and eight only give a looping 135M model more turns to loop in (experiments/terminal_base).
LEVEL0_MAX_TURNS = 4
# The recipe's sampling temperature for terminal episodes. SmolLM2-135M at the policy's default 0.8
# writes noise (3.3% of level-0 episodes pass, 3 of 30 GRPO groups mixed); at 0.4, 22.5% pass and 12 of
# 30 groups are mixed (experiments/terminal_base, level 0), so GRPO has a signal.
TERMINAL_TEMPERATURE = 0.4
TERMINAL_MAX_NEW_TOKENS = 128  # per turn


def terminal_max_turns(levels: tuple[int, ...]) -> int:
    """The default turn limit of an episode on these levels: ``LEVEL0_MAX_TURNS`` when every level is
    0, else ``DEFAULT_TERMINAL_MAX_TURNS``."""
    return LEVEL0_MAX_TURNS if levels and all(lv == 0 for lv in levels) else DEFAULT_TERMINAL_MAX_TURNS


class TerminalFamily(TaskFamily):
    name = "terminal"
    levels = terminal_tasks.ALL_LEVELS

    environment = terminal_tasks.ENVIRONMENT

    def recipe(self, levels: tuple[int, ...] = ()) -> Recipe:
        return Recipe(temperature=TERMINAL_TEMPERATURE, max_new_tokens=TERMINAL_MAX_NEW_TOKENS, max_turns=terminal_max_turns(tuple(levels)))

    def make_env(self, max_turns: int):
        from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv

        return TerminalEnv(TerminalConfig(max_turns=max_turns))

    def task_from_row(self, row):
        return terminal_tasks.TerminalTask.from_task_row(row)


FAMILY = TerminalFamily()
