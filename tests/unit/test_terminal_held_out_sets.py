"""The terminal held-out sets beside the levels' splits: a kind held out of training whole
(``--hold-out-kind``, benchmark ``terminal-l1-<kind>``) and the level in other words
(``terminal-l1-paraphrased``); checked from their contracts (what training can and cannot reach)."""

from __future__ import annotations

import json
import re

import pytest

from tentalis_pipelines.envs.terminal_tasks import FAMILIES, PARAPHRASED, make_task
from tentalis_pipelines.evaluation.benchmarks import (
    BENCHMARKS,
    is_environment_benchmark,
    load_benchmark,
)
from tentalis_pipelines.tasks.batches import (
    HELD_OUT_SEED_BASE,
    check_excluded_families,
    check_training_seed,
    register_terminal_batch,
    terminal_evaluation_tasks,
    terminal_fingerprint,
    terminal_held_out_tasks,
    terminal_kind_held_out_tasks,
    terminal_paraphrased_tasks,
    terminal_training_tasks,
)


def test_training_batches_never_hold_an_excluded_kind_and_keep_their_size():
    for excluded in (("last_line",), ("last_line", "count_lines"), ("find_line", "nth_field", "line_n", "count_matching", "count_lines")):
        tasks = terminal_training_tasks(3, 25, (1,), excluded)
        assert len(tasks) == 25
        kinds = {t.family for t in tasks}
        assert kinds.isdisjoint(excluded)
        assert kinds == set(FAMILIES[1]) - set(excluded)  # every kind left appears
        assert all(t.split == "train" for t in tasks)


def test_no_exclusion_is_the_batch_as_before_and_the_empty_values_mean_none():
    before = [t.task_id for t in terminal_training_tasks(4, 12, (1, 2))]
    assert [t.task_id for t in terminal_training_tasks(4, 12, (1, 2), ())] == before
    assert check_excluded_families((1,), ()) == ()
    # duplicates collapse, the order is canonical
    assert check_excluded_families((1,), ("last_line", "count_lines", "last_line")) == ("count_lines", "last_line")


def test_an_exclusion_only_touches_the_level_that_has_the_kind():
    tasks = terminal_training_tasks(5, 12, (1, 2), ("last_line",))
    assert sorted({t.level for t in tasks}) == [1, 2]
    assert [t.level for t in tasks].count(2) == 6
    level2 = [t.task_id for t in tasks if t.level == 2]
    assert level2 == [t.task_id for t in terminal_training_tasks(5, 12, (1, 2)) if t.level == 2]


@pytest.mark.parametrize(("levels", "kinds", "words"), [
    ((1,), ("tail",), "not a task kind of levels [1]"),
    ((2,), ("last_line",), "not a task kind of levels [2]"),
    ((1,), tuple(FAMILIES[1]), "leaves level 1 no task kind"),
])
def test_a_bad_exclusion_is_refused_naming_the_kinds(levels, kinds, words):
    with pytest.raises(ValueError, match=re.escape(words)) as info:
        check_excluded_families(levels, kinds)
    if "not a task kind" in words:
        assert all(k in str(info.value) for k in FAMILIES[levels[0]])  # the kinds there are, to choose from


def test_the_manifest_records_the_exclusion_and_the_id_says_so(tmp_path):
    plain = register_terminal_batch(tmp_path, seed=2, num_tasks=8, levels=(1,))
    held = register_terminal_batch(tmp_path, seed=2, num_tasks=8, levels=(1,), exclude_families=("last_line",))
    assert plain != held and held.endswith("-x1")
    assert "exclude_families" not in json.loads((tmp_path / plain / "manifest.json").read_text())
    assert json.loads((tmp_path / held / "manifest.json").read_text())["exclude_families"] == ["last_line"]
    with pytest.raises(ValueError, match="not a task kind"):
        register_terminal_batch(tmp_path, seed=2, num_tasks=8, levels=(1,), exclude_families=("nope",))


def test_a_kind_set_is_that_kind_only_from_a_reserved_seed_and_unlike_any_training_task():
    tasks = terminal_kind_held_out_tasks(1, "last_line")
    assert len(tasks) == 30 and {t.family for t in tasks} == {"last_line"}
    assert len({terminal_fingerprint(t) for t in tasks}) == 30  # 30 different tasks
    assert all(t.seed >= HELD_OUT_SEED_BASE for t in tasks)
    with pytest.raises(ValueError, match="reserved"):
        check_training_seed(tasks[0].seed)
    training = {terminal_fingerprint(t) for s in (0, 1, 2, 3) for t in terminal_training_tasks(s, 60, (1,))}
    assert training.isdisjoint(terminal_fingerprint(t) for t in tasks)


def test_the_paraphrased_set_asks_the_same_kinds_in_other_words_over_other_files():
    para = terminal_paraphrased_tasks(1)
    plain = terminal_held_out_tasks((1,))
    assert len(para) == 30
    assert [t.family for t in para] == [list(PARAPHRASED[1])[i % 6] for i in range(30)]
    plain_words = {t.instruction.split(" ")[0] for t in plain}
    assert all(t.metadata == {"wording": "paraphrased"} and t.task_id.endswith("-para") for t in para)
    # other wording: no paraphrased instruction starts like a default one, and no file name is shared
    assert not plain_words & {t.instruction.split(" ")[0] for t in para}
    assert not {p for t in plain for p in t.tree} & {p for t in para for p in t.tree}
    # the same check kind and a one-command-then-submit solution, as level 1's
    assert all(t.kind == "answer" and len(t.solution) == 2 and t.solution[1].startswith("submit ") for t in para)
    # the answer is never written in the instruction
    assert all(t.check["expected"] not in t.instruction for t in para if len(t.check["expected"]) > 3)


def test_make_task_refuses_an_unknown_wording_kind_or_level():
    with pytest.raises(ValueError, match="wording"):
        make_task(1, 0, wording="other")
    with pytest.raises(ValueError, match="no task kind 'tail'"):
        make_task(1, 0, family="tail")
    with pytest.raises(ValueError, match="level 2 has no paraphrased tasks"):
        make_task(2, 0, wording="paraphrased")


def test_the_default_round_robin_tasks_did_not_move():
    # the stored tasks and benchmark items keep their ids and content: the kind-fixed path salts its seed,
    # the default path does not
    t = make_task(1, 5, seed=0)
    assert t.task_id == "terminal-s0-l1-0005-last_line"
    fixed = make_task(1, 5, seed=0, family="last_line")
    assert fixed.family == "last_line" and fixed.tree != t.tree  # its own random stream
    assert t == make_task(1, 5, seed=0)
    assert terminal_fingerprint(t) == terminal_fingerprint(make_task(1, 5, seed=0))


def test_the_benchmarks_load_and_are_environment_benchmarks():
    for name in ("terminal-l1-paraphrased", "terminal-l1-last_line", "terminal-l3-replace_word"):
        assert name in BENCHMARKS and is_environment_benchmark(name)
        _, items = load_benchmark(name)
        assert len(items) == 30 and all(it.environment == "terminal" for it in items)
    _, items = load_benchmark("terminal-l1-last_line", limit=4)
    assert len(items) == 4


def test_the_contamination_guard_screens_every_evaluation_set():
    every = {terminal_fingerprint(t) for t in terminal_evaluation_tasks()}
    for task in [*terminal_paraphrased_tasks(1), *terminal_kind_held_out_tasks(3, "sort_in_place"), *terminal_held_out_tasks((0,))]:
        assert terminal_fingerprint(task) in every
