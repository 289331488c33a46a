"""Planted bugs in lineage manifests and replay (``tentalis_pipelines/lineage.py``): the ones a tired
developer writes (see tools/mutants/mutants.py).

Guarded by tests/test_lineage_chain.py (pure: Delta tables written by hand in tests/chain_rows.py,
no model, no Dagster run), which builds a chain of three checkpoints (c1 <- c2 <- c3, a sibling line, an unpromoted child, a
run that crashed between its lineage and its checkpoint row): the cases a fixture with one checkpoint
never reaches. The continuity of the LoRA weights from parent to child over three generations is
guarded by tests/test_pipeline_training.py (the tiny model, trained three cycles).

No mutant here is equivalent."""

L = "tentalis_pipelines/lineage.py"
P = "tentalis_pipelines/stages/training.py"
T = ["tests/test_lineage_chain.py"]
TP = ["tests/test_pipeline_training.py"]

MUTANTS = [
    {"id": "lineage-ancestors-parent-only", "file": L, "find": "        parent_id = parents.get(parent_id)\n",
     "replace": "        parent_id = None\n", "tests": T,
     "why": "ancestors stops at the parent: a grandchild's manifest forgets where its weights began"},
    {"id": "lineage-taint-children-only", "file": L,
     "find": "hit = next((a for a in ancestors(lake, r[\"parent_id\"]) if a in direct), None)",
     "replace": "hit = r[\"parent_id\"] if r[\"parent_id\"] in direct else None", "tests": T,
     "why": "only children of a direct user are found: the grandchild of a retracted review keeps serving"},
    {"id": "lineage-unrecorded-checkpoint", "file": L, "find": "if r[\"checkpoint_id\"] in known and ((r[\"kind\"]",
     "replace": "if ((r[\"kind\"]", "tests": T,
     "why": "a run that crashed after recording its lineage (no checkpoint row) is reported as affected"},
    {"id": "lineage-reviews-current-version", "file": L,
     "find": "lake.read(\"reviews\", batch_id=batch, version=version)", "replace": "lake.read(\"reviews\", batch_id=batch)", "tests": T,
     "why": "the reviews are read now, not at the pinned version: a review written after the run lands in its manifest"},
    {"id": "lineage-blank-hints", "file": L, "find": "if (r.get(\"hint\") or \"\").strip()]",
     "replace": "if r.get(\"hint\") is not None]", "tests": T,
     "why": "a blank hint ('   ') counts as a hint: 'which hints taught X' lists reviews that gave none"},
    {"id": "lineage-opd-any-decision", "file": L, "find": "r[\"decision\"] == \"used\" and r[\"hint_id\"]",
     "replace": "r[\"hint_id\"]", "tests": T,
     "why": "every screened hint is listed as distilled, also those the filter dropped (no_effect)"},
    {"id": "lineage-opd-row-id", "file": L, "find": "\"row_id\": h[\"hint_id\"], \"batch_id\": h[\"batch_id\"]}",
     "replace": "\"row_id\": h[\"rollout_id\"], \"batch_id\": h[\"batch_id\"]}", "tests": T,
     "why": "the opd_hint lineage row names the rollout, not the hint: the query 'which hints taught X' finds none"},
    {"id": "lineage-optional-tables-skipped", "file": L, "find": "    for name in OPTIONAL_TABLES:\n", "replace": "    for name in ():\n",
     "tests": T, "why": "the versions of teacher_logprobs and skills are not pinned: a replay reads them as they are now"},
    {"id": "lineage-first-manifest", "file": L, "find": "return json.loads(max(found, key=lambda r: r[\"created_at\"])[\"detail\"])",
     "replace": "return json.loads(found[0][\"detail\"])", "tests": T,
     "why": "a checkpoint recorded twice (a retried run) reads its first, stale manifest"},
    {"id": "lineage-order-by-rollout-id", "file": L,
     "find": "r[\"group_index\"] if r[\"group_index\"] is not None else -1,\n                                       r[\"rollout_id\"]))",
     "replace": "r[\"rollout_id\"]))", "tests": T,
     "why": "training order by rollout id: 'r-10' sorts before 'r-2', so a replay's order and digest differ"},
    {"id": "lineage-digest-no-temperature", "file": L,
     "find": "                             None if s.temperature is None else repr(float(s.temperature)), s.loss_mask]",
     "replace": "                             s.loss_mask]", "tests": T,
     "why": "the temperature is left out of the digest: a replay at another temperature verifies"},
    {"id": "lineage-digest-no-loss-mask", "file": L, "find": "repr(float(s.temperature)), s.loss_mask]",
     "replace": "repr(float(s.temperature))]", "tests": T,
     "why": "the loss mask is left out of the digest: training on the user's tokens too verifies"},
    {"id": "lineage-child-from-base", "file": P, "find": "    model = build_policy(model_dir, adapter, config)\n",
     "replace": "    model = build_policy(model_dir, None, config)\n", "tests": TP,
     "why": "each cycle trains a fresh adapter: the optimizer state continues, the weights do not"},
]
