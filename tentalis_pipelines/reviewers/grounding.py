"""The deterministic grounding check: claims in an answer that the session's context does not support.

An agent's answer restates what its tools returned. This check extracts the **numbers** (with their
units), **dates** and times, **paths** and **names** (capitalised words, tickers, identifiers such as
``ORD-10023``, e-mail addresses) that the answer states and looks each up in the context the answer was
written from (the tool outputs, the user's and the system's messages of the same session). What the
context does not contain is flagged: a :class:`Flag` with the character span in the answer, its kind
and the reason.

Normalisation, so that a faithful restatement is not flagged:

* numbers: ``1,000`` = ``1000``; ``3.50`` = ``3.5``; the sign is ignored (``-2.5`` and "down 2.5"); a
  number rounded from one in the context (``72`` or ``72.4`` for ``72.41``, a half either way) is supported; list markers
  (``1.`` at the start of a line) are not claims;
* units: ``°F`` = ``F`` = ``degrees Fahrenheit``, ``$`` = ``USD`` = ``dollars``, ``km`` = ``kilometers``
  and so on (``UNITS``); a number the context has only with *another* unit is flagged as ``unit``;
* dates: ``2024-03-05``, ``03/05/2024`` (either day order), ``March 5, 2024``, ``5 March 2024``, ``Mar 5th``
  all compare as (year, month, day), a year missing on either side matching any, a two-digit year this
  century's; times ``14:30`` = ``2:30 PM``;
* names: case-insensitive; a leading "The" and common sentence-opening words are not names.

What it cannot see: a claim that is true of the context but wrong in meaning (the right number attached
to the wrong field, a swapped pair), numbers spelled out in words, derived quantities (a sum the answer
computed is flagged when the context lacks it). The token tagger (``grounding_tagger.py``) learns some
of the first kind; see ``docs/grounding.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import MAX_PREC, ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal, InvalidOperation

KINDS = ("number", "unit", "date", "time", "path", "entity")
DETECTOR = "rules"


@dataclass(frozen=True)
class Flag:
    """One unsupported claim: ``answer[start:end]`` (``text``), its ``kind`` (one of ``KINDS``), why."""

    start: int
    end: int
    kind: str
    reason: str
    text: str
    detector: str = DETECTOR


class FlagError(ValueError):
    """A flag that does not fit the text it names (the message says which and why)."""


def validate_flag(flag: Flag, text: str) -> Flag:
    """``flag`` if its span lies inside ``text`` and covers ``flag.text``; else :class:`FlagError`."""
    if not (0 <= flag.start < flag.end <= len(text)):
        raise FlagError(f"flag {flag.kind!r} span [{flag.start}, {flag.end}) lies outside the {len(text)}-character text: "
                        "a flag must name characters of the answer it was computed on")
    if flag.kind not in KINDS:
        raise FlagError(f"flag kind {flag.kind!r} is not one of {KINDS}")
    if flag.text and text[flag.start:flag.end] != flag.text:
        raise FlagError(f"flag span [{flag.start}, {flag.end}) reads {text[flag.start:flag.end]!r}, not the flagged "
                        f"{flag.text!r}: the flag was computed on another text")
    return flag


# --------------------------------------------------------------------------- units
UNITS = {
    "f": "degF", "°f": "degF", "fahrenheit": "degF", "degrees fahrenheit": "degF", "degf": "degF",
    "c": "degC", "°c": "degC", "celsius": "degC", "degrees celsius": "degC", "degc": "degC",
    "$": "usd", "usd": "usd", "dollars": "usd", "dollar": "usd", "€": "eur", "eur": "eur", "euros": "eur",
    "£": "gbp", "gbp": "gbp", "pounds": "gbp",
    "%": "pct", "percent": "pct", "pct": "pct",
    "km": "km", "kilometers": "km", "kilometres": "km", "mi": "mi", "miles": "mi", "mile": "mi",
    "m": "m", "meters": "m", "metres": "m", "cm": "cm", "mm": "mm", "ft": "ft", "feet": "ft",
    "kg": "kg", "kilograms": "kg", "g": "g", "grams": "g", "lb": "lb", "lbs": "lb",
    "kb": "kb", "mb": "mb", "gb": "gb", "tb": "tb", "k": "kb", "b": "bytes", "bytes": "bytes",
    "kib": "kb", "mib": "mb", "gib": "gb",
    "ms": "ms", "s": "s", "sec": "s", "seconds": "s", "second": "s", "min": "min", "minutes": "min", "minute": "min",
    "h": "h", "hr": "h", "hrs": "h", "hours": "h", "hour": "h", "days": "day", "day": "day",
    "mph": "mph", "km/h": "kmh", "kmh": "kmh", "kph": "kmh", "m/s": "mps",
    "shares": "shares", "units": "units", "items": "items",
    "thousand": "thousand", "million": "million", "mn": "million", "billion": "billion", "bn": "billion",
}
_UNIT_WORDS = sorted((u for u in UNITS if u not in ("$", "€", "£")), key=len, reverse=True)
_UNIT_ALT = "|".join(re.escape(u) for u in _UNIT_WORDS)

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
NUMBER_RE = re.compile(
    r"(?P<cur>[$€£])?\s?(?<![\w.,])(?P<num>" + NUMBER + r")(?![\w]*\.\d)(?:\s?(?:degrees\s)?(?P<unit>°\s?[CFcf]\b|%|(?:"
    + _UNIT_ALT + r")(?![\w/])))?", re.IGNORECASE)


def unit_of(raw: str | None) -> str | None:
    """The canonical unit of ``raw`` (``°F`` -> ``degF``), None for none or an unknown one."""
    if not raw:
        return None
    # Whitespace and "degrees" dropped: "° F", "degrees  Fahrenheit" and "°f" are one key.
    return UNITS.get(re.sub(r"\s+", "", raw.lower()).replace("degrees", ""))


def normalize_number(raw: str) -> Decimal | None:
    """``1,000.50`` -> ``Decimal('1000.5')`` (None when ``raw`` is no number)."""
    try:
        return Decimal(raw.replace(",", "")).normalize()
    except InvalidOperation:
        return None


# Rounding a context number with more digits than the default 28-digit precision must not raise.
_WIDE = Context(prec=MAX_PREC)
_HALVES = (ROUND_HALF_UP, ROUND_HALF_EVEN)


def _decimals(raw: str) -> int:
    return len(raw.split(".", 1)[1]) if "." in raw else 0


# --------------------------------------------------------------------------- dates and times
MONTHS = {m: i + 1 for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july", "august",
                                          "september", "october", "november", "december"])}
MONTHS.update({m[:3]: i for m, i in list(MONTHS.items())})
MONTHS["sept"] = 9
_MONTH_ALT = r"(?:January|February|March|April|May|June|July|August|September|October|November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)"
DATE_RES = [
    ("iso", re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b")),
    ("slash", re.compile(r"\b(?P<a>\d{1,2})/(?P<b>\d{1,2})/(?P<y>\d{4}|\d{2})\b")),
    ("mdy", re.compile(r"\b(?P<mon>" + _MONTH_ALT + r")\.?\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?\b(?:,?\s+(?P<y>\d{4})\b)?", re.IGNORECASE)),
    ("dmy", re.compile(r"\b(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon>" + _MONTH_ALT + r")\b\.?(?:,?\s+(?P<y>\d{4})\b)?", re.IGNORECASE)),
]
TIME_RE = re.compile(r"\b(?P<h>\d{1,2})(?::(?P<mi>\d{2}))(?::\d{2})?(?:\s?(?P<ap>[AaPp])(?:\.[Mm]\.|[Mm]\b))?(?![\w:])"
                     r"|\b(?P<h2>\d{1,2})\s?(?P<ap2>[AaPp])(?:\.[Mm]\.|[Mm]\b)")

Date = tuple[int | None, int, int]


def _year(raw: str | None) -> int | None:
    """A two-digit year is this century's (``24`` -> 2024); four digits are the year as written (``0024``)."""
    if not raw:
        return None
    return int(raw) + 2000 if len(raw) == 2 else int(raw)


