"""The mutmut driver (tools/mutants/generated.py): its targets exist, its results parser and its score.

The driver's verdicts are only as honest as the parsing of mutmut's output and the scoring rule, so both
are checked against hand-written mutmut output, including the statuses that must not count as killed
and an explanation whose diff no longer matches the survivor it was written for."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from tools.mutants import generated

ROOT = Path(__file__).resolve().parents[2]


def test_every_target_names_real_files_and_unit_tests():
    names = [t.name for t in generated.TARGETS]
    assert len(names) == len(set(names)) and len(names) >= 10
    areas = {t.area for t in generated.TARGETS}
    assert {"learning", "gym", "gateway", "imports", "reviewers"} <= areas
    for t in generated.TARGETS:
        assert t.files and t.tests, t.name
        for f in (*t.files, *t.tests):
            assert (ROOT / f).is_file(), f"{t.name}: {f} is missing"
        # forked mutmut workers import the mutated copy; only in-process (unit-tier) tests can kill a mutant
        assert all(test.startswith("tests/unit/") for test in t.tests), t.name


def test_mutmut_section_is_valid_toml_restricted_to_the_target():
    t = generated.Target("x", ("tentalis_pipelines/a.py", "tentalis_pipelines/b.py"), ("tests/unit/test_a.py",), "learning")
    conf = tomllib.loads(generated.mutmut_section(t))["tool"]["mutmut"]
    assert conf["only_mutate"] == ["tentalis_pipelines/a.py", "tentalis_pipelines/b.py"]
    assert conf["pytest_add_cli_args_test_selection"] == ["tests/unit/test_a.py"]
    assert conf["source_paths"] == ["tentalis_pipelines/"]
    assert conf["process_isolation"] == "fork" and "do_not_mutate_patterns" not in conf
    t = generated.Target("x", ("tentalis_pipelines/a.py",), ("tests/unit/test_a.py",), "rewards", isolation="forkserver")
    assert tomllib.loads(generated.mutmut_section(t))["tool"]["mutmut"]["process_isolation"] == "forkserver"


def test_skip_marks_only_the_named_top_level_headers():
    src = "class Kept:\n    x = 1\n\nclass Big(Base):\n    def f(self):\n        return 1\n\ndef big_helper():\n    pass\n"
    out = generated.skip_blocks(src, ("Big",))
    assert out.splitlines()[3] == "class Big(Base):  # pragma: no mutate block"
    assert out.replace("  # pragma: no mutate block", "") == src  # nothing else changed (not big_helper)
    with pytest.raises(SystemExit, match="'Missing'"):
        generated.skip_blocks(src, ("Missing",))


RESULTS = """\
    tentalis_pipelines.training.guide.x_choose_hint__mutmut_1: killed
    tentalis_pipelines.training.guide.x_choose_hint__mutmut_2: survived
    tentalis_pipelines.training.guide.x_choose_hint__mutmut_10: timeout
    tentalis_pipelines.training.guide.xǁHintǁ__init____mutmut_3: no tests
    tentalis_pipelines.training.guide.x_f__mutmut_4: skipped
    tentalis_pipelines.training.guide.x_f__mutmut_5: suspicious
some progress line 3/5 🎉
"""


def test_parse_results_reads_every_status_and_ignores_other_lines():
    got = generated.parse_results(RESULTS)
    assert got == {
        "tentalis_pipelines.training.guide.x_choose_hint__mutmut_1": "killed",
        "tentalis_pipelines.training.guide.x_choose_hint__mutmut_2": "survived",
        "tentalis_pipelines.training.guide.x_choose_hint__mutmut_10": "timeout",
        "tentalis_pipelines.training.guide.xǁHintǁ__init____mutmut_3": "no tests",
        "tentalis_pipelines.training.guide.x_f__mutmut_4": "skipped",
        "tentalis_pipelines.training.guide.x_f__mutmut_5": "suspicious",
    }
    assert generated.parse_results("") == {}


def test_score_counts_timeouts_as_killed_and_untested_as_survivors():
    st = generated.parse_results(RESULTS)
    # scored: 1 killed, 2 survived, 10 timeout, 3 no tests, 5 suspicious (4 skipped is not scored)
    assert generated.score(st, set()) == (2, 5, pytest.approx(0.4))
    eq = {"tentalis_pipelines.training.guide.x_choose_hint__mutmut_2"}
    assert generated.score(st, eq) == (2, 4, pytest.approx(0.5))
    assert generated.score({}, set()) == (0, 0, None)
    only_skipped = {"a__mutmut_1": "skipped"}
    assert generated.score(only_skipped, set()) == (0, 0, None)


def testdiff_body_keeps_changed_lines_only():
    show = "# m: survived\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n def f():\n-    return a + 1\n+    return a - 1\n"
    assert generated.diff_body(show) == "-    return a + 1\n+    return a - 1"


def test_report_scores_an_equivalent_survivor_only_while_its_diff_matches(tmp_path, monkeypatch):
    monkeypatch.setattr(generated, "REPORTS", tmp_path)
    monkeypatch.setattr(generated, "provenance", lambda target: ("abc1234", False))
    t = generated.Target("demo", ("tentalis_pipelines/training/guide.py",), ("tests/unit/test_guide.py",), "learning")
    result = {"statuses": {"m__mutmut_1": "killed", "m__mutmut_2": "survived"},
              "diffs": {"m__mutmut_2": "-    x = 1\n+    x = 2"}, "seconds": 1.0}
    fresh = {"m__mutmut_2": {"kind": "equivalent", "diff": "-    x = 1\n+    x = 2", "reason": "x is never read"}}
    assert generated.write_report(t, result, fresh, 1) == (1, 1, 1.0)
    assert "x is never read" in (tmp_path / "demo.md").read_text()
    stale = {"m__mutmut_2": {"kind": "equivalent", "diff": "-    y = 1\n+    y = 2", "reason": "old"}}
    assert generated.write_report(t, result, stale, 1) == (1, 2, 0.5)
    text = (tmp_path / "demo.md").read_text()
    assert "STALE" in text and "old" not in text
    assert generated.write_report(t, result, {}, 1) == (1, 2, 0.5)
    assert "UNEXPLAINED" in (tmp_path / "demo.md").read_text()


def test_unknown_target_is_an_error_naming_the_fix(capsys):
    with pytest.raises(SystemExit):
        generated.main(["--only", "no_such_target"])
    assert "--list" in capsys.readouterr().err


def test_report_names_the_commit_the_tree_was_copied_at(tmp_path, monkeypatch):
    monkeypatch.setattr(generated, "REPORTS", tmp_path)
    monkeypatch.setattr(generated, "provenance", lambda target: ("now0000", False))
    t = generated.Target("demo", ("tentalis_pipelines/training/guide.py",), ("tests/unit/test_guide.py",), "learning")
    result = {"statuses": {"m__mutmut_1": "killed"}, "diffs": {}, "seconds": 1.0, "commit": "copied1", "dirty": True}
    generated.write_report(t, result, {}, 1)
    text = (tmp_path / "demo.md").read_text()
    assert "`copied1` + uncommitted edits" in text and "now0000" not in text
