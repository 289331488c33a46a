"""The environment interface: ``reset(task)``, ``step(action)``, a turn limit, ``close()`` and ``verify()``.

The shape is the one the field uses (SkyRL-gym's ``BaseTextEnv``, gymnasium's ``Env``): the environment
holds the state of one episode; ``reset`` gives the first observation (the messages that open the
conversation: a system prompt and the task), each ``step`` takes the assistant's text and gives the
observation that follows (messages to append), a reward, whether the episode is over and an info dict;
``verify`` is the final verifier (Terminal-Bench's final-state tests, BFCL's checker, SWE-bench's
FAIL_TO_PASS) and decides the outcome. The step that ends an episode carries the verifier's reward, the
others 0.

An :class:`Episode` is the record of one run (see ``runner.py``): every message the model saw, each
assistant turn's text with the token ids and sampling log-probs it came with, the verdict, the turns
used and why it ended. Plain dataclasses, JSON both ways; this package imports nothing beyond the
standard library here (the sandbox, the policies: torch and transformers at most), so environments run
on a bare GPU machine as training and inference do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Why an episode ended (Episode.end_reason): one of these, or "hostile: <what>" / "error: <what>".
SUBMITTED = "submitted"  # the agent said it was done (answer tasks: with its answer)
TURN_LIMIT = "turn_limit"  # max_turns assistant turns without a submission
HOSTILE = "hostile"  # the agent did something the sandbox stopped and the environment refuses to go on from
ERROR = "error"  # the environment or the policy failed (not the agent's doing)


def hostile(reason: str) -> str:
    return f"{HOSTILE}: {reason}"


def error(reason: str) -> str:
    return f"{ERROR}: {reason}"


def end_kind(end_reason: str) -> str:
    """``submitted``, ``turn_limit``, ``hostile`` or ``error`` (the part before any ``: reason``)."""
    return end_reason.split(":", 1)[0].strip()


class EnvironmentUnavailable(RuntimeError):
    """The environment cannot run on this machine at all (e.g. no sandbox): raised, never recorded as a
    failed episode, so that a broken setup fails loudly instead of scoring every episode 0."""


@dataclass
class Observation:
    """What the environment says: messages to append to the conversation (``role`` and ``content``; a
    ``kind`` key says what each one is: ``system``, ``instruction``, ``observation``, ``format_error``)."""

    messages: list[dict[str, str]]


@dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """The final verifier's outcome: ``passed``, the reward it gives (in [0, 1]) and a short reason."""

    passed: bool
    reward: float
    detail: str = ""


class Environment:
    """Base class of agent environments. Subclasses implement ``reset``, ``step``, ``verify`` and
    ``close``; ``name`` names the family (it becomes the task's ``environment``)."""

    name: str = "env"
    max_turns: int = 8

    def reset(self, task: Any) -> Observation:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, action: str) -> StepResult:  # pragma: no cover - interface
        raise NotImplementedError

    def verify(self) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        pass

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class AssistantTurn:
    """One assistant turn: what the policy sent back and what the environment made of it.

    ``prompt_token_ids`` is the exact templated context the model saw when the policy knows it (None
    otherwise); ``token_ids`` and ``logprobs`` are what it sampled (log-probs aligned one-to-one, None
    where the policy gives none)."""

    index: int
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str = "stop"
    action: str | None = None  # the parsed action (the command), None for a format error
    observation: str = ""  # the environment's reply to this turn ("" on the last turn)
    info: dict[str, Any] = field(default_factory=dict)
    seconds_policy: float = 0.0
    seconds_env: float = 0.0


TOKEN_FIELDS = ("token_ids", "logprobs", "prompt_token_ids")  # an AssistantTurn's token columns


@dataclass
class Episode:
    """One agent episode, start to verdict (JSON both ways: :meth:`to_dict` / :meth:`from_dict`)."""

    environment: str
    task_id: str
    messages: list[dict[str, str]]  # everything in order: system, instruction, assistant, observations
    turns: list[AssistantTurn]
    verdict: Verdict
    end_reason: str
    reward: float
    max_turns: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def turns_used(self) -> int:
        return len(self.turns)

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["turns_used"] = self.turns_used
        return d

    def transcript(self) -> dict[str, Any]:
        """:meth:`to_dict` without the turns' token ids and log-probs: what a table keeps beside the tokens
        it already holds (a rollout's segment, a session's turns); :meth:`from_dict` takes it back, the
        tokens then ``None`` until the caller puts them in."""
        d = self.to_dict()
        for t in d["turns"]:
            for key in TOKEN_FIELDS:
                t.pop(key)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        d = {k: v for k, v in d.items() if k != "turns_used"}
        return cls(**{**d, "verdict": Verdict(**d["verdict"]), "turns": [AssistantTurn(**t) for t in d["turns"]]})
