"""The UI, seen (issue 12): the real dagster-webserver on a copy of a finished learning cycle's state,
in real headless Chromium. Fails on browser console errors and on asset pages whose metadata is missing
or empty. `make ui-check` runs it and writes the screenshots into docs/images/.

Needs /usr/bin/chromium (`apt-get install -y chromium`; .ci/run and `make ui-check` install it) and the
`playwright` package (the dev extra; its own browser download is not used). Skips without them, unless
TENTALIS_UI_REQUIRED=1 (CI, `make ui-check`), where it fails instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ui_state import BENCHMARK, build_finished_cycle

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("TENTALIS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a closed network: without the background-networking ones Chromium's own connections are refused.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REQUIRED = os.environ.get("TENTALIS_UI_REQUIRED") == "1"
SCREENSHOTS = os.environ.get("TENTALIS_UI_SCREENSHOTS")  # a folder: `make ui-check` passes docs/images/


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"chromium is not installed ({CHROMIUM}): `apt-get install -y chromium`, or `make ui-check`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed: pip install -e '.[dev]'"
    return None


if _missing():
    if REQUIRED:
        raise RuntimeError(f"TENTALIS_UI_REQUIRED=1 but {_missing()}")
    pytest.skip(_missing(), allow_module_level=True)

# Console messages that are not faults of Tentalis, each with why. Everything else at level "error" fails.
BENIGN_CONSOLE = [
    # None seen with dagster-webserver 1.13.27 and Chromium 156; add (pattern, reason) pairs only with a reason.
]
# Request failures that are not errors: the UI polls GraphQL, and leaving a page aborts its open queries.
BENIGN_REQUEST_FAILURES = ["net::ERR_ABORTED"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def state(tmp_path_factory, tiny_model_dir) -> dict:
    """A finished cycle's $TENTALIS_HOME, and a copy of it for the webserver (which never sees the original)."""
    made = tmp_path_factory.mktemp("finished") / "home"
    # The next batch (a second policy version in the reward plot) only for the screenshots: it costs ~7 s.
    ids = build_finished_cycle(made, tiny_model_dir, next_batch=bool(SCREENSHOTS))
    copy = tmp_path_factory.mktemp("copy") / "home"
    shutil.copytree(made, copy, symlinks=True)
    return {**ids, "home": copy}


@pytest.fixture(scope="module")
def webserver(state, tmp_path_factory):
    """dagster-webserver, read-only, on 127.0.0.1 and a free port, over the copied state."""
    port = _free_port()
    log = tmp_path_factory.mktemp("webserver") / "webserver.log"
    env = {**os.environ, "TENTALIS_HOME": str(state["home"]), "DAGSTER_HOME": str(state["home"] / "dagster"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [str(Path(sys.executable).parent / "dagster-webserver"), "-w", str(ROOT / "workspace.yaml"),
           "-h", "127.0.0.1", "-p", str(port), "--read-only"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/server_info", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"dagster-webserver did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.5)
        yield {"url": url, "log": log}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the webserver and its code server
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "Traceback" not in text and " - ERROR - " not in text, text[-3000:]


@pytest.fixture(scope="module")
def browser_context(webserver, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1600, "height": 1000},
        )
        ctx.set_default_timeout(30_000)
        # The newsletter dialog Dagster shows once on localhost: dismissed, as a user's "Skip" would.
        ctx.add_init_script("window.localStorage.setItem('communityNux', JSON.stringify('1'))")
        yield ctx
        ctx.close()


class Page:
    """One browser tab that records every console error, uncaught exception and failed request."""

    def __init__(self, ctx, base: str):
        self.page, self.base, self.errors = ctx.new_page(), base, []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", lambda r: r.status >= 400 and self.errors.append(f"HTTP {r.status} {r.url}"))

    def _console(self, msg):
        if msg.type == "error" and not any(re.search(p, msg.text) for p, _ in BENIGN_CONSOLE):
            self.errors.append(f"console error: {msg.text} at {msg.location}")

    def _failed(self, req):
        if not any(b in (req.failure or "") for b in BENIGN_REQUEST_FAILURES):
            self.errors.append(f"request failed: {req.url} {req.failure}")

    def goto(self, path: str):
        self.page.goto(self.base + path)
        return self.page

    def close(self):
        self.page.wait_for_timeout(300)  # late errors of the page count too
        self.page.close()
        assert not self.errors, "\n".join(self.errors)


@pytest.fixture()
def tab(browser_context, webserver):
    t = Page(browser_context, webserver["url"])
    yield t
    t.close()


def _screenshot(page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / name))


