"""The sandbox's shell sessions (one per episode), directly: the tree in and out, limits, and a dead session."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tentalis_pipelines.envs.agents import scripted_agent
from tentalis_pipelines.envs.base import end_kind
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.evaluation.sandbox import (
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
