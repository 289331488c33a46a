"""Batch kinds: what a batch's stages do, decided once per partition.

A batch is tasks -> rollouts -> step_scores -> reviews -> (teacher_logprobs) -> trajectories whatever
its tasks are, but *how* some of those stages work depends on what the batch holds. Each per-batch
stage asks :func:`batch_kind` once for its partition and calls the kind's method; the plain functions
that do the work stay in their stage modules (``stages/*.py``, ``quality.py``) and in ``sessions.py``.
This module is only the dispatch: it holds no stage logic of its own.

The kinds:

* :class:`TaskBatch` (``TASKS``): tasks with a reference answer (``math``, ``code``, ...). Generated
  batches (``tasks/arithmetic.py``), task files (``tasks/jsonl.py``, the inbox) and dataset slices
  (``tasks/batches.py``) are one kind: they differ only in where their tasks come from, which the
  ``tasks`` stage settles from the batch's manifest. G samples per task from the serving policy, step
  scores of the parsed steps, one manager review per rollout, single-turn trajectories with
  group-relative advantages.
* :class:`EnvironmentBatch` (``ENVIRONMENT``): agent environments (issue #28; the terminal family so
  far), every task an environment's (``environment = 'terminal'``). G episodes per task with the serving
  policy, each a multi-turn rollout shaped like a session segment; the environment's step scores per
  turn (recorded, not trained on); one review per episode scored by the verifier (critique and hint by
  the llm manager when ``review.manager = 'llm'``); ``multi_turn`` trajectories with the G episodes of a task as the
  GRPO group (``env_batches.py``).
* :class:`SessionsBatch` (``SESSIONS``): live sessions that the ``fresh_sessions`` sensor cut
  (``sessions-<hash>``, see ``sessions.py``). Rollouts are built from the turns (never sampled again),
  reviews are the sessions' live reviews (and the judge's), trajectories are ``multi_turn`` rows.

The operations (each a method of :class:`BatchKind`), who calls them, and what differs between kinds:

* ``matches``: :func:`batch_kind`; which batches are of this kind.
* ``rollouts``: ``stages.rollouts.build_rollouts``; sampled per task, or built from the turns.
* ``step_scores``: ``stages.step_scores.build_step_scores``; whether and how steps are scored (one
  shared default today: a session's rollouts state no steps, so it scores none).
* ``reviews``: ``stages.reviews.build_reviews``; a manager's review per rollout, or the live reviews.
* ``teacher_logprobs``: ``stages.teacher_logprobs.build_teacher_logprobs`` (when ``w_opd > 0``); the
  hint after the task, or after the segment's last user message with the signal on assistant tokens.
* ``trajectories``: ``stages.trajectories.build_trajectories``; ``single`` rows with group advantages,
  or ``multi_turn`` rows with per-turn advantages and a loss mask.
* ``check_rollouts``: :func:`rollouts_per_task` (the asset check); exactly G per task, or at least one per session.
* ``check_reviews``: :func:`one_review_per_rollout` (the asset check); one per rollout, or at least one per session.

What every kind shares stays in the stage (the manager name's validation, the ``w_opd = 0`` shortcut).

How a batch's kind is decided: from its ``tasks`` rows (a batch whose every task has
``source = 'live-sessions'`` is a sessions batch, ``sessions.is_sessions_batch``), so every stage after
``tasks`` agrees. The ``tasks`` stage itself runs before those rows exist: it reads the batch's
manifest (``stages/tasks.py``: ``sessions.is_sessions_manifest``, else ``tasks.batches.load_batch``).

Adding a kind: the agent environments of issue #28 (terminal, BFCL tool calls, mini-SWE). The
``EnvironmentBatch`` below follows this plan for the terminal family (``env_batches.py``; its step scores
are none and its teacher log-probs empty so far). An ``EnvironmentBatch`` is a task source (a manifest kind that the ``tasks`` stage loads: each task an
environment, its initial state and its verifier) plus a rollout kind, and implements:

* ``matches``: the batch's tasks come from an environment (e.g. their ``environment`` or ``source``
  names an environment family);
* ``rollouts``: G episodes per task (``reset(task)``, then policy turn / ``step(action)`` up to the turn
  limit, then the final verifier), each landing as a multi-turn rollout like a session segment: turn
  spans, the assistant mask (observations masked out), token ids and sampling log-probs, the verdict;
* ``step_scores``: the shared default (the parsed steps), or a score per turn's action;
* ``reviews``: one per episode, the verifier's outcome as the score plus the configured manager's
  critique and hint;
* ``teacher_logprobs``: like sessions (the hint after the last user or observation message, the signal
  on the assistant tokens only);
* ``trajectories``: ``multi_turn`` rows with group-relative advantages over the G episodes of a task;
* ``check_rollouts`` / ``check_reviews``: G episodes per task, one review per episode.

and goes into :data:`KINDS` ahead of ``TASKS``. No stage changes: the trainer already tells rows apart
by the trajectory's ``kind`` column (``single`` / ``multi_turn``), a property of each row, not of its batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.stages.common import StageResult

if TYPE_CHECKING:
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.quality import CheckOutcome
    from tentalis_pipelines.rewards.llm_manager import LLMManager
    from tentalis_pipelines.rewards.scoring import RewardWeights
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.training.trainer import GRPOConfig

# The implementations are imported where they are called: the stage modules import this one (a cycle
# otherwise), and the asset checks below load no stage (nor torch) until a check runs.


class BatchKind(ABC):
    """The per-stage operations in which batch kinds differ (see the module docstring for the table)."""

    name: str

    @abstractmethod
    def matches(self, lake: Lakehouse, batch_id: str) -> bool:
        """Whether ``batch_id`` is of this kind (read from its ``tasks`` rows)."""

    @abstractmethod
    def rollouts(self, lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, backend=None) -> StageResult:
        """Write the batch's ``rollouts``."""

    def step_scores(self, lake: Lakehouse, batch_id: str, *, scorer: str, judge=None) -> StageResult:
        """Write the batch's ``step_scores``: every parsed step of every rollout, checked or judged."""
        from tentalis_pipelines.stages.step_scores import score_parsed_steps

        return score_parsed_steps(lake, batch_id, scorer=scorer, judge=judge)

    @abstractmethod
    def reviews(self, lake: Lakehouse, batch_id: str, manager: str,
                llm_manager: LLMManager | Callable[[], LLMManager] | None) -> StageResult:
        """Write the batch's ``reviews`` (``manager`` is already validated)."""

    @abstractmethod
    def teacher_logprobs(self, lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings,
                         config: GRPOConfig) -> StageResult:
        """Write the batch's ``teacher_logprobs`` (called only when ``config.w_opd > 0``)."""

    @abstractmethod
    def trajectories(self, lake: Lakehouse, batch_id: str, *, scale_rewards: str, dynamic_sampling: bool,
                     overlong_buffer: int, max_completion_length: int, advantage_mode: str, w_rl: float, w_opd: float,
                     weights: RewardWeights | None, guide_answer_format: str = "lenient",
                     episode_format_weight: float = 0.0) -> StageResult:
        """Write the batch's ``trajectories`` (``guide_answer_format``: which hint-guided successes join
        their group, task batches; ``episode_format_weight``: the format reward's weight, environment
        batches)."""

    @abstractmethod
    def check_rollouts(self, lake: Lakehouse, batch_id: str, num_generations: int) -> CheckOutcome:
        """The ``rollouts_per_task`` check: every task has the rollouts this kind expects."""

    @abstractmethod
    def check_reviews(self, lake: Lakehouse, batch_id: str) -> CheckOutcome:
        """The ``one_review_per_rollout`` check: every unit of this kind is reviewed, no review is an orphan."""

    def __repr__(self) -> str:
        return f"<batch kind {self.name}>"


