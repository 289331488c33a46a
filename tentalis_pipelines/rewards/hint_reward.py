"""A dense reward for a hint: how much it raises the worker's log-probability of the reference answer.

RLT ("Reinforcement-Learned Teachers", Cetin et al., 2025) rewards a teacher's explanation by the
student's log-likelihood of the known solution given it. Here the explanation is a manager's hint and
the student is the worker that failed:

    hint_reward = log p(answer | prompt + hint, "<answer>") - log p(answer | prompt, "<answer>")

summed over the answer's value tokens (the reference, ``19``), one teacher-forced forward pass per
side, no generation. Both sides are given the opening ``<answer>`` tag as context, so only the value is
scored: a first version scored the tags too, and a hint that merely mentions ``<answer></answer>``
("finish with the final number inside <answer></answer>") then earned the highest reward by raising the
tags' probability while it rescued the fewest groups (experiments/guided_resampling). The hint sits
where hinted OPD's teacher sees it (``opd.hinted_prompt``). A hint that names the reference answer scores 0:
raising the answer's probability by stating it is copying, not teaching (the same leak check as OPD's).
It is cheap enough for every hint, and it is a prediction: whether it predicts what the hint really did
(the hinted samples' success, ``guided_rollouts``) is measured, not assumed (experiments/guided_resampling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tentalis_pipelines.training import opd

ANSWER_PREFIX = "<answer>"  # context on both sides: only the answer's value is scored


@dataclass(frozen=True)
class HintQuery:
    """One hint to score: the worker's rendered prompt, the task's text inside it, the hint, the reference."""

    prompt_text: str
    task_prompt: str
    hint: str
    reference: str


@dataclass(frozen=True)
class HintReward:
    reward: float  # with - without; 0.0 for a hint that leaks the answer
    with_hint: float | None  # log p(answer | prompt + hint, "<answer>"), summed over the answer's value tokens
    without_hint: float | None  # log p(answer | prompt, "<answer>")
    decision: str  # opd's hint-filter decision: used | no_hint | trivial | leaks_answer


def answer_text(reference: str) -> str:
    """The scored continuation: the reference's value, as the worker would write it after ``<answer>``."""
    return reference.strip()


def hint_rewards(model, tokenizer, queries: Sequence[HintQuery], *, dtype: str = "auto", micro_batch_tokens: int = 4096
                 ) -> list[HintReward]:
    """The dense reward of every query's hint under ``model`` (the worker), in batches. Hints the OPD
    filter rejects are not scored: ``leaks_answer`` scores 0.0 by rule, ``no_hint`` and ``trivial`` 0.0
    because there is nothing to teach (their ``with_hint``/``without_hint`` are None)."""
    out: list[HintReward | None] = [None] * len(queries)
    items, where = [], []
    for i, q in enumerate(queries):
        decision, _ = opd.screen_hint(q.hint, q.reference)
        if decision != opd.USED:
            out[i] = HintReward(0.0, None, None, decision)
            continue
        answer_ids = tokenizer(answer_text(q.reference), add_special_tokens=False)["input_ids"]
        prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
        items.append(opd.OPDItem(tokenizer(q.prompt_text, add_special_tokens=False)["input_ids"] + prefix,
                                 tokenizer(opd.hinted_prompt(q.prompt_text, q.task_prompt, q.hint), add_special_tokens=False)["input_ids"] + prefix,
                                 answer_ids, 1.0))
        where.append(i)
    if items:
        scored = opd.teacher_student_logprobs(model, tokenizer, items, micro_batch_tokens=micro_batch_tokens, dtype=dtype)
        for i, (with_hint, without) in zip(where, scored):
            w, wo = float(sum(with_hint)), float(sum(without))
            out[i] = HintReward(w - wo, w, wo, opd.USED)
    return [o for o in out if o is not None]
