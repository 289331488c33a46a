"""The LLM-judge PRM: tolerant parsing, majority with the pessimistic tie rule, batching, and the real
transformers backend end to end (tiny random model)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.rewards.judge import (
    FIRST_ERROR_VERDICT_PREFIX,
    STEP_VERDICT_PREFIX,
    JudgeConfig,
    JudgePRM,
    JudgeRequest,
    StepJudgement,
    first_wrong_step,
    majority_first_error,
    majority_score,
    parse_first_error,
    parse_step_verdict,
    unit_score,
)


class ScriptedBackend:
    """A GenerationBackend that answers from a script: ``script(prompt)`` gives the replies for one
    prompt (cycled to ``num_generations``). It records every call."""

    name = "scripted"
    model_name = "scripted-judge"
    tokenizer = None

    def __init__(self, script: Callable[[str], list[str]]):
        self.script = script
        self.calls: list[tuple[list[str], SamplingParams]] = []

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append((list(prompts), params))
        out = []
        for p in prompts:
            replies = self.script(p)
            texts = [replies[i % len(replies)] for i in range(params.num_generations)]
            out.append([Generation(text=t, token_ids=[], finish_reason="stop", prompt_tokens=0, seconds=0.0) for t in texts])
        return out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The arithmetic holds. \\boxed{1}", 1.0),
        ("\\boxed{-1}", -1.0),
        ("Hard to say. \\boxed{0}", 0.0),
        ("$\\boxed{ +1 }$", 1.0),
        ("\\boxed{\\text{incorrect}}", -1.0),
        ("At first \\boxed{1}, but 3 * 4 is 12 not 13, so \\boxed{-1}", -1.0),  # last boxed wins
        ("It computes \\boxed{24}, which is correct.", 1.0),  # a boxed non-verdict is skipped
        ('{"score": -1, "reason": "wrong sum"}', -1.0),
        ('Result: {"score": 1}', 1.0),
        ("Verdict: incorrect because 5 + 6 is 11", -1.0),
        ("Score: 0", 0.0),
        ("Yes, it follows from step 1.", 1.0),
        ("No. The total is off.", -1.0),
        ("There is no error here; the step is correct.", 1.0),  # "no" inside a sentence is not a verdict
        ("This step is not correct.", -1.0),
        ("The step is wrong", -1.0),
        ("I am unsure about this step.", 0.0),
        ("Janet has 16 eggs and bakes muffins", None),
        ("", None),
    ],
)
def test_parse_step_verdict(text: str, expected: float | None) -> None:
    assert parse_step_verdict(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Paragraph 2 adds wrongly. \\boxed{2}", 2),
        ("All paragraphs are fine: \\boxed{-1}", -1),
        ("\\boxed{paragraph_1}", 1),
        ("maybe \\boxed{3} ... no, \\boxed{0}", 0),  # last boxed wins
        ("\\boxed{7}", None),  # out of range for 4 steps
        ("\\boxed{2.5}", None),  # the problem's answer, not a paragraph index
        ("\\boxed{\\text{Step } 3}", 3),
        ('{"index": 3}', 3),
        ("the solution looks long", None),
    ],
)
def test_parse_first_error(text: str, expected: int | None) -> None:
    assert parse_first_error(text, num_steps=4) == expected


def test_majority_and_the_pessimistic_tie_rule() -> None:
    assert majority_score([1.0, 1.0, -1.0]) == 1.0
    assert majority_score([1.0, -1.0]) == -1.0  # tie -> the lower score
    assert majority_score([1.0, 0.0]) == 0.0
    assert majority_score([1.0, 1.0, 0.0, 0.0, -1.0]) == 0.0
    assert majority_score([1.0, None, None]) == 1.0  # unparseable votes are excluded, not a "None" majority
    assert majority_score([None, None]) is None
    assert majority_first_error([2, 2, -1]) == 2
    assert majority_first_error([-1, 3]) == 3  # tie -> an error beats "no error"
    assert majority_first_error([3, 1]) == 1  # tie -> the earliest step
    assert majority_first_error([-1, -1, 2]) == -1
    assert majority_first_error([None, None, 0]) == 0
    assert majority_first_error([None]) is None
    assert [unit_score(v) for v in (-1.0, 0.0, 1.0, None)] == [0.0, 0.5, 1.0, None]


def _step_script(prompt: str) -> list[str]:
    # Replies depend on which step is under review; the "bad" step gets a split vote with one garbled reply.
    step = re.search(r"Step under review \(step (\d+)\)", prompt)
    assert step, prompt
    if "BAD" in prompt.split("Step under review")[1]:
        return ["6 + 7 is 13, not 14. \\boxed{-1}", "Looks fine \\boxed{1}", "blah blah"]
    return ["Correct arithmetic. \\boxed{1}", "\\boxed{1}", "???"]


def test_score_steps_batches_everything_and_returns_every_vote() -> None:
    backend = ScriptedBackend(_step_script)
    judge = JudgePRM(backend, JudgeConfig(num_votes=3, max_new_tokens=32))
    requests = [
        JudgeRequest("Add 6 and 7, then double.", ["6 + 7 = 13", "13 * 2 = 26"]),
        JudgeRequest("Add 6 and 7.", ["First add.", "BAD 6 + 7 = 14", "So 14."]),
    ]
    result = judge.score_steps(requests)

    assert len(backend.calls) == 1  # all steps of all rollouts in one generate call
    prompts, params = backend.calls[0]
    assert len(prompts) == 5 and params.num_generations == 3 and params.max_new_tokens == 32
    assert "\\boxed{-1}" in params.stop
    # The judge sees the problem and the steps before the one under review, never the later ones.
    assert "6 + 7 = 13" in prompts[1] and "13 * 2 = 26" not in prompts[0].split("Step under review")[0]
    assert "So 14." not in prompts[3]

    assert [len(r) for r in result] == [2, 3]
    good, bad = result[0][0], result[1][1]
    assert isinstance(good, StepJudgement)
    assert good.votes == [1.0, 1.0, None] and good.score == 1.0
    # one -1, one 1, one unparseable: the None is excluded and the 1-1 tie goes to -1
    assert bad.votes == [-1.0, 1.0, None] and bad.score == -1.0
    assert "13, not 14" in bad.rationale and len(bad.rationale) <= 200
    assert first_wrong_step(result[1]) == 1 and first_wrong_step(result[0]) == -1


def test_all_unparseable_votes_give_no_score() -> None:
    judge = JudgePRM(ScriptedBackend(lambda p: ["the cat sat on the mat"]), JudgeConfig(num_votes=2))
    [[j]] = judge.score_steps([JudgeRequest("p", ["only step"])])
    assert j.score is None and j.votes == [None, None]
    assert first_wrong_step([j]) == -1  # an unscored step is not an error


def test_first_error_mode_is_one_prompt_per_solution() -> None:
    def script(prompt: str) -> list[str]:
        return ["\\boxed{1}", "\\boxed{1}", "\\boxed{-1}"] if "<paragraph_2>" in prompt else ["\\boxed{-1}", "x"]

    backend = ScriptedBackend(script)
    judge = JudgePRM(backend, JudgeConfig(num_votes=3))
    out = judge.first_errors([JudgeRequest("p1", ["a", "b", "c"]), JudgeRequest("p2", ["a", "b"])])
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 2
    prompt = backend.calls[0][0][0]
    assert "indexed from 0" in prompt and "<paragraph_0>\na\n</paragraph_0>" in prompt
    assert out[0].prediction == 1 and out[0].votes == [1, 1, -1]
    assert out[1].prediction == -1 and out[1].votes == [-1, None, -1]


def test_forced_verdict_prefills_the_reply() -> None:
    backend = ScriptedBackend(lambda p: ["-1}"] if p.endswith(STEP_VERDICT_PREFIX) else ["2"])
    judge = JudgePRM(backend, JudgeConfig(num_votes=1, max_new_tokens=64, forced_verdict=True))
    [[j]] = judge.score_steps([JudgeRequest("p", ["s"])])
    assert j.score == -1.0 and j.rationale == "Verdict: \\boxed{-1}"
    assert backend.calls[0][1].max_new_tokens <= 4 and backend.calls[0][1].stop == ("}",)
    [fe] = judge.first_errors([JudgeRequest("p", ["a", "b", "c"])])
    assert backend.calls[1][0][0].endswith(FIRST_ERROR_VERDICT_PREFIX)
    assert fe.prediction == 2  # an unclosed "2" is closed before parsing