class TaskBatch(BatchKind):
    """Tasks with a reference answer: generated, from a task file or from a dataset (one kind)."""

    name = "tasks"

    def matches(self, lake: Lakehouse, batch_id: str) -> bool:
        return True  # every batch that no other kind claims

    def rollouts(self, lake, paths, batch_id, policy, backend=None):
        from tentalis_pipelines.stages.rollouts import sample_rollouts

        return sample_rollouts(lake, paths, batch_id, policy, backend)

    def reviews(self, lake, batch_id, manager, llm_manager):
        from tentalis_pipelines.stages.reviews import manager_reviews

        return manager_reviews(lake, batch_id, manager, llm_manager)

    def teacher_logprobs(self, lake, paths, batch_id, policy, config):
        from tentalis_pipelines.stages.teacher_logprobs import task_teacher_logprobs

        return task_teacher_logprobs(lake, paths, batch_id, policy, config)

    def trajectories(self, lake, batch_id, *, scale_rewards, dynamic_sampling, overlong_buffer, max_completion_length,
                     advantage_mode, w_rl, w_opd, weights, guide_answer_format="lenient", episode_format_weight=0.0):
        from tentalis_pipelines.stages.trajectories import single_turn_trajectories

        return single_turn_trajectories(lake, batch_id, scale_rewards=scale_rewards, dynamic_sampling=dynamic_sampling,
                                        overlong_buffer=overlong_buffer, max_completion_length=max_completion_length,
                                        advantage_mode=advantage_mode, w_rl=w_rl, w_opd=w_opd, weights=weights,
                                        guide_answer_format=guide_answer_format)

    def check_rollouts(self, lake, batch_id, num_generations):
        from tentalis_pipelines.quality import rollouts_cover_tasks

        return rollouts_cover_tasks(lake, batch_id, num_generations)

    def check_reviews(self, lake, batch_id):
        from tentalis_pipelines.quality import each_rollout_reviewed_once

        return each_rollout_reviewed_once(lake, batch_id)


