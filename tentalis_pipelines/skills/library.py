"""The skill library: distil failures into lessons, merge duplicates, retrieve, and the verification rule.

Plain functions over rows (dicts shaped like the ``skills`` and ``skill_decisions`` tables); the
``skills`` stage (``stages/skills.py``) reads and writes the tables around them.

* **Distil**: a review scored below a threshold is a failure. Its type (no answer, ran out of tokens,
  format, wrong step, wrong operation) comes from the review's critique and hint; a template turns the
  type (and, for arithmetic, the operation involved) into one imperative sentence. An llm manager's
  own hint is used as the lesson when it is a usable sentence.
* **Merge**: the same normalised text, or an embedding cosine at or above ``merge_cosine`` with an
  existing skill, is one skill; its ``source_review_ids`` accumulate.
* **Retrieve**: the top-k *verified* skills by cosine between the task prompt and the skill text.
* **Verify**: a paired comparison on the same validation items, greedy, with the skill alone in the
  prompt versus no skill (see :func:`skill_effect` and :func:`decide`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from tentalis_pipelines.config_fields import config_field
from tentalis_pipelines.statistics import paired_bootstrap

MAX_SKILL_CHARS = 200
STATUSES = ("candidate", "verified", "retired")
FAILURE_TYPES = ("no_answer", "length", "format", "wrong_step", "wrong_operation", "other")

# ------------------------------------------------------------------------------------------ templates
# One lesson per (failure type, operation). The texts name the situation in the words task prompts use
# ("gives away", "boxes ... in each"), so that a prompt retrieves the lesson about its own operation.
OPERATION_LESSONS = {
    "subtract": "When something is given away, eaten or lost, subtract it: left = start - amount taken away; check by adding back.",
    "add": "When more items are received or two amounts are combined, add them: total = first + second; recheck the sum digit by digit.",
    "multiply": "When there are several boxes, bags or packs of the same size, multiply: total = number of groups * items in each.",
    "divide": "When items are shared equally, divide: each share = total / number of groups; check by multiplying back.",
}
STEP_LESSONS = {
    "subtract": "Check every subtraction before moving on: the difference plus the amount taken away must give back the start.",
    "add": "Check every addition before moving on: add the ones, then the tens, and carry when a column passes 9.",
    "multiply": "Check every multiplication before moving on: recompute groups * items in each, for example as repeated addition.",
    "divide": "Check every division before moving on: the quotient times the divisor must give back the total.",
}
TEMPLATES = {
    "no_answer": "Always finish with the final number inside <answer></answer> tags, even when unsure.",
    "length": "Keep each step short so the final <answer></answer> comes before the length limit.",
    "format": "Write each step inside <step></step> tags and put only the final number inside <answer></answer>.",
    "wrong_step": "Recheck the arithmetic of each step before writing the next one.",
    "wrong_operation": "Reread the question to decide which quantities combine and whether to add, subtract, multiply or divide.",
}
# Words of a task prompt that say which operation it asks for, checked in this order.
_OPERATION_WORDS = (
    ("subtract", ("gives away", "gave away", "give away", "left", "eats", "ate", "loses", "lost", "spends", "spent", "fewer", "remain")),
    ("divide", ("shared equally", "split equally", "divided", "per person", "each get")),
    ("multiply", ("in each", "each box", "each bag", "packs of", "boxes with", "times")),
    ("add", ("more", "total", "altogether", "in all", "combined")),
)
_OP_SYMBOLS = {"-": "subtract", "+": "add", "*": "multiply", "x": "multiply", "×": "multiply", "/": "divide", "÷": "divide"}
_WRONG_EQUATION = re.compile(r"step \d+: (.*?) is wrong", re.S)


@dataclass(frozen=True)
class Failure:
    """One low-scored review, with what the lesson templates read."""

    review_id: str
    score: float
    critique: str
    hint: str
    manager: str = "verifier"
    task_prompt: str = ""


@dataclass(frozen=True)
class Lesson:
    text: str
    failure_type: str
    source: str  # template | llm
    review_id: str


def normalise(text: str) -> str:
    """Lower case, single spaces, no trailing punctuation: the text a content hash is taken over."""
    return re.sub(r"\s+", " ", text.strip().lower()).rstrip(" .!;")


def skill_id(text: str) -> str:
    return "sk-" + hashlib.sha1(normalise(text).encode()).hexdigest()[:16]


def failure_type(critique: str, hint: str) -> str:
    """The failure a review describes (the verifier's critiques, and keywords of free-text reviews)."""
    c, h = critique.lower(), hint.lower()
    if "ran out of tokens" in c or "too long" in c or "length limit" in c:
        return "length"
    if c.startswith("no final answer") or "no answer" in c or "missing answer" in c:
        return "no_answer"
    if c.startswith("right number") or "format" in c or "<answer>" in h and "tag" in c:
        return "format"
    if re.search(r"step \d+", c) or "recheck the arithmetic" in h:
        return "wrong_step"
    if c.startswith("answered") or "expected" in c or "wrong" in c or "incorrect" in c:
        return "wrong_operation"
    return "other"


def operation_of_prompt(prompt: str) -> str | None:
    """The operation a question's words ask for (whole words: "ate" is not in "plate"), or None."""
    p = prompt.lower()
    for op, words in _OPERATION_WORDS:
        if any(re.search(rf"\b{re.escape(w)}\b", p) for w in words):
            return op
    return None


def operation_of_wrong_step(critique: str) -> str | None:
    """The operator of the equation the verifier found wrong (``step 2: 12 - 5 = 8 is wrong``)."""
    m = _WRONG_EQUATION.search(critique)
    if not m:
        return None
    for ch in m.group(1):
        if ch in _OP_SYMBOLS:
            return _OP_SYMBOLS[ch]
    return None


def _clean_sentence(text: str) -> str | None:
    """The first sentence of a free-text hint as a lesson, or None when it is not usable."""
    text = re.sub(r"\s+", " ", text or "").strip()
    if not text:
        return None
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0].strip()
    if len(first) < 12:
        return None
    if len(first) > MAX_SKILL_CHARS:
        first = first[: MAX_SKILL_CHARS - 1].rsplit(" ", 1)[0].rstrip(",;:") + "."
    return first[0].upper() + first[1:]


