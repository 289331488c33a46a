"""Planted bugs in hinted on-policy distillation: the signal, its clip, the hint filter, the weights and
the pipeline rows."""

OPD = "tentalis_pipelines/training/opd.py"
TR = "tentalis_pipelines/stages/trajectories.py"
P = "tentalis_pipelines/stages/training.py"
SA = "tentalis_pipelines/training/samples.py"
TU = ["tests/unit/test_opd.py", "tests/test_opd_integration.py"]
TP = ["tests/test_opd_pipeline.py"]
S = "tentalis_pipelines/sessions.py"
TL = "tentalis_pipelines/stages/teacher_logprobs.py"
TS = ["tests/test_opd_sessions.py"]
TV = ["tests/test_opd_server.py"]
GW = "tentalis_pipelines/gateway/app.py"

MUTANTS = [
    {"id": "opd-signal-reversed", "file": OPD, "find": "        d = float(t) - float(s)\n", "replace": "        d = float(s) - float(t)\n",
     "tests": TU, "why": "student minus teacher: a hint pushes its own advice down"},
    {"id": "opd-unclipped", "file": OPD, "find": "        if clip is not None:\n            d = max(-clip, min(clip, d))\n",
     "replace": "", "tests": TU, "why": "the clip is ignored: one surprising token dominates the update"},
    {"id": "opd-mask-ignored", "file": OPD, "find": "        if mask is not None and not mask[i]:\n",
     "replace": "        if False:\n", "tests": TU, "why": "context tokens of a multi-turn sample get a distillation signal"},
    {"id": "hint-placed-before-task", "file": OPD, "find": "    end = at + len(task_prompt)\n", "replace": "    end = at\n",
     "tests": TU, "why": "the hint is inserted before the question instead of after it"},
    {"id": "answer-leak-not-screened", "file": OPD, "find": "    if reference is not None and _leaks(text, reference):\n",
     "replace": "    if False:\n", "tests": TU, "why": "a hint that states the answer is distilled (teaches copying)"},
    {"id": "generic-hint-kept", "file": OPD, "find": "    if len(text) < MIN_HINT_CHARS or bare in GENERIC_HINTS:\n",
     "replace": "    if len(text) < 1:\n", "tests": TU, "why": "'try again' becomes a teacher context"},
    {"id": "opd-weight-ignored", "file": OPD, "find": "    return [w_rl * a + w_opd * s for a, s in zip(rl_advantages, signal)]\n",
     "replace": "    return [w_rl * a + s for a, s in zip(rl_advantages, signal)]\n", "tests": TU + TP,
     "why": "w_opd is not applied: the combine weights cannot be tuned"},
    {"id": "teacher-is-student", "file": OPD, "find": "rows = [TrainSample((it.teacher_prompt_ids if side == \"teacher\" else it.student_prompt_ids)",
     "replace": "rows = [TrainSample((it.student_prompt_ids)", "tests": TU + TP,
     "why": "the teacher never sees the hint: the signal is always zero"},
    {"id": "opd-only-keeps-unhinted-rows", "file": OPD, "find": "    return bool((w_rl > 0 and rl_signal) or (w_opd > 0 and opd_signal is not None))",
     "replace": "    return bool(rl_signal or (w_opd > 0 and opd_signal is not None))", "tests": TU + TP + TS,
     "why": "with w_rl = 0 rows without a hint are trained on with a zero advantage (they dilute the token mean)"},
    {"id": "hinted-row-dropped-without-rl-signal", "file": OPD, "find": "    return bool((w_rl > 0 and rl_signal) or (w_opd > 0 and opd_signal is not None))",
     "replace": "    return bool(w_rl > 0 and rl_signal)", "tests": TU + TP + TS,
     "why": "a group with equal rewards is dropped although its hinted rows carry an OPD signal"},
    {"id": "opd-signal-not-trained", "file": SA, "find": "        if t.get(\"opd_signal\") is not None or w_rl != 1.0:\n",
     "replace": "        if False:\n", "tests": TP, "why": "trajectories carry the signal but the trainer uses the RL advantage alone"},
    {"id": "session-opd-context-tokens", "file": TL, "find": "mask=item.completion_mask)", "replace": "mask=None)", "tests": TS,
     "why": "a session's tool results and user messages get a distillation signal"},
    {"id": "session-opd-shortest-hint", "file": TL, "find": "(decision, reason), review = max(usable,", "replace": "(decision, reason), review = min(usable,",
     "tests": TS,
     "why": "the shortest usable hint of a segment becomes the teacher's context"},
    {"id": "session-opd-hint-at-prompt-end", "file": OPD, "find": "    cut = lo\n", "replace": "    cut = len(ids)\n", "tests": TS,
     "why": "the hint lands after the assistant header, inside the reply, not after the user's message"},
    {"id": "session-opd-signal-not-trained", "file": SA, "find": "    if trajectory.get(\"opd_signal\") is not None or w_rl != 1.0:\n",
     "replace": "    if False:\n", "tests": TS, "why": "a hinted session segment trains on its turn advantages alone"},
    {"id": "server-teacher-off-by-one", "file": TL, "find": "lp[len(it.teacher_prompt_ids) - 1:]", "replace": "lp[len(it.teacher_prompt_ids):]",
     "tests": TV, "why": "the server's log-probs are read one token late (position k scores token k+1)"},
    {"id": "server-teacher-student-at-sampling-temperature", "file": TL, "find": "            items = [replace(it, temperature=1.0) for it in items]\n",
     "replace": "", "tests": TV, "why": "raw server log-probs are compared with a student at its sampling temperature"},
    {"id": "echo-logprobs-misaligned", "file": GW, "find": ".gather(-1, x[0, 1:, None])", "replace": ".gather(-1, x[0, :-1, None])",
     "tests": TV, "why": "the gateway scores each prompt token with the logits at its own position"},
]
