"""Task families: each family's recipe (how its batches are sampled) next to the family, and a registry.

A *family* is where a batch's tasks come from and how they are run: ``arithmetic`` (seeded word
problems), ``gsm8k`` (dataset slices), ``jsonl`` (task files dropped into the inbox), and the agent
environments ``terminal``, ``bfcl`` and ``swe``. One module per family in this package; each defines a
:class:`TaskFamily` and the registry (:func:`get_family`) finds it by name. Packages installed in the
same environment add families through the ``tentalis.families`` Python entry-point group (the entry
point names a :class:`TaskFamily` instance or subclass), with no change to Tentalis.

Issue 71's ``TaskFamily`` interface. Every family owns its levels and its :class:`Recipe`. An
*environment family* (multi-turn agent episodes) also names its ``environment`` and implements the small
interface below; the generic code paths (registering a seeded batch, loading its task rows, the
environment batch kind's episodes, the held-out benchmark named after the family, the contamination
guard's held-out screening, ``tentalis learn --tasks <family>``) reach it through the registry only, so a
family from another package runs end to end with no file of ``tentalis_pipelines/`` naming it
(docs/families.md walks through ``examples/tentalis-family-example``). In the spirit of verl's agent loops
registered by name and TRL's ``rollout_func``:

* ``environment``: the ``environment`` column of the family's task rows (usually the family's name);
* ``training_tasks(seed, num_tasks, levels)``: the seeded training tasks (never a held-out one);
* ``held_out_tasks(levels)``: the held-out split, which is the family's benchmark (named after it);
* ``task_row(task)`` / ``task_from_row(row)``: a task as a ``tasks`` row and back;
* ``fingerprint(task)``: what makes two tasks the same task (the contamination guard's key);
* ``make_env(max_turns)``: a fresh environment with ``envs/base.py``'s protocol (``reset``, ``step``,
  ``verify``, ``close``), the verifier inside it;
* ``hints`` (optional): the verifier review's hint per failure type, in the words of the family's tools.

A task is any object with ``task_id`` (str) and ``level`` (int); an optional ``kind`` names its final check
(the verdict review's wording, default ``answer``). Single-turn families (arithmetic, gsm8k, jsonl) leave
``environment`` ``None`` and raise :class:`NotImplementedError` from the environment methods. The built-in
environment families (terminal, bfcl, swe) implement ``make_env`` and ``task_from_row``; their batches and
benchmarks keep their own code paths (seeds, curriculum, per-level partitions).

The recipe reaches every launcher through the batch's manifest: a batch is registered with its family's
recipe for its levels (plus any override given at registration, e.g. ``tentalis batch new
--temperature``) written into ``manifest.json`` under ``"recipe"``, and the rollout stage samples with
it (:func:`batch_policy`) whoever launched the run: the CLI, the Dagster launchpad, ``dagster job
execute``, a sensor or the nightly schedule. A manifest written before recipes were recorded (no
``"recipe"`` key) falls back to its family's recipe for its levels (and its ``max_turns``, if recorded).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tentalis_pipelines.policy import PolicySettings

ENTRY_POINT_GROUP = "tentalis.families"


@dataclass(frozen=True)
class Recipe:
    """How a family's batches are sampled. ``None`` means "not the family's to say": the ``policy``
    resource's value (e.g. its temperature, 0.8) applies.

    * ``temperature``: the rollouts' sampling temperature, in (0, 2] (GRPO needs samples that differ);
    * ``max_new_tokens``: the token budget of a completion (agent families: of each turn);
    * ``max_turns``: an episode's turn limit (BFCL: the replies with calls per user turn); single-turn
      families leave it ``None``;
    * ``num_generations``: samples (episodes) per task, the GRPO group size.
    """

    temperature: float | None = None
    max_new_tokens: int | None = None
    max_turns: int | None = None
    num_generations: int | None = None

    def __post_init__(self):
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 < t <= 2.0):
            raise ValueError(f"recipe temperature {t!r}: choose a value in (0, 2]; GRPO needs samples that differ, so not 0")
        for name in ("max_new_tokens", "max_turns", "num_generations"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"recipe {name} {v!r}: must be a whole number of at least 1 (or unset)")

    def with_overrides(self, **overrides: Any) -> Recipe:
        """This recipe with every override that is not ``None`` (a flag left unset keeps the family's)."""
        unknown = set(overrides) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown recipe field(s) {sorted(unknown)}; known: {[f.name for f in fields(self)]}")
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, *, where: str = "recipe") -> Recipe:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object of recipe fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def apply(self, policy: PolicySettings) -> PolicySettings:
        """``policy`` with this recipe's sampling fields (those set) in place of the resource's."""
        update = {k: getattr(self, k) for k in ("temperature", "max_new_tokens", "num_generations") if getattr(self, k) is not None}
        return dataclasses.replace(policy, **update) if update else policy