# ---------------------------------------------------------------------------------------------- reading a page
_TABLE_ROWS = """(header) => {
  const th = [...document.querySelectorAll('thead td, thead th')].find(t => t.textContent.trim() === header);
  if (!th) return null;
  return [...th.closest('table').querySelectorAll(':scope > tbody > tr')].map(r => {  // not a markdown table's rows
    const last = r.cells[r.cells.length - 1];
    return {key: r.cells[0].innerText.trim(), value: last.innerText.trim(),
            images: [...last.querySelectorAll('img')].map(i => ({src: i.getAttribute('src') || '', width: i.naturalWidth,
                                                                 shown: i.complete && i.getBoundingClientRect().width > 0}))};
  });
}"""


def _rows(page, header: str) -> list[dict]:
    page.wait_for_function(f"() => ({_TABLE_ROWS})({header!r})?.length > 0")
    return page.evaluate(_TABLE_ROWS, header)


def _labelled(page, label: str, containing: str = "") -> str:
    """The text of the block under a label of the asset page ("Row count", "Storage")."""
    block = page.locator(f"xpath=//*[normalize-space(text())='{label}']/..").filter(has_text=containing).first
    block.wait_for()
    return block.inner_text()


def _assert_metadata_shows(page, expect_keys: list[str], inline_images: list[str]) -> dict:
    """Every metadata row of the latest materialization has a visible value; the named plots show as
    images without a click (and are not hidden behind "[Show Markdown]")."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    _rows(page, "Key")
    for key in inline_images:  # markdown renders lazily: give each plot time to decode; the asserts say what is wrong
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function(
                """(key) => [...document.querySelectorAll('tr')].some(r => r.cells[0]?.innerText.trim() === key &&
                     [...r.querySelectorAll('img')].some(i => i.complete && i.naturalWidth > 0))""", arg=key, timeout=10_000)
    rows = {r["key"]: r for r in _rows(page, "Key")}
    assert set(expect_keys) <= set(rows), f"metadata keys missing: {set(expect_keys) - set(rows)}"
    empty = [k for k, r in rows.items() if not r["value"] and not any(i["shown"] and i["width"] for i in r["images"])]
    assert not empty, f"empty metadata values: {empty}"
    for key in inline_images:
        assert "[Show Markdown]" not in rows[key]["value"], f"{key} is hidden behind a click"
        assert any(i["shown"] and i["width"] > 0 and i["src"].startswith("data:image/svg+xml") for i in rows[key]["images"]), rows[key]
    return rows


def _assert_columns_described(page, name: str) -> dict[str, str]:
    """The asset page's Columns view lists the table's columns, each with its description from
    ``schemas.py`` (the view's last cell: "Column name", "Type", "Description"). Returns what it shows.

    The view may first draw the columns without descriptions and fill them in when the asset's
    definition arrives: it is read once every row has one, or after 15 s (then the asserts say what is missing)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from tentalis_pipelines.schemas import SCHEMAS, column_descriptions

    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(f"(h) => ({_TABLE_ROWS})(h)?.every(r => r.value) ?? false", arg="Column name", timeout=15_000)
    shown = {r["key"]: r["value"] for r in _rows(page, "Column name")}
    assert list(shown) == SCHEMAS[name].names, f"{name}: the page lists columns {list(shown)}"
    undescribed = [c for c, text in shown.items() if not text]
    assert not undescribed, f"{name}: columns shown without a description: {undescribed}"
    # Descriptions are Markdown: `code` shows without its backticks.
    expected = {c: text.replace("`", "") for c, text in column_descriptions(name).items()}
    assert shown == expected, f"{name}: the page shows descriptions {shown}"
    return shown


def _assert_table_asset(page, name: str, home: Path, row_count: int) -> None:
    """Column schema (names and descriptions), table name, Delta URI and row count, as the asset page shows them."""
    _assert_columns_described(page, name)
    storage = _labelled(page, "Storage", containing=f"lakehouse.{name}")
    assert str(home / "lakehouse" / name) in storage, f"{name}: no Delta URI under Storage: {storage!r}"
    assert _labelled(page, "Row count").split() == ["Row", "count", str(row_count)]


# ---------------------------------------------------------------------------------------------------- the tests
def test_global_asset_graph_shows_every_asset(tab):
    from tentalis_pipelines.definitions import defs

    page = tab.goto("/asset-groups")
    page.get_by_text("learning_loop", exact=True).first.wait_for()
    page.keyboard.press("Alt+KeyE")  # the UI's "Expand all groups"; it remembers, and a reload fits the graph
    page.wait_for_timeout(500)
    page.reload()
    names = sorted(k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys())
    assert {"tasks", "trajectories", "checkpoints", "benchmark_results", "serving", "learning_curve", "human_reviews"} <= set(names)
    missing = []
    for n in names:  # the asset nodes, not a group's header (the `serving` group holds the `serving` asset)
        node = page.locator("foreignObject [class*='AssetNode_assetName']").get_by_text(n, exact=True)
        try:
            node.wait_for(timeout=3000)
        except Exception:
            missing.append(n)
    # The graph renders only the nodes inside its fitted viewport (a larger window zooms out further and
    # names fewer: 7 of 20 unnamed at 2400x1500, 5 at 1600x1000; 8 of 23 at 1600x1000 once `demonstrations`
    # and `warm_start` joined). The graph must still name most of them (an empty or broken graph names
    # none), and every one it leaves out must be reachable: its own asset page loads.
    assert len(missing) <= len(names) // 2, missing
    page.wait_for_timeout(500)
    _screenshot(page, "ui-asset-graph.png")
    for n in missing:
        tab.goto(f"/assets/{n}").get_by_text(n, exact=True).first.wait_for()


def test_trajectories_page_shows_columns_uri_rows_and_the_reward_plot(tab, state):
    from tentalis_pipelines.lakehouse import Lakehouse

    lake = Lakehouse(state["home"] / "lakehouse")
    latest = lake.read("trajectories", batch_id=state["next_batch_id"] or state["trained_batch_id"]).num_rows
    page = tab.goto("/assets/trajectories")
    _assert_table_asset(page, "trajectories", state["home"], latest)
    rows = _assert_metadata_shows(page, ["num_trajectories", "reward_mean", "reward_per_policy_version", "reward_per_policy_version_png"],
                                  inline_images=["reward_per_policy_version"])
    assert rows["num_trajectories"]["value"] == str(latest)
    page.locator("tr", has_text="reward_per_policy_version").locator("img").first.scroll_into_view_if_needed()
    _screenshot(page, "ui-trajectories.png")


def test_rollouts_page_describes_every_column(tab):
    """Issue 34: each column's description (Arrow field metadata in schemas.py) shows in the Columns view."""
    page = tab.goto("/assets/rollouts")
    shown = _assert_columns_described(page, "rollouts")
    assert shown["policy_version"] == "checkpoint id that sampled it, or 'base'", shown["policy_version"]
    page.get_by_text("checkpoint id that sampled it, or 'base'", exact=True).wait_for()  # visible, not only in the DOM


def test_checkpoints_page_shows_columns_uri_and_rows(tab, state):
    page = tab.goto("/assets/checkpoints")
    _assert_table_asset(page, "checkpoints", state["home"], 1)
    rows = _assert_metadata_shows(page, ["checkpoint_id"], inline_images=[])
    assert rows["checkpoint_id"]["value"] == state["checkpoint_id"]


def test_benchmark_results_page_shows_the_accuracy_plot(tab, state):
    page = tab.goto("/assets/benchmark_results")
    _assert_table_asset(page, "benchmark_results", state["home"], 1)
    _assert_metadata_shows(page, ["accuracy_per_checkpoint", "plot", "plot_png"], inline_images=["plot"])


def test_serving_page_shows_the_pointer_and_the_gate_decision(tab, state):
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.serving import serving_checkpoint, serving_history

    lake = Lakehouse(state["home"] / "lakehouse")
    decision = state["decision"]
    page = tab.goto("/assets/serving")
    _assert_table_asset(page, "serving", state["home"], len(serving_history(lake)))
    rows = _assert_metadata_shows(page, ["gate_benchmark", "candidate", "incumbent", "promoted", "serving", "decision", "serving_history"],
                                  inline_images=[])
    shown = {k: rows[k]["value"] for k in ("gate_benchmark", "candidate", "incumbent", "promoted", "serving", "decision")}
    assert shown == {"gate_benchmark": BENCHMARK, "candidate": state["checkpoint_id"], "incumbent": decision["incumbent"],
                     "promoted": str(decision["promote"]).lower(), "serving": serving_checkpoint(lake), "decision": decision["reason"]}, shown
    if decision["promote"]:
        assert state["checkpoint_id"] in rows["serving_history"]["value"], rows["serving_history"]


def test_promotion_gate_check_shows_its_decision(tab, state):
    from dagster import AssetCheckKey, AssetKey, DagsterInstance

    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.serving import serving_checkpoint

    decision = state["decision"]
    key = AssetCheckKey(AssetKey("serving"), "promotion_gate")
    with DagsterInstance.from_config(str(state["home"] / "dagster")) as instance:
        latest = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)[0]
        evaluation = latest.event.dagster_event.event_specific_data
    assert evaluation.passed is decision["promote"]
    page = tab.goto("/assets/serving?view=checks")
    page.get_by_text("promotion_gate").first.wait_for()
    result = _labelled(page, "Evaluation result")
    assert ("Passed" if decision["promote"] else "Failed") in result, result
    page.get_by_text(decision["reason"], exact=True).wait_for()  # the check's description: the gate's reason
    shown = {k: page.locator(f"xpath=//td[normalize-space(text())='{k}']/following-sibling::td[1]").first.inner_text().strip()
             for k in ("candidate", "incumbent", "serving", "n_paired")}
    assert shown == {"candidate": state["checkpoint_id"], "incumbent": decision["incumbent"],
                     "serving": serving_checkpoint(Lakehouse(state["home"] / "lakehouse")), "n_paired": str(decision["n_paired"])}, shown
    _screenshot(page, "ui-promotion-gate.png")


