"""The ``jsonl`` family: task files (math, code, chat) dropped into the inbox (``tasks/jsonl.py``)."""

from tentalis_pipelines.tasks.families import Recipe, TaskFamily


class JsonlFamily(TaskFamily):
    name = "jsonl"
    default_recipe = Recipe()


FAMILY = JsonlFamily()
