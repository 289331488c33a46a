"""Library configs are frozen dataclasses whose fields carry their help text. The Dagster resources and
asset configs mirror them field for field (``resources.mirrored`` reads the default and the help back),
so each setting is defined, defaulted and explained in one place."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def config_field(default: Any, help: str, **kw: Any) -> Any:
    """A config field with its help text (the ``help`` metadata, shown by the Dagster resource that
    mirrors the config). A tuple default is given through a factory, so every instance gets its own."""
    if isinstance(default, tuple):
        return field(default_factory=lambda: default, metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)