def test_every_run_of_the_cycle_shows_under_its_job(tab, state):
    """The cycle is runs of the asset jobs (jobs/runner.py): each shows on the Runs page with its job and
    status, and promotion_job's page names the assets it materialises."""
    from tentalis_pipelines.definitions import defs

    assert set(state["runs"]) == {"rollout_job", "train_job", "benchmark_job", "promotion_job"}, state["runs"]
    expected = {run_id[:8]: job for job, run_ids in state["runs"].items() for run_id in run_ids}
    page = tab.goto("/runs")
    rows = page.locator("[class*='VirtualizedTable_row']")  # the runs list: one row per run, newest first
    rows.filter(has_text=next(iter(expected))).wait_for()
    lines = [r.split("\n") for r in rows.all_inner_texts()]
    shown = {ls[0]: next((x for x in ls if x in state["runs"]), None) for ls in lines}
    assert shown == expected, shown
    assert all("Success" in ls for ls in lines), lines
    job = defs.resolve_job_def("promotion_job")
    page = tab.goto("/locations/tentalis/jobs/promotion_job")
    page.get_by_text(job.description, exact=True).wait_for()
    assets = sorted(k.to_user_string() for k in job.asset_layer.selected_asset_keys)
    assert assets == ["hint_efficacy", "learning_curve", "serving"], assets
    page.get_by_text(f"View {len(assets)} assets", exact=True).wait_for()


def test_learning_curve_page_shows_the_curve_and_its_plot(tab, state):
    page = tab.goto("/assets/learning_curve")
    assert _labelled(page, "Row count").split() == ["Row", "count", "2"]
    rows = _assert_metadata_shows(page, ["benchmark", "curve", "plot", "plot_png"], inline_images=["plot"])
    assert rows["benchmark"]["value"] == BENCHMARK
    assert "base" in rows["curve"]["value"] and state["checkpoint_id"] in rows["curve"]["value"].replace("\n", "")
    page.locator("tr", has_text="curve").first.scroll_into_view_if_needed()
    _screenshot(page, "ui-learning-curve.png")