def _dates(m: re.Match, style: str) -> set[Date]:
    """Every (year, month, day) the match can mean (two for an ambiguous ``03/05/2024``)."""
    g = m.groupdict()
    y = _year(g.get("y"))
    if style == "slash":
        a, b = int(g["a"]), int(g["b"])
        out = {(y, a, b)} if 1 <= a <= 12 and 1 <= b <= 31 else set()
        if 1 <= b <= 12 and 1 <= a <= 31:
            out.add((y, b, a))
        return out
    month = int(g["m"]) if style == "iso" else MONTHS[g["mon"].lower().rstrip(".")]
    day = int(g["d"])
    return {(y, month, day)} if 1 <= month <= 12 and 1 <= day <= 31 else set()


def _minutes(m: re.Match) -> int | None:
    g = m.groupdict()
    h = int(g["h"] if g["h"] is not None else g["h2"])
    mi = int(g["mi"] or 0)
    ap = (g["ap"] or g["ap2"] or "").lower()
    if ap:
        if not 1 <= h <= 12:
            return None
        h = h % 12 + (12 if ap == "p" else 0)
    return h * 60 + mi if h < 24 and mi < 60 else None


def _date_supported(candidates: set[Date], known: set[Date]) -> bool:
    for y, mo, d in candidates:
        for ky, kmo, kd in known:
            if (mo, d) == (kmo, kd) and (y is None or ky is None or y == ky):
                return True
    return False


