"""An idle window's process trains in the background CPU class: every thread, and the ones started later."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, threading
from tentalis_pipelines.training.cpu_priority import run_in_background
gate = threading.Event()
early = threading.Thread(target=gate.wait)  # a thread that exists before the call (torch's pool may)
early.start()
how = run_in_background()
seen = {}
def look():
    for tid in os.listdir("/proc/self/task"):
        seen[tid] = [os.sched_getscheduler(int(tid)), os.getpriority(os.PRIO_PROCESS, int(tid))]
late = threading.Thread(target=look)  # a thread started after the call inherits it
late.start(); late.join()
gate.set(); early.join()
print(json.dumps({"how": how, "threads": seen, "idle": os.SCHED_IDLE}))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
def test_every_thread_of_a_background_process_is_idle_class_at_nice_19():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["how"] == "sched_idle"
    assert len(got["threads"]) >= 3  # the main thread, the early one, the late one (and any an import started)
    assert all(policy == got["idle"] and nice == 19 for policy, nice in got["threads"].values()), got
