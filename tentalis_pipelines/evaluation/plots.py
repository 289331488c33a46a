"""Plots for asset metadata: PNG bytes (behind a click in the Dagster UI) and small inline SVGs (shown on the asset page)."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any


def _figure(points: int):
    """A figure and its axes, wide enough for ``points`` labelled x positions (matplotlib's Agg backend:
    no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(max(4, 1.2 * points + 2), 3.2), dpi=100)


def _png(fig) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def accuracy_plot_png(rows: Sequence[dict[str, Any]], title: str) -> bytes:
    """Accuracy with its 95% interval per checkpoint (in the given order)."""
    labels = [str(r["checkpoint_id"])[-10:] for r in rows]
    acc = [r["accuracy"] for r in rows]
    lo = [max(0.0, r["accuracy"] - r["ci_low"]) for r in rows]
    hi = [max(0.0, r["ci_high"] - r["accuracy"]) for r in rows]
    fig, ax = _figure(len(rows))
    ax.errorbar(range(len(rows)), acc, yerr=[lo, hi], fmt="o-", capsize=4, label="strict accuracy (95% CI)")
    if rows and "lenient_accuracy" in rows[0]:
        ax.plot(range(len(rows)), [r["lenient_accuracy"] for r in rows], "s--", alpha=0.7, label="lenient accuracy")
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return _png(fig)


def markdown_image(png: bytes, alt: str = "plot") -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


# --------------------------------------------------------------------------- plots that show without a click
# The Dagster UI (1.13, ui-core metadata/MetadataEntry.tsx) renders a markdown metadata value inline on the
# asset page only while it is shorter than 1,000 characters; a longer one (any PNG as a data URI) waits
# behind a "[Show Markdown]" link. So each plot also comes as a small SVG data URI under that limit.
INLINE_MARKDOWN_LIMIT = 1000
_SVG_W, _SVG_H, PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 360, 132, 28, 352, 18, 108


def _svg_url(svg: str) -> str:
    """An SVG as a compact data URI that a markdown link destination keeps intact (no spaces,
    no unbalanced parentheses; '#' and '%' escaped)."""
    for ch, code in (("%", "%25"), ("#", "%23"), (" ", "%20"), ("(", "%28"), (")", "%29"), ('"', "'")):
        svg = svg.replace(ch, code)
    return "data:image/svg+xml," + svg


def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v == v else "nan"


def inline_plot_markdown(
    labels: Sequence[str],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    *,
    title: str,
    intervals: Sequence[tuple[float, float] | None] | None = None,
    ylim: tuple[float, float] | None = None,
    limit: int = INLINE_MARKDOWN_LIMIT,
) -> str:
    """A line plot as a markdown image (an SVG data URI) shorter than ``limit`` characters, so the
    Dagster asset page shows it without a click. ``series`` are (name, colour, values) over the x
    ``labels``; ``intervals`` (low, high) draw whiskers on the first series, which also gets dots. When every point does not
    fit, an evenly spaced subset (always the first and the last) is drawn and the title says so."""
    n = len(labels)
    for k in range(n, 0, -1):
        keep = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [n - 1]
        md = _inline_plot([labels[i] for i in keep], [(a, c, [list(v)[i] for i in keep]) for a, c, v in series],
                          title if k == n else f"{title} ({k} of {n})",
                          None if intervals is None else [list(intervals)[i] for i in keep], ylim)
        if len(md) < limit:
            return md
    return f"_{title}: no room to draw it inline_"