# --------------------------------------------------------------------------- paths and names
PATH_EXTS = ("py|txt|csv|json|jsonl|md|log|yaml|yml|toml|sh|js|ts|html|css|pdf|png|jpg|jpeg|gif|zip|tar|gz|cfg|ini|xml|sql"
             "|c|h|cpp|rs|go|java|rb|ipynb|parquet|db|lock|env|conf|bak|tmp|out|dat|xlsx|docx")
# A closing markup tag (`</tool_call>`, the text a model writes around a tool call) is no path: `<` before `/`.
PATH_RE = re.compile(r"(?<![\w/.<])(?:~|\.{1,2})?/(?:[\w.\-]+/?)+|\b[\w\-]+(?:/[\w.\-]+)+/?|\b[\w\-]+(?:\.[\w\-]+)*\.(?:" + PATH_EXTS + r")\b")
EMAIL_RE = re.compile(r"\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+\b")
IDENT_RE = re.compile(r"\b[A-Z][A-Z0-9]*[-_#]?\d[\w\-]*\b|\b[A-Z]{2,6}\b")
NAME_RE = re.compile(r"\b[A-Z][a-zA-Z'’\-]*[a-z][a-zA-Z'’\-]*(?:\s+(?:of\s+|de\s+|van\s+|&\s+)?[A-Z][a-zA-Z'’\-]*[a-z][a-zA-Z'’\-]*)*")
URL_RE = re.compile(r"\bhttps?://\S+")

# Capitalised words that open sentences or are the vocabulary of answers, not names.
COMMON = frozenset(re.findall(r"\S+", """
a an the it its it's this that these those there here your you i we he she they my our their yes no sure ok okay
currently today tomorrow yesterday now based according note also total in on at for from to as of with by and but or so
after before if when which what who where why how please thanks thank let done found here's there's i'm we're you're
order orders the weather forecast temperature price stock shares file files directory folder event events meeting
calendar account balance status result results summary overall however although while since because then next first
second third last finally both each every all some any none most many few several other another such only just still
upcoming scheduled shipped delivered pending cancelled processing open closed high low current latest new old
good great unfortunately fortunately looks seems appears it looks sunny cloudy rainy clear windy snow rain
monday tuesday wednesday thursday friday saturday sunday
"""))
_CAP_LIMIT = 80  # longest name span looked at (a capitalised title line is not one name)


def _canon(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("’", "'")).strip().lower()