def template_lesson(f: Failure) -> Lesson:
    """The template's lesson for one failure."""
    kind = failure_type(f.critique, f.hint)
    if kind == "wrong_step":
        step_op, asked = operation_of_wrong_step(f.critique), operation_of_prompt(f.task_prompt)
        if step_op and asked and step_op != asked:
            # "14 x 8 = ..." for a question that adds: the slip is the operation, not the arithmetic.
            return Lesson(OPERATION_LESSONS[asked], "wrong_operation", "template", f.review_id)
        text = STEP_LESSONS.get(step_op or asked, TEMPLATES["wrong_step"])
    elif kind == "wrong_operation":
        op = operation_of_prompt(f.task_prompt)
        text = OPERATION_LESSONS.get(op, TEMPLATES["wrong_operation"])
    elif kind in TEMPLATES:
        text = TEMPLATES[kind]
    else:
        text = _clean_sentence(f.hint) or TEMPLATES["wrong_operation"]
    return Lesson(text, kind, "template", f.review_id)


def distil(failures: Iterable[Failure], *, threshold: float = 0.75,
           llm: Callable[[list[Failure]], list[str | None]] | None = None) -> list[Lesson]:
    """One lesson per review scored below ``threshold``. ``llm`` (reviews -> one sentence each, or None
    where it wrote nothing usable) writes the lessons when given; a template covers the rest. A free-text
    (non-verifier) hint that reads as a lesson is used as written."""
    low = [f for f in failures if f.score < threshold]
    written = llm(low) if (llm is not None and low) else [None] * len(low)
    out = []
    for f, text in zip(low, written):
        text = _clean_sentence(text) if text else None
        if text:
            out.append(Lesson(text, failure_type(f.critique, f.hint), "llm", f.review_id))
            continue
        if f.manager != "verifier" and (hint := _clean_sentence(f.hint)):
            out.append(Lesson(hint, failure_type(f.critique, f.hint), "template", f.review_id))
            continue
        out.append(template_lesson(f))
    return out


