"""Plots for asset metadata: the reward per policy version, and SVGs small enough to show without a click."""

from __future__ import annotations

import base64
import re
import urllib.parse
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from tentalis_pipelines.evaluation import plots

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SVG = "{http://www.w3.org/2000/svg}"


def _row(version: str, reward: float, outcome: float, minutes: int) -> dict:
    return {"policy_version": version, "reward": reward, "outcome_reward": outcome, "created_at": T0 + timedelta(minutes=minutes)}


def test_reward_per_policy_version_means_in_the_order_versions_appeared():
    rows = [
        _row("ckpt-a", 1.0, 1.0, 20), _row("base", 0.5, 0.0, 1), _row("ckpt-z", 0.25, 0.0, 10),
        _row("base", 1.0, 1.0, 0), _row("ckpt-a", 0.5, 0.0, 21), _row("base", 0.0, 0.0, 2), _row("ckpt-z", 0.5, 1.0, 11),
    ]
    # ckpt-z came before ckpt-a: the order is the policy chain's, not the names'.
    assert plots.reward_per_policy_version(rows) == [
        {"policy_version": "base", "n": 3, "reward": pytest.approx(0.5), "outcome_reward": pytest.approx(1 / 3)},
        {"policy_version": "ckpt-z", "n": 2, "reward": pytest.approx(0.375), "outcome_reward": pytest.approx(0.5)},
        {"policy_version": "ckpt-a", "n": 2, "reward": pytest.approx(0.75), "outcome_reward": pytest.approx(0.5)},
    ]
    assert plots.reward_per_policy_version([]) == []


def _svg(md: str) -> ET.Element:
    """The SVG of an inline markdown image, as the browser decodes its data URI."""
    m = re.fullmatch(r"!\[[^\]]*\]\(data:image/svg\+xml,([^\s()]*)\)", md)
    assert m, f"not a markdown image with a data URI a link destination keeps whole: {md[:120]}"
    return ET.fromstring(urllib.parse.unquote(m.group(1)))


def _points(path: ET.Element) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"[ML](\d+),(\d+)", path.get("d"))]


