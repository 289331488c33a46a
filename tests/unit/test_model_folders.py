"""Model folders are published in one rename: two first uses at once keep one whole folder, never half of one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tentalis_pipelines.inference import models


def _folder(path: Path, marker: str, *, complete: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "weights.bin").write_text(marker)
    if complete:
        (path / "config.json").write_text("{}")
    return path


def _has_config(folder: Path) -> bool:
    return (folder / "config.json").exists()


def test_publish_moves_the_folder_into_place(tmp_path):
    tmp, target = _folder(tmp_path / ".m.tmp-1", "ours"), tmp_path / "m"
    assert models.publish_folder(tmp, target, _has_config) == target
    assert (target / "weights.bin").read_text() == "ours" and not tmp.exists()


def test_a_folder_published_first_is_kept_and_ours_dropped(tmp_path):
    """The later writer must not delete the folder the earlier one published (a reader may be loading it)."""
    winner = _folder(tmp_path / "m", "theirs")
    inode = winner.stat().st_ino
    tmp = _folder(tmp_path / ".m.tmp-2", "ours")
    assert models.publish_folder(tmp, winner, _has_config) == winner
    assert (winner / "weights.bin").read_text() == "theirs"
    assert winner.stat().st_ino == inode  # the same directory, not a replacement
    assert not tmp.exists()


def test_an_incomplete_folder_is_replaced(tmp_path):
    _folder(tmp_path / "m", "half", complete=False)
    tmp = _folder(tmp_path / ".m.tmp-3", "ours")
    models.publish_folder(tmp, tmp_path / "m", _has_config)
    assert (tmp_path / "m" / "weights.bin").read_text() == "ours" and _has_config(tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # neither the stale copy nor ours is left behind


def test_other_rename_errors_are_raised(tmp_path):
    tmp = _folder(tmp_path / ".m.tmp-4", "ours")
    with pytest.raises(OSError) as err:
        models.publish_folder(tmp, tmp_path / "no-such-parent" / "m", _has_config)
    assert err.value.filename == str(tmp)  # the rename's own error, not one from setting aside a folder that is not there
    assert (tmp / "weights.bin").read_text() == "ours"

