"""Model folders built on first use: a process that loses the race to publish keeps the winner's folder."""

from __future__ import annotations

import os
from pathlib import Path

from tentalis_pipelines.inference import models


def _folder(path: Path, marker: str) -> Path:
    path.mkdir(parents=True)
    (path / "weights.bin").write_text(marker)
    (path / "config.json").write_text("{}")
    return path


def test_two_tiny_model_builds_at_once_keep_the_first(tmp_path, monkeypatch, embedded_model_dir):
    """build_tiny_llama in a process that loses the race: between its check and its rename another process
    publishes the same folder (simulated by publishing a marked copy just before the real rename)."""
    target = tmp_path / "tiny"
    real_replace = os.replace

    def another_process_wins(src, dst):
        if Path(dst) == target and not target.exists():
            _folder(target, "theirs")
        return real_replace(src, dst)

    monkeypatch.setattr(models.os, "replace", another_process_wins)
    assert models.build_tiny_llama(embedded_model_dir, target) == target
    assert (target / "weights.bin").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]