def _inline_plot(labels, series, title, intervals, ylim) -> str:
    values = [v for _, _, vs in series for v in vs if v is not None]
    values += [b for iv in intervals or [] if iv for b in iv]
    lo, hi = ylim if ylim else (min([0.0, *values]), max([1.0, *values]))
    if hi <= lo:
        hi = lo + 1.0
    k = len(labels)

    def x(i: int) -> int:
        return round(PLOT_LEFT + 6 + (i * (PLOT_RIGHT - PLOT_LEFT - 12) / (k - 1) if k > 1 else (PLOT_RIGHT - PLOT_LEFT - 12) / 2))

    def y(v: float) -> int:
        return round(PLOT_BOTTOM - (v - lo) * (PLOT_BOTTOM - PLOT_TOP) / (hi - lo))

    # One style sheet instead of repeated attributes: lines, dots ("h0" paths with round caps), labels.
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{_SVG_W}' height='{_SVG_H}' style='background:#fff'>"
             "<style>path{fill:none}[d$=h0]{stroke-width:5;stroke-linecap:round}text{font:11px sans-serif;stroke:none}</style>"
             f"<path d='M{PLOT_LEFT},{PLOT_TOP}V{PLOT_BOTTOM}H{PLOT_RIGHT}' stroke='gray'/>"
             f"<text y='{PLOT_TOP + 4}'>{_fmt(hi)}</text><text y='{PLOT_BOTTOM}'>{_fmt(lo)}</text>"
             f"<text x='{PLOT_LEFT}' y='11'>{_esc(title)}</text>"]
    if k:
        parts.append(f"<text x='{PLOT_LEFT}' y='{PLOT_BOTTOM + 12}'>{_esc(labels[0])}</text>")
        if k > 1:
            parts.append(f"<text x='{PLOT_RIGHT}' y='{PLOT_BOTTOM + 12}' text-anchor='end'>{_esc(labels[-1])}</text>")
    legend_x = PLOT_LEFT + 70
    for idx, (name, colour, vs) in enumerate(series):
        pts = [(x(i), y(v)) for i, v in enumerate(vs) if v is not None]
        parts.append(f"<g stroke='{colour}' fill='{colour}'>")
        if idx == 0 and intervals:
            whiskers = "".join(f"M{x(i)},{y(iv[0])}V{y(iv[1])}" for i, iv in enumerate(intervals) if iv)
            if whiskers:
                parts.append(f"<path d='{whiskers}'/>")
        if len(pts) > 1:
            parts.append(f"<path d='M{'L'.join(f'{a},{b}' for a, b in pts)}'/>")
        if pts and (idx == 0 or len(pts) == 1):  # dots on the first series only: they cost room
            parts.append(f"<path d='{''.join(f'M{a},{b}h0' for a, b in pts)}'/>")
        parts.append(f"<text x='{legend_x}' y='{_SVG_H - 1}'>{_esc(name)}</text></g>")
        legend_x += 6 * len(name) + 18
    parts.append("</svg>")
    return f"![plot]({_svg_url(''.join(parts))})"


def _esc(text: str) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def accuracy_inline_markdown(rows: Sequence[dict[str, Any]], title: str) -> str:
    """The accuracy plot (strict with its 95% interval, lenient) of ``rows`` as an inline markdown image."""
    return inline_plot_markdown(
        [_short_label(r["checkpoint_id"]) for r in rows],
        [("strict accuracy", "steelblue", [r["accuracy"] for r in rows]),
         ("lenient", "darkorange", [r.get("lenient_accuracy") for r in rows])],
        title=title, intervals=[(r["ci_low"], r["ci_high"]) for r in rows], ylim=(0.0, 1.0),
    )


def level_success_markdown(per_level: dict[str, dict[str, float]], title: str) -> str:
    """Success per level (``benchmarks.level_success``: level -> n, success, Wilson interval) as an
    inline markdown image: one point per level, its 95% interval as whiskers."""
    levels = sorted(per_level, key=int)
    return inline_plot_markdown(
        [f"level {lv} (n={int(per_level[lv]['n'])})" for lv in levels],
        [("success", "steelblue", [per_level[lv]["success"] for lv in levels])],
        title=title, intervals=[(per_level[lv]["ci_low"], per_level[lv]["ci_high"]) for lv in levels], ylim=(0.0, 1.0),
    )


def _short_label(version: str) -> str:
    return str(version) if len(str(version)) <= 10 else str(version)[-6:]


