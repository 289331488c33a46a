"""Task batches: the unit of work of the pipeline (one Dagster dynamic partition each).

A batch is registered once, with an immutable snapshot of its input under ``$TENTALIS_HOME/batches``:
either a copy of an inbox file or the parameters of a seeded generator. Re-running a batch therefore
reads exactly what its first run read, even if the inbox file has since changed or gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tentalis_pipelines.envs import bfcl_tasks, swe_tasks, terminal_tasks
from tentalis_pipelines.envs.bfcl import BfclTask
from tentalis_pipelines.lakehouse import validate_batch_id
from tentalis_pipelines.tasks.arithmetic import arithmetic_task_rows, generate_arithmetic
from tentalis_pipelines.tasks.families import (
    Recipe,
    TaskFamily,
    get_family,
    installed_environment_families,
    manifest_recipe,
)
from tentalis_pipelines.tasks.families.terminal import (  # noqa: F401 - re-exported: the terminal recipe's constants
    DEFAULT_TERMINAL_MAX_TURNS,
    LEVEL0_MAX_TURNS,
    TERMINAL_TEMPERATURE,
    terminal_max_turns,
)
from tentalis_pipelines.tasks.jsonl import LoadedTasks, load_jsonl_tasks


class BatchNotRegistered(LookupError):
    pass


@dataclass(frozen=True)
class InboxFile:
    path: Path
    batch_id: str


@dataclass(frozen=True)
class RefusedEntry:
    """An inbox entry that is not taken, and why (its content is never read)."""

    path: Path
    reason: str


# A file becomes a batch only once it has not changed for this long, so a file still being written is
# not taken half-way (writers that rename a finished `.part` or dot-file into place are never at risk).
DEFAULT_SETTLE_SECONDS = 10.0
MAX_INBOX_FILE_BYTES = 256 * 1024 * 1024


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:80] or "batch"


def read_inbox_file(path: Path) -> bytes:
    """The bytes of a regular inbox file, refusing symlinks, FIFOs, devices and oversized files.

    ``O_NOFOLLOW`` makes the open fail on a symlink (so nothing outside the inbox is ever read) and
    ``O_NONBLOCK`` keeps a FIFO from blocking the caller; the type is checked on the open descriptor.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if st.st_size > MAX_INBOX_FILE_BYTES:
            raise OSError(f"{path.name} is {st.st_size:,} bytes (limit {MAX_INBOX_FILE_BYTES:,})")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def inbox_batch_id(path: Path, data: bytes | None = None) -> str:
    """Stable id for an inbox file: its name plus a hash of its bytes (same file, same batch)."""
    digest = hashlib.sha256(read_inbox_file(path) if data is None else data).hexdigest()[:10]
    return f"{_slug(path.stem)}-{digest}"


def scan_inbox(inbox: Path, *, settle_seconds: float = DEFAULT_SETTLE_SECONDS, now: float | None = None,
               refused: list[RefusedEntry] | None = None) -> list[InboxFile]:
    """The settled ``*.jsonl`` files in the inbox, oldest first.

    Skipped, never read: dot-files and other names (``x.jsonl.part`` while being written), and files
    changed in the last ``settle_seconds``. Refused, and appended to ``refused`` with the reason, each on
    its own so that one bad entry never blocks the others: symlinks (never followed out of the inbox),
    FIFOs, sockets, devices, folders named ``*.jsonl``, unreadable and oversized files.
    """
    if not inbox.exists():
        return []
    now = time.time() if now is None else now
    found: list[tuple[float, str, InboxFile]] = []
    with os.scandir(inbox) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".jsonl"):
                continue
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise OSError("a symlink (refused: inbox files are never followed outside the inbox)")
                if not stat.S_ISREG(st.st_mode):
                    raise OSError("not a regular file")
                if now - st.st_mtime < settle_seconds:
                    continue  # still being written, or just finished: next tick
                data = read_inbox_file(path)
            except OSError as exc:
                if refused is not None:
                    refused.append(RefusedEntry(path, exc.strerror or str(exc)))
                continue
            found.append((st.st_mtime, entry.name, InboxFile(path, inbox_batch_id(path, data))))
    return [f for _, _, f in sorted(found, key=lambda t: (t[0], t[1]))]


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def family_recipe(family: str, levels: tuple[int, ...] = (), recipe: Recipe | None = None, **overrides: Any) -> Recipe:
    """The recipe a new batch of ``family`` is written with: ``recipe`` when given, else the family's for
    ``levels``; then every override that is set (``max_turns=None`` keeps the family's)."""
    return (recipe or get_family(family).recipe(tuple(levels))).with_overrides(**overrides)


def _same_batch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two manifests describe the same batch: the same parameters and the same recipe (a manifest
    written before recipes were recorded is compared by the recipe it falls back to)."""
    def params(m):
        return {k: v for k, v in m.items() if k not in ("recipe", "family", "max_turns")}

    return params(a) == params(b) and manifest_recipe(a) == manifest_recipe(b)


def _store_manifest(folder: Path, batch_id: str, manifest: dict[str, Any]) -> None:
    """Write a seeded batch's manifest once; the same batch registered again must have the same parameters."""
    path = folder / "manifest.json"
    if path.exists():
        existing = json.loads(path.read_text())
        if not _same_batch(existing, manifest):
            raise ValueError(f"batch {batch_id!r} is already registered with other parameters: {existing}")
    else:
        _atomic_write(path, json.dumps(manifest))


