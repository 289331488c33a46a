"""Skills from failures: distillation, merging, retrieval with real MiniLM embeddings, injection into
prompts (recorded as skill_ids), and the verification rule in both directions."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tentalis_pipelines.inference.prompts import SKILLS_HEADER, render_prompt
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.skills import library
from tentalis_pipelines.skills.embedder import embed
from tentalis_pipelines.skills.library import (
    OPERATION_LESSONS,
    STEP_LESSONS,
    TEMPLATES,
    Failure,
    SkillSettings,
    decide,
    distil,
    skill_effect,
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


def test_distillation_gives_the_template_of_each_failure_type():
    lessons = {ls.review_id: ls for ls in distil(REVIEWS, threshold=0.75)}
    assert set(lessons) == {"r1", "r2", "r3", "r4", "r5", "r7"}  # r6 scored 1.0: not a failure
    assert lessons["r1"].text == TEMPLATES["no_answer"] and lessons["r1"].failure_type == "no_answer"
    assert lessons["r2"].text == TEMPLATES["length"] and lessons["r2"].failure_type == "length"
    assert lessons["r3"].text == TEMPLATES["format"] and lessons["r3"].failure_type == "format"
    # The wrong equation was a subtraction; the question asked for one ("gives away ... left").
    assert lessons["r4"].text == STEP_LESSONS["subtract"] and lessons["r4"].failure_type == "wrong_step"
    assert lessons["r5"].text == OPERATION_LESSONS["subtract"] and lessons["r5"].failure_type == "wrong_operation"
    # A wrong multiplication in a question that adds is a wrong operation: the lesson is the addition one.
    [mixed] = distil([Failure("m1", 0.0, "Answered 4, expected 22; step 1: 14 x 8 = 4 is wrong (it is 112).", "Recheck the arithmetic in step 1.",
                              task_prompt="Ben has 14 cards and gets 8 more. How many cards does Ben have now?")])
    assert (mixed.text, mixed.failure_type) == (OPERATION_LESSONS["add"], "wrong_operation")
    assert all(ls.source == "template" and len(ls.text) <= library.MAX_SKILL_CHARS for ls in lessons.values())
    # A stricter threshold keeps only the worst: the 0.7 format review is no longer a failure.
    assert "r3" not in {ls.review_id for ls in distil(REVIEWS, threshold=0.5)}


def test_the_operation_of_a_question_is_read_from_whole_words():
    assert library.operation_of_prompt(SUB_Q) == "subtract"
    assert library.operation_of_prompt("Kim has a plate of 5 cookies and gets 3 more. How many cookies now?") == "add"  # not "ate"
    assert library.operation_of_prompt("Dev buys 4 boxes with 6 pencils in each box.") == "multiply"
    assert library.operation_of_prompt("What is the capital of France?") is None


def test_free_text_hints_and_llm_lessons_are_used_as_written_and_bad_ones_fall_back():
    human = Failure("h1", 0.2, "The total is off.", "Add the two amounts before answering. Also show your work.", manager="human")
    [ls] = distil([human])
    assert ls.text == "Add the two amounts before answering." and ls.source == "template"
    # The llm's sentence wins when usable; an empty or too-short reply falls back to the template.
    out = distil(REVIEWS[:2], llm=lambda fs: ["Always end with the answer tag.", "ok"])
    assert out[0].text == "Always end with the answer tag." and out[0].source == "llm"
    assert out[1].text == TEMPLATES["length"] and out[1].source == "template"


def _skill(text: str, status: str = "verified", **kw) -> dict:
    [vec] = embed([text])
    return {"skill_id": library.skill_id(text), "text": text, "failure_type": "other", "embedding": [float(x) for x in vec],
            "source_review_ids": ["r1"], "support": 1, "source": "template", "status": status, "gain": None, "ci_low": None,
            "ci_high": None, "n": None, "measured_on": None, "measured_at": None, "verified_at": None, "created_at": NOW,
            "updated_at": NOW, **kw}


def test_injection_changes_the_prompt_only_when_skills_are_given(smol_tokenizer):
    tok = smol_tokenizer
    plain = render_prompt(tok, SUB_Q)
    assert SKILLS_HEADER not in plain and render_prompt(tok, SUB_Q, skills=[]) == plain
    with_skill = render_prompt(tok, SUB_Q, skills=[OPERATION_LESSONS["subtract"]])
    assert f"{SKILLS_HEADER}\n- {OPERATION_LESSONS['subtract']}" in with_skill
    # The lesson sits in the system message, before the task.
    assert with_skill.index(OPERATION_LESSONS["subtract"]) < with_skill.index(SUB_Q)


def _write_tasks(lake: Lakehouse, batch_id: str, prompts: list[str]) -> None:
    lake.write_batch("tasks", batch_id, [
        {"batch_id": batch_id, "task_id": f"t{i}", "source": "test", "environment": "math", "prompt": p, "reference": "7",
         "difficulty": 1, "metadata": "{}", "created_at": NOW} for i, p in enumerate(prompts)])


# ------------------------------------------------------------------------------------------ the rule
def _outcomes(with_right: int, without_right: int, both: int, n: int = 32) -> tuple[dict, dict]:
    """n items: ``both`` right in both runs, then ``with_right`` right only with the skill, then
    ``without_right`` right only without it; the rest wrong in both."""
    w, wo = {}, {}
    for k in range(n):
        w[f"i{k}"] = k < both or both <= k < both + with_right
        wo[f"i{k}"] = k < both or both + with_right <= k < both + with_right + without_right
    return w, wo


def test_effect_is_the_paired_mean_difference():
    w, wo = _outcomes(with_right=5, without_right=1, both=10)
    e = skill_effect(w, wo)
    assert (e.n, e.wins, e.losses) == (32, 5, 1)
    assert e.gain == pytest.approx((5 - 1) / 32) and e.with_accuracy == pytest.approx(15 / 32) and e.without_accuracy == pytest.approx(11 / 32)
    assert e.ci_low < e.gain < e.ci_high
    with pytest.raises(ValueError, match="both with and without"):
        skill_effect({"a": True}, {"b": True})


@pytest.mark.parametrize("wins,losses,status,expected", [
    (4, 0, "candidate", "verified"),     # helps on 4 items, hurts on none: interval [0, +]
    (2, 0, "candidate", "verified"),     # the least that verifies: 2 net wins, interval [0, +]
    (1, 0, "candidate", "candidate"),    # one item's flip is not enough (1 net win < 2)
    (3, 1, "candidate", "candidate"),    # 2 net wins, but the interval reaches below 0
    (0, 4, "candidate", "candidate"),    # hurts: never verified
    (0, 0, "candidate", "candidate"),    # no effect: not verified
    (5, 4, "candidate", "candidate"),    # a net gain of 1 item, but the interval reaches well below 0
    (3, 0, "verified", "verified"),      # still helps: kept
    (0, 2, "verified", "retired"),       # stopped helping: retired
    (1, 1, "verified", "retired"),       # no longer a gain: retired
])
def test_promotion_and_retirement_rule(wins, losses, status, expected):
    e = skill_effect(*_outcomes(with_right=wins, without_right=losses, both=8))
    new, rule = decide(status, e)
    assert new == expected, rule
    assert f"{wins} won / {losses} lost of 32" in rule


def test_a_skill_that_hurts_is_never_verified_even_with_a_lax_bound():
    for losses in (1, 3, 10):
        e = skill_effect(*_outcomes(with_right=0, without_right=losses, both=5))
        assert e.gain < 0 and decide("candidate", e, min_ci_low=-1.0)[0] == "candidate"


def test_settings_refuse_a_validation_seed_that_overlaps_training_or_the_gate():
    with pytest.raises(ValueError, match="validation_seed"):
        SkillSettings(validation_seed=1_000_000)
    with pytest.raises(ValueError, match="validation_seed"):
        SkillSettings(validation_seed=42)


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


def test_a_dataset_validation_set_is_the_datasets_reserved_train_tail(tmp_path, monkeypatch):
    """Skills distilled from GSM8K failures are verified on GSM8K questions no batch trains on, with the
    `#### N` answer as the reference; arithmetic stays the default."""
    import json

    from tentalis_pipelines.stages.skills import validation_items, validation_label
    from tentalis_pipelines.tasks.batches import register_dataset_batch

    (tmp_path / "gsm8k").mkdir()
    rows = [{"question": f"Ann has {i} apples and buys 2 more. How many now?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(40)]
    (tmp_path / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(tmp_path))
    settings = library.SkillSettings(validation_source="gsm8k", validation_items=6)
    items = validation_items(settings)
    assert [it.item_id for it in items] == [f"skillval-gsm8k-{k:03d}" for k in range(6)]
    by_question = {r["question"]: str(int(r["answer"].rsplit("#### ", 1)[1])) for r in rows}
    assert all(it.prompt in by_question and it.reference == by_question[it.prompt] for it in items)
    trained = {json.loads(x)["question"] for _ in range(3)
               for x in (tmp_path / "b" / register_dataset_batch(tmp_path / "b", tmp_path, "gsm8k", num_tasks=8) / "tasks.jsonl").read_text().splitlines()}
    assert not trained & {it.prompt for it in items}
    assert validation_label(settings, 6) == "gsm8k train reserved tail n=6 greedy"
    assert validation_items(library.SkillSettings())[0].item_id.startswith("skillval")  # arithmetic by default
    assert validation_label(library.SkillSettings(), 32) == "arithmetic seed=2000000 n=32 levels=1,2 greedy"
    with pytest.raises(ValueError, match="validation_source 'math': choose arithmetic or one of \\['gsm8k'\\]"):
        library.SkillSettings(validation_source="math")
    monkeypatch.delenv("TENTALIS_DATA_DIR")
    with pytest.raises(ValueError, match="reads its training split from TENTALIS_DATA_DIR, which is not set"):
        validation_items(settings)
