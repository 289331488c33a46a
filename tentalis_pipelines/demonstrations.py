"""Demonstrations: sequences of actions that solve a training task, verified in its environment.

A demonstration is a review that shows *how*: where a verifier's review says an episode failed and a
hint says what kind of thing to try, a demonstration is the whole sequence of assistant turns that
solves the task, in the policy's own action format (a ```` ```bash ```` block per turn for terminal and
mini-SWE tasks, a Python list of calls for BFCL). The warm-start stage (``stages/warm_start.py``)
trains on them with a supervised loss on the demonstrated turns only.

Demonstrations are rows of their own table, ``demonstrations`` (``schemas.py``), not columns on
``reviews``: a review's grain is one rollout, while a demonstration answers a *task* (an oracle's or a
person's needs no rollout), holds a list of actions and the conversation of the episode that verified
it, and lands per (batch, source). Like every review it has lineage: the batch and task it solves, who
demonstrated it (``source``), the task's fingerprint when it was demonstrated, and the checkpoints that
trained on it name it (``lineage`` rows of kind ``demonstration``).

Three sources, one path: every demonstration is **replayed through the real environment** (the
sandbox for terminal and mini-SWE, BFCL's simulators) by :func:`replay`, and only those that pass the
task's check are kept as verified:

* ``oracle``: the generated task's scripted solution (:func:`oracle_actions`: terminal and mini-SWE
  ``task.solution``, one command per bash block; BFCL ``bfcl.oracle_replies``);
* ``openai:<model>``: a successful episode of a stronger model served by an OpenAI-compatible server
  (``inference/openai_backend.py``), its actions written back in the action format and replayed
  (:func:`model_demonstrations`);
* ``human:<file>``: a person's, imported from a JSONL file (:func:`import_demonstrations`, format in
  docs/training.md): checked line by line, every error naming the file and line, bad lines to
  ``quarantine``.

Held-out tasks never get a demonstration: :func:`~tentalis_pipelines.contamination.held_out_reason`
refuses them wherever a demonstration is made, and the ``demonstrations`` asset's check fails on any
row that names one.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tentalis_pipelines.envs.agents import bash_block
from tentalis_pipelines.envs.base import Episode
from tentalis_pipelines.envs.bfcl import ENVIRONMENT as BFCL
from tentalis_pipelines.envs.runner import is_policy_turn, run_episode
from tentalis_pipelines.envs.swe_tasks import ENVIRONMENT as SWE
from tentalis_pipelines.envs.terminal_tasks import ENVIRONMENT as TERMINAL
from tentalis_pipelines.lakehouse import Lakehouse, now_utc

TABLE = "demonstrations"
ORACLE = "oracle"
STAGE = "demonstrations"  # quarantine.stage of a refused demonstration
MAX_ACTIONS = 64  # an imported demonstration holds at most this many turns
IMPORT_KEYS = {"batch_id", "task_id", "actions"}
IMPORT_OPTIONAL = {"environment", "note"}


class DemonstrationExhausted(RuntimeError):
    """The environment asked for a turn after the demonstration's last action."""


def openai_source(model: str) -> str:
    return f"openai:{model}"


def human_source(path: Path | str) -> str:
    return f"human:{Path(path).name}"


def demonstration_id(batch_id: str, task_id: str, source: str, actions: Sequence[str]) -> str:
    key = json.dumps([batch_id, task_id, source, list(actions)])
    return "demo-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def task_fingerprint(task_row: dict[str, Any]) -> str:
    """What the task is (prompt, check, initial state): ``contamination.task_fingerprint``."""
    from tentalis_pipelines.contamination import task_fingerprint as fingerprint

    return fingerprint(task_row)


# --------------------------------------------------------------------------- actions and replays
def oracle_actions(environment: str, task: Any) -> list[str]:
    """The task's scripted solution as the policy would have written it: terminal and mini-SWE, one bash
    block per command of ``task.solution`` (the last one ``submit``); BFCL, ``oracle_replies``."""
    if environment in (TERMINAL, SWE):
        return [bash_block(c) for c in task.solution]
    if environment == BFCL:
        from tentalis_pipelines.envs.bfcl import oracle_replies

        return oracle_replies(task)
    raise ValueError(f"no oracle for environment {environment!r}; known: {TERMINAL}, {BFCL}, {SWE}")