def register_file_batch(batches_dir: Path, path: Path, batch_id: str | None = None, *, family: str = "jsonl",
                        recipe: Recipe | None = None) -> str:
    """Snapshot a JSONL task file as a batch. Idempotent for the same batch id.

    The snapshot is the bytes the batch id was hashed from (read with :func:`read_inbox_file`, so a
    symlink or special file is refused), not a second read that could see a newer version. A terminal
    task file (lines with an ``instruction``, ``tasks/terminal_file.py``) dropped into the inbox is a
    ``terminal`` family batch of all its training lines, with the terminal recipe for their levels.
    """
    from tentalis_pipelines.tasks.terminal_file import is_terminal_task_file, read_terminal_file

    data = read_inbox_file(path)
    batch_id = validate_batch_id(batch_id or inbox_batch_id(path, data))
    if batch_id != inbox_batch_id(path, data):
        raise ValueError(f"{path} changed since it was scanned; it will be taken on a later tick")
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "manifest.json").exists():
        tmp = folder / ".tasks.jsonl.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, folder / "tasks.jsonl")
        levels: tuple[int, ...] = ()
        if family == "jsonl" and is_terminal_task_file(folder / "tasks.jsonl"):
            family = TERMINAL_MANIFEST
            levels = tuple(sorted({t.level for t in read_terminal_file(folder / "tasks.jsonl").train}))
        manifest = {"kind": "jsonl", "family": family, "source": str(path), "file": "tasks.jsonl",
                    "recipe": family_recipe(family, levels, recipe=recipe).to_json()}
        if levels:
            manifest["levels"] = list(levels)
        _atomic_write(folder / "manifest.json", json.dumps(manifest))
    return batch_id


def generated_batch_id(seed: int, num_tasks: int, levels: tuple[int, ...]) -> str:
    return f"arith-s{seed}-n{num_tasks}-l{''.join(map(str, levels))}"


def register_generated_batch(
    batches_dir: Path, *, seed: int, num_tasks: int, levels: tuple[int, ...] = (1, 2), batch_id: str | None = None,
    recipe: Recipe | None = None,
) -> str:
    """Record the parameters of a seeded arithmetic batch. Idempotent for the same batch id.

    Seeds at or above :data:`HELD_OUT_SEED_BASE` are refused: they generate the held-out gate set, and
    training on them would leak the gate's items into the policy.
    """
    check_training_seed(seed)
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    batch_id = validate_batch_id(batch_id or generated_batch_id(seed, num_tasks, levels))
    generate_arithmetic(1, seed=seed, levels=levels)  # validate the parameters now, not at run time
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": "arithmetic", "family": "arithmetic", "seed": seed, "num_tasks": num_tasks, "levels": list(levels),
                "recipe": family_recipe("arithmetic", tuple(levels), recipe).to_json()}
    _store_manifest(folder, batch_id, manifest)
    return batch_id


# Seeds at or above this are reserved for held-out evaluation sets; training batches never use them.
HELD_OUT_SEED_BASE = 1_000_000


class ReservedSeedError(ValueError):
    """A training batch asked for a seed of the held-out evaluation range."""


