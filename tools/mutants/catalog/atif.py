"""Planted bugs in the ATIF v1.4 round trip (envs/atif.py) and the episode import/export (episodes.py):
token ids and log-probs lost or shifted, observations misplaced, the verdict dropped, bad input accepted,
a session imported twice."""

A = "tentalis_pipelines/envs/atif.py"
E = "tentalis_pipelines/episodes.py"
TU = ["tests/unit/test_atif.py"]
TI = ["tests/test_atif_integration.py"]

MUTANTS = [
    {"id": "atif-logprobs-dropped", "file": A, "find": "    if turn.logprobs is not None:\n        metrics[\"logprobs\"] = list(turn.logprobs)\n",
     "replace": "", "tests": TU + TI, "why": "the sampling log-probs do not travel: an imported episode cannot be trained off-policy"},
    {"id": "atif-prompt-ids-as-completion", "file": A,
     "find": "                             token_ids=_opt(metrics.get(\"completion_token_ids\"), int),\n",
     "replace": "                             token_ids=_opt(metrics.get(\"prompt_token_ids\"), int),\n", "tests": TU + TI,
     "why": "the completion's token ids come back as the prompt's"},
    {"id": "atif-logprobs-shifted", "file": A, "find": "        metrics[\"logprobs\"] = list(turn.logprobs)\n",
     "replace": "        metrics[\"logprobs\"] = list(turn.logprobs)[1:] + list(turn.logprobs)[:1]\n", "tests": TU + TI,
     "why": "log-probs rotated by one token: each token gets its neighbour's"},
    {"id": "atif-observation-dropped", "file": A,
     "find": "            messages.extend({**k, \"content\": c} for k, c in zip(kinds, contents))\n", "replace": "", "tests": TU + TI,
     "why": "the tool outputs the model saw are not in the imported context"},
    {"id": "atif-final-observation-in-context", "file": A, "find": "        if ours.get(\"observation_in_context\", True):\n",
     "replace": "        if True:\n", "tests": TU + TI,
     "why": "the last observation (after the episode ended, never seen by the model) is put back into the context"},
    {"id": "atif-verdict-ignored", "file": A, "find": "    if root:\n        v = root[\"verdict\"]\n",
     "replace": "    if False:\n        v = root[\"verdict\"]\n", "tests": TU + TI,
     "why": "an exported episode comes back without its verifier's verdict (and environment, task, reward)"},
    {"id": "atif-step-ids-unchecked", "file": A,
     "find": "        if step.get(\"step_id\") != i + 1 or not _is_int(step.get(\"step_id\")):\n",
     "replace": "        if not _is_int(step.get(\"step_id\")):\n", "tests": TU,
     "why": "out-of-order or duplicate step ids are accepted (ATIF requires 1, 2, 3, ...)"},
    {"id": "atif-unknown-source-accepted", "file": A, "find": "        if source not in ROLES:\n", "replace": "        if False:\n",
     "tests": TU, "why": "a step whose source is not system, user or agent is accepted"},
    {"id": "atif-turn-count-unchecked", "file": A, "find": "    if written != len(episode.turns):\n", "replace": "    if False:\n",
     "tests": TU, "why": "an episode whose turns and policy messages disagree is exported, pairing turns with the wrong messages"},
    {"id": "import-other-turns-unchanged", "file": E, "find": "            if not _same(existing[sid], rows):\n",
     "replace": "            if False:\n", "tests": TU + TI,
     "why": "a trajectory reusing an imported session id with other turns is counted unchanged (its turns silently lost)"},
    {"id": "import-duplicate-ids-accepted", "file": E, "find": "        if sid in seen:\n", "replace": "        if False:\n",
     "tests": TU + TI, "why": "two trajectories with one session_id in one import land as one session"},
    {"id": "import-other-tenant", "file": E, "find": "        if sid in owners and owners[sid] != tenant:\n", "replace": "        if False:\n",
     "tests": TU + TI, "why": "a session of another tenant is overwritten by an import"},
]