def test_inline_plot_maps_values_to_the_axes_and_stays_under_the_ui_limit():
    md = plots.inline_plot_markdown(["base", "ckpt-1", "ckpt-2"], [("mean reward", "steelblue", [0.0, 0.5, 1.0]),
                                                                   ("outcome", "darkorange", [1.0, None, 0.0])],
                                    title="reward", ylim=(0.0, 1.0))
    assert len(md) < plots.INLINE_MARKDOWN_LIMIT
    svg = _svg(md)
    series = svg.findall(f"{SVG}g")
    assert [g.get("stroke") for g in series] == ["steelblue", "darkorange"]
    assert [g.find(f"{SVG}text").text for g in series] == ["mean reward", "outcome"]
    line = series[0].findall(f"{SVG}path")[0]
    # 0 sits on the x axis (bottom), 1 at the top, 0.5 halfway; x runs left to right inside the axes.
    assert _points(line) == [(plots.PLOT_LEFT + 6, plots.PLOT_BOTTOM), ((plots.PLOT_LEFT + plots.PLOT_RIGHT) // 2, (plots.PLOT_TOP + plots.PLOT_BOTTOM) // 2),
                             (plots.PLOT_RIGHT - 6, plots.PLOT_TOP)]
    assert _points(series[1].findall(f"{SVG}path")[0]) == [(plots.PLOT_LEFT + 6, plots.PLOT_TOP), (plots.PLOT_RIGHT - 6, plots.PLOT_BOTTOM)]  # None skipped
    labels = [t.text for t in svg.findall(f"{SVG}text")]
    assert labels[:5] == ["1", "0", "reward", "base", "ckpt-2"]


def test_a_long_history_is_thinned_to_fit_keeping_the_first_and_last_point():
    n = 60
    labels = ["base"] + [f"ckpt-20260101-xyz{i:03d}" for i in range(1, n)]
    md = plots.inline_plot_markdown(labels, [("accuracy", "steelblue", [i / (n - 1) for i in range(n)])], title="acc",
                                    intervals=[(max(0, i / (n - 1) - 0.1), min(1, i / (n - 1) + 0.1)) for i in range(n)], ylim=(0, 1))
    assert len(md) < plots.INLINE_MARKDOWN_LIMIT
    svg = _svg(md)
    title = next(t.text for t in svg.findall(f"{SVG}text") if t.text.startswith("acc"))
    k = int(re.fullmatch(r"acc \((\d+) of 60\)", title).group(1))
    assert 5 <= k < n
    whiskers, line, dots = svg.find(f"{SVG}g").findall(f"{SVG}path")
    assert len(_points(line)) == k and len(re.findall("h0", dots.get("d"))) == k and len(re.findall("V", whiskers.get("d"))) == k
    assert _points(line)[0] == (plots.PLOT_LEFT + 6, plots.PLOT_BOTTOM) and _points(line)[-1] == (plots.PLOT_RIGHT - 6, plots.PLOT_TOP)
    assert [t.text for t in svg.findall(f"{SVG}text")][3:5] == ["base", labels[-1]]


def test_accuracy_plot_draws_the_interval_of_each_checkpoint():
    rows = [{"checkpoint_id": "base", "accuracy": 0.5, "lenient_accuracy": 0.75, "ci_low": 0.25, "ci_high": 0.75},
            {"checkpoint_id": "ckpt-x", "accuracy": 1.0, "lenient_accuracy": 1.0, "ci_low": 0.5, "ci_high": 1.0}]
    svg = _svg(plots.accuracy_inline_markdown(rows, "arithmetic"))
    whiskers = svg.find(f"{SVG}g").findall(f"{SVG}path")[0]
    h = plots.PLOT_BOTTOM - plots.PLOT_TOP
    assert re.findall(r"M(\d+),(\d+)V(\d+)", whiskers.get("d")) == [
        (str(plots.PLOT_LEFT + 6), str(round(plots.PLOT_BOTTOM - 0.25 * h)), str(round(plots.PLOT_BOTTOM - 0.75 * h))),
        (str(plots.PLOT_RIGHT - 6), str(round(plots.PLOT_BOTTOM - 0.5 * h)), str(plots.PLOT_TOP)),
    ]


def test_level_success_plot_puts_each_level_in_order_with_its_wilson_interval():
    # Levels arrive as strings and out of order; level 10 must come after level 2 (numeric order).
    per_level = {"2": {"n": 4, "success": 0.25, "ci_low": 0.0, "ci_high": 0.5},
                 "0": {"n": 30, "success": 0.5, "ci_low": 0.25, "ci_high": 0.75},
                 "10": {"n": 2, "success": 1.0, "ci_low": 0.5, "ci_high": 1.0}}
    svg = _svg(plots.level_success_markdown(per_level, "terminal"))
    whiskers, line, _ = svg.find(f"{SVG}g").findall(f"{SVG}path")
    h = plots.PLOT_BOTTOM - plots.PLOT_TOP
    assert [y for _, y in _points(line)] == [round(plots.PLOT_BOTTOM - v * h) for v in (0.5, 0.25, 1.0)]
    assert [(int(lo), int(hi)) for _, lo, hi in re.findall(r"M(\d+),(\d+)V(\d+)", whiskers.get("d"))] == [
        (round(plots.PLOT_BOTTOM - lo * h), round(plots.PLOT_BOTTOM - hi * h)) for lo, hi in ((0.25, 0.75), (0.0, 0.5), (0.5, 1.0))]
    labels = [t.text for t in svg.findall(f"{SVG}text")]
    assert "level 0 (n=30)" in labels and "level 10 (n=2)" in labels


def test_reward_plots_give_an_inline_svg_and_the_full_png():
    out = plots.reward_plots([_row("base", 0.2, 0.0, 0), _row("ckpt-1", 0.8, 1.0, 5)])
    assert set(out) == {"reward_per_policy_version", "reward_per_policy_version_png"}
    assert len(out["reward_per_policy_version"]) < plots.INLINE_MARKDOWN_LIMIT
    line = _svg(out["reward_per_policy_version"]).find(f"{SVG}g").findall(f"{SVG}path")[0]
    assert [y for _, y in _points(line)] == [round(plots.PLOT_BOTTOM - 0.2 * (plots.PLOT_BOTTOM - plots.PLOT_TOP)),
                                             round(plots.PLOT_BOTTOM - 0.8 * (plots.PLOT_BOTTOM - plots.PLOT_TOP))]
    png = base64.b64decode(re.fullmatch(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", out["reward_per_policy_version_png"]).group(1))
    assert png.startswith(b"\x89PNG")


def test_the_accuracy_plot_is_a_png_and_leaves_no_figure_open():
    import matplotlib.pyplot as plt

    rows = [{"checkpoint_id": "base", "accuracy": 0.5, "ci_low": 0.25, "ci_high": 0.75, "lenient_accuracy": 0.6},
            {"checkpoint_id": "ckpt-1", "accuracy": 1.0, "ci_low": 0.5, "ci_high": 1.0, "lenient_accuracy": 1.0}]
    open_before = len(plt.get_fignums())
    assert plots.accuracy_plot_png(rows, "arithmetic").startswith(b"\x89PNG")
    assert len(plt.get_fignums()) == open_before
