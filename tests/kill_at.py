"""Run the `tentalis` CLI and SIGKILL it at a named moment: ``python tests/kill_at.py SPEC ARGS...``.

SPEC is ``module.attr:N:when`` (``lakehouse.Lakehouse.delete:2:after``: right after the second call of
``Lakehouse.delete`` returns; ``audit.record:1:before``: as the first audit row is about to be written).
The process kills itself with SIGKILL, the signal nothing can catch: no ``finally``, no atexit, no
flush runs, the same as ``kill -9`` from outside at that instant. A test-side wrapper, so the product
code carries no test hooks."""

from __future__ import annotations

import importlib
import os
import signal
import sys


def arm(spec: str) -> None:
    target, n, when = spec.rsplit(":", 2)
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest importable module path, then attributes
        try:
            owner = importlib.import_module("tentalis_pipelines." + ".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            continue
    for name in parts[i:-1]:
        owner = getattr(owner, name)
    real = getattr(owner, parts[-1])
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        hit = calls[0] == int(n)
        if hit and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if hit and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, parts[-1], wrapper)


if __name__ == "__main__":
    arm(sys.argv[1])
    from tentalis_pipelines.cli import app

    sys.argv = ["tentalis", *sys.argv[2:]]
    app()
