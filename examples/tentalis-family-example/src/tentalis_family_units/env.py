"""The ``units`` environment: the agent calls a converter tool, then submits a number; the verifier
checks the number. Tentalis's environment protocol (``tentalis_pipelines.envs.base``): ``reset(task)``,
``step(action)``, ``verify()``, ``close()``.

An action is one fenced block per reply::

    ```convert
    3 km to m
    ```

runs the tool (the observation is ``3 km = 3000 m``), and::

    ```answer
    3000
    ```

submits the answer and ends the episode. A reply without a block is a format error (the agent is told
how to write one); ``max_turns`` replies without an answer end the episode at the turn limit.
"""

from __future__ import annotations

import math
import re

from tentalis_family_units.tasks import UnitsTask, convert
from tentalis_pipelines.envs.base import SUBMITTED, TURN_LIMIT, Environment, Observation, StepResult, Verdict

ENVIRONMENT = "units"
SYSTEM = ("You convert units with a converter tool. Call it with one block:\n```convert\n<amount> <unit> to <unit>\n```\n"
          "When you know the number, submit it with:\n```answer\n<number>\n```")
BLOCK = re.compile(r"```(convert|answer)\s*\n(.*?)(?:```|\Z)", re.S)
CALL = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s+(\w+)\s+to\s+(\w+)\s*$")


class UnitsEnv(Environment):
    name = ENVIRONMENT

    def __init__(self, max_turns: int = 4):
        self.max_turns = int(max_turns)
        self.task: UnitsTask | None = None
        self.turns = 0
        self.submitted: str | None = None

    def reset(self, task: UnitsTask) -> Observation:
        self.task, self.turns, self.submitted = task, 0, None
        return Observation([{"role": "system", "content": SYSTEM, "kind": "system"},
                            {"role": "user", "content": task.question, "kind": "instruction"}])

    def _reply(self, text: str, info: dict, kind: str = "observation") -> StepResult:
        if self.turns >= self.max_turns:  # the turn limit: the verifier decides on nothing submitted
            return StepResult(Observation([]), self.verify().reward, True, {**info, "end_reason": TURN_LIMIT})
        return StepResult(Observation([{"role": "user", "content": text, "kind": kind}]), 0.0, False, info)

    def step(self, action: str) -> StepResult:
        self.turns += 1
        m = BLOCK.search(action or "")
        if m is None:
            why = "no ```convert or ```answer block"
            return self._reply(f"Format error: {why}. Reply with exactly one block.", {"format_error": why}, "format_error")
        tool, body = m.group(1), m.group(2).strip()
        if tool == "answer":
            self.submitted = body
            return StepResult(Observation([]), self.verify().reward, True,
                              {"command": f"answer {body}", "answer": body, "end_reason": SUBMITTED})
        call = CALL.match(body)
        try:
            if call is None:
                raise ValueError(f"write '<amount> <unit> to <unit>', not {body[:60]!r}")
            amount, src, dst = float(call.group(1)), call.group(2), call.group(3)
            result = f"{amount:g} {src} = {convert(amount, src, dst):.6g} {dst}"
            score, why = 1.0, "the tool ran"
        except ValueError as exc:
            result, score, why = f"Error: {exc}", 0.0, f"the tool refused: {exc}"
        return self._reply(result, {"command": f"convert {body}", "step_score": score, "step_reason": why})

    def verify(self) -> Verdict:
        """The verifier: the submitted number equals the conversion (relative tolerance 1e-4)."""
        if self.task is None or self.submitted is None:
            return Verdict(False, 0.0, "no answer submitted")
        try:
            value = float(self.submitted.replace(",", ""))
        except ValueError:
            return Verdict(False, 0.0, f"the answer {self.submitted[:40]!r} is not a number")
        ok = math.isclose(value, self.task.answer, rel_tol=1e-4, abs_tol=1e-9)
        return Verdict(ok, 1.0 if ok else 0.0, f"submitted {value:g}, expected {self.task.answer:.6g}")
