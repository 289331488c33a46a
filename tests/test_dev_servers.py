"""`tentalis ui` and `dg dev` start the webserver and daemon on this checkout's code location.

Both are started as real processes (as a user runs them, from a venv that is not activated) and asked
over GraphQL whether the `tentalis` location loaded and shows the learning loop's assets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.local_servers import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
QUERY = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } }
  assetNodes { assetKey { path } } }"""


def _graphql(port: int) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": QUERY}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["data"]


def _serve_and_ask(cmd: list[str], port: int, env: dict, timeout: float = 150.0) -> dict:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"{cmd[0]} exited {proc.returncode}: {proc.stdout.read().decode()[-3000:]}")
            try:
                data = _graphql(port)
                entries = data["workspaceOrError"]["locationEntries"]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    return data
            except (OSError, KeyError, TypeError, ValueError):
                pass
            time.sleep(1.0)
        pytest.fail(f"{' '.join(cmd)} did not load the code location within {timeout:.0f} s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "DAGSTER_HOME")}
    env["PATH"] = "/usr/bin:/bin"  # not activated: the commands must find the venv's dagster themselves
    env["TENTALIS_HOME"] = str(home)
    return env


def _check_location(data: dict) -> None:
    entries = data["workspaceOrError"]["locationEntries"]
    assert [e["name"] for e in entries] == ["tentalis"], entries
    assert entries[0]["locationOrLoadError"]["__typename"] == "RepositoryLocation", entries
    keys = {"/".join(n["assetKey"]["path"]) for n in data["assetNodes"]}
    assert {"tasks", "rollouts", "trajectories", "checkpoints", "benchmark_results", "serving"} <= keys, sorted(keys)


def test_tentalis_ui_serves_the_code_location_without_an_activated_venv(tmp_path):
    port = free_port()
    data = _serve_and_ask([str(BIN / "tentalis"), "ui", "--port", str(port)], port, _clean_env(tmp_path / "home"))
    _check_location(data)


def test_dg_dev_serves_the_same_code_location(tmp_path):
    port = free_port()
    env = _clean_env(tmp_path / "home")
    env["PATH"] = f"{BIN}:/usr/bin:/bin"  # `dg dev --use-active-venv` runs the dagster on PATH
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env["DAGSTER_HOME"] = str(tmp_path / "home" / "dagster")
    (tmp_path / "home" / "dagster").mkdir(parents=True)
    data = _serve_and_ask([str(BIN / "dg"), "dev", "--use-active-venv", "-p", str(port)], port, env)
    _check_location(data)
