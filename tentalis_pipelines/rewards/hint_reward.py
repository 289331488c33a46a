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

RLT scores the teacher's explanation by the student's likelihood of the whole reference *solution*, not
of the bare answer. Where a task knows its solution's steps (``HintQuery.steps``; a generated arithmetic
task its expression, ``solution_steps``) the scored continuation is the solution in the worker's format,
``<step>12 + 7 = 19</step><answer>19``, with the format's tags as unscored context (the tags' own
probability is what the first version was fooled by) and the steps' text and the answer's value scored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tentalis_pipelines.training import opd

ANSWER_PREFIX = "<answer>"  # context on both sides: only the answer's value is scored
STEP_PREFIX = "<step>"  # the context a solution's first step follows


@dataclass(frozen=True)
class HintQuery:
    """One hint to score: the worker's rendered prompt, the task's text inside it, the hint, the reference."""

    prompt_text: str
    task_prompt: str
    hint: str
    reference: str
    steps: tuple[str, ...] = ()  # the reference solution's steps, when the task has them: scored with the answer


def solution_steps(task: dict) -> tuple[str, ...]:
    """The reference solution's steps of a task row, as the worker would write them: a generated
    arithmetic task's expression and its result (``"12 + 7 = 19"``); () for a task without one."""
    try:
        expression = json.loads(task.get("metadata") or "{}").get("expression")
    except (json.JSONDecodeError, AttributeError):
        return ()
    return (f"{expression} = {str(task['reference']).strip()}",) if expression else ()


def scored_continuation(tokenizer, reference: str, steps: Sequence[str] = ()) -> tuple[list[int], list[int], list[bool]]:
    """(context ids appended to both prompts, continuation ids, which continuation tokens are scored).
    Without steps: ``<answer>`` as context, the answer's value scored. With steps: ``<step>`` as context,
    then each step's text (scored) between the format's tags (not scored), then the answer's value."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    if not steps:
        value = ids(answer_text(reference))
        return ids(ANSWER_PREFIX), value, [True] * len(value)
    segments: list[tuple[str, bool]] = []
    for i, step in enumerate(steps):
        segments += [("</step><step>" if i else "", False), (step.strip(), True)]
    segments += [("</step>" + ANSWER_PREFIX, False), (answer_text(reference), True)]
    cont, scored = [], []
    for text, flag in segments:
        piece = ids(text) if text else []
        cont += piece
        scored += [flag] * len(piece)
    return ids(STEP_PREFIX), cont, scored


@dataclass(frozen=True)
class HintReward:
    reward: float  # with - without; 0.0 for a hint that leaks the answer
    with_hint: float | None  # log p(answer | prompt + hint, "<answer>"), summed over the scored tokens
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
    items, where, masks = [], [], []
    for i, q in enumerate(queries):
        decision, _ = opd.screen_hint(q.hint, q.reference)
        if decision != opd.USED:
            out[i] = HintReward(0.0, None, None, decision)
            continue
        prefix, cont, mask = scored_continuation(tokenizer, q.reference, q.steps)
        items.append(opd.OPDItem(tokenizer(q.prompt_text, add_special_tokens=False)["input_ids"] + prefix,
                                 tokenizer(opd.hinted_prompt(q.prompt_text, q.task_prompt, q.hint), add_special_tokens=False)["input_ids"] + prefix,
                                 cont, 1.0))
        masks.append(mask)
        where.append(i)
    if items:
        scored = opd.teacher_student_logprobs(model, tokenizer, items, micro_batch_tokens=micro_batch_tokens, dtype=dtype)
        for i, mask, (with_hint, without) in zip(where, masks, scored):
            w = float(sum(lp for lp, m in zip(with_hint, mask) if m))
            wo = float(sum(lp for lp, m in zip(without, mask) if m))
            out[i] = HintReward(w - wo, w, wo, opd.USED)
    return [o for o in out if o is not None]
