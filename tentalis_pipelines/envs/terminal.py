"""The terminal environment: the agent's commands run as real ``bash`` in the project's sandbox.

**Action format.** Each assistant turn holds exactly one fenced code block tagged ``bash`` (``sh`` and
``shell`` are read the same way); its content is the command. The agent finishes with the ``submit``
command: ``submit ANSWER`` for a question, a bare ``submit`` after file edits. This is mini-swe-agent's
format (one bash block per turn, a fixed command to finish), chosen for the embedded SmolLM2-135M because
it asks for nothing that model cannot write: it has seen a great many Markdown code fences in
pre-training and produces them unprompted, whereas tool calls need a JSON object with the right
nesting and escaping and a chat template that SmolLM2's (plain ChatML, no ``tools``) does not have.
A Markdown fence cannot be malformed in a way that hides a command (one regular expression reads it,
the same one a reader would), the command inside is ordinary shell, and ``submit`` is one word. It is
a shell function (exported into every command's environment), so it composes with the shell:
``submit $(wc -l < notes.txt)`` answers in one turn. It writes its arguments to the sandbox's
submission channel, a pipe on descriptor 3 that the sandbox's server reads apart from the command's
output; nothing in the shell's environment is secret (``env``, ``declare -f`` and ``set`` show the
function, and printing anything, that included, submits nothing), and nothing else ends an episode.

The conversation opens with the system prompt and one worked example (a two-turn exchange on a task
of no generated family: print a file's first line, submit it), then the task. Measured on 18 held-out
tasks (6 per level), 3 turns each, greedy, SmolLM2-135M-Instruct in bf16: with the system prompt alone
14 of 54 turns held a bash block (the model answers in prose); with an extra reminder under the task,
33 of 54; with the worked example, 49 of 50. A demonstration of a task family itself would be copied
(a count-lines example made the model solve count-lines tasks by rote), so the example is of none.

A turn with no code block or with several is answered with a format message, runs nothing and counts
as a turn. Observations are the command's output (stdout and stderr together, as a terminal shows
them) and its exit code, cut to ``observation_chars`` with a visible marker that says how much is
missing (``[... 12,345 characters truncated ...]``; the beginning and the end are kept). They are
sanitised first (:func:`sanitize`): NUL bytes, ANSI escape sequences and other control characters
(all but newline and tab) are removed, so they reach neither the policy nor a stored transcript.

**Execution.** One :class:`~tentalis_pipelines.sandbox.ShellSession` per episode: a fresh copy
of the task's tree in the session's own size-limited tmpfs (the only writable place), no network, a
throwaway uid, limits on time per command, memory, processes, file size and disk, the project's tree
and ``$TENTALIS_HOME`` hidden. Files persist from one command to the next; processes do not (whatever a
command leaves running is killed when it ends), nor do ``cd`` and variables (each command is a new
``bash -c``, as in mini-swe-agent).

**Hostile actions.** The sandbox stops them; the environment also ends the episode (end reason
``hostile: ...``, reward 0) when a command ran into the process limit (a fork bomb: the sandbox's
server counted the session's processes at the cap), into the episode's memory limit (the kernel
killed a process at the session cgroup's limit) or tried to reach the network (the network
namespace's kernel counter of packets with no route rose), unless ``end_on_violation`` is off. Each
of these is decided from what the sandbox observed, never from text the command printed: printing
"Read-only file system" or "Network is unreachable" is harmless. A write outside the working
directory is refused by the read-only filesystem and reported in the output like a denied read, and
the episode goes on; so does a command killed at its time limit.

**Verdict.** At the end (submitted, turn limit), answer tasks compare the submitted answer, edit tasks
check the final tree, read back from the sandbox as data (never executed). An edit task is checked even
without ``submit`` (the final state is what counts); an answer task without a submission fails.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from tentalis_pipelines.envs.base import (
    SUBMITTED,
    TURN_LIMIT,
    Environment,
    EnvironmentUnavailable,
    Observation,
    StepResult,
    Verdict,
    end_kind,
    error,
    hostile,
)
from tentalis_pipelines.envs.terminal_tasks import TerminalTask, verify
from tentalis_pipelines.sandbox import (
    SUBMIT_FD,
    SandboxUnavailableError,
    ShellLimits,
    ShellResult,
    ShellSession,
)

SYSTEM_PROMPT = (
    "You are a shell agent. You work in a Linux terminal, in a directory that holds the task's files.\n"
    "Reply with exactly one bash code block: the one command to run next. For example:\n"
    "```bash\nls\n```\n"
    "You will see its output, then reply with the next command.\n"
    "When you know the answer, submit it:\n"
    "```bash\nsubmit ANSWER\n```\n"
    "When the task asks you to change files, make the changes, then run submit on its own."
)

# One worked example between the system prompt and the task (module doc); its messages are context.
DEMONSTRATION = (
    {"role": "user", "content": "What is the first line of the file list.txt? Submit that line."},
    {"role": "assistant", "content": "```bash\nhead -n 1 list.txt\n```"},
    {"role": "user", "content": "red apple\n[exit code 0]"},
    {"role": "assistant", "content": "```bash\nsubmit red apple\n```"},
)

# Said after the output of a command that repeats the previous turn's (``TerminalConfig.repeat_notice``):
# the embedded model's commonest failure is to run the right command again and again instead of submitting.
REPEAT_NOTICE = ("[You ran this same command in your last turn and got the same output. If that output "
                 "answers the task, submit it: submit followed by the output.]")

ACTION_RE = re.compile(r"```(?:bash|sh|shell)[ \t]*\n(.*?)```", re.DOTALL)

# ANSI escape sequences (CSI, OSC, two-byte ESC sequences) and every other control character but
# newline and tab (C0, DEL, C1): removed from observations and answers (module doc).
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class TerminalConfig:
    max_turns: int = 8
    observation_chars: int = 1000
    limits: ShellLimits = field(default_factory=lambda: ShellLimits(command_timeout_s=10.0))
    end_on_violation: bool = True
    system_prompt: str = SYSTEM_PROMPT
    demonstration: bool = True  # the worked example (module doc) before the task
    demonstration_messages: tuple[dict[str, str], ...] = DEMONSTRATION  # which worked example (a variant's)
    repeat_notice: bool = False  # a command identical to the previous turn's gets REPEAT_NOTICE after its output


def parse_action(text: str) -> tuple[str | None, str]:
    """(the command, "") from an assistant turn, or (None, why not) when it does not hold exactly one
    non-empty bash block."""
    blocks = ACTION_RE.findall(text)
    if len(blocks) == 1 and blocks[0].strip():
        return blocks[0].strip(), ""
    if not blocks:
        why = "no bash code block found"
    elif len(blocks) > 1:
        why = f"{len(blocks)} bash code blocks found"
    else:
        why = "the bash code block is empty"
    return None, why


def format_error_message(why: str) -> str:
    return (f"Format error: {why}. Reply with exactly one bash code block holding one command, like\n"
            "```bash\nls\n```\nTo finish, run submit ANSWER (or submit on its own after changing files).")


def repeat_notice(command: str, previous: str | None) -> str:
    """The notice after a command that repeats ``previous`` (the last turn's command), else ""."""
    return "\n" + REPEAT_NOTICE if previous is not None and command.strip() == previous.strip() else ""


def sanitize(text: str) -> str:
    """``text`` without NUL bytes, ANSI escape sequences and control characters other than ``\\n`` and
    ``\\t`` (a terminal's colours and cursor moves, a carriage return that would hide a line)."""
    return _CONTROL_RE.sub("", _ANSI_RE.sub("", text))


def truncate_middle(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a marker that says how
    many characters are missing."""
    if len(text) <= limit:
        return text
    head_n = limit // 2
    tail_n = limit - head_n
    cut = len(text) - head_n - tail_n
    return f"{text[:head_n]}\n[... {cut:,} characters truncated ...]\n{text[len(text) - tail_n:]}"


def truncate_output(head: str, tail: str, omitted: int, limit: int) -> str:
    """A command's output for the observation: the sandbox kept ``head`` and ``tail`` and dropped
    ``omitted`` bytes between them; at most ``limit`` characters of it are shown."""
    if omitted <= 0:
        return truncate_middle(head + tail, limit)
    head_n = limit // 2
    tail_n = limit - head_n
    h = head[:head_n]
    t = tail[len(tail) - tail_n:] if tail_n > 0 else ""
    cut = (len(head) - len(h)) + omitted + (len(tail) - len(t))
    return f"{h}\n[... {cut:,} characters truncated ...]\n{t}"


def format_observation(result: ShellResult, *, limit: int, timeout_s: float) -> str:
    text = truncate_output(sanitize(result.head), sanitize(result.tail), result.omitted_bytes, limit).rstrip("\n")
    lines = [text if text.strip() else "(no output)"]
    if result.timed_out:
        lines.append(f"[killed: the command ran past the {timeout_s:g} s time limit]")
    else:
        lines.append(f"[exit code {result.exit_code}]")
    if result.process_limit:
        lines.append("[killed: the command ran into the process limit]")
    elif result.memory_limit:
        lines.append("[killed: the command ran into the episode's memory limit]")
    elif result.killed_processes:
        lines.append(f"[{result.killed_processes} process(es) it left running were killed]")
    return "\n".join(lines)


def violation(result: ShellResult) -> str | None:
    """Why this command counts as hostile (module doc), or None: from the sandbox's own signals (the
    process count, the cgroup's OOM kills, the network namespace's no-route counter), never from output."""
    if result.process_limit:
        return "process limit reached (fork bomb?)"
    if result.memory_limit:
        return "memory limit of the episode reached"
    if result.network_attempts > 0:
        return "network access"
    return None


def submit_function() -> str:
    """The body of the exported ``submit`` bash function: write the arguments (NUL-terminated) to the
    sandbox's submission channel, descriptor ``SUBMIT_FD``, then end the command. No secret in it: the
    channel, not a marker in the output, is what the sandbox reads."""
    return f"() {{ printf '%s\\0' \"$*\" >&{SUBMIT_FD}; exit 0; }}"


class TerminalEnv(Environment):
    """One terminal episode at a time: ``reset(task)``, ``step(text)`` until done, ``verify()``, ``close()``."""

    name = "terminal"

    def __init__(self, config: TerminalConfig | None = None, *, hide_dirs: list[str] | None = None):
        self.config = config or TerminalConfig()
        self.hide_dirs = hide_dirs
        self.session: ShellSession | None = None
        self.task: TerminalTask | None = None
        self.sandbox_uid: int | None = None
        self._reset_state()

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return self.config.max_turns

    def _reset_state(self) -> None:
        self.turn = 0
        self.done = False
        self.answer: str | None = None
        self.end_reason = ""
        self._tree: dict[str, dict] | None = None
        self._verdict: Verdict | None = None
        self._previous_command: str | None = None

    def reset(self, task: TerminalTask | dict) -> Observation:
        """Start an episode on ``task`` (a TerminalTask or its dict): a fresh sandbox with the task's tree."""
        self.close()
        self.task = task if isinstance(task, TerminalTask) else TerminalTask.from_dict(task)
        self._reset_state()
        try:
            self.session = ShellSession(self.task.tree, self.config.limits, hide_dirs=self.hide_dirs,
                                        env={"BASH_FUNC_submit%%": submit_function()})
        except SandboxUnavailableError as exc:
            raise EnvironmentUnavailable(f"the terminal environment needs the sandbox: {exc}") from exc
        self.sandbox_uid = self.session.uid  # kept after the episode: its processes are findable by uid
        demo = ([{**m, "kind": "demonstration"} for m in self.config.demonstration_messages]
                if self.config.demonstration else [])
        return Observation([
            {"role": "system", "content": self.config.system_prompt, "kind": "system"},
            *demo,
            {"role": "user", "content": self.task.instruction, "kind": "instruction"},
        ])

    def step(self, action: str) -> StepResult:
        if self.done or self.session is None:
            raise RuntimeError("step() after the episode ended (or before reset)")
        self.turn += 1
        t0 = time.perf_counter()
        info: dict[str, Any] = {"turn": self.turn}
        command, why = parse_action(action)
        kind = "observation"
        if command is None:
            text, kind = format_error_message(why), "format_error"
            info["format_error"] = why
        else:
            info["command"] = command
            result = self.session.run(command)
            info.update(exit_code=result.exit_code, timed_out=result.timed_out, output_bytes=result.output_bytes,
                        process_limit=result.process_limit, killed_processes=result.killed_processes,
                        memory_limit=result.memory_limit, network_attempts=result.network_attempts,
                        memory_limit_kind=self.session.memory_limit["kind"],
                        memory_limit_bytes=self.session.memory_limit["bytes"], command_seconds=result.seconds)
            if result.error:
                text = f"The environment failed: {result.error}"
                self._finish(error(f"sandbox: {result.error}"))
            else:
                bad = violation(result) if self.config.end_on_violation else None
                text = format_observation(result, limit=self.config.observation_chars,
                                          timeout_s=self.config.limits.command_timeout_s)
                if bad is not None:
                    text += f"\n[episode ended: {bad}]"
                    self._finish(hostile(bad))
                elif result.submitted:
                    answer = sanitize(result.submission).strip()
                    self.answer = answer
                    info["answer"] = answer
                    self._finish(SUBMITTED)
                elif self.config.repeat_notice:
                    text += repeat_notice(command, self._previous_command)
            self._previous_command = command
        if not self.done and self.turn >= self.config.max_turns:
            self._finish(TURN_LIMIT)
        reward = 0.0
        if self.done:
            verdict = self.verify()
            reward = verdict.reward
            info.update(end_reason=self.end_reason, passed=verdict.passed, detail=verdict.detail)
        info["env_seconds"] = time.perf_counter() - t0
        return StepResult(Observation([{"role": "user", "content": text, "kind": kind}]), reward, self.done, info)

    def _finish(self, reason: str) -> None:
        """The episode is over: read the final tree (edit tasks), then end the sandbox."""
        self.done = True
        self.end_reason = reason
        if self.session is not None and self.session.alive and self.task is not None and self.task.kind == "tree":
            try:
                # The files the check reads first: unrelated large files cannot use up their budget.
                needed = [r["path"] for r in self.task.check.get("rules", []) if "file" in r]
                self._tree = self.session.snapshot(first=needed)
            except Exception as exc:  # noqa: BLE001 - the environment failed, not the agent
                self._tree = None
                self.end_reason = error(f"the final tree could not be read: {exc}")
        if self.session is not None:
            self.session.close()
            self.session = None

    def verify(self) -> Verdict:
        """The final verifier. Before the end it reads the state as it is (a probe, for tools and tests)."""
        if self.task is None:
            raise RuntimeError("verify() before reset()")
        if not self.done:
            tree = self.session.snapshot() if self.task.kind == "tree" and self.session is not None else None
            return verify(self.task, self.answer, tree)
        if self._verdict is None:
            kind = end_kind(self.end_reason)
            if kind in ("hostile", "error"):
                self._verdict = Verdict(False, 0.0, self.end_reason)
            else:
                self._verdict = verify(self.task, self.answer, self._tree)
        return self._verdict

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
