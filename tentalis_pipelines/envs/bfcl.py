"""The BFCL tool-calling environment: BFCL's multi-turn tasks on its own pure-Python simulators.

The ``bfcl-eval`` wheel (the optional extra ``bfcl``) ships the multi-turn tasks (``BFCL_v4_multi_turn_base.json``:
200 items, each a list of user turns, an initial configuration of the simulated tools and the ground-truth
calls per turn), the function docs of each tool and the simulators themselves (a file system, messaging,
a trading bot, travel booking, ... in ``eval_checker/multi_turn_eval/func_source_code``), and the
multi-turn checker. This module loads those, runs an episode on fresh simulator instances and scores it
with BFCL's ``multi_turn_checker`` itself (not a re-implementation): after every user turn the simulators'
public state must equal the state the ground-truth calls leave, and every result the ground-truth calls
returned must be among the results of the model's calls so far.

**Action format.** BFCL's own format for prompt-mode (non-function-calling) models: the reply is a Python
list of calls, ``[cd(folder='docs'), touch(file_name='a.txt')]``; the system prompt is BFCL's default one
(``ret_fmt=python``, function docs as JSON, plain text, classic style: :func:`system_prompt`). The embedded
SmolLM2-135M has a plain ChatML template with no tools, so a function-calling format is not available to
it, and this is the format BFCL scores every prompt-mode model in, which keeps the score comparable with
BFCL's leaderboard. As in BFCL's prompting loop, each reply that holds calls is executed and the results
come back as the next message (BFCL's ``format_execution_results_prompting`` shape: a list of
``{'role': 'tool', 'name': call, 'content': result}``, results cut to ``result_chars`` with a visible
``[... N characters truncated ...]`` marker); a reply without calls (an answer in words, ``[]``, or text
that is not a call list) ends the user turn and the next user turn follows; after the last one the
episode ends. A user turn that goes past ``max_steps_per_turn`` replies with calls is force-quit as BFCL
does (BFCL: 20 steps, ``MAXIMUM_STEP_LIMIT``) and the episode fails (BFCL's ``force_terminated``).

**Safe execution.** BFCL's executor ``eval``s the model's text (and its decoder ``eval``s arithmetic and
lambdas in arguments). Here a reply is parsed with :mod:`ast` only (:func:`parse_calls`): a list of calls
whose function is a bare name among the public methods of this task's simulator instances, with keyword
arguments whose values are literals (``ast.literal_eval``: strings, numbers, booleans, None, lists, dicts,
tuples). Anything else (attribute access, ``__import__``, a name that is not a tool, a call or expression
inside an argument, positional arguments: BFCL's decoder drops those, so they are refused with the fix)
is not executed: the reply counts as a turn without calls, with a format note naming what was refused.
Accepted calls are run by looking the method up in that whitelist (``getattr`` of the instance), never
by ``eval``; the checker, which does ``eval``, only ever sees the canonical text re-made from the
validated tree (``name(key=repr(value), ...)``), and the ground truth is validated the same way.

**Verdict.** The decoded calls of every step, grouped by user turn, go to ``multi_turn_checker`` with the
task's ground truth (BFCL's evaluation loop: undecodable or empty steps are dropped; an episode that did
not reach the last user turn is ``force_terminated``). Generated training tasks (``envs/bfcl_tasks.py``)
carry a ground-truth call list per turn too, so they are checked by the same checker.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import inspect
import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
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
)

ENVIRONMENT = "bfcl"
CATEGORY = "multi_turn_base"
DATA_FILE = "BFCL_v4_multi_turn_base.json"
BFCL_STEP_LIMIT = 20  # BFCL's MAXIMUM_STEP_LIMIT (constants/default_prompts.py)
INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23 (the pin of the extra tentalis[bfcl]; --no-deps: its own pins clash with torch's numpy)"
# BFCL's executor refuses these method names before it evals (multi_turn_utils.py); kept refused here too.
REFUSED_NAMES = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
# Task ids end up in Python identifiers inside BFCL's checker (instance names), so only these characters
# (matched whole: ``$`` alone would let a trailing newline through).
ID_RE = re.compile(r"[A-Za-z0-9_]+")


class BfclUnavailable(EnvironmentUnavailable):
    """``bfcl-eval`` is not installed (or its data is missing)."""


# --------------------------------------------------------------------------- the wheel's data
def package_dir() -> Path:
    """The installed ``bfcl_eval`` package folder (found without importing it)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BfclUnavailable(f"the BFCL environment needs the bfcl-eval package: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def data_dir() -> Path:
    path = package_dir() / "data"
    if not (path / DATA_FILE).exists():
        raise BfclUnavailable(f"bfcl-eval is installed but {path / DATA_FILE} is missing; reinstall it ({INSTALL_HINT})")
    return path


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@lru_cache(maxsize=16)
def function_docs(class_name: str) -> tuple[dict, ...]:
    """BFCL's function docs of one simulator class (``data/multi_turn_func_doc``)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    if class_name not in MULTI_TURN_FUNC_DOC_FILE_MAPPING:
        raise ValueError(f"no BFCL simulator class {class_name!r}; known: {', '.join(MULTI_TURN_FUNC_DOC_FILE_MAPPING)}")
    return tuple(_jsonl(data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def system_prompt(functions: list[dict]) -> str:
    """BFCL's default system prompt for prompt-mode models (``formulate_system_prompt`` with
    ``DEFAULT_SYSTEM_PROMPT_FORMAT``: Python call list, JSON function docs, plain text, classic style),
    built from the wheel's own templates (its ``model_handler.utils`` needs tree-sitter, which the
    simulators and the checker do not)."""
    from bfcl_eval.constants import default_prompts as dp

    style = dp.PROMPT_STYLE_TEMPLATES["classic"]
    return dp.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"], task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(output_format=dp.OUTPUT_FORMAT_MAPPING["python"],
                                                          param_types=dp.PARAM_TYPE_MAPPING["python"]),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions=json.dumps(functions, indent=4)))


@dataclass(frozen=True)
class BfclTask:
    """One multi-turn tool-calling task: user ``turns`` (one message each), the simulators'
    ``initial_config`` and ``involved_classes``, and the ground-truth calls per turn (BFCL's shape).
    ``level`` is 0 for BFCL's official items, 1-3 for generated ones (``envs/bfcl_tasks.py``)."""

    task_id: str
    turns: list[str]
    initial_config: dict
    involved_classes: list[str]
    ground_truth: list[list[str]]
    level: int = 0
    family: str = CATEGORY
    split: str = "test"
    seed: int = 0
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not ID_RE.fullmatch(self.task_id):
            raise ValueError(f"BFCL task id {self.task_id!r}: use letters, digits and '_' only "
                             "(BFCL's checker makes Python names from it)")
        if len(self.turns) != len(self.ground_truth):
            raise ValueError(f"task {self.task_id}: {len(self.turns)} user turns but {len(self.ground_truth)} ground-truth turns")

    @property
    def kind(self) -> str:
        return "bfcl"

    @property
    def prompt(self) -> str:
        """The user turns joined: what the contamination guard compares."""
        return "\n".join(self.turns)

    def test_entry(self) -> dict:
        """The task as BFCL's checker takes it (``id``, ``initial_config``, ``involved_classes``)."""
        return {"id": self.task_id, "initial_config": self.initial_config, "involved_classes": list(self.involved_classes)}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BfclTask:
        return cls(**d)

    def task_row(self) -> dict:
        """The task as the ``tasks`` table holds it: prompt = the user turns joined, reference = the ground
        truth (JSON), metadata = level, family, split, turns, initial config and classes (JSON)."""
        meta = {"level": self.level, "family": self.family, "split": self.split, "seed": self.seed, "turns": self.turns,
                "initial_config": self.initial_config, "involved_classes": self.involved_classes, **self.metadata}
        return {"task_id": self.task_id, "environment": ENVIRONMENT, "prompt": self.prompt,
                "reference": json.dumps(self.ground_truth), "metadata": json.dumps(meta, sort_keys=True)}

    @classmethod
    def from_task_row(cls, row: dict) -> BfclTask:
        meta = json.loads(row["metadata"])
        core = ("level", "family", "split", "seed", "turns", "initial_config", "involved_classes")
        return cls(task_id=row["task_id"], turns=list(meta["turns"]), initial_config=dict(meta["initial_config"]),
                   involved_classes=list(meta["involved_classes"]), ground_truth=json.loads(row["reference"]),
                   level=int(meta["level"]), family=meta["family"], split=meta.get("split", "train"),
                   seed=int(meta.get("seed", 0)), metadata={k: v for k, v in meta.items() if k not in core})


def load_official(category: str = CATEGORY) -> list[BfclTask]:
    """BFCL's official items of ``category`` (default ``multi_turn_base``, 200) with their ground truth."""
    if category != CATEGORY:
        raise ValueError(f"only {CATEGORY!r} is supported (got {category!r})")
    root = data_dir()
    questions = _jsonl(root / DATA_FILE)
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(root / "possible_answer" / DATA_FILE)}
    out = []
    for q in questions:
        turns = []
        for turn in q["question"]:
            users = [m["content"] for m in turn if m.get("role") == "user"]
            turns.append("\n".join(users))
        out.append(BfclTask(task_id=q["id"], turns=turns, initial_config=q["initial_config"],
                            involved_classes=list(q["involved_classes"]), ground_truth=answers[q["id"]], level=0,
                            family=CATEGORY, split="test", metadata={"path": q.get("path", [])}))
    return out