class Replay:
    """A ``generate(messages)`` that answers with ``actions`` in turn and raises once they run out (so a
    demonstration that stops short fails its episode instead of being padded)."""

    def __init__(self, actions: Sequence[str]):
        self.actions = list(actions)
        self.calls = 0

    def __call__(self, messages: list[dict[str, str]]) -> str:
        if self.calls >= len(self.actions):
            raise DemonstrationExhausted(f"the demonstration has {len(self.actions)} action(s) and the episode asked for more")
        self.calls += 1
        return self.actions[self.calls - 1]


def make_env(environment: str, max_turns: int):
    from tentalis_pipelines import env_batches

    return env_batches.make_env(environment, max_turns)


def task_max_turns(task_row: dict[str, Any]) -> int:
    return int(json.loads(task_row.get("metadata") or "{}").get("max_turns", 8))


def replay(environment: str, task: Any, actions: Sequence[str], *, max_turns: int,
           env_factory: Callable[[str, int], Any] = make_env) -> Episode:
    """The episode of ``actions`` replayed in a fresh environment (the real one: sandbox or simulator)."""
    return run_episode(env_factory(environment, max_turns), task, Replay(actions))


def episode_messages(episode: Episode) -> list[dict[str, str]]:
    """The episode's conversation (role, content, kind): what the warm start trains on."""
    return [{"role": str(m["role"]), "content": str(m["content"]), "kind": str(m.get("kind") or m["role"])}
            for m in episode.messages]


def policy_actions(episode: Episode) -> list[str]:
    """The assistant turns the episode ran (the demonstration as replayed)."""
    return [str(m["content"]) for m in episode.messages if is_policy_turn(m)]


def verdict_detail(episode: Episode) -> str:
    return f"{'passed' if episode.passed else 'failed'} ({episode.end_reason}): {episode.verdict.detail or 'no detail'}"


def demonstration_row(batch_id: str, task_row: dict[str, Any], source: str, episode: Episode, *,
                      source_line: int | None = None, created_at=None) -> dict[str, Any]:
    """The ``demonstrations`` row of a replayed demonstration (verified = the replay passed)."""
    actions = policy_actions(episode)
    return {"demonstration_id": demonstration_id(batch_id, task_row["task_id"], source, actions), "batch_id": batch_id,
            "task_id": task_row["task_id"], "environment": task_row.get("environment") or episode.environment, "source": source,
            "source_line": source_line, "actions": actions, "verified": bool(episode.passed), "verify_detail": verdict_detail(episode),
            "messages": json.dumps(episode_messages(episode)), "task_fingerprint": task_fingerprint(task_row),
            "created_at": created_at or now_utc()}


# --------------------------------------------------------------------------- sources
def _tasks(lake: Lakehouse, batch_id: str) -> list[tuple[dict, Any]]:
    from tentalis_pipelines import env_batches

    return env_batches.load_tasks(lake, batch_id)


def _refuse_held_out(row: dict[str, Any]) -> None:
    from tentalis_pipelines.contamination import held_out_reason

    why = held_out_reason(row)
    if why:
        raise ValueError(f"task {row['task_id']} is held out ({why}): a held-out task never gets a demonstration")


def oracle_demonstrations(lake: Lakehouse, batch_id: str, *, env_factory: Callable[[str, int], Any] = make_env
                          ) -> tuple[list[dict], dict[str, Any]]:
    """One oracle demonstration per task of the batch, replayed in the real environment; only those that
    pass are returned (the summary counts the others and names the first few)."""
    rows, failed = [], []
    created = now_utc()
    for row, task in _tasks(lake, batch_id):
        _refuse_held_out(row)
        ep = replay(row["environment"], task, oracle_actions(row["environment"], task), max_turns=task_max_turns(row),
                    env_factory=env_factory)
        if ep.passed:
            rows.append(demonstration_row(batch_id, row, ORACLE, ep, created_at=created))
        else:
            failed.append(f"{row['task_id']}: {verdict_detail(ep)}")
    return rows, {"source": ORACLE, "verified": len(rows), "failed": len(failed), "failures": "; ".join(failed[:5]) or None}


