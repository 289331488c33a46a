"""The "no stored row changed" helper must itself notice a change."""

from __future__ import annotations

import pytest

from tentalis_pipelines.lakehouse import Lakehouse
from tests.table_hashes import assert_unchanged, table_hashes


def test_table_hashes_see_a_changed_added_or_rewritten_row(tmp_path):
    lake = Lakehouse(tmp_path)
    lake.quarantine([{"source": "a.jsonl", "line": 1, "error": "bad", "raw": "{}"}])
    before = table_hashes(tmp_path)
    assert set(before) == {"quarantine"}
    assert_unchanged(tmp_path, before)
    lake.quarantine([{"source": "b.jsonl", "line": 2, "error": "bad", "raw": "{}"}])
    with pytest.raises(AssertionError, match="quarantine"):
        assert_unchanged(tmp_path, before)
    assert_unchanged(tmp_path, before, allow={"quarantine"})
