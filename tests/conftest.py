"""Shared fixtures: a per-test TENTALIS_HOME, the real tokenizer, and a tiny random Llama."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests share one model cache (conversion of the embedded GGUF takes ~45 s, once).
CACHE = Path(os.environ.get("TENTALIS_TEST_CACHE", Path(__file__).resolve().parents[1] / ".tentalis" / "test-cache"))
# The contamination index's MiniLM embeddings (~2,000 benchmark items, minutes on this CPU) are computed
# once and shared by every test, whatever its TENTALIS_HOME (subprocesses inherit the variable).
os.environ.setdefault("TENTALIS_CONTAMINATION_CACHE", str(CACHE / "contamination"))


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    from tentalis_pipelines.inference.models import resolve_model

    return resolve_model("embedded", CACHE / "models")


@pytest.fixture(scope="session")
def tiny_model_dir(embedded_model_dir: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer: generation and training in seconds."""
    from tentalis_pipelines.inference.models import build_tiny_llama

    return build_tiny_llama(embedded_model_dir, CACHE / "models" / "tiny-llama")


@pytest.fixture(scope="session")
def smol_tokenizer(embedded_model_dir: Path):
    """SmolLM2's tokenizer (the tiny model's too), loaded once per session: reading it costs about a second of
    CPU. Shared: read it, never change its settings (copy.deepcopy it first)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


@pytest.fixture()
def home(tmp_path: Path, monkeypatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("TENTALIS_HOME", str(h))
    return h