def backend_policy(backend: Any, *, max_new_tokens: int = 256, temperature: float = 0.0, seed: int = 0) -> Callable:
    """A ``generate(messages) -> text`` on a generation backend (the ``openai`` one): the conversation is
    rendered with the backend's tokenizer's chat template, one sample per turn."""
    from tentalis_pipelines.envs.runner import model_messages
    from tentalis_pipelines.inference.base import SamplingParams

    if getattr(backend, "tokenizer", None) is None:
        raise ValueError("the backend has no tokenizer to render the conversation: give it the model folder (model_dir)")
    calls = {"n": 0}

    def generate(messages: list[dict[str, str]]) -> str:
        prompt = backend.tokenizer.apply_chat_template(model_messages(messages), add_generation_prompt=True, tokenize=False)
        params = SamplingParams(num_generations=1, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + calls["n"], stop=())
        calls["n"] += 1
        return backend.generate([prompt], params)[0][0].text

    return generate


def action_format(environment: str, episode: Episode) -> list[str]:
    """An episode's turns in the action format: terminal and mini-SWE, each turn's command in one bash
    block (what the environment ran, without the words around it); BFCL, the reply as written."""
    if environment == BFCL:
        return [t.text for t in episode.turns]
    return [bash_block(t.action) if t.action is not None else t.text for t in episode.turns]


