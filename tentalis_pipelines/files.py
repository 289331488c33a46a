"""Durable files: the fsync calls that make a write survive a power loss, shared by the checkpoint store
(an adapter folder renamed into place) and the gateway's write-ahead log (a new segment's name).

A file's data is durable once the file is fsynced; its *name* (a new file, or a rename) only once the
folder that holds it is fsynced too."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder, so that the names created, renamed or removed in it survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder``, deepest first, then ``folder`` itself."""
    for p in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if p.is_file():
            with p.open("rb") as fh:
                os.fsync(fh.fileno())
        elif p.is_dir():
            fsync_dir(p)
    fsync_dir(folder)
