"""Planted bugs in retraction (``tentalis_pipelines/retraction.py``): what goes with a retracted review,
session or task, which checkpoints it taints and where serving falls back to.

Guarded by tests/test_retraction_chain.py (a chain of three checkpoints with a sibling line and an
unpromoted child, written by hand), tests/unit/test_lineage.py (LLM-distilled skills retracted with
their review) and the session retraction in tests/test_lineage_integration.py (sessions retracted
everywhere on disk); all pure (no model, no Dagster run).

No mutant here is equivalent."""

R = "tentalis_pipelines/retraction.py"
T = ["tests/test_retraction_chain.py", "tests/unit/test_lineage.py",
     "tests/test_lineage_integration.py::test_retracting_a_session_removes_its_turns_reviews_and_batch_rows_everywhere_on_disk"]

MUTANTS = [
    {"id": "retraction-no-group", "file": R,
     "find": "out += [r for r in rows if r[\"rollout_id\"] in rids or (r.get(\"kind\") != \"multi_turn\" and r[\"task_id\"] in groups)]",
     "replace": "out += [r for r in rows if r[\"rollout_id\"] in rids]", "tests": T,
     "why": "only the reviewed rollout's trajectory goes: its group mates keep advantages normalised with the retracted score"},
    {"id": "retraction-human-source-kept", "file": R, "find": "if r[\"manager\"] == \"human\":", "replace": "if r[\"manager\"] == \"humans\":",
     "tests": T, "why": "a human review's source row (human_reviews, with the text) stays"},
    {"id": "retraction-session-review-own-rollout", "file": R, "find": "            if r.get(\"session_id\"):  # a sessions batch",
     "replace": "            if False:  # a sessions batch", "tests": T,
     "why": "a session review's copy in a sessions batch takes the trajectory of its rollout id (the session id: none), not the segments"},
    {"id": "retraction-task-step-scores-kept", "file": R, "find": "for name in (\"step_scores\", \"step_labels\", \"human_reviews\"):",
     "replace": "for name in (\"step_labels\", \"human_reviews\"):", "tests": T,
     "why": "a retracted task's step scores (with the step text) stay"},
    {"id": "retraction-reviews-only-taint", "file": R,
     "find": "affected = lineage.checkpoints_using(lake, trajectories=trajectory_ids, reviews=review_keys)",
     "replace": "affected = lineage.checkpoints_using(lake, reviews=review_keys)", "tests": T,
     "why": "checkpoints are found by the review keys only: one trained on the group's trajectories keeps serving"},
    {"id": "retraction-fallback-oldest", "file": R, "find": "key=lambda r: r[\"created_at\"], reverse=True)",
     "replace": "key=lambda r: r[\"created_at\"])", "tests": T,
     "why": "serving falls back to the oldest clean promoted checkpoint, not the newest"},
    {"id": "retraction-fallback-unpromoted", "file": R,
     "find": "if not r[\"promoted\"] or r[\"checkpoint_id\"] in affected", "replace": "if r[\"checkpoint_id\"] in affected", "tests": T,
     "why": "serving falls back to a checkpoint the gate never promoted"},
    {"id": "retraction-no-taint-rows", "file": R, "find": "        if cid not in already:  # a resumed retraction",
     "replace": "        if cid in already:  # a resumed retraction", "tests": T,
     "why": "the affected checkpoints are never marked in audit: serving may promote them again"},
    {"id": "retraction-predicate-and", "file": R, "find": "    return \" OR \".join(", "replace": "    return \" AND \".join(", "tests": T,
     "why": "the delete predicate joins the rows' conditions with AND: a retraction of several rows deletes none"},
    {"id": "retraction-template-skills-too", "file": R, "find": "if s.get(\"source\") == \"llm\" and rollout_ids",
     "replace": "if rollout_ids", "tests": T,
     "why": "template skills (a fixed sentence, nothing of the review's) are deleted with the review too"},
    {"id": "retraction-serving-not-moved", "file": R, "find": "    if out.serving_after in out.affected:\n",
     "replace": "    if out.serving_before in out.affected and out.serving_before != out.serving_after:\n", "tests": T,
     "why": "the serving pointer is only checked against what served before: an affected checkpoint keeps serving"},
]