# --------------------------------------------------------------------------- the context's evidence
@dataclass
class Evidence:
    """What a context supports, indexed once and checked against many answers."""

    text: str  # the context, lower-cased, whitespace collapsed
    numbers: dict[Decimal, set[str | None]]  # value -> the units it appears with (None: without one)
    raw_numbers: list[tuple[Decimal, int]]  # (value, decimals) for rounding
    dates: set[Date]
    times: set[int]
    paths: set[str]

    @classmethod
    def of(cls, context: str | Iterable[str]) -> Evidence:
        text = context if isinstance(context, str) else "\n".join(context)
        dates: set[Date] = set()
        date_spans: list[tuple[int, int]] = []
        for style, rx in DATE_RES:
            for m in rx.finditer(text):
                dates |= _dates(m, style)
                date_spans.append(m.span())
        numbers: dict[Decimal, set[str | None]] = {}
        raw: list[tuple[Decimal, int]] = []
        for m in NUMBER_RE.finditer(text):
            if not _free(date_spans, *m.span("num")):
                continue  # a date's day is no quantity: "2" of 2024-03-02 must not support "2 mph"
            v = normalize_number(m.group("num"))
            if v is None:
                continue
            numbers.setdefault(abs(v), set()).add(unit_of(m.group("cur")) or unit_of(m.group("unit")))
            raw.append((abs(v), _decimals(m.group("num"))))
        # Digits inside identifiers and dates are numbers too (an answer may quote "10023" of ORD-10023).
        for m in re.finditer(r"\d+(?:\.\d+)?", text):
            if not _free(date_spans, *m.span()):
                continue
            v = normalize_number(m.group())
            if v is not None:
                numbers.setdefault(abs(v), set()).add(None)
        times = {t for m in TIME_RE.finditer(text) if (t := _minutes(m)) is not None}
        paths = {p.group().rstrip("/.") for p in PATH_RE.finditer(text)}
        paths |= {p.rsplit("/", 1)[-1] for p in list(paths)}
        return cls(_canon(text), numbers, raw, dates, times, paths)

    def number_supported(self, value: Decimal, decimals: int) -> bool:
        """``value`` (written with ``decimals`` places) is a number of the context or one of its numbers rounded
        to that many places, a half rounded either way (2.5 -> 3 as people round, 2.5 -> 2 as ``round`` does)."""
        if value in self.numbers:
            return True
        q = Decimal(1).scaleb(-decimals)
        return any(d > decimals and any(v.quantize(q, rounding=r, context=_WIDE) == value for r in _HALVES)
                   for v, d in self.raw_numbers)

    def has_phrase(self, phrase: str) -> bool:
        p = _canon(phrase)
        return bool(re.search(r"(?<![\w])" + re.escape(p) + r"(?![\w])", self.text))


# --------------------------------------------------------------------------- the check
def _free(taken: list[tuple[int, int]], start: int, end: int) -> bool:
    return all(end <= s or start >= e for s, e in taken)


def _list_marker(answer: str, start: int, end: int) -> bool:
    """``answer[start:end]`` is a number that opens its line followed by ``.`` or ``)`` (one space at most
    between) and a space: a list marker ("1. ", "  2) "), not a claim."""
    line = answer[answer.rfind("\n", 0, start) + 1:start]
    return not line.strip() and re.match(r"[ \t]?[.)]\s", answer[end:]) is not None


def _sentence_start(answer: str, start: int) -> bool:
    before = answer[:start].rstrip()
    return not before or before[-1] in ".!?:\n-*•>\"'(" or answer[:start].endswith("\n")


