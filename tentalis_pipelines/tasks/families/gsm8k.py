"""The ``gsm8k`` family: consecutive slices of GSM8K's training split (``tasks/batches.register_dataset_batch``)."""

from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class Gsm8kFamily(TaskFamily):
    name = "gsm8k"
    default_recipe = Recipe()


FAMILY = Gsm8kFamily()
