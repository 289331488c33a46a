"""Policy lag: how many policy versions behind the serving one a row was sampled.

The versions form a chain through ``checkpoints.parent_id``: every checkpoint trains from the policy
that served when it trained, so the serving checkpoint's ancestors, back to ``base``, are the policies
that served before it, in order. A row sampled by the serving policy has lag 0, by its parent lag 1,
and so on; a row of a policy outside the chain (a candidate the gate refused, a line given up by a
rollback) has no lag (None): nothing says how far it is from what serves, and training refuses it.

``trajectories.policy_lag`` records the lag when the row was written; it grows as new checkpoints
serve, so training computes it again (:func:`policy_lags`) and refuses rows whose lag is over
``trainer.max_policy_lag`` (0 by default: only the serving policy's own rows, as before).
"""

from __future__ import annotations

BASE = "base"


def policy_lags(parents: dict[str, str | None], serving: str) -> dict[str, int]:
    """``{policy_version: lag}`` for the serving policy and its ancestors. ``parents`` maps each
    checkpoint id to its parent (None or 'base' for a checkpoint trained from the base model).
    A cycle in the parents (a corrupt table) raises ValueError naming it."""
    lags: dict[str, int] = {}
    version: str | None = serving
    while version is not None:
        if version in lags:
            raise ValueError(f"checkpoints.parent_id forms a cycle through {version!r}: the lineage is corrupt")
        lags[version] = len(lags)
        if version == BASE:
            break
        if version not in parents:
            break  # a checkpoint without a row: its ancestors are unknown
        version = parents[version] or BASE
    return lags


def checkpoint_parents(lake) -> dict[str, str | None]:
    """``{checkpoint_id: parent_id}`` from the ``checkpoints`` table (empty before the first checkpoint)."""
    if not lake.exists("checkpoints"):
        return {}
    return {r["checkpoint_id"]: r["parent_id"] for r in lake.read("checkpoints", columns=["checkpoint_id", "parent_id"]).to_pylist()}


def serving_lags(lake) -> dict[str, int]:
    """The lag of every policy version in the serving policy's chain (see :func:`policy_lags`)."""
    from tentalis_pipelines.training.serving import serving_checkpoint

    return policy_lags(checkpoint_parents(lake), serving_checkpoint(lake))


def with_policy_lag(lake, rows: list[dict]) -> list[dict]:
    """Set ``policy_lag`` on trajectory rows (in place, and returned) from their ``policy_version``."""
    lags = serving_lags(lake)
    for r in rows:
        r["policy_lag"] = lags.get(r.get("policy_version") or "")
    return rows


def split_by_lag(rows: list[dict], lags: dict[str, int], max_lag: int) -> tuple[list[dict], list[dict]]:
    """(rows within ``max_lag`` versions of the serving policy, rows refused: older or outside the chain)."""
    if max_lag < 0:
        raise ValueError(f"max_policy_lag must be 0 or more, got {max_lag}")
    kept, refused = [], []
    for r in rows:
        lag = lags.get(r["policy_version"] or "")
        (kept if lag is not None and lag <= max_lag else refused).append(r)
    return kept, refused
