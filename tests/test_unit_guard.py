"""The guard of tests/unit (its conftest): a unit test that builds a model fails naming what it did, while
the shared cache's session fixtures may build one while they fill the cache on a fresh clone, once.

Runs the real conftest in a separate pytest (a subprocess) over a copy of the folder layout, with a stand-in
for tests/conftest.py whose cache fixture builds a 1-layer Llama from a config: the real one converts the
embedded GGUF (~45 s), which is the cost this guard exists to keep out of the unit tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

UNIT_CONFTEST = Path(__file__).resolve().parent / "unit" / "conftest.py"
CPU_BUDGET = Path(__file__).resolve().parent / "cpu_budget.py"

BUILD = '''
def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16,
                                        num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1))
'''

ROOT_CONFTEST = '''
import pytest
from build_model import build


@pytest.fixture(scope="session")
def embedded_model_dir(tmp_path_factory):
    build()  # what the real fixture does on a fresh clone: a model is built while the cache fills
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def slow_session_fixture():
    return build()  # not a cache fixture: the guard must still refuse it
'''

UNIT_TESTS = '''
import transformers  # noqa: F401  (the guard guards what the test modules imported)

from build_model import build


def test_fills_the_cache_then_builds_a_model(embedded_model_dir):
    build()  # the guard is back once the cache fixture is set up


def test_uses_the_cache(embedded_model_dir):
    assert embedded_model_dir.exists()


def test_uses_the_cache_again(embedded_model_dir):
    assert embedded_model_dir.exists()


def test_builds_a_model_itself():
    build()


def test_builds_one_in_a_session_fixture(slow_session_fixture):
    pass
'''


def test_the_cache_fixtures_may_fill_the_cache_and_nothing_else_may_build_a_model(tmp_path):
    (tmp_path / "build_model.py").write_text(BUILD)
    (tmp_path / "conftest.py").write_text(ROOT_CONFTEST)
    (tmp_path / "unit").mkdir()
    shutil.copy(UNIT_CONFTEST, tmp_path / "unit" / "conftest.py")
    (tmp_path / "tests").mkdir()  # the unit conftest registers the CPU budget from tests/cpu_budget.py
    (tmp_path / "tests" / "__init__.py").write_text("")
    shutil.copy(CPU_BUDGET, tmp_path / "tests" / "cpu_budget.py")
    (tmp_path / "unit" / "test_guarded.py").write_text(UNIT_TESTS)
    # pythonpath=. for build_model; no cacheprovider: nothing written beside the copy
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "-o", "pythonpath=.", "-o", "addopts=", "-rA", "unit"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    outcomes = {name: outcome for outcome, name in
                re.findall(r"^(PASSED|FAILED|ERROR) unit/test_guarded.py::(\w+)", out, re.M)}
    assert outcomes == {
        "test_fills_the_cache_then_builds_a_model": "FAILED",
        "test_uses_the_cache": "PASSED",
        "test_uses_the_cache_again": "PASSED",
        "test_builds_a_model_itself": "FAILED",
        "test_builds_one_in_a_session_fixture": "ERROR",
    }, out
    assert out.count("a unit test may not build a model") >= 3, out
    assert "2 passed" in out and "2 failed" in out and "1 error" in out, out
