"""Planted bugs in the BFCL and mini-SWE families (issue 28): the safety of reading a model's calls, the
reward from the final check (BFCL's checker, the FAIL_TO_PASS / PASS_TO_PASS verdict), observation
truncation. Guarded by the pure unit tests of each family (no model; BFCL's checker runs in-process). Then the
episodes' step scores and manager reviews (env_batches, the llm manager's episode pass, the stage's choice of
manager) and the policy's shared-prefix KV (tests with the tiny or embedded model and the sandbox)."""

BF = "tentalis_pipelines/envs/bfcl.py"
SW = "tentalis_pipelines/envs/swe.py"
TB = ["tests/unit/test_envs_bfcl.py"]
TS = ["tests/unit/test_envs_swe.py", "tests/test_envs_swe_integration.py::test_the_engine_is_deterministic_and_every_candidate_parses_and_differs"]
TT = ["tests/unit/test_swe_tamper.py", "tests/test_swe_tamper_integration.py"]
SV = "tentalis_pipelines/envs/swe_verify.py"
ST = "tentalis_pipelines/envs/swe_tamper.py"
FO = "tentalis_pipelines/forensics.py"
EB = "tentalis_pipelines/env_batches.py"
LM = "tentalis_pipelines/rewards/llm_manager.py"
KI = "tentalis_pipelines/stages/kinds.py"
PO = "tentalis_pipelines/envs/policies.py"
BD = "tentalis_pipelines/inference/batch_decoder.py"
EPI = ["tests/test_episode_decoding.py", "tests/test_envs_policy.py"]
EPU = ["tests/unit/test_episode_decoder_parts.py"]
SR = ["tests/unit/test_env_step_reviews.py"]
MR = ["tests/test_env_manager_reviews.py"]