def check_training_seed(seed: int) -> int:
    """``seed`` if a training batch may use it; else a clear error naming the reserved range."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer (got {seed!r})")
    if seed >= HELD_OUT_SEED_BASE:
        raise ReservedSeedError(
            f"seed {seed} is reserved: seeds >= {HELD_OUT_SEED_BASE:,} generate the held-out evaluation "
            f"sets, so training on them would leak the gate's items; use a seed below {HELD_OUT_SEED_BASE:,}"
        )
    return seed


def register_nightly_batch(batches_dir: Path, day: str, *, num_tasks: int, levels: tuple[int, ...]) -> str:
    """The nightly cycle's batch for ``day`` (``YYYYMMDD``): registered once with the next unused training
    seed, and the same batch returned when that night is evaluated again."""
    batch_id = validate_batch_id(f"nightly-{day}")
    path = batches_dir / batch_id / "manifest.json"
    if path.exists():
        return batch_id
    return register_generated_batch(batches_dir, seed=next_generator_seed(batches_dir), num_tasks=num_tasks, levels=levels,
                                    batch_id=batch_id)


def next_generator_seed(batches_dir: Path) -> int:
    """The smallest training seed above every seed already used by a registered generated batch."""
    return max(_generated_batches(batches_dir), default=0) + 1


def _generated_batches(batches_dir: Path) -> dict[int, list[str]]:
    """``{training seed: ids of the registered generated batches with that seed}``."""
    seeds: dict[int, list[str]] = {}
    for manifest in Path(batches_dir).glob("*/manifest.json"):
        m = json.loads(manifest.read_text())
        if m.get("kind") == "arithmetic" and m["seed"] < HELD_OUT_SEED_BASE:
            seeds.setdefault(m["seed"], []).append(manifest.parent.name)
    return seeds


def interrupted_cycle_batch(batches_dir: Path, *, task_source: str, num_tasks: int, levels: tuple[int, ...] | None,
                            settled: Collection[str], shuffle_seed: int = 0) -> str | None:
    """The batch that a cycle of this shape registered last and left unfinished, or None.

    A cycle registers the next batch of its source (the next seed, or the next slice of a dataset's
    order) and then writes its trajectories. Killed in between (rollouts half done), it leaves a
    registered batch with no trajectories; without this, the next cycle would register the batch after
    it, so a run killed and resumed trains on other tasks in its later cycles than the same run never
    killed. ``settled`` is every batch that has trajectories or a checkpoint trained on it; only the
    newest batch of the sequence qualifies (an older gap is not a cycle in progress), and for
    arithmetic only one a cycle registered (``arith-s…``; a nightly batch is the schedule's). ``levels``
    None: a terminal curriculum cycle, whose batch's levels the curriculum chose (``tasks/curriculum.py``).
    """
    newest: str | None = None
    if task_source == "arithmetic":
        seeds = _generated_batches(batches_dir)
        if seeds:
            top = max(seeds)
            if seeds[top] == [generated_batch_id(top, num_tasks, tuple(levels))]:
                newest = seeds[top][0]
    elif task_source == "terminal":
        seeds = terminal_batch_seeds(batches_dir)
        if seeds:
            top = max(seeds)
            if levels is None:  # a curriculum cycle: its levels were chosen, so any of this size the curriculum chose
                (only,) = seeds[top] if len(seeds[top]) == 1 else (None,)
                if only is not None and only.startswith(f"terminal-s{top}-n{num_tasks}-") and "curriculum" in batch_manifest(batches_dir, only):
                    newest = only
            elif seeds[top] == [terminal_batch_id(top, num_tasks, tuple(levels))]:
                newest = seeds[top][0]
    elif task_source == "bfcl":
        seeds = bfcl_batch_seeds(batches_dir)
        if seeds:
            top = max(seeds)
            if seeds[top] == [bfcl_batch_id(top, num_tasks, tuple(levels))]:
                newest = seeds[top][0]
    elif task_source == "swe":
        seeds = swe_batch_seeds(batches_dir)
        if seeds:
            top = max(seeds)
            if seeds[top] == [swe_batch_id(top, num_tasks, tuple(levels))]:
                newest = seeds[top][0]
    elif task_source in installed_environment_families():  # an installed family: its seeds, as terminal's
        seeds = family_batch_seeds(batches_dir, task_source)
        if seeds:
            top = max(seeds)
            if seeds[top] == [family_batch_id(task_source, top, num_tasks, tuple(levels or ()))]:
                newest = seeds[top][0]
    elif is_task_file_source(task_source):  # a terminal task file: its slices, as a dataset's
        done = terminal_file_batches(batches_dir, Path(task_source), num_tasks)
        newest = done[-1] if done else None
    else:
        done = _dataset_batches(batches_dir, task_source, num_tasks, shuffle_seed)
        newest = done[-1] if done else None
    return newest if newest is not None and newest not in settled else None


def batch_manifest(batches_dir: Path, batch_id: str) -> dict[str, Any]:
    path = batches_dir / validate_batch_id(batch_id) / "manifest.json"
    if not path.exists():
        raise BatchNotRegistered(
            f"task batch {batch_id!r} is not registered under {batches_dir}: drop a .jsonl file into the "
            "inbox (the task_inbox sensor registers it) or run `tentalis run`"
        )
    return json.loads(path.read_text())


def load_batch(batches_dir: Path, batch_id: str, created_at: datetime, **jsonl_options: Any) -> LoadedTasks:
    """The task rows (and quarantined lines) of a registered batch (``jsonl_options``: see ``load_jsonl_tasks``)."""
    manifest = batch_manifest(batches_dir, batch_id)
    if manifest["kind"] == "jsonl" and manifest.get("family") == TERMINAL_MANIFEST:
        return load_terminal_file_batch(batches_dir, batch_id, manifest, created_at)
    if manifest["kind"] == "jsonl":
        return load_jsonl_tasks(batches_dir / batch_id / manifest["file"], batch_id, created_at, source=manifest["source"],
                                **jsonl_options)
    if manifest["kind"] == "arithmetic":
        tasks = generate_arithmetic(manifest["num_tasks"], seed=manifest["seed"], levels=tuple(manifest["levels"]))
        return LoadedTasks(tasks=arithmetic_task_rows(batch_id, tasks, created_at))
    if manifest["kind"] == TERMINAL_MANIFEST:
        tasks = terminal_training_tasks(manifest["seed"], manifest["num_tasks"], tuple(manifest["levels"]),
                                        tuple(manifest.get("exclude_families", ())))
        return LoadedTasks(tasks=terminal_task_rows(batch_id, tasks, created_at, max_turns=int(manifest_recipe(manifest).max_turns)))
    if manifest["kind"] == BFCL_MANIFEST:
        bfcl = bfcl_training_tasks(manifest["seed"], manifest["num_tasks"], tuple(manifest["levels"]))
        return LoadedTasks(tasks=bfcl_task_rows(batch_id, bfcl, created_at, max_turns=int(manifest_recipe(manifest).max_turns)))
    if manifest["kind"] == SWE_MANIFEST:
        swe = swe_tasks.training_tasks(manifest["seed"], manifest["num_tasks"], tuple(manifest["levels"]))
        return LoadedTasks(tasks=swe_task_rows(batch_id, swe, created_at, max_turns=int(manifest_recipe(manifest).max_turns)))
    if manifest["kind"] == FAMILY_MANIFEST:
        return load_family_batch(batch_id, manifest, created_at)
    raise ValueError(f"batch {batch_id!r} has an unknown manifest kind {manifest['kind']!r}")


# --------------------------------------------------------------------------- terminal (agent) batches
TERMINAL_MANIFEST = "terminal"
TERMINAL_SOURCE = "generator:terminal"
# The terminal benchmark's held-out split: the first ``DEFAULT_TEST_PER_LEVEL`` tasks of each level of
# this generator seed (``terminal_tasks.generate_tasks``). Training batches never hold one of them.
TERMINAL_HELD_OUT_SEED = 0
def terminal_held_out_tasks(levels: tuple[int, ...] = terminal_tasks.ALL_LEVELS) -> list[terminal_tasks.TerminalTask]:
    """The terminal benchmark's items: the held-out split of :data:`TERMINAL_HELD_OUT_SEED`, every level
    (level 0 included: it is the level a learning run on the embedded model is gated on)."""
    per_level = terminal_tasks.DEFAULT_TEST_PER_LEVEL
    return terminal_tasks.generate_tasks(per_level, seed=TERMINAL_HELD_OUT_SEED, levels=tuple(levels))


def terminal_fingerprint(task: terminal_tasks.TerminalTask) -> str:
    """What makes two terminal tasks the same task (instruction, initial tree, check), ids aside."""
    body = json.dumps([task.instruction, task.tree, task.check], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def check_excluded_families(levels: tuple[int, ...], exclude_families: tuple[str, ...]) -> tuple[str, ...]:
    """``exclude_families`` sorted and deduplicated if every name is a task kind of one of ``levels`` and
    no level is left without a kind; else a clear error naming the kinds there are."""
    if not exclude_families:
        return ()
    kinds = {fam for lv in levels for fam in terminal_tasks.FAMILIES.get(lv, {})}
    unknown = sorted(set(exclude_families) - kinds)
    if unknown:
        raise ValueError(f"--hold-out-kind {', '.join(unknown)}: not a task kind of levels {list(levels)}; "
                         f"kinds: {', '.join(sorted(kinds))}")
    for lv in levels:
        if lv in terminal_tasks.FAMILIES and set(terminal_tasks.FAMILIES[lv]) <= set(exclude_families):
            raise ValueError(f"--hold-out-kind leaves level {lv} no task kind to train on; hold out fewer kinds")
    return tuple(sorted(set(exclude_families)))


def terminal_training_tasks(seed: int, num_tasks: int, levels: tuple[int, ...],
                            exclude_families: tuple[str, ...] = ()) -> list[terminal_tasks.TerminalTask]:
    """``num_tasks`` training tasks of generator seed ``seed``, levels in turn: task ``k`` of a level is
    that level's training-split task ``DEFAULT_TEST_PER_LEVEL + k`` (never one of the first
    ``DEFAULT_TEST_PER_LEVEL``, the held-out split), skipping any that equals a held-out task of the
    benchmark (same instruction, tree and check), so no benchmark item is ever trained on, and any of
    a kind in ``exclude_families`` (a kind held out whole, to measure transfer to a kind never seen)."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    bad = [lv for lv in levels if lv not in terminal_tasks.ALL_LEVELS]
    if bad or not levels:
        raise ValueError(f"terminal levels must be a non-empty subset of {list(terminal_tasks.ALL_LEVELS)}, got {list(levels)}")
    excluded = set(check_excluded_families(tuple(levels), tuple(exclude_families)))
    held_out = {terminal_fingerprint(t) for t in terminal_held_out_tasks()}
    start = terminal_tasks.DEFAULT_TEST_PER_LEVEL
    next_index = dict.fromkeys(levels, start)
    out = []
    for i in range(num_tasks):
        level = levels[i % len(levels)]
        while True:
            task = terminal_tasks.make_task(level, next_index[level], seed=seed)
            next_index[level] += 1
            if task.split == "train" and task.family not in excluded and terminal_fingerprint(task) not in held_out:
                break
        out.append(task)
    return out


