"""An LLM-as-judge process reward model (``scorer='judge'``).

The calculator verifier (``rewards/process.py``) only scores steps that state an equation; the judge
scores every step by asking a language model. It talks to any :class:`GenerationBackend`, so the judge
model can be the embedded SmolLM2, a local folder, or an OpenAI-compatible server.

Two modes:

* **per step** (:meth:`JudgePRM.score_steps`): one prompt per step, showing the problem, the steps
  before it and the step under review. The judge must end its reply with ``\\boxed{1}`` (correct),
  ``\\boxed{0}`` (neutral / unsure) or ``\\boxed{-1}`` (wrong).
* **first error** (:meth:`JudgePRM.first_errors`): one prompt per solution listing every step as
  ``<paragraph_i>`` (0-based); the judge must put the index of the earliest wrong step in ``\\boxed{}``,
  or ``-1`` when every step is correct. This is ProcessBench's own critic protocol and its prompt
  (Zheng et al., 2024), and it needs one prompt per solution instead of one per step.

Votes: each prompt is sampled ``num_votes`` times in the same batched ``generate`` call
(``num_generations = num_votes``). Replies are parsed tolerantly (:func:`parse_step_verdict`,
:func:`parse_first_error`); a reply that cannot be parsed is a ``None`` vote. Votes are aggregated by
plurality over the parsed votes only (``None`` votes are excluded, but every vote is returned so the
caller can store them in ``step_scores.votes``). **Tie rule: the more pessimistic verdict wins** — for a
step score the lowest tied score (``-1 < 0 < 1``); for a first-error index the earliest tied step, and
any step index beats ``-1`` ("no error"). A judge that cannot make up its mind should not let a step
pass. When every vote is ``None`` the aggregate is ``None``.

``JudgeConfig.forced_verdict`` pre-fills the reply up to ``\\boxed{`` so that the model only writes the
verdict: no reasoning, but small models then keep the contract and a judgement costs about one forward
pass over the prompt.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tentalis_pipelines.inference.base import GenerationBackend, SamplingParams

JUDGE_SCORER = "judge"
VALID_SCORES = (-1.0, 0.0, 1.0)
# Reply openings used with ``JudgeConfig.forced_verdict``; the model continues right after the brace.
STEP_VERDICT_PREFIX = "Verdict: \\boxed{"
# Names what goes in the box: a bare "Final answer:" makes small models box the math answer instead.
FIRST_ERROR_VERDICT_PREFIX = "Index of the earliest wrong paragraph (-1 if all are correct): \\boxed{"
FORCED_MAX_NEW_TOKENS = 4  # "-1}" is at most three tokens

STEP_SYSTEM_PROMPT = (
    "You are a strict math teacher who checks one step of a student's solution at a time. Judge only the "
    "step under review, given the problem and the steps before it. Write at most two short sentences of "
    "reasoning, then end with exactly one verdict: \\boxed{1} if the step is correct, \\boxed{-1} if it "
    "contains a mistake (wrong arithmetic, wrong logic, or a misreading of the problem), or \\boxed{0} "
    "if you cannot tell."
)

FIRST_ERROR_SYSTEM_PROMPT = "You are a careful math teacher who reviews solutions paragraph by paragraph."

# ProcessBench's critique template (QwenLM/ProcessBench, code/templates/critique_template.txt).
FIRST_ERROR_TEMPLATE = (
    "The following is a math problem and a solution (split into paragraphs, enclosed with tags and "
    "indexed from 0):\n\n[Math Problem]\n\n{problem}\n\n[Solution]\n\n{tagged_response}\n\n"
    "Your task is to review and critique the solution paragraph by paragraph. Once you identify an error "
    "in a paragraph, return the index of the paragraph where the earliest error occurs. Otherwise, return "
    'the index of -1 (which typically denotes "not found").\n\n'
    "Please put your final answer (i.e., the index) in \\boxed{{}}."
)


# --------------------------------------------------------------------------- data types
@dataclass(frozen=True)
class JudgeRequest:
    """One solution to judge: the problem text and its steps in order."""

    problem: str
    steps: Sequence[str]


@dataclass(frozen=True)
class StepJudgement:
    """The judge's verdict on one step.

    ``score`` is the aggregated vote (1.0 correct, 0.0 unsure, -1.0 wrong) or ``None`` when no vote could
    be parsed; ``votes`` holds every sample's parsed vote in sampling order (``None`` = unparseable);
    ``rationale`` is a short excerpt of a reply that agrees with ``score``.
    """

    score: float | None
    votes: list[float | None]
    rationale: str


@dataclass(frozen=True)
class FirstErrorJudgement:
    """The judge's verdict on a whole solution: the 0-based index of the earliest wrong step, ``-1`` when
    all steps are correct, or ``None`` when no vote could be parsed."""

    prediction: int | None
    votes: list[int | None]
    rationale: str


@dataclass
class JudgeConfig:
    """Sampling settings for the judge.

    ``max_new_tokens`` is small on purpose: the verdict is one boxed number after a short reason.
    Sampling (``temperature > 0``) is what makes several votes differ.

    ``forced_verdict``: pre-fill the start of the judge's reply up to the verdict's opening
    (``Verdict: \\boxed{``), so the model writes only the number and a closing brace (at most
    ``FORCED_MAX_NEW_TOKENS`` tokens). The judge then gives no reasoning, but a small model keeps the
    output contract (left free, a 135M model mostly restates the problem) and judging costs little more
    than reading the prompt. Works with any backend that continues a text prompt.
    """

    num_votes: int = 3
    max_new_tokens: int = 64
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int = 0
    forced_verdict: bool = False
    extra_stop: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- parsing
_BOXED_RE = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_KEY_VALUE_RE = re.compile(
    r"[\"']?\b(score|verdict|label|rating|judgement|judgment|answer|result)\b[\"']?\s*[:=]\s*[\"']?\s*"
    r"([+-]?\d+(?:\.0+)?|not\s+[a-z]+|[a-z]+)",
    re.I,
)
# Negated and longer forms come first so "incorrect" / "not correct" never read as "correct".
_WORDS: list[tuple[str, float]] = [
    (r"not\s+(?:correct|right|valid)", -1.0),
    (r"incorrect|wrong|invalid|erroneous|mistaken|false", -1.0),
    (r"not\s+sure|unsure|uncertain|unclear|neutral|cannot\s+tell|can't\s+tell", 0.0),
    (r"correct|right|valid|true", 1.0),
]
_WORD_RE = re.compile(r"\b(" + "|".join(f"(?:{p})" for p, _ in _WORDS) + r")\b", re.I)
# "Yes"/"No" are only trusted as the first word of the reply or right after "answer:"/"verdict:": inside
# a sentence ("there is no error") they would flip the verdict.
_YES_NO_RE = re.compile(r"(?:^|\b(?:answer|verdict)\s*[:=]\s*)\**\s*(yes|no)\b", re.I)
_INDEX_RE = re.compile(r"(?:(?:paragraph|step|index)[\s_]*)?([+-]?\d+)", re.I)


def _word_value(word: str) -> float | None:
    for pattern, value in _WORDS:
        if re.fullmatch(pattern, word.strip(), re.I):
            return value
    if word.strip().lower() in ("yes", "no"):
        return 1.0 if word.strip().lower() == "yes" else -1.0
    return None


def _score_value(raw: str) -> float | None:
    """Map one boxed/JSON value to -1.0, 0.0 or 1.0 (``None`` if it is none of them)."""
    text = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", raw).strip().strip("$").strip().strip("\"'").strip()
    try:
        value = float(text)
    except ValueError:
        return _word_value(text)
    return value if value in VALID_SCORES else None


def _json_objects(text: str) -> list[dict]:
    objects = []
    for m in re.finditer(r"\{[^{}]*\}", text):
        try:
            obj = json.loads(m.group(0))
        except ValueError:
            continue
        if isinstance(obj, dict):
            objects.append(obj)
    return objects


def parse_step_verdict(text: str) -> float | None:
    """A step verdict from a judge reply: 1.0 correct, 0.0 unsure, -1.0 wrong, ``None`` if unparseable.

    In order of trust: the last ``\\boxed{…}`` holding a verdict (``1``/``0``/``-1``, also words such as
    ``correct``); a JSON object or ``key: value`` pair such as ``{"score": 1}`` or ``Verdict: incorrect``
    (last one wins); a leading ``Yes``/``No``; the last verdict word in the text ("incorrect", "wrong",
    "correct", "unsure", …).
    """
    text = text or ""
    for raw in reversed(_BOXED_RE.findall(text)):
        value = _score_value(raw)
        if value is not None:
            return value
    for obj in reversed(_json_objects(text)):
        for key in ("score", "verdict", "label", "rating", "judgement", "judgment", "answer"):
            if key in obj:
                value = _score_value(str(obj[key]))
                if value is not None:
                    return value
    for _, raw in reversed(_KEY_VALUE_RE.findall(text)):
        value = _score_value(raw)
        if value is not None:
            return value
    yes_no = _YES_NO_RE.findall(text.strip())
    if yes_no:
        return 1.0 if yes_no[-1].lower() == "yes" else -1.0
    words = _WORD_RE.findall(text)
    return _word_value(words[-1]) if words else None


def parse_first_error(text: str, num_steps: int) -> int | None:
    """The earliest-wrong-step index from a first-error reply, or ``None``.

    The last ``\\boxed{…}`` that holds an integer (``\\boxed{2}``, ``\\boxed{paragraph_2}``) wins, then a
    JSON/``key: value`` field (``index``, ``first_error``, ``answer``, ``paragraph``). The index must be
    ``-1`` or a valid 0-based step index: anything else is not a usable vote.
    """
    text = text or ""

    def valid(raw: str) -> int | None:
        # A whole integer only (optionally "paragraph_2" / "step 2"): a boxed 5.4 is the problem's answer,
        # not paragraph 5.
        cleaned = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", raw).strip().strip("$").strip().strip("\"'").rstrip(".").strip()
        m = _INDEX_RE.fullmatch(cleaned)
        if m is None:
            return None
        value = int(m.group(1))
        return value if -1 <= value < num_steps else None

    for raw in reversed(_BOXED_RE.findall(text)):
        value = valid(raw)
        if value is not None:
            return value
    keys = ("index", "first_error", "earliest_error", "answer", "paragraph", "step")
    for obj in reversed(_json_objects(text)):
        for key in keys:
            if key in obj:
                value = valid(str(obj[key]))
                if value is not None:
                    return value
    for m in reversed(list(re.finditer(r"\b(" + "|".join(keys) + r")\b\s*[:=]\s*\"?([+-]?\d+)", text, re.I))):
        value = valid(m.group(2))
        if value is not None:
            return value
    return None


# --------------------------------------------------------------------------- aggregation
def majority_score(votes: Sequence[float | None]) -> float | None:
    """Plurality over the parsed votes; ties go to the lowest (most pessimistic) score; ``None`` votes
    are excluded, and all-``None`` gives ``None``."""
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return None
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


def majority_first_error(votes: Sequence[int | None]) -> int | None:
    """Plurality over the parsed first-error votes; ties go to the earliest tied step, and any step index
    beats ``-1`` (an error flagged by as many votes as "no error" is kept); ``None`` votes are excluded."""
    counts = Counter(v for v in votes if v is not None)
    if not counts:
        return None
    top = max(counts.values())
    tied = [v for v, c in counts.items() if c == top]
    errors = [v for v in tied if v >= 0]
    return min(errors) if errors else -1


def _short(text: str, limit: int = 200) -> str:
    one_line = " ".join((text or "").split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


# --------------------------------------------------------------------------- prompts
def render_messages(tokenizer, messages: list[dict[str, str]]) -> str:
    """Chat messages as the exact prompt text: the tokenizer's chat template with the generation prompt,
    or (no tokenizer / no template) plain ``role: content`` blocks, as ``inference.prompts`` does."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "


def step_judge_messages(problem: str, previous_steps: Sequence[str], step: str) -> list[dict[str, str]]:
    """The chat messages asking the judge to score ``step`` given the problem and the steps before it."""
    earlier = "\n".join(f"Step {i + 1}: {s.strip()}" for i, s in enumerate(previous_steps)) or "(none: this is the first step)"
    user = (
        f"Problem:\n{problem.strip()}\n\nEarlier steps (assume they are given):\n{earlier}\n\n"
        f"Step under review (step {len(previous_steps) + 1}):\n{step.strip()}\n\n"
        "Is the step under review correct? Reason briefly, then end with \\boxed{1} (correct), "
        "\\boxed{-1} (wrong) or \\boxed{0} (cannot tell)."
    )
    return [{"role": "system", "content": STEP_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def first_error_messages(problem: str, steps: Sequence[str]) -> list[dict[str, str]]:
    """ProcessBench's critic prompt: all steps as 0-based ``<paragraph_i>`` blocks."""
    tagged = "\n\n".join(f"<paragraph_{i}>\n{s.strip()}\n</paragraph_{i}>" for i, s in enumerate(steps))
    user = FIRST_ERROR_TEMPLATE.format(problem=problem.strip(), tagged_response=tagged)
    return [{"role": "system", "content": FIRST_ERROR_SYSTEM_PROMPT}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------- the judge
class JudgePRM:
    """An LLM-as-judge process reward model over any :class:`GenerationBackend`.

    ``tokenizer`` renders the chat template; by default the backend's own (``backend.tokenizer``), which
    the transformers backend has. Every call makes exactly one ``backend.generate`` call for all prompts
    of all requests (the backend groups prompts by length), with ``num_generations = num_votes``.
    """

    def __init__(self, backend: GenerationBackend, config: JudgeConfig | None = None, *, tokenizer=None):
        self.backend = backend
        self.config = config or JudgeConfig()
        if self.config.num_votes < 1:
            raise ValueError("num_votes must be at least 1")
        self.tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)

    @property
    def name(self) -> str:
        """``judge:<model>`` — what to store as the scorer's model."""
        return f"{JUDGE_SCORER}:{getattr(self.backend, 'model_name', 'unknown')}"

    def _params(self, stop: tuple[str, ...]) -> SamplingParams:
        c = self.config
        return SamplingParams(
            num_generations=c.num_votes,
            max_new_tokens=min(c.max_new_tokens, FORCED_MAX_NEW_TOKENS) if c.forced_verdict else c.max_new_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            seed=c.seed,
            # Forced: the verdict is over at its closing brace. Free: stop as soon as a verdict is boxed,
            # the rest of the budget would be wasted.
            stop=(("}",) if c.forced_verdict else stop) + tuple(c.extra_stop),
        )

    def _reply(self, prefix: str, text: str) -> str:
        """The judge's whole reply: with a forced verdict, the pre-filled opening plus the continuation
        (closed with a brace when the model stopped without one)."""
        if not self.config.forced_verdict:
            return text
        return prefix + text if "}" in text else prefix + text.strip() + "}"

    def _render(self, messages: list[dict[str, str]], prefix: str) -> str:
        prompt = render_messages(self.tokenizer, messages)
        return prompt + prefix if self.config.forced_verdict else prompt

    def step_prompts(self, request: JudgeRequest) -> list[str]:
        """The rendered per-step prompts of one solution, in step order."""
        steps = list(request.steps)
        return [self._render(step_judge_messages(request.problem, steps[:i], s), STEP_VERDICT_PREFIX) for i, s in enumerate(steps)]

    def first_error_prompt(self, request: JudgeRequest) -> str:
        """The rendered first-error prompt of one solution."""
        return self._render(first_error_messages(request.problem, request.steps), FIRST_ERROR_VERDICT_PREFIX)

    def score_steps(self, requests: Sequence[JudgeRequest]) -> list[list[StepJudgement]]:
        """Score every step of every request; returns one list of :class:`StepJudgement` per request."""
        prompts: list[str] = []
        owners: list[int] = []
        for r, request in enumerate(requests):
            for prompt in self.step_prompts(request):
                prompts.append(prompt)
                owners.append(r)
        out: list[list[StepJudgement]] = [[] for _ in requests]
        if not prompts:
            return out
        generations = self.backend.generate(prompts, self._params(tuple(f"\\boxed{{{v}}}" for v in (1, 0, -1))))
        for r, samples in zip(owners, generations):
            replies = [self._reply(STEP_VERDICT_PREFIX, g.text) for g in samples]
            votes = [parse_step_verdict(t) for t in replies]
            score = majority_score(votes)
            out[r].append(StepJudgement(score=score, votes=votes, rationale=_rationale(replies, votes, score)))
        return out

    def first_errors(self, requests: Sequence[JudgeRequest]) -> list[FirstErrorJudgement]:
        """The earliest wrong step of every request (ProcessBench's critic protocol), one prompt each."""
        if not requests:
            return []
        prompts = [self.first_error_prompt(r) for r in requests]
        longest = max(len(r.steps) for r in requests)
        stop = tuple(f"\\boxed{{{i}}}" for i in range(-1, longest))
        generations = self.backend.generate(prompts, self._params(stop))
        out = []
        for request, samples in zip(requests, generations):
            replies = [self._reply(FIRST_ERROR_VERDICT_PREFIX, g.text) for g in samples]
            votes = [parse_first_error(t, len(request.steps)) for t in replies]
            pred = majority_first_error(votes)
            out.append(FirstErrorJudgement(prediction=pred, votes=votes, rationale=_rationale(replies, votes, pred)))
        return out


def _rationale(replies: Sequence[str], votes: Sequence[object], verdict: object) -> str:
    """A short excerpt of the first reply that agrees with the verdict (else the first reply)."""
    agreeing = next((t for t, v in zip(replies, votes) if v is not None and v == verdict), None)
    return _short(agreeing if agreeing is not None else (replies[0] if replies else ""))


def first_wrong_step(judgements: Sequence[StepJudgement]) -> int:
    """The index of the first step whose aggregated score is -1, or -1 when there is none (unscored and
    unsure steps are not errors)."""
    return next((i for i, j in enumerate(judgements) if j.score is not None and j.score < 0), -1)


def unit_score(score: float | None) -> float | None:
    """A judge score (-1, 0, 1) on the calculator verifier's scale (0.0 wrong, 0.5 unsure, 1.0 correct),
    for tables and rewards that mix both scorers."""
    return None if score is None else (score + 1.0) / 2.0
