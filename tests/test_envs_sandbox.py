"""The sandbox's shell sessions (one per episode), directly: the tree in and out, limits, and a dead session."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from tentalis_pipelines.envs.agents import scripted_agent
from tentalis_pipelines.envs.base import end_kind
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.sandbox import (
    ShellLimits,
    ShellSession,
    ShellSessionError,
    shell_tree_parts,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="the sandbox needs Linux namespaces and root (CI runs as root)")


def test_tree_goes_in_and_comes_back_as_data():
    files = {"a.txt": "hello\n", "d/e/f.bin": b"\xff\x00\x01", "empty/": ""}
    with ShellSession(files) as s:
        r = s.run("cat a.txt; ls -R; ln -s /etc/passwd link; mkfifo pipe; printf 'x' > d/new.txt")
        assert r.exit_code == 0 and r.head.startswith("hello\n") and "f.bin" in r.head
        tree = s.snapshot()
    assert tree["a.txt"] == {"type": "file", "mode": 0o644, "size": 6, "text": "hello\n"}
    assert tree["d/e/f.bin"]["hex"] == "ff0001"
    assert tree["empty"]["type"] == "dir" and tree["d/e"]["type"] == "dir"
    assert tree["link"] == {"type": "symlink", "target": "/etc/passwd"}  # read as a link, never followed
    assert tree["pipe"] == {"type": "other"}
    assert tree["d/new.txt"]["text"] == "x"


def test_bad_tree_paths_are_refused_before_anything_starts():
    for bad in ("/etc/x", "../x", "a/../../x", "", "a//b", "./a"):
        with pytest.raises(ValueError):
            shell_tree_parts(bad)
        with pytest.raises(ValueError):
            ShellSession({bad: "x"})


def test_disk_and_file_size_limits():
    with ShellSession({}, ShellLimits(disk_mb=2, max_file_mb=1)) as s:
        r = s.run("head -c 1500000 /dev/zero > big; echo $?; ls -l big | awk '{print $5}'")
        assert "File size limit exceeded" in r.head or r.head.split()[-1] == "1048576"
        r = s.run("for i in 1 2 3; do head -c 900000 /dev/zero > f$i; done; df -k . | tail -1")
        assert "No space left on device" in r.head
        assert s.run("echo fine").head == "fine\n"  # the session goes on


def test_memory_limit():
    with ShellSession({}, ShellLimits(memory_mb=64)) as s:
        r = s.run("python3 -c 'x = bytearray(200 * 1024 * 1024)'; echo code=$?")
        assert "MemoryError" in r.head + r.tail and "code=1" in r.head + r.tail


def test_a_session_that_dies_is_reported_not_raised():
    with ShellSession({"a": "b"}) as s:
        os.killpg(s.pid, signal.SIGKILL)  # as if the machine killed it
        r = s.run("echo hi")
        assert r.error and not s.alive
        with pytest.raises(ShellSessionError):
            s.snapshot()


def test_an_episode_whose_sandbox_dies_ends_with_an_error():
    task = TerminalTask("t", 1, "x", "q", {"a.txt": "1\n"}, {"kind": "answer", "expected": "1"}, ["submit 1"])
    env = TerminalEnv()

    def agent(messages, calls=[]):  # noqa: B006 - a counter across calls
        calls.append(1)
        if len(calls) == 1:
            os.killpg(env.session.pid, signal.SIGKILL)
        return "```bash\nsubmit 1\n```"

    ep = run_episode(env, task, agent)
    assert end_kind(ep.end_reason) == "error" and "sandbox" in ep.end_reason and not ep.passed
    again = run_episode(env, task, scripted_agent(["submit 1"]))
    assert again.passed


# ---- the episode's memory limit (a cgroup where the host allows one) -------------------------------------
ALLOCATE = "python3 -c 'import time; x = bytearray(30 * 2**20); x[::4096] = b\"x\" * len(x[::4096]); time.sleep(2)'"


def test_processes_together_cannot_exceed_the_episode_memory_limit():
    # Four processes of 30 MB each, each far under its own 256 MB address-space limit, against a 64 MB limit
    # for the episode: the kernel kills at the limit, and the session says so from the cgroup's count.
    limits = ShellLimits(memory_mb=256, episode_memory_mb=64, command_timeout_s=8.0)
    with ShellSession({}, limits) as s:
        if s.memory_limit["kind"] == "rlimit":
            pytest.skip("no writable memory cgroup on this host (the rlimit bound is tested below)")
        assert s.memory_limit == {"kind": s.memory_limit["kind"], "bytes": 64 * 2**20}
        one = s.run(ALLOCATE)
        assert one.exit_code == 0 and not one.memory_limit  # one process fits
        r = s.run(f"for i in 1 2 3 4; do {ALLOCATE} & done; wait; echo done")
        assert r.memory_limit, r
        assert s.run("echo fine").head == "fine\n" and not s.run("true").memory_limit  # the session goes on


def test_printing_out_of_memory_words_is_not_a_memory_violation():
    with ShellSession({}) as s:
        r = s.run("echo 'Killed'; echo 'MemoryError: Cannot allocate memory' >&2; echo 'Out of memory: Killed process 1'")
        assert not r.memory_limit and not r.process_limit and r.network_attempts == 0 and not r.submitted


def test_without_a_cgroup_the_sum_is_bounded_by_the_rlimits(monkeypatch):
    monkeypatch.setenv("TENTALIS_SANDBOX_CGROUP", "0")
    with ShellSession({}, ShellLimits(memory_mb=64, max_procs=8)) as s:
        assert s.memory_limit == {"kind": "rlimit", "bytes": 64 * 2**20 * 8}
        assert s.run("echo ok").head == "ok\n"


def test_the_memory_limits_kind_is_in_each_turns_info():
    task = TerminalTask("t", 1, "x", "q", {"a.txt": "1\n"}, {"kind": "answer", "expected": "1"}, ["submit 1"])
    ep = run_episode(TerminalEnv(), task, scripted_agent(["submit 1"]))
    info = ep.turns[0].info
    assert info["memory_limit_kind"] in ("cgroup-v1", "cgroup-v2", "rlimit") and info["memory_limit_bytes"] > 0


def test_an_episode_that_exceeds_its_memory_ends_as_a_memory_violation():
    config = TerminalConfig(limits=ShellLimits(memory_mb=256, episode_memory_mb=64, command_timeout_s=8.0))
    env = TerminalEnv(config)
    task = TerminalTask("t", 1, "x", "q", {"a.txt": "1\n"}, {"kind": "answer", "expected": "1"}, ["submit 1"])
    ep = run_episode(env, task, scripted_agent([f"for i in 1 2 3 4; do {ALLOCATE} & done; wait", "submit 1"]))
    if ep.turns[0].info["memory_limit_kind"] == "rlimit":
        pytest.skip("no writable memory cgroup on this host")
    assert ep.end_reason == "hostile: memory limit of the episode reached" and not ep.passed
    assert "episode's memory limit" in ep.turns[0].observation


# ---- the final tree: checked files first; an agent's deep tree is the agent's ---------------------------
EDIT = TerminalTask("edit", 3, "x", "Make b.txt hold hi.", {"a.txt": "x\n"},
                    {"kind": "tree", "rules": [{"path": "b.txt", "file": "hi"}, {"path": "a.txt", "file": "x"}]},
                    ["echo hi > b.txt", "submit"])


def test_large_unrelated_files_do_not_evict_the_checked_ones_from_the_snapshot():
    # "a-big.bin" sorts (and is walked) before b.txt and is larger than the whole snapshot budget.
    limits = ShellLimits(disk_mb=8, max_file_mb=4, snapshot_max_bytes=1024 * 1024)
    env = TerminalEnv(TerminalConfig(limits=limits))
    ep = run_episode(env, EDIT, scripted_agent(["head -c 3000000 /dev/zero > a-big.bin; mkdir aa; "
                                                "head -c 2000000 /dev/zero > aa/big; echo hi > b.txt", "submit"]))
    assert ep.end_reason == "submitted" and ep.passed, ep.verdict


def test_snapshot_reads_the_named_files_first_and_marks_the_rest_truncated():
    with ShellSession({"z.txt": "zed\n"}, ShellLimits(disk_mb=8, max_file_mb=4, snapshot_max_bytes=100_000)) as s:
        s.run("head -c 200000 /dev/zero > a.bin")
        tree = s.snapshot(first=["z.txt", "missing.txt", "../x", "a.bin/"])
        assert tree["z.txt"]["text"] == "zed\n" and "truncated" not in tree["z.txt"]
        assert tree["a.bin"]["truncated"] and tree["a.bin"]["size"] == 200000
        assert "missing.txt" not in tree
        plain = s.snapshot()
        assert plain["z.txt"].get("truncated")  # without it, the big file took the budget


def test_an_over_deep_directory_of_the_agent_is_its_own_outcome_not_an_environment_error():
    name = "d" * 60
    deep = f"for i in $(seq 90); do mkdir {name} && cd {name} || break; done; echo deep > leaf.txt"
    env = TerminalEnv(TerminalConfig(limits=ShellLimits(max_inodes=2048)))
    ep = run_episode(env, EDIT, scripted_agent([f"{deep}; cd /home/agent 2>/dev/null; cd ~; echo hi > b.txt", "submit"]))
    assert end_kind(ep.end_reason) != "error", ep.end_reason
    assert ep.end_reason == "submitted" and ep.passed, ep.verdict  # the deep tree is read; the rules hold
    wrong = run_episode(env, EDIT, scripted_agent([f"{deep}", "submit"]))
    assert wrong.end_reason == "submitted" and not wrong.passed and "b.txt should be a file" in wrong.verdict.detail


def test_a_tree_deeper_than_path_max_comes_back_whole():
    name = "e" * 100
    with ShellSession({}) as s:
        s.run(f"for i in $(seq 60); do mkdir {name} && cd {name} || break; done; echo bottom > f.txt")
        tree = s.snapshot()
    leaf = "/".join([name] * 60) + "/f.txt"
    assert len(leaf) > 4096 and tree[leaf]["text"] == "bottom\n"


# ---- observations: no NUL, no terminal escapes --------------------------------------------------------
def test_nul_and_ansi_bytes_reach_neither_observations_nor_transcripts():
    task = TerminalTask("t", 1, "x", "q", {"a.txt": "1\n"}, {"kind": "answer", "expected": "1"}, ["submit 1"])
    ep = run_episode(TerminalEnv(), task, scripted_agent([
        "printf 'a\\0b\\033[31mred\\033[0m\\033]0;title\\007\\r\\tok\\n'", "submit $(printf '\\033[1m1\\033[0m')"]))
    obs = ep.turns[0].observation
    assert obs.startswith("abred\tok\n") and not any(c in obs for c in "\0\x1b\x07\r")
    assert ep.turns[1].info["answer"] == "1" and ep.passed
    dumped = json.dumps(ep.to_dict())  # the stored transcript
    assert "\\u0000" not in dumped and "\\u001b" not in dumped