# Held-out sets beside the benchmark's split, from reserved seeds (no training batch can use them):
# one kind alone (a kind a run held out of training: ``--hold-out-kind``), and the paraphrased wording.
TERMINAL_KIND_SEED = HELD_OUT_SEED_BASE + 7_100
TERMINAL_PARAPHRASE_SEED = HELD_OUT_SEED_BASE + 7_200


def terminal_kind_held_out_tasks(level: int, family: str, n: int = terminal_tasks.DEFAULT_TEST_PER_LEVEL) -> list[terminal_tasks.TerminalTask]:
    """``n`` held-out tasks of one kind of ``level`` (a reserved seed: never in a training batch)."""
    return [terminal_tasks.make_task(level, i, seed=TERMINAL_KIND_SEED, family=family, test_per_level=n) for i in range(n)]


def terminal_paraphrased_tasks(level: int, n: int = terminal_tasks.DEFAULT_TEST_PER_LEVEL) -> list[terminal_tasks.TerminalTask]:
    """``n`` held-out tasks of ``level`` in other words (``wording="paraphrased"``; kinds in turn)."""
    return [terminal_tasks.make_task(level, i, seed=TERMINAL_PARAPHRASE_SEED, wording="paraphrased", test_per_level=n)
            for i in range(n)]


def terminal_evaluation_tasks() -> list[terminal_tasks.TerminalTask]:
    """Every terminal task a benchmark evaluates on: the levels' held-out split, each kind's set and the
    paraphrased sets (what the contamination guard screens training tasks and demonstrations against)."""
    kinds = [t for lv, fams in terminal_tasks.FAMILIES.items() for fam in fams for t in terminal_kind_held_out_tasks(lv, fam)]
    return [*terminal_held_out_tasks(), *kinds, *(t for lv in terminal_tasks.PARAPHRASED for t in terminal_paraphrased_tasks(lv))]


def terminal_task_rows(batch_id: str, tasks: list[terminal_tasks.TerminalTask], created_at,
                       max_turns: int = DEFAULT_TERMINAL_MAX_TURNS) -> list[dict]:
    """The ``tasks`` rows of terminal tasks (``TerminalTask.task_row``; the turn limit in the metadata)."""
    rows = []
    for t in tasks:
        row = t.task_row()
        meta = {**json.loads(row["metadata"]), "max_turns": int(max_turns)}
        rows.append({**row, "batch_id": batch_id, "source": TERMINAL_SOURCE, "difficulty": t.level,
                     "metadata": json.dumps(meta, sort_keys=True), "created_at": created_at})
    return rows


def terminal_batch_id(seed: int, num_tasks: int, levels: tuple[int, ...]) -> str:
    return f"terminal-s{seed}-n{num_tasks}-l{''.join(map(str, levels))}"