class SessionsBatch(BatchKind):
    """Live sessions cut by the ``fresh_sessions`` sensor (``sessions.py``). Their rollouts state no
    steps, so the shared ``step_scores`` writes none."""

    name = "sessions"

    def matches(self, lake: Lakehouse, batch_id: str) -> bool:
        from tentalis_pipelines import sessions

        return sessions.is_sessions_batch(lake, batch_id)

    def rollouts(self, lake, paths, batch_id, policy, backend=None):
        from tentalis_pipelines import sessions

        return StageResult(*sessions.build_session_rollouts(lake, batch_id))  # built from the turns, never sampled again

    def reviews(self, lake, batch_id, manager, llm_manager):
        from tentalis_pipelines.stages.reviews import session_reviews

        return session_reviews(lake, batch_id, manager, llm_manager)

    def teacher_logprobs(self, lake, paths, batch_id, policy, config):
        from tentalis_pipelines.stages.teacher_logprobs import session_teacher_logprobs

        return session_teacher_logprobs(lake, paths, batch_id, policy, config)

    def trajectories(self, lake, batch_id, *, scale_rewards, dynamic_sampling, overlong_buffer, max_completion_length,
                     advantage_mode, w_rl, w_opd, weights, guide_answer_format="lenient", episode_format_weight=0.0):
        from tentalis_pipelines import sessions

        return StageResult(*sessions.build_session_trajectories(lake, batch_id, scale_rewards=scale_rewards,
                                                                dynamic_sampling=dynamic_sampling, w_rl=w_rl, w_opd=w_opd))

    def check_rollouts(self, lake, batch_id, num_generations):
        from tentalis_pipelines.quality import rollouts_cover_tasks

        return rollouts_cover_tasks(lake, batch_id, None)  # at least one per session: one per segment

    def check_reviews(self, lake, batch_id):
        from tentalis_pipelines.quality import each_session_reviewed

        return each_session_reviewed(lake, batch_id)