# --------------------------------------------------------------------------- simulators
def make_instances(task: BfclTask) -> dict[str, Any]:
    """Fresh simulator instances for ``task`` (class name -> instance), loaded as BFCL's executor loads them."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    out = {}
    for name in task.involved_classes:
        if name not in CLASS_FILE_PATH_MAPPING:
            raise ValueError(f"task {task.task_id}: unknown BFCL class {name!r}")
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(task.initial_config.get(name, {})), long_context=False)
        out[name] = instance
    return out


def method_table(instances: dict[str, Any]) -> dict[str, Any]:
    """Public method name -> bound method, over the instances in order (a later class wins a shared name,
    as in BFCL's executor): the whitelist of callable tools."""
    table = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_") and name not in REFUSED_NAMES:
                table[name] = method
    return table


def tool_names(task: BfclTask) -> frozenset[str]:
    return frozenset(method_table(make_instances(task)))


# --------------------------------------------------------------------------- parsing calls
@dataclass(frozen=True)
class Call:
    name: str
    kwargs: tuple[tuple[str, Any], ...]
    args: tuple[Any, ...] = ()

    def text(self) -> str:
        """The canonical call text (what BFCL's checker evaluates): literals by ``repr``."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"


class CallFormatError(ValueError):
    """A reply (or a ground-truth call) that is not a list of whitelisted calls with literal arguments."""


def _strip(text: str) -> str:
    # BFCL's default_decode_execute_prompting: strip backticks, newlines and spaces, wrap in [ ].
    s = text.strip("`\n ")
    for tag in ("python", "py", "json"):
        if s.startswith(tag + "\n"):
            s = s[len(tag):].strip("`\n ")
    s = s.strip().strip("'")
    if not s.startswith("["):
        s = "[" + s
    if not s.endswith("]"):
        s = s + "]"
    return s


def parse_calls(text: str, allowed: frozenset[str] | set[str], *, positional: bool = False) -> list[Call]:
    """The calls in ``text`` (BFCL's Python-list format), validated with :mod:`ast` only (module doc).
    Raises :class:`CallFormatError` naming what is wrong; ``[]`` gives no calls. ``positional`` allows
    positional literal arguments (the official ground truth uses a few; the model's replies may not)."""
    source = _strip(text)
    if len(source) > 20000:
        raise CallFormatError(f"the reply is {len(source)} characters long; a call list is expected")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise CallFormatError(f"not a Python list of calls ({exc.msg})") from None
    body = tree.body
    elts = body.elts if isinstance(body, ast.List | ast.Tuple) else [body]
    calls = []
    for node in elts:
        if not isinstance(node, ast.Call):
            raise CallFormatError(f"{ast.unparse(node)[:60]!r} is not a function call")
        if not isinstance(node.func, ast.Name):
            raise CallFormatError(f"{ast.unparse(node.func)[:60]!r}: call a tool by its bare name (no attribute access)")
        name = node.func.id
        if name not in allowed:
            raise CallFormatError(f"{name!r} is not one of this task's tools")
        if node.args and not positional:
            raise CallFormatError(f"{name}(...) has positional arguments; write them as name=value")
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise CallFormatError(f"{name}(...): *args is not allowed")
            args.append(_literal(name, a))
        kwargs = []
        for kw in node.keywords:
            if kw.arg is None:
                raise CallFormatError(f"{name}(...): **kwargs is not allowed")
            kwargs.append((kw.arg, _literal(name, kw.value)))
        calls.append(Call(name, tuple(kwargs), tuple(args)))
    return calls


def _literal(name: str, node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CallFormatError(f"{name}(...): argument {ast.unparse(node)[:60]!r} is not a literal value") from None


def result_text(value: Any) -> str:
    """A call's result as BFCL's executor renders it (str as is, dict as JSON, else ``str``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


EXECUTION_ERROR = "Error during execution: "  # BFCL's text for a call that raised


def execute(calls: list[Call], table: dict[str, Any]) -> list[str]:
    """Run validated calls on the instances' whitelisted methods; an exception becomes BFCL's error text."""
    out = []
    for c in calls:
        try:
            out.append(result_text(table[c.name](*c.args, **dict(c.kwargs))))
        except Exception as exc:  # noqa: BLE001 - a tool error is the agent's observation, as in BFCL
            out.append(f"{EXECUTION_ERROR}{exc}")
    return out


def call_failed(result: str) -> bool:
    """Whether a call's result (:func:`execute`'s text) says it failed: it raised, or the simulator
    returned its error dict (``{"error": ...}``, how BFCL's tools refuse a bad argument)."""
    if result.startswith(EXECUTION_ERROR):
        return True
    try:
        value = json.loads(result)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}[... {len(text) - limit:,} characters truncated ...]{text[len(text) - tail:]}"


# --------------------------------------------------------------------------- the checker
def check(task: BfclTask, decoded: list[list[list[str]]]) -> Verdict:
    """BFCL's ``multi_turn_checker`` on ``decoded`` (per user turn, per step, canonical call texts).

    The checker keeps simulator instances in its module's globals under names made of the model name and
    the task id, and reuses them when the name comes again; they are removed after each check (so a second
    check of the same task starts fresh), and a fresh model name per call keeps two checks of one task
    apart even while both run (threads)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if len(decoded) != len(task.ground_truth):
        return Verdict(False, 0.0, f"force_terminated: {len(decoded)} of {len(task.ground_truth)} user turns were reached")
    allowed = tool_names(task)
    try:  # the checker evals the ground truth too: validate it as strictly as a reply
        truth = [[c.text() for gt in turn for c in parse_calls(gt, allowed, positional=True)] for turn in task.ground_truth]
    except CallFormatError as exc:
        return Verdict(False, 0.0, f"error: the task's ground truth is not a valid call list: {exc}")
    model = f"tentalis_{uuid.uuid4().hex}"
    try:
        result = multi_turn_checker(decoded, truth, task.test_entry(), CATEGORY, model)
    except Exception as exc:  # noqa: BLE001 - BFCL's checker asserts on mismatched instances
        return Verdict(False, 0.0, f"checker error: {type(exc).__name__}: {exc}")
    finally:
        g = vars(multi_turn_utils)
        for key in [k for k in g if k.startswith(model)]:
            del g[key]
    if result.get("valid"):
        return Verdict(True, 1.0, "BFCL multi-turn checker: valid")
    return Verdict(False, 0.0, f"{result.get('error_type', 'invalid')}: {str(result.get('error_message', ''))[:300]}")


# --------------------------------------------------------------------------- the environment
@dataclass(frozen=True)
class BfclConfig:
    max_steps_per_turn: int = BFCL_STEP_LIMIT  # replies with calls per user turn before a force-quit
    max_turns: int | None = None  # assistant replies in all; None: (max_steps_per_turn + 1) per user turn
    result_chars: int = 2000  # per call result shown to the model


class BfclEnv(Environment):
    """One BFCL episode at a time: ``reset(task)``, ``step(reply)`` until done, ``verify()`` (module doc)."""

    name = ENVIRONMENT

    def __init__(self, config: BfclConfig | None = None):
        self.config = config or BfclConfig()
        self.task: BfclTask | None = None
        self._reset_state()

    @property
    def max_turns(self) -> int:  # type: ignore[override]
        if self.config.max_turns is not None:
            return self.config.max_turns
        n = len(self.task.turns) if self.task is not None else 1
        return n * (self.config.max_steps_per_turn + 1)

    def _reset_state(self) -> None:
        self.turn = 0
        self.user_turn = 0
        self.steps_in_turn = 0
        self.done = False
        self.end_reason = ""
        self.decoded: list[list[list[str]]] = []
        self.instances: dict[str, Any] = {}
        self.table: dict[str, Any] = {}
        self._verdict: Verdict | None = None

    def reset(self, task: BfclTask | dict) -> Observation:
        self.task = task if isinstance(task, BfclTask) else BfclTask.from_dict(task)
        self._reset_state()
        self.instances = make_instances(self.task)
        self.table = method_table(self.instances)
        functions = [d for c in self.task.involved_classes for d in function_docs(c)]
        self.decoded = [[]]
        return Observation([
            {"role": "system", "content": system_prompt(functions), "kind": "system"},
            {"role": "user", "content": self.task.turns[0], "kind": "instruction"},
        ])

    def step(self, action: str) -> StepResult:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended (or before reset)")
        t0 = time.perf_counter()
        self.turn += 1
        info: dict[str, Any] = {"turn": self.turn, "user_turn": self.user_turn}
        messages: list[dict[str, str]] = []
        try:
            calls = parse_calls(action, frozenset(self.table))
            why = ""
        except CallFormatError as exc:
            calls, why = [], str(exc)
        if calls:
            self.steps_in_turn += 1
            texts = [c.text() for c in calls]
            results = execute(calls, self.table)
            self.decoded[-1].append(texts)
            info["command"] = json.dumps(texts)
            info["calls"] = texts
            info["failed_calls"] = sum(call_failed(r) for r in results)  # the step's deterministic signal
            shown = [{"role": "tool", "name": t, "content": truncate(r, self.config.result_chars)} for t, r in zip(texts, results)]
            messages.append({"role": "user", "content": repr(shown), "kind": "observation"})
            if self.steps_in_turn >= self.config.max_steps_per_turn:
                self._finish(TURN_LIMIT)  # BFCL's force-quit: the episode fails
                info["force_quit"] = True
        else:
            if why:
                info["format_error"] = why
            self.user_turn += 1
            self.steps_in_turn = 0
            if self.user_turn >= len(self.task.turns):
                self._finish(SUBMITTED)
            else:
                self.decoded.append([])
                note = f"[Not executed: {why}.]\n" if why else ""
                messages.append({"role": "user", "content": note + self.task.turns[self.user_turn], "kind": "instruction"})
        if not self.done and self.turn >= self.max_turns:
            self._finish(TURN_LIMIT)
        reward = 0.0
        if self.done:
            verdict = self.verify()
            reward = verdict.reward
            info.update(end_reason=self.end_reason, passed=verdict.passed, detail=verdict.detail)
            messages = messages or [{"role": "user", "content": "[episode over]", "kind": "observation"}]
        info["env_seconds"] = time.perf_counter() - t0
        return StepResult(Observation(messages), reward, self.done, info)

    def _finish(self, reason: str) -> None:
        self.done = True
        self.end_reason = reason

    def verify(self) -> Verdict:
        """BFCL's checker on the calls so far (before the end: a probe; a run that stopped early is
        ``force_terminated``, as in BFCL's evaluation)."""
        if self.task is None:
            raise RuntimeError("verify() before reset()")
        if self.done and self._verdict is not None:
            return self._verdict
        kind = end_kind(self.end_reason) if self.done else ""
        if kind in ("hostile", "error"):
            verdict = Verdict(False, 0.0, self.end_reason)
        elif self.done and kind == "turn_limit":
            verdict = Verdict(False, 0.0, f"force_terminated: the step limit was reached in user turn {self.user_turn + 1} "
                                          f"of {len(self.task.turns)}")
        else:
            verdict = check(self.task, [list(t) for t in self.decoded])
        if self.done:
            self._verdict = verdict
        return verdict

    def close(self) -> None:
        self.instances = {}
        self.table = {}


def keyword_reply(calls: list[str], task: BfclTask) -> str:
    """A reply in the model's format that makes the given ground-truth calls: positional arguments
    bound to their parameter names (the oracle agent; tests)."""
    table = method_table(make_instances(task))
    out = []
    for text in calls:
        for c in parse_calls(text, frozenset(table), positional=True):
            bound = inspect.signature(table[c.name]).bind_partial(*c.args, **dict(c.kwargs))
            out.append(Call(c.name, tuple(bound.arguments.items())).text())
    return "[" + ", ".join(out) + "]"


def oracle_replies(task: BfclTask) -> list[str]:
    """The replies of an agent that knows the ground truth: per user turn its calls in one reply (none
    when the turn has no ground truth), then a reply without calls that ends the turn."""
    replies = []
    for turn in task.ground_truth:
        if turn:
            replies.append(keyword_reply(turn, task))
        replies.append("Done.")
    return replies
