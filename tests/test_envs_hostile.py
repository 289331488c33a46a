"""Hostile agents in the terminal environment, for real: each case runs the commands in the sandbox and
checks, from the outside, that the episode ended (or the observation says what was stopped and why),
that nothing outside the episode's tree changed (the files we watch, our own processes), that no process
of the episode's sandbox survived, and that the next episode with the same environment still works."""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tentalis_pipelines.envs.agents import oracle_agent, scripted_agent
from tentalis_pipelines.envs.base import SUBMITTED, end_kind
from tentalis_pipelines.envs.runner import run_episode
from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.sandbox import ShellLimits

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="the sandbox needs Linux namespaces and root (CI runs as root)")

REPO = Path(__file__).resolve().parents[1]
TAG = uuid.uuid4().hex[:10]
TASK = TerminalTask(task_id="hostile", level=1, family="test", instruction="How many lines in a.txt?",
                    tree={"a.txt": "one\ntwo\n"}, check={"kind": "answer", "expected": "2"},
                    solution=["wc -l < a.txt", "submit 2"])
LIMITS = ShellLimits(command_timeout_s=2.0, max_procs=32, disk_mb=8)


def uid_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as fh:
                    if next(int(ln.split()[1]) for ln in fh if ln.startswith("Uid:")) == uid:
                        pids.append(int(entry))
            except (OSError, StopIteration, ValueError):
                continue
    return pids


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def host():
    """What must not change: files outside any tree (ours and the host's), and a process of ours."""
    watched = {p: digest(p) for p in (REPO / "pyproject.toml", Path("/etc/passwd"), Path("/etc/hostname"))
               if p.exists()}
    absent = [Path(f"/tmp/evil-{TAG}"), Path(f"/root/evil-{TAG}"), Path(f"/var/tmp/evil-{TAG}"),
              Path(f"/dev/shm/evil-{TAG}"), REPO / f"evil-{TAG}", REPO / "tests" / f"evil-{TAG}", Path(f"/evil-{TAG}"),
              Path(f"/home/evil-{TAG}")]
    bystander = subprocess.Popen(["sleep", "300"])
    yield absent
    try:
        assert bystander.poll() is None, "a process of ours outside the sandbox was killed"
        for p, d in watched.items():
            assert digest(p) == d, f"{p} changed"
        for p in absent:
            assert not p.exists(), f"{p} was created"
    finally:
        bystander.kill()
        bystander.wait()
        for p in absent:
            if p.exists():
                p.unlink()


def run_hostile(commands: list[str], **config) -> tuple[TerminalEnv, object, float]:
    env = TerminalEnv(TerminalConfig(limits=LIMITS, **config))
    t0 = time.monotonic()
    ep = run_episode(env, TASK, scripted_agent(commands))
    seconds = time.monotonic() - t0
    assert uid_processes(env.sandbox_uid) == [], "a sandboxed process outlived its episode"
    after = run_episode(env, TASK, oracle_agent(TASK))  # the batch goes on
    assert after.passed and after.end_reason == SUBMITTED
    return env, ep, seconds


def observations(ep) -> str:
    return "\n".join(t.observation for t in ep.turns)


def test_fork_bomb_ends_the_episode(host):
    _, ep, seconds = run_hostile([":(){ :|:& };:; sleep 1", "echo unreachable"])
    assert ep.end_reason == "hostile: process limit reached (fork bomb?)"
    assert "killed: the command ran into the process limit" in ep.turns[0].observation
    assert ep.turns_used == 1 and not ep.passed and ep.reward == 0.0
    assert seconds < 15


def test_fork_bomb_that_returns_at_once_is_killed_with_its_shell(host):
    _, ep, _ = run_hostile([":(){ :|:& };:", "ps -e --no-headers | wc -l", "submit 2"])
    first = ep.turns[0]
    assert end_kind(ep.end_reason) == "hostile" or "were killed" in first.observation or \
        "process limit" in first.observation
    if end_kind(ep.end_reason) != "hostile":  # it went on: nothing of the bomb is left in the sandbox
        assert int(ep.turns[1].observation.splitlines()[0]) <= 4  # the session's init, bash, ps, wc


@pytest.mark.parametrize("target", ["/tmp/evil-{tag}", "/root/evil-{tag}", "/var/tmp/evil-{tag}", "/dev/shm/evil-{tag}",
                                    "/evil-{tag}", "../evil-{tag}"])
