from dagster import DynamicPartitionsDefinition

# One partition per task batch; the task_inbox sensor, the nightly schedule and `tentalis batch new`
# (or `tentalis run`) register new ones.
task_batches = DynamicPartitionsDefinition(name="task_batches")

# One partition per checkpoint ("base" for the base model): `checkpoints` registers each new one.
checkpoint_ids = DynamicPartitionsDefinition(name="checkpoint_ids")
