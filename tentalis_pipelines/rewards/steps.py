"""Parse a completion into steps and a final answer.

The policy is asked to write ``<step>…</step>`` blocks and one ``<answer>…</answer>``. Small models
often ignore the tags, so parsing falls back (documented in the README):

* steps: the ``<step>`` blocks if there are any, else the non-empty lines of the text before any
  ``<answer>`` tag;
* answer: the text of the ``<answer>`` block (``parse_mode='tagged'``), else the last number in
  the text (``parse_mode='fallback'``), else ``None``. An empty answer tag, or several that disagree,
  is no answer (``None``, and ``has_answer_tag`` is false).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STEP_RE = re.compile(r"<step>(.*?)(?:</step>|(?=<step>)|(?=<answer>)|\Z)", re.S | re.I)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


@dataclass(frozen=True)
class ParsedCompletion:
    steps: list[str]
    answer: str | None
    parse_mode: str  # "tagged" | "fallback"
    has_step_tags: bool
    has_answer_tag: bool


def last_number(text: str) -> str | None:
    nums = NUMBER_RE.findall(text or "")
    return nums[-1].replace(",", "") if nums else None


def parse_completion(text: str) -> ParsedCompletion:
    text = text or ""
    answer_match = ANSWER_RE.search(text)
    body = text[: answer_match.start()] if answer_match else text
    tagged_steps = [s.strip() for s in STEP_RE.findall(body) if s.strip()]
    if tagged_steps:
        steps = tagged_steps
    else:
        steps = [ln.strip() for ln in re.split(r"\n+", body) if ln.strip() and not ln.strip().lower().startswith("<answer")]
    if answer_match:
        # An empty answer tag, or several answer tags that disagree (hedging), is no answer at all: no
        # format credit for the tag and no fallback to a number elsewhere in the text.
        answers = {a.strip() for a in ANSWER_RE.findall(text)}
        answer = answer_match.group(1).strip()
        if not answer or len(answers) > 1:
            return ParsedCompletion(steps, None, "tagged", bool(tagged_steps), False)
        return ParsedCompletion(steps, answer, "tagged", bool(tagged_steps), True)
    return ParsedCompletion(steps, last_number(text), "fallback", bool(tagged_steps), False)
