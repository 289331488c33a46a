"""The ``arithmetic`` family: seeded multi-step word problems (``tasks/arithmetic.py``)."""

from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class ArithmeticFamily(TaskFamily):
    name = "arithmetic"
    levels = (1, 2, 3)
    default_recipe = Recipe()  # the policy resource's sampling (temperature 0.8)


FAMILY = ArithmeticFamily()