def register_terminal_batch(batches_dir: Path, *, seed: int, num_tasks: int, levels: tuple[int, ...] = (1,),
                            max_turns: int | None = None, batch_id: str | None = None, recipe: Recipe | None = None,
                            curriculum: dict[str, Any] | None = None, exclude_families: tuple[str, ...] = ()) -> str:
    """Record the parameters of a seeded terminal batch (agent episodes in the sandbox; the batch kind
    ``EnvironmentBatch``). Idempotent for the same batch id. Its tasks are the generator's training
    split only (:func:`terminal_training_tasks`), without the kinds in ``exclude_families``."""
    check_training_seed(seed)
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be at least 1 (got {max_turns})")
    excluded = check_excluded_families(tuple(levels), tuple(exclude_families))
    terminal_training_tasks(seed, 1, tuple(levels), excluded)  # validate the parameters now, not at run time
    chosen = family_recipe("terminal", tuple(levels), recipe, max_turns=max_turns)  # the family's, max_turns as given
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    default_id = terminal_batch_id(seed, num_tasks, tuple(levels)) + (f"-x{len(excluded)}" if excluded else "")
    batch_id = validate_batch_id(batch_id or default_id)
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": TERMINAL_MANIFEST, "family": "terminal", "source": "terminal", "seed": seed, "num_tasks": num_tasks, "levels": list(levels),
                "recipe": chosen.to_json()}
    if curriculum:  # why these levels: the curriculum's choice and the success figures it used
        manifest["curriculum"] = curriculum
    if excluded:  # the kinds held out of training (evaluated on terminal-l<N>-<kind>)
        manifest["exclude_families"] = list(excluded)
    _store_manifest(folder, batch_id, manifest)
    return batch_id


def manifest_seeds(batches_dir: Path, kind: str) -> dict[int, list[str]]:
    """``{seed: ids of the registered batches of manifest ``kind`` with that seed}`` (an environment's batches)."""
    seeds: dict[int, list[str]] = {}
    for manifest in Path(batches_dir).glob("*/manifest.json"):
        m = json.loads(manifest.read_text())
        if m.get("kind") == kind:
            seeds.setdefault(int(m["seed"]), []).append(manifest.parent.name)
    return seeds


def next_manifest_seed(batches_dir: Path, kind: str) -> int:
    """The smallest seed above every seed of a registered batch of manifest ``kind`` (1 for the first)."""
    return max(manifest_seeds(batches_dir, kind), default=0) + 1


def terminal_batch_seeds(batches_dir: Path) -> dict[int, list[str]]:
    return manifest_seeds(batches_dir, TERMINAL_MANIFEST)


def next_terminal_seed(batches_dir: Path) -> int:
    return next_manifest_seed(batches_dir, TERMINAL_MANIFEST)


# --------------------------------------------------------------------------- BFCL (tool-calling) batches
BFCL_MANIFEST = "bfcl"
BFCL_SOURCE = "generator:bfcl"
# The generated BFCL tasks' held-out split (the first DEFAULT_TEST_PER_LEVEL of each level of this seed).
# The `bfcl` benchmark itself is BFCL's official multi_turn_base, kept out by the contamination guard.
BFCL_HELD_OUT_SEED = 0
DEFAULT_BFCL_STEPS = 4  # replies with calls per user turn (BFCL's own limit, 20, is for the benchmark)


def bfcl_held_out_tasks(levels: tuple[int, ...] = bfcl_tasks.LEVELS) -> list[BfclTask]:
    """The generated held-out split of :data:`BFCL_HELD_OUT_SEED` (never in a training batch)."""
    return bfcl_tasks.generate_tasks(bfcl_tasks.DEFAULT_TEST_PER_LEVEL, seed=BFCL_HELD_OUT_SEED, levels=tuple(levels))