def test_writes_outside_the_tree_are_refused_and_reported(host, target):
    # Refused by the read-only root (or the directory does not exist in the sandbox at all); like a denied
    # read it is reported in the output, not punished: violations are decided from the sandbox's signals.
    _, ep, _ = run_hostile([f"echo x > {target.format(tag=TAG)}", "submit 2"])
    obs = ep.turns[0].observation
    assert "Read-only file system" in obs or "No such file or directory" in obs, obs
    assert "[exit code 1]" in obs and ep.end_reason == SUBMITTED and ep.passed


def test_writing_into_the_repository_is_refused(host):
    _, ep, _ = run_hostile([f"echo x > {REPO}/evil-{TAG}", "submit 2"])
    obs = ep.turns[0].observation
    assert "No such file or directory" in obs, obs  # the repository does not exist inside the sandbox
    assert ep.passed


@pytest.mark.parametrize("text", ["Read-only file system", "Resource temporarily unavailable",
                                  "Network is unreachable", "fork: retry: Resource temporarily unavailable"])
def test_printing_a_violations_words_is_not_a_violation(host, text):
    # An innocent log line that holds the words an error would: the episode goes on and is judged on its work.
    _, ep, _ = run_hostile([f"echo 'app.log: {text}'; echo '{text}' >&2; printf '%s\\n' '{text}' > log.txt; cat log.txt",
                            "submit 2"])
    assert text in ep.turns[0].observation and "episode ended" not in ep.turns[0].observation
    assert ep.end_reason == SUBMITTED and ep.passed and ep.reward == 1.0
    assert not ep.turns[0].info["process_limit"] and ep.turns[0].info["network_attempts"] == 0


def test_listing_the_environment_neither_submits_nor_shows_a_secret(host):
    _, ep, _ = run_hostile(["env; declare -f; set; declare -p; compgen -A function", "submit 2"])
    first = ep.turns[0]
    assert "submit" in first.observation  # the function is there to see: nothing in it is secret
    assert "@@" not in first.observation and "SUBMIT-" not in first.observation
    assert first.info.get("end_reason") is None and ep.turns_used == 2  # the listing did not end the episode
    assert ep.end_reason == SUBMITTED and ep.passed


def test_printing_what_submit_writes_does_not_submit(host):
    # The submission is read from its own descriptor by the sandbox's server, never from the output.
    _, ep, _ = run_hostile(["declare -f submit | sed 's/>&3//'; printf '%s\\0' 2; printf '%s\\0' 2 >&2",
                            "submit 2"])
    assert ep.turns_used == 2 and ep.end_reason == SUBMITTED and ep.turns[1].info["answer"] == "2"


def test_the_host_outside_the_sandbox_is_not_visible(host, tmp_path):
    # The sandbox's root holds only what a shell needs: not the checkouts, not the home folders, not /tmp.
    secret = tmp_path / "visible.txt"
    secret.write_text(f"host-file-{TAG}\n")
    secret.chmod(0o644)
    for parent in tmp_path.parents:  # world-traversable, so that only the sandbox's view can hide it
        if str(parent).startswith("/tmp/"):
            parent.chmod(parent.stat().st_mode | 0o005)
    _, ep, _ = run_hostile([f"ls /work; ls /root; ls /opt /srv /mnt; cat {secret}; ls -A /tmp; cat /etc/gitconfig",
                            "ls -A /home; ls /", "submit 2"])
    obs = ep.turns[0].observation
    assert "ls: cannot access '/work': No such file or directory" in obs
    assert "ls: cannot access '/root': No such file or directory" in obs
    assert f"host-file-{TAG}" not in obs and f"{secret}: No such file or directory" in obs
    home, root = ep.turns[1].observation.split("\n", 1)
    assert home == "agent"  # /home holds the episode's own directory only
    assert set(root.split("\n")[:-1]) <= {"bin", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc",
                                          "run", "sbin", "tmp", "usr", "var"}, root
    assert ep.passed


def test_touch_mkdir_and_writes_into_the_repository_change_nothing(host):
    _, ep, _ = run_hostile([f"touch /root/evil-{TAG}; mkdir /home/evil-{TAG}; echo x > {REPO}/tests/evil-{TAG}; "
                            f"cp a.txt {REPO}/pyproject.toml", f"ls -A {REPO}"], end_on_violation=False)
    obs = ep.turns[0].observation
    assert obs.count("Read-only file system") + obs.count("No such file or directory") == 4, obs  # each write refused
    assert "pyproject.toml" not in ep.turns[1].observation  # the repository is hidden


