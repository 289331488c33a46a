"""``units``: an example Tentalis task family in a package of its own (issue 71).

Installed next to Tentalis, the entry point in this package's ``pyproject.toml`` adds the family:
``tentalis learn --tasks units`` trains on its seeded tasks, ``units`` is a benchmark (its held-out
split) and the gate, and the contamination guard keeps the held-out tasks out of training. Nothing
in Tentalis names it.
"""

from __future__ import annotations

import json

from tentalis_family_units import tasks
from tentalis_family_units.env import ENVIRONMENT, UnitsEnv
from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class UnitsFamily(TaskFamily):
    name = "units"
    environment = ENVIRONMENT
    levels = tasks.LEVELS
    # Short replies (one block), a few turns: convert, then answer.
    default_recipe = Recipe(temperature=0.7, max_new_tokens=48, max_turns=4)
    # The verifier review's hint per failure type, in this tool's words (the generic ones speak of bash).
    hints = {
        "format": "Reply with exactly one ```convert block (amount, unit, 'to', unit) or one ```answer block holding a number.",
        "turn_limit": "Call ```convert once, then submit its result in an ```answer block within the turn limit.",
        "wrong_answer": "Submit exactly the number the ```convert tool printed, in the unit the question asks for.",
    }

    def training_tasks(self, seed, num_tasks, levels):
        return tasks.training_tasks(seed, num_tasks, tuple(levels))

    def held_out_tasks(self, levels=()):
        return tasks.held_out_tasks(tuple(levels) or tasks.LEVELS)

    def task_row(self, task):
        return {"task_id": task.task_id, "environment": ENVIRONMENT, "prompt": task.question,
                "reference": json.dumps({"answer": task.answer}),
                "metadata": json.dumps({"level": task.level, "split": task.split, "amount": task.amount,
                                        "from_unit": task.from_unit, "to_unit": task.to_unit}, sort_keys=True)}

    def task_from_row(self, row):
        meta = json.loads(row["metadata"])
        return tasks.UnitsTask(row["task_id"], int(meta["level"]), float(meta["amount"]), meta["from_unit"], meta["to_unit"],
                               float(json.loads(row["reference"])["answer"]), meta.get("split", "train"))

    def fingerprint(self, task):
        return tasks.fingerprint(task)

    def make_env(self, max_turns):
        return UnitsEnv(max_turns=max_turns)


FAMILY = UnitsFamily()