class TaskFamily:
    """A family of tasks: its name, levels and recipe; for an environment family (``environment`` set) its
    tasks and its environment too. Subclass it in one module (see the module docstring for the interface)."""

    name: str = ""
    levels: tuple[int, ...] = ()
    default_recipe: Recipe = Recipe()
    environment: str | None = None  # the tasks' ``environment`` column; None: a single-turn family
    # The verifier review's hint per failure type (``envs.verdicts.failure_type``: ``format``, ``turn_limit``,
    # ``wrong_answer``, ...) where the generic wording (the terminal's: bash blocks, files) does not fit.
    hints: dict[str, str] = {}

    def recipe(self, levels: tuple[int, ...] = ()) -> Recipe:
        """The family's recipe for a batch of these levels (override when it depends on them)."""
        return self.default_recipe

    # ------------------------------------------------------------------ the environment family interface
    def _not_an_environment(self, what: str) -> NotImplementedError:
        if self.environment is None:
            return NotImplementedError(f"task family {self.name!r} is single-turn (no environment): it has no {what}")
        return NotImplementedError(f"environment family {self.name!r} does not implement {what}; "
                                   f"see tentalis_pipelines/tasks/families/__init__.py and docs/families.md")

    def training_tasks(self, seed: int, num_tasks: int, levels: tuple[int, ...]) -> list[Any]:
        """``num_tasks`` training tasks of generator seed ``seed`` on ``levels``: the same tasks for the same
        arguments, never one of :meth:`held_out_tasks` (the registry's loader checks by :meth:`fingerprint`)."""
        raise self._not_an_environment("training_tasks(seed, num_tasks, levels)")

    def held_out_tasks(self, levels: tuple[int, ...] = ()) -> list[Any]:
        """The held-out split (every level when ``levels`` is empty): the family's benchmark, never trained on."""
        raise self._not_an_environment("held_out_tasks(levels)")

    def task_row(self, task: Any) -> dict[str, Any]:
        """A task as a ``tasks`` row: ``task_id``, ``environment``, ``prompt``, ``reference`` (the check, a
        string) and ``metadata`` (a JSON object string; ``max_turns`` is added by the loader). The default
        calls ``task.task_row()``."""
        if hasattr(task, "task_row"):
            return task.task_row()
        raise self._not_an_environment("task_row(task)")

    def task_from_row(self, row: dict[str, Any]) -> Any:
        """The task of a ``tasks`` row written by :meth:`task_row` (what ``env.reset`` is given)."""
        raise self._not_an_environment("task_from_row(row)")

    def fingerprint(self, task: Any) -> str:
        """What makes two tasks the same task, ids and splits aside (the contamination guard compares
        training tasks with the held-out ones by it). Default: sha256 of the row's prompt, check and state
        (``contamination.task_fingerprint``)."""
        from tentalis_pipelines.contamination import task_fingerprint

        return task_fingerprint(self.task_row(task))

    def make_env(self, max_turns: int) -> Any:
        """A fresh environment (``envs/base.Environment``'s protocol) for episodes of at most ``max_turns``
        assistant turns; its ``verify()`` is the family's verifier."""
        raise self._not_an_environment("make_env(max_turns)")

    def __repr__(self) -> str:
        return f"<task family {self.name}>"


_BUILTIN = ("arithmetic", "gsm8k", "jsonl", "terminal", "bfcl", "swe")
_registry: dict[str, TaskFamily] = {}


def _load_builtin(into: dict[str, TaskFamily]) -> None:
    import importlib

    for name in _BUILTIN:
        family = importlib.import_module(f"{__name__}.{name}").FAMILY
        into[family.name] = family


