"""Plots for asset metadata (PNG bytes; the Dagster UI shows them inline as markdown images)."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any


def accuracy_plot_png(rows: Sequence[dict[str, Any]], title: str) -> bytes:
    """Accuracy with its 95% interval per checkpoint (in the given order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r["checkpoint_id"])[-10:] for r in rows]
    acc = [r["accuracy"] for r in rows]
    lo = [max(0.0, r["accuracy"] - r["ci_low"]) for r in rows]
    hi = [max(0.0, r["ci_high"] - r["accuracy"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rows) + 2), 3.2), dpi=100)
    ax.errorbar(range(len(rows)), acc, yerr=[lo, hi], fmt="o-", capsize=4, label="strict accuracy (95% CI)")
    if rows and "lenient_accuracy" in rows[0]:
        ax.plot(range(len(rows)), [r["lenient_accuracy"] for r in rows], "s--", alpha=0.7, label="lenient accuracy")
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def markdown_image(png: bytes, alt: str = "plot") -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"
