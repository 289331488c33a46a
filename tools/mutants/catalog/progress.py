"""Planted bugs in the idle window's saved progress: the atomic save, refusing a foreign or stale progress, the yield
poll, the fingerprint, and the resume (weights, AdamW state, RNG state, the in-flight step's gradients,
the position it continues from)."""

PR = "tentalis_pipelines/training/progress.py"
TR = "tentalis_pipelines/training/trainer.py"
TU = ["tests/unit/test_progress.py"]
# The resume on the tiny model: a run preempted twice and resumed must end with the uninterrupted adapter.
RESUME = ["tests/test_idle_training.py::test_preempted_twice_and_resumed_ends_with_the_uninterrupted_adapter"]
STALE = ["tests/test_idle_training.py::test_a_progress_for_other_rows_is_refused"]
SPLIT = ["tests/unit/test_progress.py", "tests/test_idle_training.py::test_a_progress_saved_under_another_step_split_is_refused"]
PLAIN = ["tests/test_idle_training.py::test_checkpointing_without_a_yield_changes_nothing"]

MUTANTS = [
    {"id": "progress-saved-in-place", "file": PR, "find": "        tmp = self.path.with_name(f\".{self.path.name}.{os.getpid()}.tmp\")\n",
     "replace": "        tmp = self.path\n", "tests": TU,
     "why": "a save that fails half-way (a crash, a full disk) destroys the previous progress: the window's work is lost"},
    {"id": "progress-temp-left-behind", "file": PR, "find": "            tmp.unlink(missing_ok=True)\n            raise\n",
     "replace": "            raise\n", "tests": TU, "why": "every failed save leaves a temporary file the size of the adapter and AdamW state"},
    {"id": "progress-format-unchecked", "file": PR, "find": "        if raw.get(\"format\") != FORMAT:\n", "replace": "        if False:\n",
     "tests": TU, "why": "a progress written by another format is resumed as if it were this one"},
    {"id": "progress-unreadable-unexplained", "file": PR, "find": "        except Exception as exc:  # noqa: BLE001",
     "replace": "        except ImportError as exc:  # noqa: BLE001", "tests": TU,
     "why": "a corrupt progress file fails with a bare unpickling error instead of naming the file and saying to delete it"},
    {"id": "checkpointing-negative-every", "file": PR, "find": "        if self.every < 0:\n", "replace": "        if self.every < -1:\n",
     "tests": TU, "why": "every = -1 is accepted and saves at an unexpected rhythm instead of naming the setting"},
    {"id": "checkpointing-save-without-store", "file": PR, "find": "        if self.every and self.store is None:\n",
     "replace": "        if False:\n", "tests": TU, "why": "saving with no store fails at the first save, after minutes of training"},
    {"id": "poll-forced-check-throttled", "file": PR, "find": "        if not force and now - self._last_poll < self.poll_s:\n",
     "replace": "        if now - self._last_poll < self.poll_s:\n", "tests": TU,
     "why": "the poll at a micro-step boundary is skipped inside poll_s: a request waits another micro-batch"},
    {"id": "poll-yield-ignored", "file": PR, "find": "        if self.should_yield():\n", "replace": "        if False:\n",
     "tests": TU, "why": "the run never yields: the gateway's users wait for a whole training run"},
    {"id": "poll-not-before-layers", "file": PR, "find": "            handles.append(layer.register_forward_pre_hook(before))\n",
     "replace": "", "tests": TU, "why": "no poll inside a forward pass: a request waits for a whole micro-batch's forward"},
    {"id": "poll-not-in-backward", "file": PR, "find": "                out.register_hook(lambda grad: self.check(force=False))\n",
     "replace": "                pass\n", "tests": TU, "why": "no poll inside a backward pass: a request waits for a whole backward"},
    {"id": "poll-hooks-stay-on-the-model", "file": TR, "find": "        for h in self.hooks:\n            h.remove()\n",
     "replace": "        for h in self.hooks:\n            pass\n", "tests": PLAIN,
     "why": "the finished run's poll hooks stay on the model: a later forward (an evaluation) can raise Preempted"},
    {"id": "fingerprint-ignores-start-step", "file": PR, "find": "\"start_step\": start_step, ", "replace": "", "tests": TU,
     "why": "a progress made on another parent checkpoint (another chain position) is resumed onto this one"},
    {"id": "fingerprint-ignores-step-plan", "file": PR, "find": ", \"step_sizes\": step_sizes}", "replace": "}", "tests": SPLIT,
     "why": "a progress saved under another split of the same rows (a full step and a remainder) resumes at a step index that "
            "points into other rows"},
    {"id": "fingerprint-ignores-old-logps", "file": PR, "find": "s.advantage, s.token_advantages, s.old_logps, s.temperature",
     "replace": "s.advantage, s.token_advantages, s.temperature", "tests": TU,
     "why": "rows re-sampled with other behaviour log-probs resume a progress computed for the old ones"},
    {"id": "resume-stale-accepted", "file": TR, "find": "            if resume.fingerprint != self.fp:\n", "replace": "            if False:\n",
     "tests": STALE, "why": "a progress for other rows is resumed: the adapter mixes two trainings"},
    {"id": "resume-weights-not-restored", "file": TR, "find": "                    p.copy_(resume.params[n].to(p.device))\n",
     "replace": "                    pass\n", "tests": RESUME, "why": "a resumed run restarts from the parent's weights: the window's updates are lost"},
    {"id": "resume-optimizer-not-restored", "file": TR, "find": "            self.optimizer.load_state_dict(resume.optimizer)\n",
     "replace": "", "tests": RESUME, "why": "AdamW's moments restart at zero after every yield: a preempted run trains differently"},
    {"id": "resume-rng-not-restored", "file": TR, "find": "            torch.set_rng_state(resume.rng)\n", "replace": "", "tests": RESUME,
     "why": "LoRA dropout draws other masks after a resume: the adapter depends on when requests arrived"},
    {"id": "resume-inflight-grads-dropped", "file": TR, "find": "                    p.grad = None if g is None else g.to(p.device).clone()\n",
     "replace": "                    p.grad = None\n", "tests": RESUME,
     "why": "the micro-batches done before a mid-step save are lost from that step's gradient"},
    {"id": "resume-step-redone-from-start", "file": TR, "find": "                first, totals = position[2], dict(resume.totals)\n",
     "replace": "                first, totals = 0, dict(resume.totals)\n", "tests": RESUME,
     "why": "a mid-step resume runs the step's first micro-batches again: their gradients count twice"},
    {"id": "resume-boundary-repeats-step", "file": TR, "find": "                nxt = (it, si + 1, 0) if si + 1 < len(steps) else (it + 1, 0, 0)\n",
     "replace": "                nxt = (it, si, 0)\n", "tests": RESUME,
     "why": "a progress saved at a step boundary resumes at the step just done: it is applied twice"},
]