def bfcl_fingerprint(task: BfclTask) -> str:
    """What makes two BFCL tasks the same task (turns, initial state, ground truth), ids aside."""
    body = json.dumps([task.turns, task.initial_config, task.ground_truth], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def bfcl_training_tasks(seed: int, num_tasks: int, levels: tuple[int, ...]) -> list[BfclTask]:
    """``num_tasks`` generated BFCL training tasks of generator seed ``seed``, levels in turn, from each
    level's training split (index ``DEFAULT_TEST_PER_LEVEL`` on), skipping any equal to a held-out one."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    bad = [lv for lv in levels if lv not in bfcl_tasks.LEVELS]
    if bad or not levels:
        raise ValueError(f"bfcl levels must be a non-empty subset of {list(bfcl_tasks.LEVELS)}, got {list(levels)}")
    held_out = {bfcl_fingerprint(t) for t in bfcl_held_out_tasks()}
    next_index = dict.fromkeys(levels, bfcl_tasks.DEFAULT_TEST_PER_LEVEL)
    out = []
    for i in range(num_tasks):
        level = levels[i % len(levels)]
        while True:
            task = bfcl_tasks.make_task(level, next_index[level], seed=seed)
            next_index[level] += 1
            if task.split == "train" and bfcl_fingerprint(task) not in held_out:
                break
        out.append(task)
    return out


def bfcl_task_rows(batch_id: str, tasks: list[BfclTask], created_at, max_turns: int = DEFAULT_BFCL_STEPS) -> list[dict]:
    """The ``tasks`` rows of BFCL tasks (``BfclTask.task_row``; the step limit per user turn in the
    metadata as ``max_turns``)."""
    rows = []
    for t in tasks:
        row = t.task_row()
        meta = {**json.loads(row["metadata"]), "max_turns": int(max_turns)}
        rows.append({**row, "batch_id": batch_id, "source": BFCL_SOURCE, "difficulty": t.level,
                     "metadata": json.dumps(meta, sort_keys=True), "created_at": created_at})
    return rows


def bfcl_batch_id(seed: int, num_tasks: int, levels: tuple[int, ...]) -> str:
    return f"bfcl-s{seed}-n{num_tasks}-l{''.join(map(str, levels))}"


def register_bfcl_batch(batches_dir: Path, *, seed: int, num_tasks: int, levels: tuple[int, ...] = (1,),
                        max_turns: int | None = None, batch_id: str | None = None, recipe: Recipe | None = None) -> str:
    """Record a seeded BFCL batch (tool-calling episodes on BFCL's simulators; the batch kind
    ``EnvironmentBatch``). Idempotent for the same batch id. Its tasks are the generator's training split
    only (:func:`bfcl_training_tasks`); ``max_turns`` is the step limit per user turn."""
    check_training_seed(seed)
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be at least 1 (got {max_turns})")
    bfcl_training_tasks(seed, 1, tuple(levels))  # validate the parameters now, not at run time
    chosen = family_recipe("bfcl", tuple(levels), recipe, max_turns=max_turns)  # the family's, max_turns as given
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    batch_id = validate_batch_id(batch_id or bfcl_batch_id(seed, num_tasks, tuple(levels)))
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": BFCL_MANIFEST, "family": "bfcl", "source": "bfcl", "seed": seed, "num_tasks": num_tasks, "levels": list(levels),
                "recipe": chosen.to_json()}
    _store_manifest(folder, batch_id, manifest)
    return batch_id


def bfcl_batch_seeds(batches_dir: Path) -> dict[int, list[str]]:
    return manifest_seeds(batches_dir, BFCL_MANIFEST)


def next_bfcl_seed(batches_dir: Path) -> int:
    return next_manifest_seed(batches_dir, BFCL_MANIFEST)


# --------------------------------------------------------------------------- dataset slices
DATASET_TRAIN_FILES = {"gsm8k": "gsm8k/train.jsonl"}
# The tail of a dataset's shuffled training order is never trained on: it is the skills' validation set
# for that dataset (``dataset_validation_lines``), so a skill is verified on questions of the family it
# was distilled from that no checkpoint has seen. At most a quarter of a (small) file.
DATASET_VALIDATION_ROWS = 256


def _dataset_batch_prefix(dataset: str, num_tasks: int, shuffle_seed: int) -> str:
    return f"{dataset}-train-p{shuffle_seed}-n{num_tasks}-"


def _dataset_batches(batches_dir: Path, dataset: str, num_tasks: int, shuffle_seed: int) -> list[str]:
    """The registered batches of one dataset slicing, in order (``…-0000``, ``…-0001``, …)."""
    prefix = _dataset_batch_prefix(dataset, num_tasks, shuffle_seed)
    return sorted(p.name for p in Path(batches_dir).glob(prefix + "*") if (p / "manifest.json").exists())


def _dataset_order(data_dir: Path, dataset: str, shuffle_seed: int) -> tuple[Path, list[str], list[int], int]:
    """(source file, its non-empty lines, their seeded order, how many of the order's tail are reserved)."""
    import random

    if dataset not in DATASET_TRAIN_FILES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(DATASET_TRAIN_FILES)}")
    source = Path(data_dir) / DATASET_TRAIN_FILES[dataset]
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found: set TENTALIS_DATA_DIR to the folder holding {DATASET_TRAIN_FILES[dataset]}")
    lines = [ln for ln in source.read_text(encoding="utf-8").splitlines() if ln.strip()]
    order = list(range(len(lines)))
    random.Random(shuffle_seed).shuffle(order)
    return source, lines, order, min(DATASET_VALIDATION_ROWS, len(lines) // 4)


def dataset_validation_lines(data_dir: Path, dataset: str, n: int, *, shuffle_seed: int = 0) -> list[str]:
    """The first ``n`` lines of ``dataset``'s reserved validation tail (never in a training batch)."""
    source, lines, order, reserved = _dataset_order(data_dir, dataset, shuffle_seed)
    if not 0 < n <= reserved:
        raise ValueError(f"{dataset} reserves {reserved} training questions for validation ({source}): ask for 1 to {reserved}, not {n}")
    return [lines[i] for i in order[len(order) - reserved:][:n]]


def register_dataset_batch(batches_dir: Path, data_dir: Path, dataset: str, *, num_tasks: int, shuffle_seed: int = 0,
                           recipe: Recipe | None = None) -> str:
    """The next ``num_tasks`` training questions of ``dataset`` (e.g. GSM8K's train.jsonl, never its test
    split) as a batch: the file's lines in a fixed seeded order, consecutive slices per batch, so every
    run with the same seed sees the same tasks in the same cycles and no question twice. The order's
    last ``DATASET_VALIDATION_ROWS`` (at most a quarter) are the skills' validation set, never a batch."""
    source, lines, order, reserved = _dataset_order(data_dir, dataset, shuffle_seed)
    done = _dataset_batches(batches_dir, dataset, num_tasks, shuffle_seed)
    index = len(done)
    start = index * num_tasks
    if start + num_tasks > len(lines) - reserved:
        raise ValueError(f"{dataset} train has {len(lines)} questions, {reserved} of them the skills' validation set: "
                         f"{index} batches of {num_tasks} used them all")
    batch_id = validate_batch_id(f"{_dataset_batch_prefix(dataset, num_tasks, shuffle_seed)}{index:04d}")
    folder = Path(batches_dir) / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    _atomic_write(folder / "tasks.jsonl", "\n".join(lines[i] for i in order[start:start + num_tasks]) + "\n")
    _atomic_write(folder / "manifest.json", json.dumps({"kind": "jsonl", "family": dataset, "source": f"{source}#seed{shuffle_seed}[{start}:{start + num_tasks}]",
                                                        "file": "tasks.jsonl", "recipe": family_recipe(dataset, recipe=recipe).to_json()}))
    return batch_id


# --------------------------------------------------------------------------- mini-SWE (agent) batches
SWE_MANIFEST = "swe"
SWE_SOURCE = "generator:swe"


def swe_task_rows(batch_id: str, tasks: list[swe_tasks.SweTask], created_at, max_turns: int = DEFAULT_TERMINAL_MAX_TURNS) -> list[dict]:
    """The ``tasks`` rows of mini-SWE tasks (``SweTask.task_row``; the turn limit in the metadata)."""
    rows = []
    for t in tasks:
        row = t.task_row()
        meta = {**json.loads(row["metadata"]), "max_turns": int(max_turns)}
        rows.append({**row, "batch_id": batch_id, "source": SWE_SOURCE, "difficulty": t.level,
                     "metadata": json.dumps(meta, sort_keys=True), "created_at": created_at})
    return rows


def swe_batch_id(seed: int, num_tasks: int, levels: tuple[int, ...]) -> str:
    return f"swe-s{seed}-n{num_tasks}-l{''.join(map(str, levels))}"


def register_swe_batch(batches_dir: Path, *, seed: int, num_tasks: int, levels: tuple[int, ...] = swe_tasks.LEVELS,
                       max_turns: int | None = None, batch_id: str | None = None, recipe: Recipe | None = None) -> str:
    """Record the parameters of a seeded mini-SWE batch (bug-fixing episodes in the sandbox; the batch kind
    ``EnvironmentBatch``). Idempotent for the same batch id. Its tasks are the catalogue's training split
    only (``swe_tasks.training_tasks``): a held-out bug is never in a batch."""
    check_training_seed(seed)
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be at least 1 (got {max_turns})")
    swe_tasks.training_tasks(seed, num_tasks, tuple(levels))  # validate the parameters now, not at run time
    chosen = family_recipe("swe", tuple(levels), recipe, max_turns=max_turns)  # the family's, max_turns as given
    batch_id = validate_batch_id(batch_id or swe_batch_id(seed, num_tasks, tuple(levels)))
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": SWE_MANIFEST, "family": "swe", "source": "swe", "seed": seed, "num_tasks": num_tasks, "levels": list(levels),
                "recipe": chosen.to_json()}
    _store_manifest(folder, batch_id, manifest)
    return batch_id


def swe_batch_seeds(batches_dir: Path) -> dict[int, list[str]]:
    return manifest_seeds(batches_dir, SWE_MANIFEST)


def next_swe_seed(batches_dir: Path) -> int:
    return next_manifest_seed(batches_dir, SWE_MANIFEST)


# --------------------------------------------------------------------------- bring-your-own terminal task files
def is_task_file_source(task_source: str) -> bool:
    """Whether a ``--tasks`` value names a task file (a path ending in ``.jsonl``, or one that exists)
    rather than a built-in family."""
    return task_source.endswith(".jsonl") or ("/" in task_source and Path(task_source).expanduser().exists())


def _terminal_file_prefix(path: Path, data: bytes, num_tasks: int) -> str:
    return f"{inbox_batch_id(path, data)}-n{num_tasks}-"


def terminal_file_batches(batches_dir: Path, path: Path, num_tasks: int) -> list[str]:
    """The registered batches of one terminal task file (its bytes) sliced ``num_tasks`` at a time, in order."""
    path = Path(path).expanduser()
    prefix = _terminal_file_prefix(path, read_inbox_file(path), num_tasks)
    return sorted(p.name for p in Path(batches_dir).glob(prefix + "*") if (p / "manifest.json").exists())


def register_terminal_file_batch(batches_dir: Path, path: Path, *, num_tasks: int, max_turns: int | None = None,
                                 overrides: dict[str, Any] | None = None) -> str:
    """The next ``num_tasks`` training tasks of a bring-your-own terminal task file (``tasks/terminal_file.py``)
    as a batch: the file's bytes snapshotted, its good training lines in file order, consecutive slices
    per batch, wrapping around to the start (never the same task twice in one batch). Bad lines are
    quarantined by the batch's ``tasks`` stage; held-out lines are never in a batch. Raises ValueError
    (file, line and fix) when the file has no usable training line."""
    from tentalis_pipelines.tasks.terminal_file import read_terminal_file

    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    path = Path(path).expanduser()
    data = read_inbox_file(path)
    parsed = read_terminal_file(path)
    train = parsed.train
    if not train:
        why = "; ".join(parsed.errors()[:3]) or "every line is marked heldout"
        raise ValueError(f"{path}: no usable training task ({why}); fix the lines named, or mark some \"split\": \"train\"")
    prefix = _terminal_file_prefix(path, data, num_tasks)
    index = len(terminal_file_batches(batches_dir, path, num_tasks))
    batch_id = validate_batch_id(f"{prefix}{index:04d}")
    levels = tuple(sorted({t.level for t in train}))
    chosen = family_recipe(TERMINAL_MANIFEST, levels, max_turns=max_turns, **(overrides or {}))
    folder = Path(batches_dir) / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".tasks.jsonl.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / "tasks.jsonl")
    _atomic_write(folder / "manifest.json", json.dumps({
        "kind": "jsonl", "family": TERMINAL_MANIFEST, "source": str(path), "file": "tasks.jsonl", "levels": list(levels),
        "start": (index * num_tasks) % len(train), "num_tasks": num_tasks, "recipe": chosen.to_json()}))
    return batch_id


def load_terminal_file_batch(batches_dir: Path, batch_id: str, manifest: dict[str, Any], created_at) -> LoadedTasks:
    """A terminal task file batch's rows: its slice of the file's training tasks, and its bad lines as
    quarantine rows (``<file>:<line>: <problem>; fix: <how>``)."""
    from tentalis_pipelines.tasks.terminal_file import read_terminal_file

    parsed = read_terminal_file(Path(batches_dir) / batch_id / manifest["file"], source=manifest["source"], display=manifest["source"])
    train = parsed.train
    n = min(int(manifest.get("num_tasks") or len(train)), len(train))  # an inbox file: all its training lines
    start = int(manifest.get("start", 0))
    chosen = [train[(start + i) % len(train)] for i in range(n)] if train else []
    rows = terminal_task_rows(batch_id, chosen, created_at, max_turns=int(manifest_recipe(manifest).max_turns))
    rows = [{**r, "source": manifest["source"]} for r in rows]
    return LoadedTasks(tasks=rows, rejects=[{**r, "batch_id": batch_id} for r in parsed.rejects])


# --------------------------------------------------------------------------- any environment family (the registry's)
FAMILY_MANIFEST = "family"


def family_batch_id(family: str, seed: int, num_tasks: int, levels: tuple[int, ...]) -> str:
    return f"{family}-s{seed}-n{num_tasks}-l{''.join(map(str, levels))}"


def _environment_family(name: str) -> TaskFamily:
    family = get_family(name)
    if not family.environment:
        raise ValueError(f"task family {name!r} is single-turn: a seeded batch of the registry is an environment family's")
    return family


def family_held_out_prints(family: TaskFamily) -> dict[str, str]:
    """``{fingerprint: task id}`` of the family's held-out tasks (every level): what no training task may be."""
    return {family.fingerprint(t): str(t.task_id) for t in family.held_out_tasks(())}


def family_task_rows(batch_id: str, family: TaskFamily, tasks: list, created_at, max_turns: int) -> list[dict]:
    """The ``tasks`` rows of an environment family's tasks (``family.task_row``; the batch's turn limit in
    the metadata as ``max_turns``, ``source`` ``generator:<family>``, ``difficulty`` the task's level)."""
    rows = []
    for t in tasks:
        row = family.task_row(t)
        meta = {**json.loads(row.get("metadata") or "{}"), "max_turns": int(max_turns)}
        rows.append({**row, "environment": family.environment, "batch_id": batch_id, "source": f"generator:{family.name}",
                     "difficulty": int(t.level), "metadata": json.dumps(meta, sort_keys=True), "created_at": created_at})
    return rows


def register_family_batch(batches_dir: Path, family: str, *, seed: int, num_tasks: int, levels: tuple[int, ...] = (),
                          max_turns: int | None = None, batch_id: str | None = None, recipe: Recipe | None = None) -> str:
    """Record a seeded batch of any environment family of the registry (``"kind": "family"`` with its
    ``"family"``; the batch kind ``EnvironmentBatch``). Idempotent for the same batch id. Its tasks are the
    family's ``training_tasks(seed, num_tasks, levels)`` (levels: the family's all when empty)."""
    fam = _environment_family(family)
    check_training_seed(seed)
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1 (got {num_tasks})")
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be at least 1 (got {max_turns})")
    levels = tuple(levels) or tuple(fam.levels)
    bad = [lv for lv in levels if fam.levels and lv not in fam.levels]
    if bad or not levels:
        raise ValueError(f"{family} levels must be a non-empty subset of {list(fam.levels)}, got {list(levels)}")
    fam.training_tasks(seed, 1, levels)  # validate the parameters now, not at run time
    chosen = family_recipe(family, levels, recipe, max_turns=max_turns)
    batch_id = validate_batch_id(batch_id or family_batch_id(family, seed, num_tasks, levels))
    folder = batches_dir / batch_id
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": FAMILY_MANIFEST, "family": family, "source": family, "seed": seed, "num_tasks": num_tasks,
                "levels": list(levels), "recipe": chosen.to_json()}
    _store_manifest(folder, batch_id, manifest)
    return batch_id


