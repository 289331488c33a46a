"""The fsync helpers (tentalis_pipelines/files.py) and their callers' use of them: what is synced, and in
which order (a power loss cannot be pulled in a test; the calls that make a write durable can be seen)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tentalis_pipelines import files
from tentalis_pipelines.gateway import wal


@pytest.fixture
def synced(monkeypatch) -> list[tuple[str, bool]]:
    """Every fsync as (the path of its descriptor, whether it is a folder)."""
    calls: list[tuple[str, bool]] = []
    real = os.fsync

    def record(fd: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode)))
        real(fd)

    monkeypatch.setattr(files.os, "fsync", record)
    return calls


def test_fsync_dir_syncs_the_folder_itself_and_closes_it(tmp_path, synced):
    before = len(os.listdir("/proc/self/fd"))
    files.fsync_dir(tmp_path)
    assert synced == [(str(tmp_path), True)]
    assert len(os.listdir("/proc/self/fd")) == before  # the descriptor is closed again
    with pytest.raises(FileNotFoundError):
        files.fsync_dir(tmp_path / "missing")  # nothing to sync is an error, never a silent no-op


def test_fsync_tree_syncs_every_file_and_folder_deepest_first_then_the_root(tmp_path, synced):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for rel in ("top.bin", "a/mid.bin", "a/b/deep.bin"):
        (tmp_path / rel).write_bytes(b"x")
    files.fsync_tree(tmp_path)
    paths = [Path(p) for p, _ in synced]
    assert set(paths) == {tmp_path, tmp_path / "a", tmp_path / "a" / "b", tmp_path / "top.bin",
                          tmp_path / "a" / "mid.bin", tmp_path / "a" / "b" / "deep.bin"}
    assert paths[-1] == tmp_path
    depth = [len(p.relative_to(tmp_path).parts) for p in paths[:-1]]
    assert depth == sorted(depth, reverse=True)
    assert dict(synced)[str(tmp_path / "a")] is True and dict(synced)[str(tmp_path / "top.bin")] is False


def test_the_wal_syncs_its_folder_when_a_segment_is_created_and_when_segments_are_removed(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(wal, "fsync_dir", lambda p: events.append((Path(p), sorted(q.name for q in Path(p).iterdir()))))
    log = wal.WriteAheadLog(tmp_path / "wal")
    log.append([{"n": 1}])
    assert events == [(tmp_path / "wal", ["wal-000000000001.jsonl"])]  # the new name, before the first acknowledgement
    log.append([{"n": 2}])
    assert len(events) == 1  # the same segment: its name is already durable
    log.seal()
    log.remove(log.sealed())
    assert events[-1] == (tmp_path / "wal", [])  # the removal is made durable too