def model_demonstrations(lake: Lakehouse, batch_id: str, backend: Any, *, attempts: int = 1, max_new_tokens: int = 256,
                         temperature: float = 0.0, env_factory: Callable[[str, int], Any] = make_env
                         ) -> tuple[list[dict], dict[str, Any]]:
    """Episodes of a stronger model (``backend``: an ``OpenAIBackend`` or any backend with ``generate`` and
    a ``tokenizer``) on the batch's tasks, up to ``attempts`` per task; a passing episode's actions, put
    in the action format (:func:`action_format`), are replayed and kept when the replay passes too."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1 (got {attempts})")
    source = openai_source(getattr(backend, "served_model", None) or getattr(backend, "model_name", "model"))
    rows, tried, passed_raw = [], 0, 0
    created = now_utc()
    for row, task in _tasks(lake, batch_id):
        _refuse_held_out(row)
        env = row["environment"]
        for a in range(attempts):
            tried += 1
            ep = run_episode(env_factory(env, task_max_turns(row)), task,
                             backend_policy(backend, max_new_tokens=max_new_tokens, temperature=temperature, seed=1000 * a))
            if not ep.passed:
                continue
            passed_raw += 1
            again = replay(env, task, action_format(env, ep), max_turns=task_max_turns(row), env_factory=env_factory)
            if again.passed:
                rows.append(demonstration_row(batch_id, row, source, again, created_at=created))
                break
    return rows, {"source": source, "episodes": tried, "passed": passed_raw, "verified": len(rows)}


# --------------------------------------------------------------------------- import
def validate_line(rec: Any) -> dict[str, Any]:
    """One imported line's object: ``batch_id``, ``task_id`` (non-empty strings) and ``actions`` (1 to
    :data:`MAX_ACTIONS` non-empty strings); ``environment`` and ``note`` optional; nothing else."""
    if not isinstance(rec, dict):
        raise ValueError(f"a line must be a JSON object, got {type(rec).__name__}")
    unknown = sorted(set(rec) - IMPORT_KEYS - IMPORT_OPTIONAL)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; a line has batch_id, task_id, actions (and optionally environment, note)")
    missing = sorted(IMPORT_KEYS - set(rec))
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    for key in ("batch_id", "task_id"):
        if not isinstance(rec[key], str) or not rec[key].strip():
            raise ValueError(f"{key} must be a non-empty string, got {rec[key]!r}")
    actions = rec["actions"]
    if not isinstance(actions, list) or not actions:
        raise ValueError("actions must be a non-empty list of strings (the assistant turns, in order)")
    if len(actions) > MAX_ACTIONS:
        raise ValueError(f"actions holds {len(actions)} turns; at most {MAX_ACTIONS}")
    for i, a in enumerate(actions):
        if not isinstance(a, str) or not a.strip():
            raise ValueError(f"actions[{i}] must be a non-empty string, got {a!r}")
    return {"batch_id": rec["batch_id"], "task_id": rec["task_id"], "actions": list(actions), "environment": rec.get("environment")}


def read_lines(path: Path) -> list[tuple[int, str, dict | None, str | None]]:
    """(line number, raw text, parsed object or None, error or None) per non-blank line."""
    out = []
    with Path(path).open(encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                out.append((n, raw.rstrip("\n"), json.loads(raw), None))
            except json.JSONDecodeError as exc:
                out.append((n, raw.rstrip("\n"), None, f"not JSON ({exc.msg} at column {exc.colno})"))
    return out


def import_demonstrations(lake: Lakehouse, path: Path | str, *, verify: bool = True,
                          env_factory: Callable[[str, int], Any] = make_env) -> dict[str, Any]:
    """Import a person's demonstrations from a JSONL file (one per line; docs/training.md). Each line is
    validated, its task looked up in ``tasks`` (never a held-out task), and its actions replayed in the
    environment (``verify``); a line that fails any of these goes to ``quarantine`` with an error that
    starts with ``<file>:<line>:``. The good ones land as ``human:<file name>`` demonstrations (importing
    the same file again replaces them). Returns the counts."""
    from tentalis_pipelines import env_batches
    from tentalis_pipelines.contamination import held_out_reason

    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"demonstration file {path} does not exist")
    source = human_source(path)
    tasks: dict[tuple[str, str], dict] = {}
    if lake.exists("tasks"):
        for r in lake.read("tasks").to_pylist():
            tasks[(r["batch_id"], r["task_id"])] = r
    good, bad, seen = [], [], set()
    created = now_utc()
    for line, raw, rec, error in read_lines(path):
        where = f"{path}:{line}"
        try:
            if error:
                raise ValueError(error)
            demo = validate_line(rec)
            why = held_out_reason({"task_id": demo["task_id"], **tasks.get((demo["batch_id"], demo["task_id"]), {})})
            if why:
                raise ValueError(f"task {demo['task_id']} is held out ({why}): a held-out task never gets a demonstration")
            row = tasks.get((demo["batch_id"], demo["task_id"]))
            if row is None:
                raise ValueError(f"unknown task {demo['task_id']!r} in batch {demo['batch_id']!r} (not in tasks): "
                                 "materialise the batch's tasks first")
            if row.get("environment") not in env_batches.environments():
                raise ValueError(f"task {demo['task_id']} is a {row.get('environment')!r} task; demonstrations are for "
                                 f"{', '.join(env_batches.environments())} tasks")
            if demo["environment"] and demo["environment"] != row["environment"]:
                raise ValueError(f"environment {demo['environment']!r} but task {demo['task_id']} is a {row['environment']} task")
            key = (demo["batch_id"], demo["task_id"], json.dumps(demo["actions"]))
            if key in seen:
                raise ValueError(f"the same demonstration of {demo['task_id']} appears twice in this file")
            seen.add(key)
            task = env_batches.task_from_row(row)
            if verify:
                ep = replay(row["environment"], task, demo["actions"], max_turns=task_max_turns(row), env_factory=env_factory)
                if not ep.passed or len(policy_actions(ep)) != len(demo["actions"]):
                    raise ValueError(f"the actions do not solve task {demo['task_id']}: {verdict_detail(ep)}")
                out = demonstration_row(demo["batch_id"], row, source, ep, source_line=line, created_at=created)
            else:
                out = {"demonstration_id": demonstration_id(demo["batch_id"], demo["task_id"], source, demo["actions"]),
                       "batch_id": demo["batch_id"], "task_id": demo["task_id"], "environment": row["environment"], "source": source,
                       "source_line": line, "actions": demo["actions"], "verified": False, "verify_detail": "not replayed (verify off)",
                       "messages": None, "task_fingerprint": task_fingerprint(row), "created_at": created}
        except ValueError as exc:
            bad.append({"source": str(path), "line": line, "raw": raw[:10000], "error": f"{where}: {exc}",
                        "batch_id": (rec or {}).get("batch_id") if isinstance(rec, dict) and isinstance(rec.get("batch_id"), str) else None,
                        "stage": STAGE, "seen_at": created})
            continue
        good.append(out)
    lake.replace_where("quarantine", {"source": str(path), "stage": STAGE}, bad)
    write_demonstrations(lake, good, sources={(b, source) for b in {r["batch_id"] for r in good}})
    return {"imported": len(good), "quarantined": len(bad), "source": source, "errors": [b["error"] for b in bad[:5]]}


# --------------------------------------------------------------------------- the table
def write_demonstrations(lake: Lakehouse, rows: Sequence[dict], *, sources: set[tuple[str, str]] | None = None) -> int:
    """Land ``rows``, replacing each (batch, source)'s earlier rows (``sources``: those pairs to replace
    even when ``rows`` has none of them). Refuses a row of a held-out task."""
    from tentalis_pipelines.contamination import held_out_reason

    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        why = held_out_reason(r)
        if why:
            raise ValueError(f"refused: demonstration {r['demonstration_id']} is of held-out task {r['task_id']} ({why})")
        groups[(r["batch_id"], r["source"])].append(r)
    for key in sources or set():
        groups.setdefault(key, [])
    n = 0
    for (batch_id, source), group in sorted(groups.items()):
        n += lake.replace_where(TABLE, {"batch_id": batch_id, "source": source}, group, partition_by=["batch_id"])
    return n


def read_demonstrations(lake: Lakehouse, *, batches: Sequence[str] | None = None, verified_only: bool = True,
                        version: int | None = None) -> list[dict]:
    """The demonstrations (of ``batches``; verified ones only by default), ordered by id."""
    if not lake.exists(TABLE):
        return []
    rows = lake.read(TABLE, version=version).to_pylist()
    if batches is not None:
        wanted = set(batches)
        rows = [r for r in rows if r["batch_id"] in wanted]
    if verified_only:
        rows = [r for r in rows if r["verified"] and r["messages"]]
    return sorted(rows, key=lambda r: r["demonstration_id"])


def check_demonstrations(lake: Lakehouse, batch_id: str) -> tuple[bool, str, dict[str, int]]:
    """The batch's demonstrations: none of a held-out task, each of a task of the batch, and each verified
    one with the conversation the warm start trains on."""
    from tentalis_pipelines.contamination import held_out_reason

    rows = lake.read(TABLE, batch_id=batch_id).to_pylist() if lake.exists(TABLE) else []
    tasks = set(lake.read("tasks", batch_id=batch_id, columns=["task_id"]).column("task_id").to_pylist()) if lake.exists("tasks") else set()
    held = [f"{r['task_id']} ({why})" for r in rows if (why := held_out_reason(r))]
    orphans = sorted({r["task_id"] for r in rows} - tasks)
    empty = [r["demonstration_id"] for r in rows if r["verified"] and not r["messages"]]
    meta = {"demonstrations": len(rows), "verified": sum(bool(r["verified"]) for r in rows), "held_out": len(held),
            "unknown_tasks": len(orphans), "without_messages": len(empty)}
    if held or orphans or empty:
        return False, (f"{len(held)} of held-out tasks{': ' + ', '.join(held[:3]) if held else ''}; {len(orphans)} of unknown "
                       f"tasks; {len(empty)} verified without a conversation"), meta
    return True, f"{len(rows)} demonstrations, {meta['verified']} verified, none of a held-out task", meta
