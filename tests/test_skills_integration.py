"""Skills from failures: distillation, merging, retrieval with real MiniLM embeddings, injection into
prompts (recorded as skill_ids), and the verification rule in both directions."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import numpy as np
import pytest

from tentalis_pipelines.inference.prompts import SKILLS_HEADER
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.skills import library
from tentalis_pipelines.skills.embedder import embed
from tentalis_pipelines.skills.library import (
    OPERATION_LESSONS,
    TEMPLATES,
    Failure,
    decide,
    distil,
    merge,
    retrieve,
)

NOW = datetime(2026, 11, 23, 3, 0, tzinfo=timezone.utc)
SUB_Q = "Ava has 12 apples and gives away 5. How many apples are left?"

# Hand-made reviews in the verifier's words (rewards/managers.py), one per failure type.
REVIEWS = [
    Failure("r1", 0.0, "No final answer given.", "Finish with the final number inside <answer></answer>.", task_prompt=SUB_Q),
    Failure("r2", 0.0, "No final answer given (ran out of tokens).", "Finish with the final number inside <answer></answer>.", task_prompt=SUB_Q),
    Failure("r3", 0.7, "Right number (7) but the work is not in the required <step>/<answer> format.",
            "Write each step in <step></step> and only the final number in <answer></answer>.", task_prompt=SUB_Q),
    Failure("r4", 0.1, "Answered 8, expected 7; step 1: 12 - 5 = 8 is wrong (it is 7).", "Recheck the arithmetic in step 1.", task_prompt=SUB_Q),
    Failure("r5", 0.1, "Answered 17, expected 7.", "Reread the question: which quantities combine, and how?", task_prompt=SUB_Q),
    Failure("r6", 1.0, "Correct: 7, shown in 1 step(s).", "", task_prompt=SUB_Q),
    Failure("r7", 0.0, "No final answer given.", "Finish with the final number inside <answer></answer>.", task_prompt="Ben has 3 cards."),
]








def test_merge_accumulates_sources_and_joins_near_duplicates():
    lessons = distil(REVIEWS)
    rows, counts = merge([], lessons, embed, now=NOW)
    by_text = {r["text"]: r for r in rows}
    # Six lessons, five distinct texts: r1 and r7 (both "no answer") are one skill with both reviews.
    assert counts == {"lessons": 6, "new_skills": 5, "merged_into_existing": 0}
    assert by_text[TEMPLATES["no_answer"]]["source_review_ids"] == ["r1", "r7"]
    assert by_text[TEMPLATES["no_answer"]]["support"] == 2
    assert all(r["status"] == "candidate" for r in rows)
    assert all(abs(np.linalg.norm(r["embedding"]) - 1.0) < 1e-4 for r in rows)
    # Distilling the same reviews again changes nothing.
    again, counts = merge(rows, lessons, embed, now=NOW)
    assert again == [] and counts["new_skills"] == 0
    # Same text up to case and punctuation: the same skill id.
    same = library.Lesson(TEMPLATES["format"].upper() + "!", "format", "template", "r8")
    # A paraphrase above the cosine threshold joins the existing skill instead of making a new one.
    para = library.Lesson("Always finish with the final number inside the <answer></answer> tags, even if unsure.", "no_answer", "llm", "r9")
    other = library.Lesson("Draw a picture of the boxes before multiplying.", "other", "llm", "r10")
    changed, counts = merge(rows, [same, para, other], embed, now=NOW)
    changed = {r["skill_id"]: r for r in changed}
    fmt, noans = library.skill_id(TEMPLATES["format"]), library.skill_id(TEMPLATES["no_answer"])
    assert library.skill_id(same.text) == fmt and changed[fmt]["source_review_ids"] == ["r3", "r8"]
    assert changed[noans]["source_review_ids"] == ["r1", "r7", "r9"] and changed[noans]["text"] == TEMPLATES["no_answer"]
    assert counts == {"lessons": 3, "new_skills": 1, "merged_into_existing": 2}


def _skill(text: str, status: str = "verified", **kw) -> dict:
    [vec] = embed([text])
    return {"skill_id": library.skill_id(text), "text": text, "failure_type": "other", "embedding": [float(x) for x in vec],
            "source_review_ids": ["r1"], "support": 1, "source": "template", "status": status, "gain": None, "ci_low": None,
            "ci_high": None, "n": None, "measured_on": None, "measured_at": None, "verified_at": None, "created_at": NOW,
            "updated_at": NOW, **kw}






def _write_tasks(lake: Lakehouse, batch_id: str, prompts: list[str]) -> None:
    lake.write_batch("tasks", batch_id, [
        {"batch_id": batch_id, "task_id": f"t{i}", "source": "test", "environment": "math", "prompt": p, "reference": "7",
         "difficulty": 1, "metadata": "{}", "created_at": NOW} for i, p in enumerate(prompts)])


def test_rollouts_and_benchmark_items_record_the_injected_skills(home, tiny_model_dir):
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.stages.evaluation import benchmark_checkpoint
    from tentalis_pipelines.stages.rollouts import build_rollouts

    paths = Paths.from_env(str(home)).ensure()
    lake = Lakehouse(paths.lakehouse)
    sub, fmt = _skill(OPERATION_LESSONS["subtract"]), _skill(TEMPLATES["format"])
    cand = _skill(OPERATION_LESSONS["multiply"], status="candidate")  # never injected: not verified
    lake.replace_in("skills", "skill_id", [s["skill_id"] for s in (sub, fmt, cand)], [sub, fmt, cand])
    _write_tasks(lake, "b1", [SUB_Q, "Dev buys 4 boxes with 6 pencils in each box. How many pencils is that in total?"])
    backend = PolicySettings(model=str(tiny_model_dir)).make_backend(tiny_model_dir)

    on = PolicySettings(model=str(tiny_model_dir), num_generations=2, max_new_tokens=4, skills_top_k=1)
    build_rollouts(lake, paths, "b1", on, backend=backend)
    rows = lake.read("rollouts", batch_id="b1").to_pylist()
    assert len(rows) == 4
    for r in rows:
        assert len(r["skill_ids"]) == 1 and (r["task_id"] != "t0" or r["skill_ids"] == [sub["skill_id"]])
        assert cand["skill_id"] not in r["skill_ids"]
        [sid] = r["skill_ids"]
        assert {sub["skill_id"]: sub, fmt["skill_id"]: fmt}[sid]["text"] in r["prompt_text"]

    off = PolicySettings(model=str(tiny_model_dir), num_generations=2, max_new_tokens=4)
    build_rollouts(lake, paths, "b1", off, backend=backend)
    rows = lake.read("rollouts", batch_id="b1").to_pylist()
    assert all(r["skill_ids"] == [] and SKILLS_HEADER not in r["prompt_text"] for r in rows)

    benchmark_checkpoint(lake, paths, on, "base", "arithmetic", limit=3, backend=backend, max_new_tokens=4)
    items = lake.read("benchmark_items").to_pylist()
    assert len(items) == 3 and all(len(i["skill_ids"]) == 1 and i["skill_ids"][0] in (sub["skill_id"], fmt["skill_id"]) for i in items)
    assert '"skills_top_k": 1' in lake.read("benchmark_results").to_pylist()[0]["config"]


# ------------------------------------------------------------------------------------------ the rule
def _outcomes(with_right: int, without_right: int, both: int, n: int = 32) -> tuple[dict, dict]:
    """n items: ``both`` right in both runs, then ``with_right`` right only with the skill, then
    ``without_right`` right only without it; the rest wrong in both."""
    w, wo = {}, {}
    for k in range(n):
        w[f"i{k}"] = k < both or both <= k < both + with_right
        wo[f"i{k}"] = k < both or both + with_right <= k < both + with_right + without_right
    return w, wo










# ------------------------------------------------------------------------------------------ the stage
class LessonFollower:
    """A scripted policy for the verification stage: it answers an item right when the prompt holds the
    ``helps`` lesson or, without any lesson, on even items only; the ``hurts`` lesson makes it wrong."""

    name, model_name = "scripted", "scripted"

    def __init__(self, tokenizer, helps: str, hurts: str):
        self.tokenizer, self.helps, self.hurts = tokenizer, helps, hurts

    def generate(self, prompts, params):
        from tentalis_pipelines.inference.base import Generation
        from tentalis_pipelines.tasks.arithmetic import generate_arithmetic

        items = generate_arithmetic(32, seed=2_000_000, levels=(1, 2), prefix="skillval")
        answers = {t.prompt: t.answer for t in items}
        out = []
        for p in prompts:
            question = next(q for q in answers if q in p)
            k = [t.prompt for t in items].index(question)
            right = self.helps in p or (self.hurts not in p and k % 2 == 0)
            text = f"<step>work</step><answer>{answers[question] if right else -1}</answer>"
            out.append([Generation(text=text, token_ids=[], finish_reason="stop", prompt_tokens=0, seconds=0.0)])
        return out




def test_a_cycle_with_skills_runs_skills_job_on_the_batch(home, tiny_model_dir):
    """`learn --skills` wiring through the real definitions and an ephemeral Dagster instance: the
    skills job distils the batch's failed reviews and measures the most supported candidate on base."""
    from dagster import DagsterInstance

    from jobs.runner import CycleOptions, run_cycle
    from tentalis_pipelines.definitions import defs
    from tentalis_pipelines.settings import Paths

    paths = Paths.from_env(str(home)).ensure()
    policy = {"model": str(tiny_model_dir), "num_generations": 2, "max_new_tokens": 8, "skills_top_k": 3}
    opts = CycleOptions(num_tasks=3, seed=11, levels=(1,), train=False, skills=True, resources={"policy": {"config": policy}},
                        skills_config={"validation_items": 8, "max_new_tokens": 8})  # CPU-cheap; the defaults are 32 and 128
    with DagsterInstance.ephemeral() as instance:
        out = run_cycle(defs, instance, paths, opts)
    assert [r.job for r in out["runs"]] == ["rollout_job", "skills_job"]
    lake = Lakehouse(paths.lakehouse)
    rollouts = lake.read("rollouts", batch_id=out["batch_id"]).to_pylist()
    assert len(rollouts) == 6 and all(r["skill_ids"] == [] for r in rollouts)  # nothing verified yet
    failed = {r["rollout_id"] for r in lake.read("reviews", batch_id=out["batch_id"]).to_pylist() if r["score"] < 0.75}
    skills = lake.read("skills").to_pylist()
    assert failed and skills  # a random tiny model fails
    assert set().union(*(s["source_review_ids"] for s in skills)) == failed
    [decision] = lake.read("skill_decisions").to_pylist()
    top = max(skills, key=lambda s: (s["support"], -s["created_at"].timestamp()))
    assert (decision["skill_id"], decision["checkpoint_id"], decision["n"], decision["kind"]) == (top["skill_id"], "base", 8, "verify")
    expected, _ = decide("candidate", library.SkillEffect(decision["n"], decision["wins"], decision["losses"], decision["with_accuracy"],
                                                           decision["without_accuracy"], decision["gain"], decision["ci_low"], decision["ci_high"]))
    assert decision["to_status"] == expected
    assert decision["gain"] == pytest.approx((decision["wins"] - decision["losses"]) / 8)


