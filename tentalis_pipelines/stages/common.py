"""What every stage returns: rows written and metadata for the UI.

Metadata lands in the Dagster instance (run and event storage, the asset page) and stays there: a
retraction deletes rows from the lakehouse but cannot reach it. So previews carry ids, scores, counts
and lengths (``text_length``), never free text that people may have to retract: critiques, hints,
completions, prompts, session messages, skill text distilled from reviews (docs/lineage.md,
"Retraction")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    rows: int
    metadata: dict[str, Any] = field(default_factory=dict)


def text_length(value: str | None) -> int:
    """A free-text cell as it goes into a preview: its length in characters (0 for none)."""
    return len(value or "")


def markdown_table(rows: list[dict[str, Any]], limit: int = 10) -> str:
    """A preview table for Dagster metadata: give it ids and numbers, not free text (module docstring)."""
    if not rows:
        return "_no rows_"
    cols = list(dict.fromkeys(c for r in rows for c in r))  # union, first-seen order
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit]:
        out.append("| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |")
    if len(rows) > limit:
        out.append(f"\n_{len(rows) - limit} more rows_")
    return "\n".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    s = str(v).replace("\n", " ").replace("|", "\\|")
    return s if len(s) <= 80 else s[:77] + "..."
