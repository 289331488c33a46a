"""Task families: each family's recipe (how its batches are sampled) next to the family, and a registry.

A *family* is where a batch's tasks come from and how they are run: ``arithmetic`` (seeded word
problems), ``gsm8k`` (dataset slices), ``jsonl`` (task files dropped into the inbox), and the agent
environments ``terminal``, ``bfcl`` and ``swe``. One module per family in this package; each defines a
:class:`TaskFamily` and the registry (:func:`get_family`) finds it by name. Packages installed in the
same environment add families through the ``tentalis.families`` Python entry-point group (the entry
point names a :class:`TaskFamily` instance or subclass), with no change to Tentalis.

This is the seed of issue 71's ``TaskFamily`` interface: today a family owns its levels and its
:class:`Recipe`; the training/held-out tasks, task rows, fingerprints, ``make_env`` and benchmark items
move behind it next.

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
    """A family of tasks: its name, levels and recipe. Subclass it (or instantiate it) in one module."""

    name: str = ""
    levels: tuple[int, ...] = ()
    default_recipe: Recipe = Recipe()

    def recipe(self, levels: tuple[int, ...] = ()) -> Recipe:
        """The family's recipe for a batch of these levels (override when it depends on them)."""
        return self.default_recipe

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


def get_family(name: str) -> TaskFamily:
    known = families()
    if name not in known:
        raise ValueError(f"no task family {name!r}; known: {', '.join(sorted(known))} (a package adds one through the "
                         f"{ENTRY_POINT_GROUP!r} entry-point group)")
    return known[name]


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
