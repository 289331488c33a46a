"""The stages of the learning loop as plain functions over the lakehouse.

Each stage reads its input tables, calls the library and replaces its own output for one batch; one
module per stage under ``tentalis_pipelines/stages/``. This module is the one import the Dagster assets
(``assets/``) use, so the logic is tested without Dagster and runs the same way from the UI, the CLI and
CI. The promotion gate lives in ``promotion.py``; live sessions in ``sessions.py``.
"""

# isort: skip_file
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.training.trainer import GRPOConfig
from tentalis_pipelines.stages.common import StageResult, markdown_table
from tentalis_pipelines.stages.tasks import NoValidTasks, build_tasks, prompt_token_counter
from tentalis_pipelines.stages.rollouts import build_rollouts, current_policy, rollout_id
from tentalis_pipelines.stages.step_scores import build_step_scores, step_reward
from tentalis_pipelines.stages.reviews import build_reviews, review_inputs
from tentalis_pipelines.stages.teacher_logprobs import build_teacher_logprobs
from tentalis_pipelines.stages.trajectories import build_trajectories
from tentalis_pipelines.stages.training import FRESH_SQL, fresh_trajectories, fresh_trajectory_count, summarize, train_checkpoint
from tentalis_pipelines.stages.evaluation import benchmark_checkpoint, resolve_checkpoint
from tentalis_pipelines.stages.human_reviews import import_human_reviews
from tentalis_pipelines.stages.step_labels import build_step_labels
from tentalis_pipelines.stages.skills import build_skills, skill_retriever

__all__ = ['FRESH_SQL', 'GRPOConfig', 'NoValidTasks', 'PolicySettings', 'StageResult', 'benchmark_checkpoint', 'build_reviews', 'build_rollouts', 'build_skills', 'build_step_labels', 'build_step_scores', 'build_tasks', 'build_teacher_logprobs', 'build_trajectories', 'current_policy', 'fresh_trajectories', 'fresh_trajectory_count', 'import_human_reviews', 'markdown_table', 'prompt_token_counter', 'resolve_checkpoint', 'review_inputs', 'rollout_id', 'skill_retriever', 'step_reward', 'summarize', 'train_checkpoint']
