"""Tentalis: LLM agents that learn from their manager's reviews.

A Dagster batch pipeline over a Delta Lake lakehouse: tasks become rollouts, rollouts get step scores
and manager reviews, the scored work becomes trajectories, and a GRPO-family trainer turns them into
LoRA checkpoints.
"""

__version__ = "0.1.0"
