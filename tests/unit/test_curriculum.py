"""The curriculum's choice of a batch's levels, against hand computations of its documented rule
(tasks/curriculum.py), the success figures read from the lakehouse, and the record in the manifest."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

import pytest

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.tasks import batches
from tentalis_pipelines.tasks.curriculum import (
    CurriculumChoice,
    choose_levels,
    curriculum_table,
    level_weights,
    plan,
    recent_success,
)

RNG = random.Random(0)


def counts(levels):
    return {lv: levels.count(lv) for lv in sorted(set(levels))}


def test_no_history_starts_at_the_lowest_level():
    assert level_weights({}, (0, 1, 2, 3)) == {0: 0.5, 1: 0.0, 2: 0.0, 3: 0.0}
    assert choose_levels({}, 8, RNG) == [0] * 8
    assert choose_levels({}, 1, RNG, levels=(1, 2, 3)) == [1]


def test_the_boundaries_at_20_and_80_percent_exactly():
    # 0.8 is mastered (review weight 0.1); 0.2 is in the learning zone (1.0); just below 0.2 is not.
    assert level_weights({0: 0.8}, (0, 1, 2, 3)) == {0: 0.1, 1: 0.5, 2: 0.0, 3: 0.0}
    assert level_weights({0: 0.7999}, (0, 1, 2, 3)) == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert level_weights({0: 0.9, 1: 0.2}, (0, 1, 2, 3)) == {0: 0.1, 1: 1.0, 2: 0.0, 3: 0.0}
    assert level_weights({0: 0.9, 1: 0.1999}, (0, 1, 2, 3)) == {0: 0.1, 1: 0.5, 2: 0.0, 3: 0.0}
    # By hand: {0: 0.8} gives 12 x 0.1/0.6 = 2 tasks of level 0 and 12 x 0.5/0.6 = 10 of level 1.
    assert counts(choose_levels({0: 0.8}, 12, RNG)) == {0: 2, 1: 10}
    # {0: 0.9, 1: 0.2}: 11 x 0.1/1.1 = 1 and 11 x 1.0/1.1 = 10.
    assert counts(choose_levels({0: 0.9, 1: 0.2}, 11, RNG)) == {0: 1, 1: 10}


def test_a_learning_zone_level_above_the_frontier_weighs_most_and_the_frontier_keeps_mass():
    success = {0: 0.9, 1: 0.1, 2: 0.5}  # level 1 is the frontier (not mastered, below 20%), level 2 in the zone
    assert level_weights(success, (0, 1, 2, 3)) == {0: 0.1, 1: 0.5, 2: 1.0, 3: 0.0}
    # 16 x (0.1, 0.5, 1.0) / 1.6 = 1, 5, 10 exactly
    assert counts(choose_levels(success, 16, RNG)) == {0: 1, 1: 5, 2: 10}
    # with one task the frontier still gets it, though level 2's share (0.67) is larger
    assert choose_levels(success, 1, random.Random(3)) == [1]


def test_all_mastered_practises_the_highest_level_and_reviews_the_rest():
    success = {0: 0.8, 1: 0.9, 2: 1.0, 3: 0.85}
    assert level_weights(success, (0, 1, 2, 3)) == {0: 0.1, 1: 0.1, 2: 0.1, 3: 1.0}
    assert counts(choose_levels(success, 13, RNG)) == {0: 1, 1: 1, 2: 1, 3: 10}


def test_left_over_seats_go_to_the_largest_remainders_and_the_choice_is_reproducible():
    # {0: 0.8}: 5 x (1/6, 5/6) = 0.83 and 4.17: level 0 gets the left-over seat (remainder 0.83 > 0.17).
    assert counts(choose_levels({0: 0.8}, 5, RNG)) == {0: 1, 1: 4}
    success = {0: 0.5, 1: 0.5}  # equal weights, an odd count: the tie is the rng's, the same for the same seed
    first = choose_levels(success, 7, random.Random(42))
    assert first == choose_levels(success, 7, random.Random(42)) and len(first) == 7 and first == sorted(first)
    assert sorted(counts(first).values()) == [3, 4]
    with pytest.raises(ValueError, match="n_tasks"):
        choose_levels({}, 0, RNG)
    with pytest.raises(ValueError, match="at least one level"):
        level_weights({}, ())


def _episode_rows(batch_id, created, outcomes):
    rows = []
    for i, (level, passed) in enumerate(outcomes):
        sid = f"{batch_id}-e{i}"
        for seg in (0, 1):  # two segments of one episode count once
            rows.append({"batch_id": batch_id, "rollout_id": f"{sid}-{seg}", "task_id": f"t{i}", "group_index": 0, "session_id": sid,
                         "policy_version": "base", "created_at": created,
                         "episode": json.dumps({"environment": "terminal", "level": level, "passed": passed})})
    return rows


def test_recent_success_reads_each_levels_newest_episodes_from_the_rollouts(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    assert recent_success(lake, (0, 1, 2, 3)) == ({}, {})
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    lake.write_batch("rollouts", "old", _episode_rows("old", t0, [(0, False)] * 4))
    lake.write_batch("rollouts", "new", _episode_rows("new", t0 + timedelta(hours=1), [(0, True), (0, True), (0, True), (1, False)]))
    success, episodes = recent_success(lake, (0, 1, 2, 3), window=5)
    # level 0: the 3 newest (passed) and 2 of the old ones (failed), 5 at most; level 1: one failure
    assert success == {0: 0.6, 1: 0.0} and episodes == {0: 5, 1: 1}
    choice = plan(lake, 4, random.Random(0))
    assert choice.success_by_level == {0: 3 / 7, 1: 0.0}  # the default window holds all 7 of level 0
    assert choice.levels == (0, 0, 0, 0)  # level 0 is in the zone, level 1 above the frontier and below 20%


def test_the_choice_is_recorded_in_the_manifest_and_shown_as_a_table(tmp_path):
    choice = CurriculumChoice((0, 0, 1), {0: 0.8}, {0: 64}, {0: 0.1, 1: 0.5, 2: 0.0, 3: 0.0})
    record = choice.record()
    assert record["tasks_per_level"] == {"0": 2, "1": 1} and record["success_by_level"] == {"0": 0.8}
    bid = batches.register_terminal_batch(tmp_path, seed=5, num_tasks=3, levels=choice.levels, curriculum=record)
    manifest = json.loads((tmp_path / bid / "manifest.json").read_text())
    assert manifest["levels"] == [0, 0, 1] and manifest["curriculum"] == record
    assert [r["difficulty"] for r in batches.load_batch(tmp_path, bid, datetime.now(timezone.utc)).tasks] == [0, 0, 1]
    table = curriculum_table(record)
    assert "| 0 | 80% | 64 | 0.1 | 2 |" in table and "| 1 | — | 0 | 0.5 | 1 |" in table
    # a killed curriculum cycle's batch is resumed whatever levels it drew
    assert batches.interrupted_cycle_batch(tmp_path, task_source="terminal", num_tasks=3, levels=None, settled=set()) == bid
    assert batches.interrupted_cycle_batch(tmp_path, task_source="terminal", num_tasks=3, levels=None, settled={bid}) is None
    assert batches.interrupted_cycle_batch(tmp_path, task_source="terminal", num_tasks=4, levels=None, settled=set()) is None


def test_the_record_is_exactly_the_choice_and_its_rule():
    choice = CurriculumChoice((2, 0, 2), {2: 0.123456, 0: 0.9}, {2: 12, 0: 64}, {2: 0.75, 0: 0.05, 10: 0.2})
    assert choice.record() == {
        "rule": "success-zone 20%-80% (tasks/curriculum.py)",
        "tasks_per_level": {"2": 2, "0": 1},  # in the order the levels were drawn
        "success_by_level": {"0": 0.9, "2": 0.1235},  # rounded to 4 places, sorted by level
        "episodes_by_level": {"0": 64, "2": 12},
        "weights": {"0": 0.05, "2": 0.75, "10": 0.2},  # sorted as numbers: 2 before 10
        "window": 64,
    }


def test_the_table_of_a_record_by_hand_including_partial_and_foreign_records():
    record = {"tasks_per_level": {"10": 1, "2": 3}, "weights": {"2": 0.5, "10": 0.25, "3": 0.25},
              "success_by_level": {"2": 0.5}, "episodes_by_level": {"2": 8, "10": 4}}
    assert curriculum_table(record) == "\n".join([
        "| level | recent success | episodes | weight | tasks |", "|---|---|---|---|---|",
        "| 2 | 50% | 8 | 0.5 | 3 |",
        "| 3 | — | 0 | 0.25 | 0 |",  # a level with a weight and no task: shown, its unset values as 0
        "| 10 | — | 4 | 0.25 | 1 |",  # numeric order: 10 after 3
    ])
    # only tasks (no weights, success or episodes recorded): every other column falls back
    assert curriculum_table({"tasks_per_level": {"1": 2}}).splitlines()[2] == "| 1 | — | 0 | 0.0 | 2 |"
    # only weights
    assert curriculum_table({"weights": {"0": 1.0}}).splitlines()[2] == "| 0 | — | 0 | 1.0 | 0 |"
    # an empty record: the header alone
    assert curriculum_table({}) == "| level | recent success | episodes | weight | tasks |\n|---|---|---|---|---|"


def test_the_tasks_asset_shows_the_curriculums_choice():
    from tentalis_pipelines.stages.tasks import curriculum_metadata

    record = CurriculumChoice((0, 1), {0: 0.8}, {0: 10}, {0: 0.1, 1: 0.5}).record()
    meta = curriculum_metadata({"kind": "terminal", "curriculum": record})
    assert meta["curriculum"].startswith("| level |") and json.loads(meta["curriculum_record"]) == record
    assert curriculum_metadata({"kind": "terminal"}) == {}  # a batch of hand-picked levels shows none


@pytest.mark.parametrize(("args", "curriculum", "levels"), [
    ([], True, (0, 1, 2, 3)),                      # no --levels: the curriculum chooses from every level
    (["--levels", "1"], False, (1,)),              # hand-picked levels: as before
    (["--levels", "0,1", "--curriculum"], True, (0, 1)),  # the curriculum within the levels given
    (["--no-curriculum"], False, (1,)),
])
def test_learn_on_terminal_tasks_uses_the_curriculum_unless_levels_are_given(home, tmp_path, monkeypatch, args, curriculum, levels):
    from typer.testing import CliRunner

    from tentalis_pipelines.cli import app
    from tentalis_pipelines.cli import cycle as cli_cycle

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    for var in ("TENTALIS_MODEL", "TENTALIS_BACKEND", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    seen = []
    monkeypatch.setattr(cli_cycle, "_execute_cycle", lambda opts, label: seen.append(opts) or {})
    out = CliRunner().invoke(app, ["learn", "--tasks", "terminal", "--cycles", "1", *args])
    assert out.exit_code == 0, out.output
    (opts,) = seen
    assert (opts.curriculum, tuple(opts.levels)) == (curriculum, levels)
    gate = opts.resources["benchmark"]["config"]["gate_benchmark"]
    assert gate == ("terminal" if curriculum else "terminal-l1")
    refused = CliRunner().invoke(app, ["learn", "--tasks", "arithmetic", "--curriculum", "--cycles", "1"])
    assert refused.exit_code == 2 and "--curriculum" in refused.output
