"""What every stage returns: rows written and metadata for the UI.

Metadata lands in the Dagster instance (run and event storage, the asset page) and stays there: a
retraction deletes rows from the lakehouse but cannot reach it. So previews carry ids, scores, counts
and lengths (``text_length``), never free text that people may have to retract: critiques, hints,
completions, prompts, session messages, skill text distilled from reviews (docs/lineage.md,
"Retraction")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tentalis_pipelines.previews import markdown_table, text_length

__all__ = ["StageResult", "markdown_table", "text_length"]


@dataclass
class StageResult:
    rows: int
    metadata: dict[str, Any] = field(default_factory=dict)
