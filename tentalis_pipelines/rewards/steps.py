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

# Linear: each match ends at the first terminator after its <step>, and the scan goes on from there.
STEP_RE = re.compile(r"<step>(.*?)(?:</step>|(?=<step>)|(?=<answer>)|\Z)", re.S | re.I)
# Answer tags are paired from the lists of openings and closings (one pass each), not with
# ``<answer>(.*?)</answer>``: that searches to the end of the text from every unclosed opening, so
# 2,000 ``<answer>`` tags without a closing cost 2,000 scans of the whole text.
_ANSWER_OPEN = re.compile(r"<answer>", re.I)
_ANSWER_CLOSE = re.compile(r"</answer>", re.I)
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


def answer_tags(text: str) -> list[tuple[int, str]]:
    """Every ``<answer>...</answer>`` in ``text`` as (start of the tag, its content), as
    ``re.findall(r"<answer>(.*?)</answer>", text, re.S | re.I)`` reads them: each opening pairs with the
    first closing after it, and the next search starts after that closing. Linear in ``len(text)``."""
    closes = [m.start() for m in _ANSWER_CLOSE.finditer(text)]
    out: list[tuple[int, str]] = []
    pos, ci = 0, 0
    for m in _ANSWER_OPEN.finditer(text):
        if m.start() < pos:
            continue
        while ci < len(closes) and closes[ci] < m.end():
            ci += 1
        if ci == len(closes):
            break  # no closing after this opening, so none after any later one either
        out.append((m.start(), text[m.end():closes[ci]]))
        pos = closes[ci] + len("</answer>")
    return out


def parse_completion(text: str) -> ParsedCompletion:
    """Steps and answer of ``text`` (see the module docstring). Linear in ``len(text)``."""
    text = text or ""
    tags = answer_tags(text)
    body = text[: tags[0][0]] if tags else text
    tagged_steps = [s.strip() for s in STEP_RE.findall(body) if s.strip()]
    if tagged_steps:
        steps = tagged_steps
    else:
        steps = [ln.strip() for ln in re.split(r"\n+", body) if ln.strip() and not ln.strip().lower().startswith("<answer")]
    if tags:
        # An empty answer tag, or several answer tags that disagree (hedging), is no answer at all: no
        # format credit for the tag and no fallback to a number elsewhere in the text.
        answers = {a.strip() for _, a in tags}
        answer = tags[0][1].strip()
        if not answer or len(answers) > 1:
            return ParsedCompletion(steps, None, "tagged", bool(tagged_steps), False)
        return ParsedCompletion(steps, answer, "tagged", bool(tagged_steps), True)
    return ParsedCompletion(steps, last_number(text), "fallback", bool(tagged_steps), False)
