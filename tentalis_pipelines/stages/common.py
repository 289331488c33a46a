"""What every stage returns: rows written and metadata for the UI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    rows: int
    metadata: dict[str, Any] = field(default_factory=dict)


def markdown_table(rows: list[dict[str, Any]], limit: int = 10) -> str:
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
