"""`tentalis import-reviews`: human reviews keyed by rollout id into `human_reviews`."""

from __future__ import annotations

from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse, now_utc


def import_human_reviews(lake: Lakehouse, path) -> dict[str, int]:
    """Import a JSONL or CSV file of human reviews keyed by rollout id. Lines naming an unknown rollout
    or carrying a bad score go to ``quarantine``; the rest are merged into ``human_reviews`` (the same
    file imported again changes nothing). The ``human`` manager then uses them for their batches."""

    from tentalis_pipelines.rewards.managers import read_review_file, validate_human_review

    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"review file {path} does not exist")
    known = {r["rollout_id"]: r["batch_id"] for r in lake.read("rollouts", columns=["rollout_id", "batch_id"]).to_pylist()}
    good, bad, seen = [], [], set()
    now = now_utc()
    for line, raw, rec, error in read_review_file(path):
        try:
            if error:
                raise ValueError(error)
            review = validate_human_review(rec)
            if review["rollout_id"] not in known:
                raise ValueError(f"unknown rollout_id {review['rollout_id']!r} (not in rollouts)")
            if review["rollout_id"] in seen:
                raise ValueError(f"rollout_id {review['rollout_id']!r} reviewed twice in this file")
        except ValueError as exc:
            bad.append({"source": str(path), "line": line, "raw": raw[:10000], "error": str(exc), "batch_id": None, "stage": "human_reviews"})
            continue
        seen.add(review["rollout_id"])
        good.append({**review, "batch_id": known[review["rollout_id"]], "source": str(path), "line": line, "imported_at": now})
    lake.replace_where("quarantine", {"source": str(path), "stage": "human_reviews"}, [{"seen_at": now, **b} for b in bad])
    lake.upsert("human_reviews", "rollout_id", good, compare=("score", "critique", "hint", "reviewer"))
    return {"applied": len(good), "quarantined": len(bad)}
