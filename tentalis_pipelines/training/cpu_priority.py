"""Training that never makes a user wait for a core: an idle window's process runs in the background class.

An idle window trains on the same cores the gateway serves from. When a request arrives, the window
yields within a layer's compute (``training/progress.py``), but until then, and while the preempted
process writes its window row and exits, the two compete for the cores. Measured on a 2-core host
(``bench/idle_bench.py``), that contention made each window's first request ~20% slower than an idle one.

:func:`run_in_background` moves every thread of the calling process to Linux's ``SCHED_IDLE`` class
(it runs only on a core nobody else wants) and to nice 19 (where ``SCHED_IDLE`` is refused or absent);
threads the process starts later (torch's intra-op pool is created lazily) inherit it. A request's
forward pass then preempts training at once, instead of sharing the cores with it.

It is one-way: an unprivileged process cannot raise its priority again, so only a process that exists
to train a window calls it (the ``training_windows`` asset's step process, the bench's window worker).

Scope: the kernel's autogroups (``kernel.sched_autogroup_enabled``) share the CPU first between
sessions, then by priority inside one. A gateway started in another terminal session than the Dagster
daemon competes with the window's session as a whole; start both from one session (one systemd unit,
one ``tmux`` pane's children) or disable autogroups for the priority to reach across them.
"""

from __future__ import annotations

import os

NICE = 19  # the lowest priority


def _threads() -> list[int]:
    """This process's thread ids (Linux), or ``[0]`` (the calling thread / process) elsewhere."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def run_in_background() -> str:
    """Lower every thread of this process to the idle class, or nice 19 where that is refused.

    Returns how: ``"sched_idle"``, ``"nice"`` or ``"unchanged"`` (neither was allowed). Never raises:
    a window trains at normal priority rather than not at all."""
    how = "sched_idle" if hasattr(os, "SCHED_IDLE") else "nice"
    changed = False
    for tid in _threads():
        if how == "sched_idle":
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                changed = True
            except OSError:
                how = "nice"
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < NICE:
                os.setpriority(os.PRIO_PROCESS, tid, NICE)
            changed = True
        except OSError:  # a thread that ended meanwhile, or a platform that refuses
            pass
    return how if changed else "unchanged"