def load_family_batch(batch_id: str, manifest: dict[str, Any], created_at) -> LoadedTasks:
    """A ``"kind": "family"`` batch's rows: its family's training tasks, each screened against the family's
    held-out tasks by ``fingerprint`` (the contamination guard for a family the index does not know): a
    training task equal to a held-out one is quarantined, never trained on."""
    fam = _environment_family(manifest["family"])
    tasks = fam.training_tasks(int(manifest["seed"]), int(manifest["num_tasks"]), tuple(manifest["levels"]))
    held_out = family_held_out_prints(fam)
    clean = [t for t in tasks if fam.fingerprint(t) not in held_out]
    rejects = [{"source": f"generator:{fam.name}", "line": None, "raw": json.dumps(fam.task_row(t), default=str)[:10000],
                "error": f"task {t.task_id} is the same task as held-out {held_out[fam.fingerprint(t)]} of {fam.name}: "
                         "training on it would contaminate the benchmark", "batch_id": batch_id, "stage": "tasks"}
               for t in tasks if fam.fingerprint(t) in held_out]
    rows = family_task_rows(batch_id, fam, clean, created_at, max_turns=int(manifest_recipe(manifest).max_turns or 8))
    return LoadedTasks(tasks=rows, rejects=rejects)


def family_batch_seeds(batches_dir: Path, family: str) -> dict[int, list[str]]:
    """``{seed: ids of the registered batches of ``family`` with that seed}`` (``"kind": "family"`` manifests)."""
    seeds: dict[int, list[str]] = {}
    for manifest in Path(batches_dir).glob("*/manifest.json"):
        m = json.loads(manifest.read_text())
        if m.get("kind") == FAMILY_MANIFEST and m.get("family") == family:
            seeds.setdefault(int(m["seed"]), []).append(manifest.parent.name)
    return seeds


def next_family_seed(batches_dir: Path, family: str) -> int:
    return max(family_batch_seeds(batches_dir, family), default=0) + 1