# ------------------------------------------------------------------------------------------ merge
def merge(existing: Sequence[dict], lessons: Sequence[Lesson], embed: Callable[[list[str]], np.ndarray], *,
          merge_cosine: float = 0.9, now: datetime) -> tuple[list[dict], dict[str, int]]:
    """Fold ``lessons`` into the skill rows ``existing``. Returns (every changed or new row, counts).

    A lesson joins the skill with the same normalised text, else the most similar skill whose cosine is
    at least ``merge_cosine``, else it becomes a new ``candidate``. Source review ids accumulate (a set:
    distilling the same batch twice changes nothing)."""
    rows = {r["skill_id"]: {**r, "source_review_ids": list(r["source_review_ids"] or [])} for r in existing}
    changed: set[str] = set()
    new_ids: set[str] = set()
    by_text: dict[str, list[Lesson]] = {}
    for lesson in lessons:
        by_text.setdefault(normalise(lesson.text), []).append(lesson)
    texts = [group[0].text for group in by_text.values()]
    vecs = embed(texts) if texts else np.zeros((0, 384), dtype=np.float32)
    for group, vec in zip(by_text.values(), vecs):
        sid = skill_id(group[0].text)
        target = sid if sid in rows else None
        if target is None and rows:
            ids = list(rows)
            mat = np.asarray([rows[i]["embedding"] for i in ids], dtype=np.float32)
            sims = mat @ vec
            best = int(np.argmax(sims))
            if sims[best] >= merge_cosine:
                target = ids[best]
        if target is None:
            target = sid
            rows[sid] = {"skill_id": sid, "text": group[0].text, "failure_type": group[0].failure_type,
                         "embedding": [float(x) for x in vec], "source_review_ids": [], "support": 0,
                         "source": group[0].source, "status": "candidate", "gain": None, "ci_low": None, "ci_high": None,
                         "n": None, "measured_on": None, "measured_at": None, "verified_at": None, "created_at": now, "updated_at": now}
            new_ids.add(sid)
        row = rows[target]
        before = set(row["source_review_ids"])
        added = [lesson.review_id for lesson in group if lesson.review_id not in before]
        if added:
            row["source_review_ids"] = sorted(before | set(added))
            row["support"] = len(row["source_review_ids"])
            row["updated_at"] = now
            changed.add(target)
    out = [rows[i] for i in rows if i in changed or i in new_ids]
    return out, {"lessons": len(lessons), "new_skills": len(new_ids), "merged_into_existing": len(changed - new_ids)}


# ------------------------------------------------------------------------------------------ retrieve
def retrieve(prompts: Sequence[str], skills: Sequence[dict], embed: Callable[[list[str]], np.ndarray],
             top_k: int) -> list[list[dict]]:
    """For each prompt, the ``top_k`` skills (of those given, normally the verified ones) most similar to
    it, most similar first."""
    if top_k <= 0 or not skills or not prompts:
        return [[] for _ in prompts]
    mat = np.asarray([s["embedding"] for s in skills], dtype=np.float32)
    sims = embed(list(prompts)) @ mat.T
    k = min(top_k, len(skills))
    # Stable order on ties (by skill id) so the same prompt always renders the same text.
    order = [sorted(range(len(skills)), key=lambda j: (-row[j], skills[j]["skill_id"]))[:k] for row in sims]
    return [[skills[j] for j in idx] for idx in order]


# ------------------------------------------------------------------------------------------ verify
@dataclass(frozen=True)
class SkillEffect:
    """A paired comparison on the same items: with the skill minus without it."""

    n: int
    wins: int
    losses: int
    with_accuracy: float
    without_accuracy: float
    gain: float
    ci_low: float
    ci_high: float