class EnvironmentBatch(BatchKind):
    """Agent episodes in an environment (the terminal family: ``tasks.batches.register_terminal_batch``):
    G episodes per task with the serving policy, the environment's step scores per turn, the verifier's
    verdict as each episode's score (critique and hint by the llm manager when it is configured),
    ``multi_turn`` trajectories grouped per task (``env_batches.py``), the guided episodes of all-fail
    groups among them with ``--method guide`` (``stages/guided_rollouts.py`` dispatches to
    ``env_batches.build_environment_guided_rollouts``). No hinted OPD yet."""

    name = "environment"

    def matches(self, lake: Lakehouse, batch_id: str) -> bool:
        from tentalis_pipelines import env_batches

        return env_batches.is_environment_batch(lake, batch_id)

    def rollouts(self, lake, paths, batch_id, policy, backend=None):
        from tentalis_pipelines import env_batches

        return StageResult(*env_batches.build_environment_rollouts(lake, paths, batch_id, policy, backend))

    def step_scores(self, lake, batch_id, *, scorer, judge=None):
        from tentalis_pipelines import env_batches

        # The environment's own signal per turn (exit status, a failed call), whatever the configured scorer.
        return StageResult(*env_batches.build_environment_step_scores(lake, batch_id))

    def reviews(self, lake, batch_id, manager, llm_manager):
        from tentalis_pipelines import env_batches
        from tentalis_pipelines.envs.verdicts import VERIFIER

        if manager == "llm":
            return StageResult(*env_batches.build_environment_reviews(lake, batch_id, manager, llm_manager))
        n, meta = env_batches.build_environment_reviews(lake, batch_id)
        if manager != VERIFIER:
            meta["configured_manager"] = f"{manager}: not used (environment episodes are reviewed by their verifier)"
        return StageResult(n, meta)

    def teacher_logprobs(self, lake, paths, batch_id, policy, config):
        n = lake.write_batch("teacher_logprobs", batch_id, [])
        return StageResult(n, {"opd": "not built for environment batches yet: no teacher pass"})

    def trajectories(self, lake, batch_id, *, scale_rewards, dynamic_sampling, overlong_buffer, max_completion_length,
                     advantage_mode, w_rl, w_opd, weights, guide_answer_format="lenient", episode_format_weight=0.0):
        from tentalis_pipelines import env_batches

        return StageResult(*env_batches.build_environment_trajectories(lake, batch_id, scale_rewards=scale_rewards,
                                                                       dynamic_sampling=dynamic_sampling, w_rl=w_rl, w_opd=w_opd,
                                                                       format_weight=episode_format_weight))

    def check_rollouts(self, lake, batch_id, num_generations):
        from tentalis_pipelines import env_batches
        from tentalis_pipelines.quality import CheckOutcome

        return CheckOutcome(*env_batches.episodes_per_task(lake, batch_id, num_generations))

    def check_reviews(self, lake, batch_id):
        from tentalis_pipelines import env_batches
        from tentalis_pipelines.quality import CheckOutcome

        return CheckOutcome(*env_batches.one_review_per_episode(lake, batch_id))


TASKS = TaskBatch()
SESSIONS = SessionsBatch()
ENVIRONMENT = EnvironmentBatch()

# Asked in order; the first kind that matches is the batch's. ``TASKS`` matches every batch: it stays last.
KINDS: tuple[BatchKind, ...] = (SESSIONS, ENVIRONMENT, TASKS)


def batch_kind(lake: Lakehouse, batch_id: str) -> BatchKind:
    """The kind of ``batch_id``: the first of :data:`KINDS` that claims it. Each stage calls this once
    for its partition and then calls the kind's method, never branching on the kind itself."""
    for kind in KINDS:
        if kind.matches(lake, batch_id):
            return kind
    raise LookupError(f"no batch kind claims batch {batch_id!r}")  # unreachable while TASKS is in KINDS


def rollouts_per_task(lake: Lakehouse, batch_id: str, num_generations: int) -> CheckOutcome:
    """The ``rollouts_per_task`` asset check: every task of the batch has the rollouts its kind expects
    (:meth:`BatchKind.check_rollouts`): exactly ``num_generations`` for a task batch, at least one per
    session (one per segment) for a sessions batch."""
    return batch_kind(lake, batch_id).check_rollouts(lake, batch_id, num_generations)


def one_review_per_rollout(lake: Lakehouse, batch_id: str) -> CheckOutcome:
    """The ``one_review_per_rollout`` asset check: the batch's reviews cover it as its kind expects
    (:meth:`BatchKind.check_reviews`): a task batch (``quality.each_rollout_reviewed_once``), a sessions
    batch (``quality.each_session_reviewed``)."""
    return batch_kind(lake, batch_id).check_reviews(lake, batch_id)
