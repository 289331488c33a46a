"""Batch kinds: one resolver decides a batch's kind, and every per-batch stage calls that kind's method.

No model, no Dagster: the stage functions are called with hand-made task rows, and the functions that
do the work are replaced by spies (the stages' own tests cover the work itself)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tentalis_pipelines import quality, sessions
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.quality import CheckOutcome
from tentalis_pipelines.stages import kinds
from tentalis_pipelines.stages import reviews as stage_reviews
from tentalis_pipelines.stages import rollouts as stage_rollouts
from tentalis_pipelines.stages import step_scores as stage_step_scores
from tentalis_pipelines.stages import teacher_logprobs as stage_teacher
from tentalis_pipelines.stages import trajectories as stage_trajectories
from tentalis_pipelines.stages.common import StageResult
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.rollouts import build_rollouts
from tentalis_pipelines.stages.step_scores import build_step_scores
from tentalis_pipelines.stages.teacher_logprobs import build_teacher_logprobs
from tentalis_pipelines.stages.trajectories import build_trajectories
from tentalis_pipelines.training.trainer import GRPOConfig

NOW = datetime.now(timezone.utc)
ROOT = Path(__file__).resolve().parents[2]
OPD_ON = GRPOConfig(w_opd=0.5)


def _task(batch_id: str, task_id: str, source: str) -> dict:
    return {"batch_id": batch_id, "task_id": task_id, "source": source, "environment": "math", "prompt": "What is 1 + 1?",
            "reference": "2", "difficulty": 1, "metadata": "{}", "created_at": NOW}


@pytest.fixture()
def lake(tmp_path) -> Lakehouse:
    lake = Lakehouse(tmp_path / "lake")
    lake.write_batch("tasks", "b-tasks", [_task("b-tasks", "t0", "arithmetic"), _task("b-tasks", "t1", "arithmetic")])
    lake.write_batch("tasks", "sessions-abc", [_task("sessions-abc", "s1", sessions.SOURCE), _task("sessions-abc", "s2", sessions.SOURCE)])
    lake.write_batch("tasks", "b-mixed", [_task("b-mixed", "s1", sessions.SOURCE), _task("b-mixed", "t0", "inbox")])
    return lake


# --------------------------------------------------------------------------- the resolver
def test_a_sessions_batch_resolves_to_the_sessions_kind_and_a_task_batch_to_the_task_kind(lake):
    assert kinds.batch_kind(lake, "sessions-abc") is kinds.SESSIONS
    assert kinds.batch_kind(lake, "b-tasks") is kinds.TASKS
    # The rule is sessions.is_sessions_batch's: every task a live session. A mixed or empty batch is a task batch.
    assert kinds.batch_kind(lake, "b-mixed") is kinds.TASKS
    assert kinds.batch_kind(lake, "b-unknown") is kinds.TASKS


def test_a_lake_without_a_tasks_table_holds_task_batches(tmp_path):
    assert kinds.batch_kind(Lakehouse(tmp_path / "empty"), "sessions-abc") is kinds.TASKS


def test_the_kinds_are_tried_in_order_and_the_task_kind_claims_the_rest():
    assert kinds.KINDS[-1] is kinds.TASKS and kinds.SESSIONS in kinds.KINDS
    assert [k.name for k in kinds.KINDS] == ["sessions", "environment", "tasks"]


# --------------------------------------------------------------------------- dispatch to a registered kind
class FakeKind(kinds.BatchKind):
    """Claims the batch ``fake-1`` and records every call; each method returns a marker."""

    name = "fake"

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.asked = 0

    def matches(self, lake, batch_id):
        self.asked += 1
        return batch_id == "fake-1"

    def _record(self, method, *args, **kwargs):
        self.calls.append((method, args, kwargs))
        return StageResult(len(self.calls), {"by": f"fake.{method}"})

    def rollouts(self, lake, paths, batch_id, policy, backend=None):
        return self._record("rollouts", batch_id, backend=backend)

    def step_scores(self, lake, batch_id, *, scorer, judge=None):
        return self._record("step_scores", batch_id, scorer=scorer)

    def reviews(self, lake, batch_id, manager, llm_manager):
        return self._record("reviews", batch_id, manager=manager)

    def teacher_logprobs(self, lake, paths, batch_id, policy, config):
        return self._record("teacher_logprobs", batch_id)

    def trajectories(self, lake, batch_id, **settings):
        return self._record("trajectories", batch_id, **settings)

    def check_rollouts(self, lake, batch_id, num_generations):
        self.calls.append(("check_rollouts", (batch_id,), {"num_generations": num_generations}))
        return CheckOutcome(True, "fake.check_rollouts")

    def check_reviews(self, lake, batch_id):
        self.calls.append(("check_reviews", (batch_id,), {}))
        return CheckOutcome(True, "fake.check_reviews")


@pytest.fixture()
def fake(monkeypatch) -> FakeKind:
    kind = FakeKind()
    monkeypatch.setattr(kinds, "KINDS", (kind, *kinds.KINDS))
    return kind


def test_each_stage_calls_the_method_of_the_kind_it_resolved_once(lake, fake):
    stages = [
        ("rollouts", lambda: build_rollouts(lake, None, "fake-1", None, backend="b")),
        ("step_scores", lambda: build_step_scores(lake, "fake-1", scorer="judge")),
        ("reviews", lambda: build_reviews(lake, "fake-1", "llm")),
        ("teacher_logprobs", lambda: build_teacher_logprobs(lake, None, "fake-1", None, OPD_ON)),
        ("trajectories", lambda: build_trajectories(lake, "fake-1", scale_rewards="batch", w_opd=0.5)),
    ]
    for method, call in stages:
        asked = fake.asked
        out = call()
        assert out.metadata == {"by": f"fake.{method}"}, method
        assert fake.calls[-1][0] == method and fake.calls[-1][1] == ("fake-1",)
        assert fake.asked == asked + 1, f"{method}: the kind is resolved once per partition"
    # The stage passes its settings through, whole.
    assert fake.calls[0][2] == {"backend": "b"}
    assert fake.calls[1][2] == {"scorer": "judge"} and fake.calls[2][2] == {"manager": "llm"}
    assert fake.calls[4][2] == {"scale_rewards": "batch", "dynamic_sampling": False, "overlong_buffer": 0,
                                "max_completion_length": 128, "advantage_mode": "outcome", "w_rl": 1.0, "w_opd": 0.5,
                                "weights": None, "guide_answer_format": "lenient", "episode_format_weight": 0.0}


def test_the_quality_checks_ask_the_kind_too(lake, fake):
    assert kinds.rollouts_per_task(lake, "fake-1", 4).description == "fake.check_rollouts"
    assert kinds.one_review_per_rollout(lake, "fake-1").description == "fake.check_reviews"
    assert [c[0] for c in fake.calls] == ["check_rollouts", "check_reviews"] and fake.calls[0][2] == {"num_generations": 4}


def test_what_every_kind_shares_stays_in_the_stage(lake, fake):
    """An unknown manager fails before any kind is asked; with w_opd = 0 no kind runs a teacher pass."""
    with pytest.raises(ValueError, match="unknown manager"):
        build_reviews(lake, "fake-1", "nobody")
    out = build_teacher_logprobs(lake, None, "fake-1", None, GRPOConfig())
    assert out.rows == 0 and "off" in out.metadata["opd"] and fake.calls == [] and fake.asked == 0


def test_other_batches_do_not_reach_a_registered_kind(lake, fake, monkeypatch):
    seen = []
    monkeypatch.setattr(stage_step_scores, "score_parsed_steps", lambda lake, batch_id, **kw: seen.append(batch_id) or StageResult(0))
    build_step_scores(lake, "b-tasks")
    assert seen == ["b-tasks"] and fake.calls == []


# --------------------------------------------------------------------------- the two kinds' wiring
def _spy(monkeypatch, module, name, returns):
    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return returns

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("batch_id, stage, module, target, returns", [
    ("b-tasks", "rollouts", stage_rollouts, "sample_rollouts", StageResult(1)),
    ("sessions-abc", "rollouts", sessions, "build_session_rollouts", (1, {})),
    ("b-tasks", "step_scores", stage_step_scores, "score_parsed_steps", StageResult(1)),
    ("sessions-abc", "step_scores", stage_step_scores, "score_parsed_steps", StageResult(1)),
    ("b-tasks", "reviews", stage_reviews, "manager_reviews", StageResult(1)),
    ("sessions-abc", "reviews", stage_reviews, "session_reviews", StageResult(1)),
    ("b-tasks", "teacher_logprobs", stage_teacher, "task_teacher_logprobs", StageResult(1)),
    ("sessions-abc", "teacher_logprobs", stage_teacher, "session_teacher_logprobs", StageResult(1)),
    ("b-tasks", "trajectories", stage_trajectories, "single_turn_trajectories", StageResult(1)),
    ("sessions-abc", "trajectories", sessions, "build_session_trajectories", (1, {})),
    ("b-tasks", "check_rollouts", quality, "rollouts_cover_tasks", CheckOutcome(True, "")),
    ("sessions-abc", "check_rollouts", quality, "rollouts_cover_tasks", CheckOutcome(True, "")),
    ("b-tasks", "check_reviews", quality, "each_rollout_reviewed_once", CheckOutcome(True, "")),
    ("sessions-abc", "check_reviews", quality, "each_session_reviewed", CheckOutcome(True, "")),
])
def test_each_kind_hands_each_stage_to_its_plain_function(lake, monkeypatch, batch_id, stage, module, target, returns):
    calls = _spy(monkeypatch, module, target, returns)
    run = {
        "rollouts": lambda: build_rollouts(lake, None, batch_id, None),
        "step_scores": lambda: build_step_scores(lake, batch_id),
        "reviews": lambda: build_reviews(lake, batch_id, "verifier"),
        "teacher_logprobs": lambda: build_teacher_logprobs(lake, None, batch_id, None, OPD_ON),
        "trajectories": lambda: build_trajectories(lake, batch_id, w_opd=0.5),
        "check_rollouts": lambda: kinds.rollouts_per_task(lake, batch_id, 4),
        "check_reviews": lambda: kinds.one_review_per_rollout(lake, batch_id),
    }[stage]
    run()
    assert len(calls) == 1 and batch_id in calls[0][0]
    if stage == "check_rollouts":  # a session has one rollout per segment: no fixed count
        assert calls[0][0][2] == (4 if batch_id == "b-tasks" else None)
    if (batch_id, stage) == ("sessions-abc", "trajectories"):
        assert calls[0][1] == {"scale_rewards": "group", "dynamic_sampling": False, "w_rl": 1.0, "w_opd": 0.5}


def test_only_the_resolver_asks_whether_a_batch_is_a_sessions_batch():
    """No stage branches on the kind: ``is_sessions_batch`` is called in ``stages/kinds.py`` alone."""
    callers = sorted(str(p.relative_to(ROOT)) for folder in ("tentalis_pipelines", "assets", "jobs")
                     for p in (ROOT / folder).rglob("*.py") if re.search(r"\bis_sessions_batch\(", p.read_text())
                     and p.name != "sessions.py")
    assert callers == ["tentalis_pipelines/stages/kinds.py"]
