"""Faults of the live gateway, for real: a full disk under the write-ahead log, a client that hangs up
mid-stream. (SIGKILL at random moments is in test_gateway.py, on that module's server.)"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tentalis_pipelines.lakehouse import Lakehouse
from tests.test_gateway import Server

pytest.importorskip("openai")

BODY = {"model": "tentalis", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a disk that can fill) needs root; CI runs as root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


def _fill(folder: Path, name: str) -> None:
    """Write ``folder/name`` until the file system is full."""
    with open(folder / name, "ab", buffering=0) as fh:
        block = b"x" * 4096
        try:
            while True:
                fh.write(block)
        except OSError:
            pass
        try:
            while True:
                fh.write(b"x")
        except OSError:
            pass


def _segments_whole(wal: Path) -> None:
    """Every WAL segment holds whole records only: no failed append left bytes behind."""
    for seg in wal.glob("wal-*.jsonl"):
        try:
            data = seg.read_bytes()
        except FileNotFoundError:  # landed and removed by the flusher meanwhile
            continue
        assert not data or data.endswith(b"\n"), f"{seg.name} ends in a torn record: {data[-80:]!r}"
        for line in data.splitlines():
            json.loads(line)


def test_wal_append_on_a_full_disk_leaves_nothing_to_land_later(tmp_path):
    """An append that fails with ENOSPC is taken back whole: neither a torn line nor the whole record
    (once left in a write buffer, it went out with the next append and landed a turn never acknowledged)."""
    from tentalis_pipelines.gateway.wal import WriteAheadLog

    folder = tmp_path / "wal"
    _mount_tmpfs(folder, "64k")
    wal = WriteAheadLog(folder)
    try:
        wal.append([{"i": 0}])
        _fill(folder, "filler")
        for i in (1, 2, 3):  # the first fills the tail of the segment's page, then fails part-way
            with pytest.raises(OSError):
                wal.append([{"i": i, "pad": "b" * 6000}])
        (folder / "filler").unlink()
        wal.append([{"i": 9}])
        wal.seal()
        assert [r["i"] for p in wal.segments() for r in wal.read(p)] == [0, 9]
        _segments_whole(folder)
    finally:
        wal.close()
        subprocess.run(["umount", str(folder)], check=False)


def test_full_disk_during_wal_append_errors_without_ack_and_recovers(tmp_path, tiny_model_dir):
    """The WAL's disk fills: each call gets an OpenAI-style 507 (streamed: an error event and no [DONE]),
    nothing of it stays in the WAL or lands; once space returns the same gateway (no restart) records and
    lands turns again, and the session's turn indexes have no gap where the failed calls were."""
    home = tmp_path / "home"
    wal = home / "gateway" / "wal"
    _mount_tmpfs(wal, "256k")
    server = Server(home, tiny_model_dir, "--no-auth", "--flush-interval", "1")
    try:
        server.start()
        session = f"disk-{uuid.uuid4().hex[:6]}"
        headers = {"X-Session-Id": session}
        acked: list[str] = []
        with httpx.Client(timeout=60) as c:
            def call(stream: bool = False) -> httpx.Response:
                return c.post(server.url + "/v1/chat/completions", headers=headers, json={**BODY, "stream": stream})

            r = call()
            assert r.status_code == 200, r.text
            acked.append(r.json()["id"] + "-0")
            failed = 0
            for k in range(12):
                _fill(wal, f"filler-{k}")
                stream = k % 3 == 2
                r = call(stream)
                if stream:
                    assert r.status_code == 200  # the headers went out before the turn was recorded
                    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
                    if events[-1] == "[DONE]":
                        acked.append(json.loads(events[0])["id"] + "-0")
                    else:
                        err = json.loads(events[-1])["error"]
                        assert err["code"] == "insufficient_storage" and err["type"] == "server_error", err
                        failed += 1
                elif r.status_code == 200:
                    acked.append(r.json()["id"] + "-0")  # it fit in the tail of a page the segment already held
                else:
                    assert r.status_code == 507, r.text
                    err = r.json()["error"]
                    assert err["code"] == "insufficient_storage" and "not recorded" in err["message"], err
                    assert "id" not in r.json()
                    failed += 1
                _segments_whole(wal)
                time.sleep(0.25)
            # Most calls hit the full disk; some fit in a page a segment already held, or in space the
            # flusher freed (a landed segment removed) between the fill and the call: 5 of 12 on a loaded
            # CI host with continuous batching, 6-9 on a quiet one. Each failure above is checked to be clean.
            assert failed >= 4, f"only {failed} of 12 calls hit the full disk"
            assert server.proc.poll() is None
            for f in wal.glob("filler-*"):
                f.unlink()  # space returns
            for _ in range(4):
                r = call()
                assert r.status_code == 200, r.text
                acked.append(r.json()["id"] + "-0")
        server.wait_flushed()
        lake = Lakehouse(home / "lakehouse")
        rows = [r for r in lake.read("turns", columns=["turn_id", "session_id", "turn_index"]).to_pylist()
                if r["session_id"] == session]
        assert sorted(r["turn_id"] for r in rows) == sorted(acked)  # every acknowledged turn once; no failed one
        assert sorted(r["turn_index"] for r in rows) == list(range(len(acked)))
        assert server.health()["wal_pending"] == 0
    finally:
        server.stop()
        subprocess.run(["umount", str(wal)], check=False)


def test_client_disconnect_mid_stream_lands_nothing(tmp_path, tiny_model_dir):
    """A client that hangs up mid-stream was never acknowledged: its turn does not land, the gateway
    keeps serving, and the session's next turn takes the index the abandoned one would have had."""
    home = tmp_path / "home"
    server = Server(home, tiny_model_dir, "--no-auth", "--flush-interval", "0.5")
    try:
        server.start()
        session = f"hangup-{uuid.uuid4().hex[:6]}"
        headers = {"X-Session-Id": session}
        long = {**BODY, "max_tokens": 200, "stream": True}
        for _ in range(3):
            with httpx.Client(timeout=60) as c, c.stream("POST", server.url + "/v1/chat/completions", headers=headers,
                                                          json=long) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                got = [next(lines) for _ in range(2)]  # the first chunks, then hang up
                assert any(line.startswith("data: {") for line in got)
            # leaving the block closes the connection mid-stream
        time.sleep(1.5)
        with httpx.Client(timeout=60) as c:
            r = c.post(server.url + "/v1/chat/completions", headers=headers, json=BODY)
            assert r.status_code == 200, r.text
            done = r.json()["id"] + "-0"
        server.wait_flushed()
        rows = [r for r in Lakehouse(home / "lakehouse").read("turns", columns=["turn_id", "session_id", "turn_index"])
                .to_pylist() if r["session_id"] == session]
        assert [(r["turn_id"], r["turn_index"]) for r in rows] == [(done, 0)]
    finally:
        server.stop()
