"""GRPO-family losses, the LoRA trainer and the checkpoint store."""

from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, train_grpo

__all__ = ["GRPOConfig", "TrainSample", "train_grpo"]
