"""Previews for Dagster metadata: a markdown table of a few rows, the length of a free-text cell.

Metadata lands in the Dagster instance and stays there (a retraction cannot reach it), so a preview
carries ids, scores, counts and lengths, never free text (``stages/common.py``). Here, below the stages,
so that the library's own modules (``promotion.benchmark_history``) build the same previews without
importing a stage (docs/architecture.md, "The import structure").
"""

from __future__ import annotations

from typing import Any


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