MUTANTS = [
    # ---- BFCL: what a reply may run
    {"id": "bfcl-attribute-call-allowed", "file": BF, "find": "        if not isinstance(node.func, ast.Name):\n",
     "replace": "        if False:\n", "tests": TB, "why": "os.system(...) style attribute calls reach the name check (and crash or run)"},
    {"id": "bfcl-any-tool-name", "file": BF, "find": "        if name not in allowed:\n", "replace": "        if False:\n",
     "tests": TB, "why": "a call to a name outside the task's tools (another class's method, a builtin) is accepted"},
    {"id": "bfcl-positional-accepted", "file": BF, "find": "        if node.args and not positional:\n",
     "replace": "        if False:\n", "tests": TB, "why": "positional arguments from the model are accepted, silently misbound"},
    {"id": "bfcl-kwargs-unpacking", "file": BF, "find": "            if kw.arg is None:\n", "replace": "            if False:\n",
     "tests": TB, "why": "**kwargs unpacking reaches the literal check with a None name"},
    {"id": "bfcl-truncate-no-marker", "file": BF,
     "find": "    return f\"{text[:head]}[... {len(text) - limit:,} characters truncated ...]{text[len(text) - tail:]}\"",
     "replace": "    return text[:limit]", "tests": TB, "why": "a long tool result is cut without the visible marker"},
    # ---- BFCL: the reward
    {"id": "bfcl-fewer-turns-pass", "file": BF, "find": "    if len(decoded) != len(task.ground_truth):\n",
     "replace": "    if len(decoded) > len(task.ground_truth):\n", "tests": TB,
     "why": "an episode that stopped before the last user turn goes to the checker as if complete"},
    {"id": "bfcl-invalid-is-valid", "file": BF, "find": "    if result.get(\"valid\"):\n", "replace": "    if result:\n",
     "tests": TB, "why": "any checker result, valid or not, passes"},
    # ---- mini-SWE: the reward from the tests
    {"id": "swe-fail-to-pass-only", "file": SW, "find": "    if passed == len(required):\n",
     "replace": "    if ok_f2p == len(task.fail_to_pass):\n", "tests": TS,
     "why": "a fix that breaks PASS_TO_PASS tests still passes"},
    {"id": "swe-missing-test-passes", "file": SW, "find": "    ok_p2p = sum(run.results.get(t) == \"PASSED\" for t in task.pass_to_pass)\n",
     "replace": "    ok_p2p = sum(run.results.get(t, \"PASSED\") == \"PASSED\" for t in task.pass_to_pass)\n", "tests": TS,
     "why": "a PASS_TO_PASS test missing from the report (deleted, renamed) counts as passed"},
    {"id": "swe-not-run-passes", "file": SW, "find": "        return Verdict(False, 0.0, f\"tests not run: {run.error}\"), 0, len(required)\n",
     "replace": "        return Verdict(True, 1.0, f\"tests not run: {run.error}\"), 0, len(required)\n", "tests": TS,
     "why": "a run that never produced a report (the module does not import) passes"},
    # ---- mini-SWE: a verdict the module cannot forge (issue 73)
    {"id": "swe-forged-ignored", "file": SW, "find": "    if run.forged:\n", "replace": "    if False:\n", "tests": TT,
     "why": "a pass the harness judged forged (a canary or negated run passed) scores 1"},
    {"id": "swe-report-unsigned", "file": SV, "find": "    if not hmac.compare_digest(mac, sign(report, key)):\n",
     "replace": "    if False:\n", "tests": TT, "why": "a report line printed by the tested code, with any signature, is believed"},
    {"id": "swe-report-not-last", "file": SV, "find": "    last = lines[-1] if lines else \"\"\n",
     "replace": "    last = next((x for x in lines if x.startswith(marker)), \"\")\n", "tests": TT,
     "why": "output after the harness's report line is ignored (the first marked line counts)"},
    {"id": "swe-tamper-given-counts", "file": ST, "find": "        if before[_key(f)] > 0:\n", "replace": "        if False:\n",
     "tests": TT, "why": "constructs already in the module the agent was given are findings: an honest fix scores 0"},
    {"id": "swe-tamper-docstring-marker", "file": ST, "find": " and id(node) not in docstrings\n",
     "replace": "\n", "tests": TT, "why": "a docstring that mentions PASSED or the runner is an exploit finding"},
    {"id": "swe-tamper-flag-share-inclusive", "file": FO, "find": "    if n >= min_n and share > max_flag_share:\n",
     "replace": "    if n >= min_n and share >= max_flag_share:\n", "tests": TT,
     "why": "a share of test-machinery edits exactly at the bar fires the check"},
    # ---- episodes: step scores per turn
    {"id": "step-exit-status-inverted", "file": EB, "find": '    return (1.0 if code == 0 else 0.0), f"exit status {code}"\n',
     "replace": '    return (1.0 if code != 0 else 0.0), f"exit status {code}"\n', "tests": SR,
     "why": "a command that failed scores 1, one that worked 0"},
    {"id": "step-timeout-not-failed", "file": EB, "find": '    if info.get("timed_out"):\n', "replace": "    if False:\n",
     "tests": SR, "why": "a command killed at its time limit scores by the killer's exit status"},
    {"id": "step-swe-tests-as-any-command", "file": EB, "find": '    if environment == SWE and "run_tests.py" in str(action):\n',
     "replace": "    if False:\n", "tests": SR, "why": "a test run is scored as any command: the rationale no longer says the tests failed"},
    {"id": "step-bfcl-prose-penalised", "file": EB,
     "find": '            if not info.get("format_error") or not CALL_LIKE.search(str(turn.get("text") or "")):\n',
     "replace": '            if not info.get("format_error"):\n', "tests": SR,
     "why": "a reply in words (BFCL's end of a user turn) scores 0 like a refused call"},
    {"id": "step-bfcl-failed-calls-not-counted", "file": BF,
     "find": '            info["failed_calls"] = sum(call_failed(r) for r in results)', "replace": '            info["failed_calls"] = 0',
     "tests": SR, "why": "a call that raised or returned an error scores 1"},
    {"id": "step-bfcl-error-dict-not-a-failure", "file": BF, "find": '    return isinstance(value, dict) and "error" in value\n',
     "replace": "    return False\n", "tests": SR, "why": "cd to a missing folder ({'error': ...}) counts as a call that ran"},
    {"id": "step-scores-off-for-episodes", "file": KI,
     "find": "        return StageResult(*env_batches.build_environment_step_scores(lake, batch_id))\n",
     "replace": '        return StageResult(lake.write_batch("step_scores", batch_id, []), {"scorer": "environment", "scored_steps": 5})\n',
     "tests": MR, "why": "the stage writes no step scores for episodes"},
    # ---- episodes: the manager's review
    {"id": "review-transcript-keeps-system-prompt", "file": EB, "find": '        if kind in ("system", "demonstration"):\n',
     "replace": '        if kind in ("demonstration",):\n', "tests": SR,
     "why": "BFCL's 4-8k tokens of function docs fill the manager's context before the work"},
    {"id": "review-observation-uncut", "file": EB,
     "find": 'and kind != "instruction" and len(text) > REVIEW_OBSERVATION_CHARS:\n',
     "replace": 'and kind != "instruction" and len(text) > 10 * REVIEW_OBSERVATION_CHARS:\n', "tests": SR,
     "why": "a long listing or tool result crowds out the rest of the episode"},
    {"id": "review-score-not-the-verifiers", "file": LM, "find": '        prefill = PREFILL + f"{round(10 * float(score))}" + CRITIQUE_BRIDGE\n',
     "replace": '        prefill = PREFILL + "10" + CRITIQUE_BRIDGE\n', "tests": SR,
     "why": "the manager is shown a perfect score for a failed episode, and critiques accordingly"},
    {"id": "review-hint-pass-forgets-critique", "file": LM,
     "find": "        asks = [p + c.replace('\"', \"'\") + '\"' + HINT_BRIDGE for p, c in zip(prompts, critiques)]\n",
     "replace": "        asks = [p + HINT_BRIDGE for p, c in zip(prompts, critiques)]\n", "tests": SR,
     "why": "the hint is asked for inside the unclosed critique: broken JSON, a hint unrelated to the critique"},
    {"id": "review-llm-manager-ignored", "file": KI, "find": '        if manager == "llm":\n            return StageResult(*env_batches.build_environment_reviews(',
     "replace": '        if False:\n            return StageResult(*env_batches.build_environment_reviews(', "tests": MR,
     "why": "review.manager = 'llm' is ignored for environment batches (the verdict's words only)"},
    {"id": "review-managers-words-dropped", "file": EB,
     "find": """            review["critique"] = critique or f"(the manager wrote no critique; the verifier's) {review['critique']}"\n""",
     "replace": """            review["critique"] = f"(the manager wrote no critique; the verifier's) {review['critique']}"\n""", "tests": MR,
     "why": "the llm manager's critique is thrown away for the verdict's"},
    {"id": "review-llm-score-from-manager", "file": EB, "find": '            review["manager"] = "llm"\n',
     "replace": '            review["manager"], review["score"] = "llm", 0.5\n', "tests": MR,
     "why": "an llm-managed episode's score is not the verifier's"},
    # ---- the policy's shared-prefix KV across conversations
    {"id": "kv-shared-cache-not-cut", "file": BD,
     "find": "            return logits, stored, False\n        cache = DynamicCache()\n        if stored is not None:\n"
             "            for i, (k, v) in enumerate(stored):\n                cache.update(k[:, :, :reuse], v[:, :, :reuse], i)\n",
     "replace": "            return logits, stored, False\n        cache = DynamicCache()\n        if stored is not None:\n"
                "            for i, (k, v) in enumerate(stored):\n                cache.update(k, v, i)\n",
     "tests": EPI, "why": "a new conversation starts from another's whole cache, not its shared prefix"},
    {"id": "kv-share-not-block-aligned", "file": BD, "find": "        return max([top - top % self.block, *ends])\n", "replace": "        return max([top, *ends])\n",
     "tests": EPI + EPU,
     "why": "the shared prefix is cut mid-block: the blocks after it are other shapes than without sharing (bf16: other greedy tokens)"},
    {"id": "kv-prefill-in-one-go", "file": BD, "find": "        block = self.prefill_block\n        ends = sorted(",
     "replace": "        block = 10 ** 9\n        ends = sorted(", "tests": EPI,
     "why": "a conversation's prompt is prefilled in one go: with a shared prefix, the rest is computed in another shape"},
    {"id": "kv-share-flag-ignored", "file": BD, "find": "            if not self.share and k < len(key):\n", "replace": "            if False:\n",
     "tests": EPU, "why": "share_prefixes=False still shares"},
    {"id": "kv-shared-prefix-whole-prompt", "file": BD, "find": "            if k == len(ids) == len(key) and theirs == mine:\n",
     "replace": "            if k == len(ids) and theirs == mine:\n", "tests": EPU,
     "why": "a prompt lying wholly inside a longer kept entry takes that entry's last logits, another position's"},
    {"id": "kv-turn-cuts-forgotten", "file": PO, "find": "(*cuts, len(prompt)))", "replace": "cuts)", "tests": EPI,
     "why": "a turn is not cut where the last prompt ended: the kept prompt is reused only up to the block grid and the rest of its block is prefilled again"},
    {"id": "kv-reuse-where-the-entry-ran-on", "file": BD, "find": "(c in theirs or c == their_len)", "replace": "True", "tests": EPU,
     "why": "reuse stops at the prompt's own cut inside a chunk the entry computed whole: those positions were computed in another shape"},
    {"id": "kv-evict-least-recently-used", "file": BD, "find": "        return stale + fresh + wanted\n",
     "replace": "        return list(self.entries)\n", "tests": EPI + EPU,
     "why": "least-recently-used drops the very context the next waiting request reuses when turns cycle through conversations"},
    {"id": "kv-evict-next-turns-earliest-first", "file": BD, "find": "key=lambda k: -last(k, 0))", "replace": "key=lambda k: last(k, 0))",
     "tests": EPU, "why": "the contexts left for the next call go earliest first, the ones that call needs first"},
    # ---- one copy of a shared prefix in the store (issue 74)
    {"id": "kv-share-unverified", "file": BD, "find": "and self._equal_prefix(pieces, kv, n):", "replace": ":",
     "tests": EPU, "why": "a prefix with equal tokens but other values (other chunks, other last bits) is shared: an entry reads back values it was not given"},
    {"id": "kv-shared-storage-counted-per-entry", "file": BD, "find": "            if ref[0] == 0:\n                self.nbytes += size\n",
     "replace": "            self.nbytes += size\n", "tests": EPU + EPI,
     "why": "a shared piece is counted once per entry holding it: the budget evicts for memory that is not held"},
    {"id": "kv-shared-freed-with-first-holder", "file": BD, "find": "            ref[0] -= 1\n            if ref[0] == 0:\n",
     "replace": "            ref[0] -= 1\n            if True:\n", "tests": EPU,
     "why": "evicting one holder of a shared piece uncounts it while others still hold it: the store holds more than it reports"},
    # ---- episodes in the batch decoder: the KV budget, the turn's end, each episode's own sampling stream
    {"id": "kv-budget-no-eviction", "file": BD, "find": "            if not order or not self.store.evict(order.pop(0)):\n                break\n",
     "replace": "            break\n", "tests": EPI,
     "why": "waiting conversations' KV is never evicted: admission outgrows the budget"},
    {"id": "kv-budget-never-defers", "file": BD, "find": "        if slab + prefill > budget:\n            return False if not self.rows else None\n",
     "replace": "", "tests": EPI, "why": "every row is admitted at once whatever the budget holds"},
    {"id": "episode-stop-after-block-ignored", "file": BD,
     "find": "            if not hit and req.stop_when is not None:\n", "replace": "            if False:\n",
     "tests": EPI, "why": "a turn goes on past its closed action block and imagines the output"},
    {"id": "episode-group-shares-one-seed", "file": PO, "find": "                                seed=_seed(self.seed, call, i), track_text=False, cuts=cuts[i],\n",
     "replace": "                                seed=_seed(self.seed, call, 0), track_text=False, cuts=cuts[i],\n", "tests": EPI,
     "why": "the G episodes of one task (one first prompt) draw the same stream: the group's samples are one sample"},
]
