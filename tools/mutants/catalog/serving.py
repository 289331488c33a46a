"""Planted bugs in the serving pointer, the checkpoint store, training claims and reconcile (see tools/mutants/mutants.py).

Not planted: skipping the fsync of the adapter's files (no test can observe a lost page cache without
pulling the power); the parent folder's fsync after the rename *is* planted, because its order
relative to the rename is observable."""

S = "tentalis_pipelines/training/serving.py"
C = "tentalis_pipelines/training/checkpoints.py"
G = "tentalis_pipelines/promotion.py"
TS = ["tests/test_serving.py"]
TC = ["tests/test_checkpoints.py"]
TX = ["tests/test_training_crash.py"]

MUTANTS = [
    {"id": "serving-oldest-row-serves", "file": S, "find": "return history[-1] if history else None",
     "replace": "return history[0] if history else None", "tests": TS,
     "why": "the first promotion ever keeps serving: later promotions and rollbacks change nothing"},
    {"id": "rollback-always-to-base", "file": S, "find": 'to = row["from_checkpoint"]', "replace": "to = BASE", "tests": TS,
     "why": "a rollback goes to the base model instead of what served before the current policy"},
    {"id": "missing-adapter-not-verified", "file": S, "find": '    return verify_adapter(row["adapter_uri"]).as_posix()\n',
     "replace": '    return str(row["adapter_uri"])\n', "tests": TS,
     "why": "a serving checkpoint whose files are gone is handed to the backend instead of failing clearly"},
    {"id": "serving-lock-per-actor", "file": S, "find": '    with lakehouse_lock(lake, table):\n        history = _read(lake, table)',
     "replace": '    with lakehouse_lock(lake, f"{table}-{actor}"):\n        history = _read(lake, table)', "tests": TS,
     "why": "concurrent promoters no longer exclude each other: duplicate seqs, a broken from/to chain"},
    {"id": "promote-unverified-target", "file": S, "find": "        if to != BASE:\n            try:",
     "replace": "        if False:\n            try:", "tests": TS,
     "why": "promote/rollback point serving at a checkpoint without a row or with missing files"},
    {"id": "gate-sets-flag-only", "file": G,
     "find": 'serving.promote(lake, checkpoint_id, actor="gate", action="gate", reason=f"{benchmark} vs {incumbent}: {decision.reason}")',
     "replace": "serving.mark_promoted(lake, checkpoint_id)", "tests": TS,
     "why": "the old behaviour: the gate flips checkpoints.promoted but the serving pointer never moves"},
    {"id": "gate-rejection-not-recorded", "file": G,
     "find": 'lake.replace_where("gate_decisions", {"checkpoint_id": checkpoint_id, "benchmark": benchmark}, [row])',
     "replace": "_ = row", "tests": TS,
     "why": "a decision leaves no row: a rejected checkpoint stays undecided and a later gate run can promote it over a newer policy"},
    {"id": "gate-compares-with-base", "file": G, "find": "    current = serving.serving_checkpoint(lake)\n    if current == checkpoint_id:",
     "replace": "    current = 'base'\n    if current == checkpoint_id:", "tests": TS,
     "why": "the candidate is compared with the base model instead of what serves: a regression against the incumbent passes"},
    {"id": "temp-folders-of-live-writers-deleted", "file": C, "find": 'return not pid_alive(int(m.group("pid")))',
     "replace": "return True", "tests": TC, "why": "save_adapter deletes another live trainer's temporary folder under it"},
    {"id": "no-fsync-of-parent-after-rename", "file": C, "find": "    fsync_dir(root)  # the rename itself",
     "replace": "    pass  # the rename itself", "tests": TC, "why": "the rename is not durable: a power loss can lose a recorded checkpoint"},
    {"id": "abandoned-checkpoints-still-consume", "file": C, "find": "event = 'abandoned' and checkpoint_id is not null",
     "replace": "event = 'abandoned' and checkpoint_id is null", "tests": TC,
     "why": "an abandoned promotion keeps its trajectories consumed: they are silently lost"},
    {"id": "claim-ignores-live-holder", "file": C, "find": "            if other.alive():\n                raise TrainingClaimError(",
     "replace": "            if other.alive() and other.pid == os.getpid():\n                raise TrainingClaimError(", "tests": TX,
     "why": "a second trainer (another process) settles the live holder's claim and trains the same fresh set"},
    {"id": "reconcile-forgets-promotion-intent", "file": C, "find": "    if not claim.promote:\n        finish_claim(",
     "replace": "    if True:\n        finish_claim(", "tests": TX,
     "why": "a run killed after its row but before promoting is marked done: the promotion is lost, its trajectories consumed"},
    {"id": "reconcile-keeps-orphan-adapter", "file": C, "find": "        folder = paths.checkpoints / claim.checkpoint_id\n",
     "replace": "        folder = paths.checkpoints / claim.claim_id\n", "tests": TX,
     "why": "an adapter renamed into place without a row (crash after the rename) is never cleaned up"},
]