def test_the_llm_distiller_writes_one_line_per_failure_from_the_review(tiny_model_dir):
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.skills.llm_distiller import LLMDistiller

    distiller = LLMDistiller(PolicySettings(model=str(tiny_model_dir)).make_backend(tiny_model_dir), max_new_tokens=12)
    prompt = distiller.prompt(REVIEWS[4])
    assert REVIEWS[4].critique in prompt and REVIEWS[4].hint in prompt and SUB_Q in prompt
    out = distiller(REVIEWS[:3])
    assert len(out) == 3 and all(t is None or (isinstance(t, str) and "\n" not in t) for t in out)
    # Whatever a (here random) model writes, each failure still gets one lesson of at most 200 characters.
    lessons = distil(REVIEWS[:3], llm=distiller)
    assert len(lessons) == 3 and all(0 < len(ls.text) <= library.MAX_SKILL_CHARS for ls in lessons)


def test_retrieval_returns_the_most_similar_skill():
    sub, fmt, mul = _skill(OPERATION_LESSONS["subtract"]), _skill(TEMPLATES["format"]), _skill(OPERATION_LESSONS["multiply"])
    questions = [SUB_Q, "Dev buys 4 boxes with 6 pencils in each box. How many pencils is that in total?"]
    top = retrieve(questions, [fmt, mul, sub], embed, top_k=1)
    assert [t[0]["skill_id"] for t in top] == [sub["skill_id"], mul["skill_id"]]
    assert [len(t) for t in retrieve(questions, [fmt, mul, sub], embed, top_k=5)] == [3, 3]  # k capped at the library
    assert retrieve(questions, [fmt], embed, top_k=0) == [[], []]