def check_answer(answer: str, context: str | Sequence[str] | Evidence) -> list[Flag]:
    """The claims of ``answer`` that ``context`` (text, texts, or its :class:`Evidence`) does not support,
    in order of position. Each flag's ``answer[start:end]`` is its ``text``."""
    ev = context if isinstance(context, Evidence) else Evidence.of(context)
    flags: list[Flag] = []
    taken: list[tuple[int, int]] = [m.span() for m in URL_RE.finditer(answer)]

    def flag(start: int, end: int, kind: str, reason: str) -> None:
        flags.append(Flag(start, end, kind, reason, answer[start:end]))

    for m in EMAIL_RE.finditer(answer):
        taken.append(m.span())
        if not ev.has_phrase(m.group()):
            flag(*m.span(), "entity", f"the address {m.group()!r} is not in the context")
    for style, rx in DATE_RES:
        for m in rx.finditer(answer):
            if not _free(taken, *m.span()):
                continue
            candidates = _dates(m, style)
            if not candidates:
                continue
            taken.append(m.span())
            if not _date_supported(candidates, ev.dates):
                flag(*m.span(), "date", f"no date in the context is {m.group()!r}")
    for m in TIME_RE.finditer(answer):
        t = _minutes(m)
        if t is None or not _free(taken, *m.span()):
            continue
        taken.append(m.span())
        if t not in ev.times:
            flag(*m.span(), "time", f"no time in the context is {m.group().strip()!r}")
    for m in PATH_RE.finditer(answer):
        s, e = m.start(), m.end()
        text = m.group().rstrip("/.")
        e = s + len(text)
        if (not _free(taken, s, e) or re.fullmatch(r"[\d./]+", text) or unit_of(text)
                or "/" not in text and not re.search(r"[A-Za-z]", text.split(".")[0])):
            continue
        taken.append((s, e))
        # A bare file name may be one of a listed folder's; a path with folders must be the context's.
        folder, _, name = text.rpartition("/")
        if text not in ev.paths and not (name in ev.paths and (not folder or folder in ev.paths)):
            flag(s, e, "path", f"the path {text!r} is not in the context")
    for m in IDENT_RE.finditer(answer):
        if not _free(taken, *m.span()) or m.group().lower() in COMMON or unit_of(m.group()):
            continue
        taken.append(m.span())
        if not ev.has_phrase(m.group()):
            flag(*m.span(), "entity", f"{m.group()!r} is not in the context")
    for m in NUMBER_RE.finditer(answer):
        ns, ne = m.span("num")
        if not _free(taken, ns, ne):
            continue
        if _list_marker(answer, ns, ne):
            continue
        raw = m.group("num")
        value = abs(normalize_number(raw) or Decimal(0))
        unit = unit_of(m.group("cur")) or unit_of(m.group("unit"))
        s, e = m.span()
        s = m.start("cur") if m.group("cur") else ns
        e = m.end("unit") if m.group("unit") else ne
        taken.append((s, e))
        if not ev.number_supported(value, _decimals(raw)):
            flag(s, e, "number", f"{raw} is not a number of the context")
        elif unit is not None:
            units = ev.numbers.get(value, set())
            known = {u for u in units if u is not None}
            if known and unit not in known:
                flag(s, e, "unit", f"the context gives {raw} in {', '.join(sorted(known))}, not {unit}")
    for m in NAME_RE.finditer(answer):
        s, e = m.span()
        if e - s > _CAP_LIMIT or not _free(taken, s, e):
            continue
        words = list(re.finditer(r"\S+", m.group()))
        # Drop opening words that are common vocabulary ("The", "Sunny", a sentence's first word).
        while words and (_canon(words[0].group()) in COMMON or _canon(words[0].group()).rstrip("'s") in COMMON):
            words.pop(0)
        if not words:
            continue
        s2, e2 = s + words[0].start(), s + words[-1].end()
        phrase = answer[s2:e2]
        if _canon(phrase).endswith("'s"):  # the possessive is not part of the name
            e2 -= 2
            phrase = answer[s2:e2]
        taken.append((s2, e2))
        if ev.has_phrase(phrase):
            continue
        # A one-word opener the context lacks may be plain English ("Unfortunately"): only names inside a sentence
        # count, and an opener with a capital inside ("OAuth") is a name wherever it stands.
        if len(words) == 1 and _sentence_start(answer, s2) and not any(ch.isupper() for ch in phrase[1:]):
            continue
        flag(s2, e2, "entity", f"{phrase!r} is not in the context")
    return sorted(flags, key=lambda f: (f.start, f.end))