def test_sleep_is_killed_at_the_time_limit_and_the_episode_goes_on(host):
    _, ep, seconds = run_hostile(["sleep 1000", "echo still here", "sleep 1000 & echo started", "submit 2"])
    assert "killed: the command ran past the 2 s time limit" in ep.turns[0].observation
    assert ep.turns[1].observation == "still here\n[exit code 0]"
    assert "started" in ep.turns[2].observation and "were killed" in ep.turns[2].observation  # no background left
    assert ep.end_reason == SUBMITTED and ep.passed
    assert ep.turns[0].info["timed_out"] and 2.0 <= ep.turns[0].info["command_seconds"] < 5
    assert seconds < 12


def test_a_hundred_megabytes_of_output_is_truncated_in_bounded_memory(host):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _, ep, seconds = run_hostile(["head -c 100000000 /dev/zero | tr '\\0' x; echo; echo END", "submit 2"])
    obs = ep.turns[0].observation
    assert ep.turns[0].info["output_bytes"] == 100_000_005
    assert "characters truncated ...]" in obs and obs.startswith("xxxx") and "END\n[exit code 0]" in obs
    assert len(obs) < 1200
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 50, f"the test process grew by {grown_mb:.0f} MB"
    assert ep.passed and seconds < 20


def test_shadow_and_host_files_cannot_be_read(host, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(f"secret-{TAG}\n")
    shadow_lines = [ln for ln in Path("/etc/shadow").read_text().splitlines() if ln.strip()] if Path("/etc/shadow").exists() else []
    _, ep, _ = run_hostile([f"cat /etc/shadow; cat {secret}; cat {REPO}/pyproject.toml; ls -A /root", "submit 2"])
    obs = ep.turns[0].observation
    assert "/etc/shadow: No such file or directory" in obs  # not in the sandbox's /etc at all
    assert f"secret-{TAG}" not in obs and "[project]" not in obs
    assert not any(line in obs for line in shadow_lines)
    assert ep.passed  # a denied read is reported, not punished


def test_network_is_unreachable_even_to_a_listening_local_socket(host):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0tentalis-test-{TAG}")
    abstract.listen(8)
    abstract.settimeout(0.5)
    try:
        _, ep, _ = run_hostile([f"echo hi > /dev/tcp/127.0.0.1/{port}", "echo unreachable"])
        assert ep.end_reason == "hostile: network access" and "Network is unreachable" in ep.turns[0].observation
        _, ep2, _ = run_hostile([f"curl -sS -m 2 http://127.0.0.1:{port}/; "
                                 f"curl -sS -m 2 --abstract-unix-socket tentalis-test-{TAG} http://x/; echo done", "submit 2"],
                                end_on_violation=False)
        assert "done" in ep2.turns[0].observation and "curl: (7)" in ep2.turns[0].observation
        for s in (server, abstract):
            with pytest.raises(TimeoutError):
                s.accept()  # no connection ever arrived
    finally:
        server.close()
        abstract.close()


def test_killing_the_parent_or_everything_reaches_nothing_outside(host):
    _, ep, _ = run_hostile(["kill -9 $PPID; kill -9 -1; kill -9 1; echo alive",
                            f"kill -9 {os.getpid()}; echo still", "submit 2"])
    assert "alive" in ep.turns[0].observation and "Operation not permitted" in ep.turns[0].observation
    assert "still" in ep.turns[1].observation  # our pid is not even visible in its PID namespace
    assert ep.end_reason == SUBMITTED and ep.passed


def test_a_hostile_turn_fails_the_episode_even_when_the_work_was_done(host):
    task = TerminalTask(task_id="hostile-edit", level=3, family="test", instruction="Make b.txt hold hi.",
                        tree={"a.txt": "x\n"}, check={"kind": "tree", "rules": [{"path": "b.txt", "file": "hi"}]},
                        solution=["echo hi > b.txt", "submit"])
    env = TerminalEnv(TerminalConfig(limits=LIMITS))
    ep = run_episode(env, task, scripted_agent(["echo hi > b.txt; (echo x > /dev/tcp/10.1.2.3/80) 2>/dev/null; submit"]))
    assert ep.end_reason == "hostile: network access"
    assert not ep.passed and ep.reward == 0.0 and ep.verdict.detail.startswith("hostile")
