"""Task sources: the seeded arithmetic generator, JSONL task files, and the inbox of task batches."""

from tentalis_pipelines.tasks.arithmetic import ArithmeticTask, generate_arithmetic
from tentalis_pipelines.tasks.batches import (
    BatchNotRegistered,
    load_batch,
    register_file_batch,
    register_generated_batch,
    scan_inbox,
)
from tentalis_pipelines.tasks.jsonl import load_jsonl_tasks, parse_task_record

__all__ = [
    "ArithmeticTask",
    "BatchNotRegistered",
    "generate_arithmetic",
    "load_batch",
    "load_jsonl_tasks",
    "parse_task_record",
    "register_file_batch",
    "register_generated_batch",
    "scan_inbox",
]