def test_stage_verifies_a_helpful_candidate_and_retires_a_skill_that_hurts(tmp_path, embedded_model_dir):
    from transformers import AutoTokenizer

    from tentalis_pipelines.stages.skills import build_skills

    lake = Lakehouse(tmp_path / "lh")
    _write_tasks(lake, "b1", [SUB_Q, "Ben has 3 cards."])
    lake.write_batch("rollouts", "b1", [{"batch_id": "b1", "rollout_id": rid, "task_id": tid} for rid, tid in (("r1", "t0"), ("r7", "t1"), ("r5", "t0"))])
    lake.write_batch("reviews", "b1", [{"batch_id": "b1", "rollout_id": f.review_id, "manager": "verifier", "score": f.score,
                                        "critique": f.critique, "hint": f.hint, "created_at": NOW} for f in REVIEWS if f.review_id in ("r1", "r7", "r5")])
    hurts = _skill(TEMPLATES["format"], status="verified", measured_on="older-ckpt", measured_at=NOW)
    lake.replace_in("skills", "skill_id", [hurts["skill_id"]], [hurts])
    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    built = []

    def make_backend():
        built.append(1)
        return LessonFollower(tok, helps=TEMPLATES["no_answer"], hurts=TEMPLATES["format"])

    res = build_skills(lake, "b1", policy_version="ckpt-1", make_backend=make_backend)
    skills = {s["skill_id"]: s for s in lake.read("skills").to_pylist()}
    noans, sub = library.skill_id(TEMPLATES["no_answer"]), library.skill_id(OPERATION_LESSONS["subtract"])
    # Distilled: "no answer" (r1, r7: the most supported, verified first) and the subtraction lesson (r5).
    assert skills[noans]["source_review_ids"] == ["r1", "r7"] and skills[sub]["source_review_ids"] == ["r5"]
    # The helpful one: right on all 32 with it, 16 without (the even items) -> gain 16/32, verified.
    assert skills[noans]["status"] == "verified" and skills[noans]["gain"] == pytest.approx(0.5) and skills[noans]["n"] == 32
    assert skills[noans]["measured_on"] == "ckpt-1" and skills[noans]["verified_at"] is not None
    # The verified skill that now hurts (wrong on every item): gain -16/32, retired.
    assert skills[hurts["skill_id"]]["status"] == "retired" and skills[hurts["skill_id"]]["gain"] == pytest.approx(-0.5)
    # One candidate per run: the subtraction lesson waits, unmeasured.
    assert skills[sub]["status"] == "candidate" and skills[sub]["gain"] is None
    decisions = {d["skill_id"]: d for d in lake.read("skill_decisions").to_pylist()}
    assert set(decisions) == {noans, hurts["skill_id"]}
    assert (decisions[noans]["kind"], decisions[noans]["from_status"], decisions[noans]["to_status"]) == ("verify", "candidate", "verified")
    assert (decisions[noans]["wins"], decisions[noans]["losses"]) == (16, 0)
    assert (decisions[hurts["skill_id"]]["kind"], decisions[hurts["skill_id"]]["to_status"]) == ("recheck", "retired")
    assert re.search(r"retired: gain no longer positive \(gain -0\.500", decisions[hurts["skill_id"]]["rule"])
    assert res.metadata["decisions"] == 2 and built == [1]

    # The next run on the same policy measures the waiting candidate (it does not help: it stays a
    # candidate) and re-checks nothing (the verified skill was measured on this policy already).
    build_skills(lake, "b1", policy_version="ckpt-1", make_backend=make_backend)
    skills = {s["skill_id"]: s for s in lake.read("skills").to_pylist()}
    assert skills[sub]["status"] == "candidate" and skills[sub]["gain"] == pytest.approx(0.0)
    assert len(lake.read("skill_decisions").to_pylist()) == 3
    # Nothing left to measure on this policy: the backend is not even built.
    build_skills(lake, "b1", policy_version="ckpt-1", make_backend=make_backend)
    assert built == [1, 1]


def test_learn_with_skills_verifies_on_its_own_task_source_and_length(home, monkeypatch):
    from typer.testing import CliRunner

    from tentalis_pipelines.cli import app
    from tentalis_pipelines.cli import cycle as cli_cycle

    seen = []
    monkeypatch.setattr(cli_cycle, "_execute_cycle", lambda opts, label: seen.append(opts) or {})
    result = CliRunner().invoke(app, ["learn", "--cycles", "1", "--tasks", "gsm8k", "--max-new-tokens", "192", "--skills", "--home", str(home)])
    assert seen, result.output
    assert (seen[0].task_source, seen[0].skills, seen[0].skills_config) == ("gsm8k", True, {"validation_source": "gsm8k", "max_new_tokens": 192})