def skill_effect(with_skill: dict[str, bool], without_skill: dict[str, bool], *, seed: int = 0) -> SkillEffect:
    """Gain = mean over the items both runs answered of (right with the skill) - (right without), with a
    95% paired percentile-bootstrap interval (``statistics.paired_bootstrap``, as the gate computes it)."""
    keys = sorted(set(with_skill) & set(without_skill))
    if not keys:
        raise ValueError("no item was evaluated both with and without the skill")
    w = [float(with_skill[k]) for k in keys]
    wo = [float(without_skill[k]) for k in keys]
    gain, lo, hi = paired_bootstrap(w, wo, seed=seed)
    return SkillEffect(len(keys), sum(a > b for a, b in zip(w, wo)), sum(a < b for a, b in zip(w, wo)),
                       float(np.mean(w)), float(np.mean(wo)), gain, lo, hi)


@dataclass(frozen=True)
class SkillSettings:
    """How skills are distilled and verified (the ``skills`` asset's config mirrors these)."""

    threshold: float = config_field(0.75, "reviews scored below this are failures to learn from")
    merge_cosine: float = config_field(0.9, "skills at least this similar (cosine) merge into one")
    verify_per_cycle: int = config_field(1, "candidates verified per run (most supported first)")
    recheck_per_cycle: int = config_field(1, "verified skills re-checked per run (oldest measurement first)")
    validation_source: str = config_field(
        "arithmetic", "where the validation items come from: arithmetic (seeded problems) or a dataset (gsm8k: the reserved tail "
        "of its shuffled train split, never trained on); use the task source the skills are distilled from")
    validation_items: int = config_field(32, "items of the validation set")
    validation_seed: int = config_field(2_000_000, "generator seed of the validation set (not a training or gate seed)")
    min_ci_low: float = config_field(0.0, "verify only when the gain's 95% interval lower end is at least this")
    min_net_wins: int = config_field(2, "verify only when the skill wins on at least this many more items than it loses")
    max_new_tokens: int = config_field(96, "completion length of the validation answers (learn's rollout limit)")

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 < self.merge_cosine <= 1.0:
            raise ValueError(f"merge_cosine must be in (0, 1], got {self.merge_cosine}")
        if self.validation_items < 2:
            raise ValueError(f"validation_items must be >= 2, got {self.validation_items}")
        from tentalis_pipelines.tasks.batches import DATASET_TRAIN_FILES

        if self.validation_source != "arithmetic" and self.validation_source not in DATASET_TRAIN_FILES:
            raise ValueError(f"validation_source {self.validation_source!r}: choose arithmetic or one of {sorted(DATASET_TRAIN_FILES)}")
        if self.validation_seed < 1_000_000 or self.validation_seed == 1_000_000:
            raise ValueError(f"validation_seed {self.validation_seed} overlaps the training seeds (< 1,000,000) or the gate's "
                             "held-out set (1,000,000): use e.g. 2,000,000")


def decide(status: str, effect: SkillEffect, *, min_ci_low: float = 0.0, min_net_wins: int = 2) -> tuple[str, str]:
    """(new status, the rule as applied). A candidate is verified when it wins on at least
    ``min_net_wins`` (at least 1) more items than it loses, so the gain is positive, and the gain's 95%
    interval's lower end is at least ``min_ci_low`` (default 0: the interval does not go below zero); a
    verified skill is retired when its gain is no longer positive. A skill that hurts (gain <= 0) is
    never verified."""
    numbers = f"gain {effect.gain:+.3f}, 95% CI [{effect.ci_low:+.3f}, {effect.ci_high:+.3f}], {effect.wins} won / {effect.losses} lost of {effect.n}"
    if status == "verified":
        if effect.gain > 0:
            return "verified", f"kept: still helps ({numbers})"
        return "retired", f"retired: gain no longer positive ({numbers})"
    need = max(min_net_wins, 1)
    net = effect.wins - effect.losses
    if effect.gain > 0 and net >= need and effect.ci_low >= min_ci_low:
        return "verified", f"verified: {net} net wins >= {need} and CI low >= {min_ci_low:+.3f} ({numbers})"
    why = "gain not positive" if effect.gain <= 0 else f"{net} net win(s) < {need}" if net < need else f"CI low below {min_ci_low:+.3f}"
    return status, f"not verified: {why} ({numbers})"