# --------------------------------------------------------------------------- reward per policy version
def reward_per_policy_version(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean reward and mean outcome reward of the trajectories of each policy version, in the order the
    versions first produced trajectories (``created_at``; base first, then each checkpoint)."""
    first: dict[str, Any] = {}
    sums: dict[str, list[float]] = {}
    for i, r in enumerate(rows):
        v = str(r["policy_version"])
        key = (r.get("created_at") is None, r.get("created_at") or 0, i)
        if v not in first or key < first[v]:
            first[v] = key
        s = sums.setdefault(v, [0, 0.0, 0.0])
        s[0] += 1
        s[1] += float(r["reward"])
        s[2] += float(r["outcome_reward"])
    return [{"policy_version": v, "n": sums[v][0], "reward": sums[v][1] / sums[v][0], "outcome_reward": sums[v][2] / sums[v][0]}
            for v in sorted(first, key=first.__getitem__)]


def reward_plot_png(summary: Sequence[dict[str, Any]], title: str = "reward per policy version") -> bytes:
    """Mean reward and outcome reward (accuracy) per policy version, from :func:`reward_per_policy_version`."""
    xs = range(len(summary))
    fig, ax = _figure(len(summary))
    ax.plot(xs, [s["reward"] for s in summary], "o-", label="mean reward")
    ax.plot(xs, [s["outcome_reward"] for s in summary], "s--", label="outcome reward (accuracy)")
    ax.set_xticks(list(xs), [f"{_short_label(s['policy_version'])}\nn={s['n']}" for s in summary], fontsize=8)
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return _png(fig)


def reward_plots(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The `trajectories` plots as markdown: inline SVG (shows on the asset page) and the full PNG."""
    summary = reward_per_policy_version(rows)
    inline = inline_plot_markdown(
        [_short_label(s["policy_version"]) for s in summary],
        [("mean reward", "steelblue", [s["reward"] for s in summary]),
         ("outcome reward", "darkorange", [s["outcome_reward"] for s in summary])],
        title="reward per policy version",
    )
    return {"reward_per_policy_version": inline, "reward_per_policy_version_png": markdown_image(reward_plot_png(summary), "reward per policy version")}


# --------------------------------------------------------------------------- trust: re-scoring and judge agreement
_COLOURS = ("steelblue", "darkorange", "seagreen", "crimson")


def rescore_inline_markdown(rows: Sequence[dict[str, Any]], base: str, version: str) -> str:
    """Every re-scored rollout's reward under the base version and the new one, rollouts ordered by the
    base reward: where the two lines part, the re-score changed the ranking signal."""
    ordered = sorted(rows, key=lambda r: (r["base_reward"], r["rollout_id"]))
    return inline_plot_markdown(
        [str(i + 1) for i in range(len(ordered))],
        [(f"reward {base}"[:18], "steelblue", [r["base_reward"] for r in ordered]),
         (f"reward {version}"[:18], "darkorange", [r["reward"] for r in ordered])],
        title="reward per rollout, by base reward",
    )


def agreement_inline_markdown(rows: Sequence[dict[str, Any]], metric: str = "pass_agreement") -> str:
    """``metric`` per window of each judge (at most four, the most-paired first), windows in time order."""
    windows = [r for r in rows if r["window_kind"] != "all"]
    overall = sorted((r for r in rows if r["window_kind"] == "all"), key=lambda r: -r["n"])[: len(_COLOURS)]
    keys = sorted({(r["window_start"], r["window_id"]) for r in windows})
    labels = [w for _, w in dict.fromkeys(keys)]
    labels = list(dict.fromkeys(labels))
    series = []
    for colour, judge in zip(_COLOURS, overall):
        per = {r["window_id"]: r[metric] for r in windows if (r["judge"], r["rubric"]) == (judge["judge"], judge["rubric"])}
        name = judge["judge"] if judge["rubric"] == "default" else f"{judge['judge']}/{judge['rubric']}"
        series.append((name[:18], colour, [per.get(w) for w in labels]))
    return inline_plot_markdown([_short_label(w) for w in labels], series, title=f"judge vs managers: {metric}", ylim=(0.0, 1.0))
