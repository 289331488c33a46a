from dagster import DynamicPartitionsDefinition

# One partition per task batch; the task_inbox sensor and the learning cycle register new ones.
task_batches = DynamicPartitionsDefinition(name="task_batches")
