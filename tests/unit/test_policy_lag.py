"""Policy lag, by hand, on a chain of three checkpoints: base <- c1 <- c2 <- c3 (serving), x1 off the chain."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.training import trainable_trajectories
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.policy_lag import policy_lags, split_by_lag, with_policy_lag

PARENTS = {"c1": None, "c2": "c1", "c3": "c2", "x1": None, "c4": "c2"}


def test_lags_along_the_chain_by_hand():
    assert policy_lags(PARENTS, "c3") == {"c3": 0, "c2": 1, "c1": 2, "base": 3}
    assert policy_lags(PARENTS, "c4") == {"c4": 0, "c2": 1, "c1": 2, "base": 3}  # a sibling line has its own chain
    assert policy_lags(PARENTS, "base") == {"base": 0}
    assert policy_lags({}, "ghost") == {"ghost": 0}  # a serving id without a row: only itself is known


def test_a_cycle_in_the_parents_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        policy_lags({"a": "b", "b": "a"}, "a")


def test_split_refuses_rows_over_the_bound_and_off_the_chain():
    lags = policy_lags(PARENTS, "c3")
    rows = [{"rollout_id": v, "policy_version": v} for v in ("c3", "c2", "c1", "base", "x1", "c4")]
    for bound, kept in ((0, ["c3"]), (1, ["c3", "c2"]), (3, ["c3", "c2", "c1", "base"])):
        ok, refused = split_by_lag(rows, lags, bound)
        assert [r["rollout_id"] for r in ok] == kept
        assert len(refused) == 6 - len(kept)  # x1 and c4 are never kept: not ancestors of what serves
    with pytest.raises(ValueError, match="max_policy_lag"):
        split_by_lag(rows, lags, -1)


def _chain(home) -> Lakehouse:
    """c1, c2, c3 in the checkpoints table, promoted in turn (c3 serves), and x1 from the base."""
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    t0 = now_utc() - timedelta(hours=1)
    for i, (cid, parent) in enumerate((("c1", None), ("c2", "c1"), ("c3", "c2"), ("x1", None))):
        folder = home / "adapters" / cid
        folder.mkdir(parents=True)
        (folder / ckpt.MARKER).write_text(json.dumps({"files": []}))
        lake.append("checkpoints", [{"checkpoint_id": cid, "parent_id": parent, "base_model": "m", "adapter_uri": str(folder),
                                     "algorithm": "grpo", "config": "{}", "trained_on": [], "trajectory_ids": [],
                                     "trajectory_count": 0, "metrics": "{}", "promoted": False, "created_at": t0 + timedelta(minutes=i)}])
    for cid in ("c1", "c2", "c3"):
        serving.promote(lake, cid, actor="test", reason="chain")
    return lake


def test_the_lag_column_on_a_chain_of_three_checkpoints(home):
    lake = _chain(home)
    rows = [{"policy_version": v} for v in ("c3", "c2", "c1", "base", "x1")]
    assert [r["policy_lag"] for r in with_policy_lag(lake, rows)] == [0, 1, 2, 3, None]


def test_training_refuses_rows_older_than_the_bound_and_counts_them(home):
    lake = _chain(home)
    t = now_utc()
    lake.write_batch("trajectories", "b1", [{"batch_id": "b1", "rollout_id": f"r-{v}-{i}", "task_id": "t", "group_index": i,
                                             "policy_version": v, "advantage": 1.0, "kept": True, "created_at": t}
                                            for v in ("c3", "c2", "c1", "base", "x1") for i in range(2)]
                     + [{"batch_id": "b1", "rollout_id": "r-dropped", "task_id": "t", "group_index": 9, "policy_version": "c3",
                         "advantage": 0.0, "kept": False, "created_at": t}])  # not kept: neither trained nor refused
    for bound, versions, refused in ((0, {"c3"}, 8), (1, {"c3", "c2"}, 6), (2, {"c3", "c2", "c1"}, 4), (5, {"c3", "c2", "c1", "base"}, 2)):
        kept, n = trainable_trajectories(lake, "c3", bound)
        assert {r["policy_version"] for r in kept} == versions and len(kept) == 2 * len(versions)
        assert n == refused, (bound, n)


def test_a_negative_bound_is_refused_in_the_config():
    from tentalis_pipelines.training.trainer import GRPOConfig

    assert GRPOConfig(max_policy_lag=0).max_policy_lag == 0
    with pytest.raises(ValueError, match="max_policy_lag must be 0 or more policy versions, got -1"):
        GRPOConfig(max_policy_lag=-1)


class _Refusing:
    """A launcher that records the job the stage built and fails (no model is trained)."""

    name = "recording"

    def __init__(self):
        self.jobs = []

    def launch(self, job, on_step=None):
        self.jobs.append(job)
        raise RuntimeError("stop here")


def test_the_checkpoints_stage_trains_the_rows_its_bound_admits(home):
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.stages.training import train_checkpoint
    from tentalis_pipelines.training.trainer import GRPOConfig

    lake = _chain(home)
    paths = Paths.from_env(home)
    t = now_utc()
    lake.write_batch("trajectories", "b1", [{"batch_id": "b1", "rollout_id": f"r-{v}", "task_id": "t", "group_index": i,
                                             "policy_version": v, "advantage": 1.0, "kept": True, "created_at": t}
                                            for i, v in enumerate(("c3", "c2", "c1", "x1"))])
    for bound, ids in ((0, ["r-c3"]), (1, ["r-c3", "r-c2"])):
        launcher = _Refusing()
        with pytest.raises(RuntimeError, match="stop here"):
            train_checkpoint(lake, paths, PolicySettings(model="embedded"), GRPOConfig(max_policy_lag=bound), promote=False,
                             launcher=launcher)
        [job] = launcher.jobs
        assert job.trajectory_ids == ids and job.policy_version == "c3", bound