def _load_entry_points(into: dict[str, TaskFamily]) -> None:
    """Families of installed packages (``[project.entry-points."tentalis.families"]``). A built-in name
    is never replaced; an entry point that fails to load is an error naming it (not skipped silently)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - re-raised with the entry point's name
            raise RuntimeError(f"task family entry point {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        family = obj() if isinstance(obj, type) else obj
        if not isinstance(family, TaskFamily) or not family.name:
            raise RuntimeError(f"task family entry point {ep.name!r} ({ep.value}) is not a named TaskFamily")
        if family.name in _BUILTIN:
            raise RuntimeError(f"task family entry point {ep.name!r} reuses the built-in family name {family.name!r}; rename it")
        into.setdefault(family.name, family)


def families() -> dict[str, TaskFamily]:
    """Every known family by name: the built-in ones, then those of installed packages."""
    if not _registry:
        found: dict[str, TaskFamily] = {}
        _load_builtin(found)
        _load_entry_points(found)  # all or nothing: a bad entry point fails every lookup, not just the first
        _registry.update(found)
    return dict(_registry)


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of Tentalis's own families (their batches keep their own code paths)."""
    return name in _BUILTIN


def environment_families() -> dict[str, TaskFamily]:
    """Every environment family by its ``environment`` name (built-in and installed)."""
    return {f.environment: f for f in families().values() if f.environment}


def family_of_environment(environment: str) -> TaskFamily:
    """The family whose tasks carry ``environment`` (a clear error naming the known ones otherwise)."""
    return _lookup(environment_families(), environment, "environment")


def installed_environment_families() -> dict[str, TaskFamily]:
    """The environment families of installed packages (not built in), by family name: those whose seeded
    batches, tasks and held-out benchmark run through the registry's generic code paths."""
    return {n: f for n, f in families().items() if not is_builtin(n) and f.environment}


def get_family(name: str) -> TaskFamily:
    return _lookup(families(), name, "task family")


def _lookup(known: dict[str, TaskFamily], key: str, what: str) -> TaskFamily:
    """``known[key]``, or an error naming the known keys and how a package adds one."""
    if key not in known:
        raise ValueError(f"no {what} {key!r}; known: {', '.join(sorted(known))} (a package adds one through the "
                         f"{ENTRY_POINT_GROUP!r} entry-point group)")
    return known[key]


# The family of a manifest that does not name one (written before families were recorded).
_FAMILY_OF_KIND = {"arithmetic": "arithmetic", "jsonl": "jsonl", "terminal": "terminal", "bfcl": "bfcl", "swe": "swe"}


def manifest_family(manifest: dict[str, Any]) -> str:
    """The family a batch manifest belongs to: its ``family``, else the one of its ``kind``."""
    return manifest.get("family") or _FAMILY_OF_KIND.get(manifest.get("kind", ""), "jsonl")


def manifest_recipe(manifest: dict[str, Any]) -> Recipe:
    """The recipe a batch samples with: the manifest's ``recipe``; for a manifest without one (a batch
    registered before recipes were recorded), its family's recipe for its levels, with the manifest's
    own ``max_turns`` when it recorded one."""
    if "recipe" in manifest:
        return Recipe.from_json(manifest["recipe"], where="manifest recipe")
    name = manifest_family(manifest)
    fam = families().get(name)
    recipe = fam.recipe(tuple(manifest.get("levels") or ())) if fam is not None else Recipe()
    return recipe.with_overrides(max_turns=manifest.get("max_turns"))


def batch_recipe(batches_dir: Path, batch_id: str) -> Recipe | None:
    """The recipe of a registered batch, or ``None`` when it has no manifest (nothing to say)."""
    path = Path(batches_dir) / batch_id / "manifest.json"
    if not path.is_file():
        return None
    return manifest_recipe(json.loads(path.read_text()))


def batch_policy(batches_dir: Path, batch_id: str, policy: PolicySettings) -> PolicySettings:
    """The policy settings a batch's rollouts are sampled with: ``policy`` (the resource's) with the batch
    manifest's recipe in place. Every launcher samples through this, so a terminal batch run from the
    launchpad or the nightly schedule samples at the terminal recipe, not the resource's default."""
    recipe = batch_recipe(batches_dir, batch_id)
    return recipe.apply(policy) if recipe is not None else policy
