"""Synthetic grounding data: tool outputs, faithful answers and span-level corruptions (TinyLettuce's recipe).

A **session** is one tool output (weather, stock quote, order, directory listing, calendar, bank
account: ``TOOLS``) and the answers written from it. Each session gets ``correct`` faithful
restatements (the tool's values in other formats: ``2024-03-05`` as "March 5", ``1234567`` as
``1,234,567``, ``72`` as ``72°F``) and ``corrupted`` answers in which one or two values were replaced:
a **number** changed, a **unit** swapped (``°F`` -> ``°C``, ``KB`` -> ``MB``), a **date** or time moved,
an **entity** (a name, city, ticker, carrier, file) replaced by another of its kind, or a **swap** (a
value of the context put in another field's place: true of the context, wrong in meaning). The gold
spans are the exact character offsets of the replaced values.

Everything is a pure function of the seed; :func:`split_by_session` splits seeded by session id, so
train and test never share a tool output.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta

CORRUPTIONS = ("number", "unit", "date", "entity", "swap")


@dataclass
class Pair:
    """One (tool output, answer) pair with its gold spans: ``(start, end, kind)`` in ``answer``."""

    session_id: str
    tool: str
    context: str
    answer: str
    spans: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def hallucinated(self) -> bool:
        return bool(self.spans)

    def to_dict(self) -> dict:
        return {"session_id": self.session_id, "tool": self.tool, "context": self.context, "answer": self.answer,
                "spans": [list(s) for s in self.spans]}


@dataclass
class Slot:
    """A value an answer states: how it reads, its kind, and how to corrupt it (a different reading)."""

    text: str
    kind: str
    corrupt: Callable[[random.Random], str]
    unit_swap: Callable[[random.Random], str] | None = None


CITIES = ["San Diego", "Boston", "Denver", "Seattle", "Austin", "Chicago", "Portland", "Miami", "Atlanta", "Phoenix",
          "Dallas", "Houston", "Nashville", "Detroit", "Oakland", "Raleigh", "Tampa", "Orlando", "Madison", "Omaha",
          "Lisbon", "Madrid", "Berlin", "Munich", "Paris", "Lyon", "Vienna", "Prague", "Dublin", "Oslo", "Helsinki",
          "Toronto", "Vancouver", "Calgary", "Sydney", "Melbourne", "Auckland", "Osaka", "Kyoto", "Seoul"]
PEOPLE = ["Maria Lopez", "James Chen", "Aisha Khan", "Tom Becker", "Lena Novak", "Omar Haddad", "Priya Raman", "Jonas Berg",
          "Sofia Rossi", "Ken Tanaka", "Nora Walsh", "Ivan Petrov", "Grace Kim", "Luis Ortega", "Hana Sato", "Ethan Brooks",
          "Zoe Martin", "Samuel Okafor", "Elena Garcia", "David Cohen", "Mia Fischer", "Ravi Patel", "Clara Dubois", "Leo Moreau"]
COMPANIES = [("AAPL", "Apple"), ("MSFT", "Microsoft"), ("NVDA", "Nvidia"), ("AMZN", "Amazon"), ("TSLA", "Tesla"),
             ("GOOG", "Alphabet"), ("META", "Meta Platforms"), ("NFLX", "Netflix"), ("INTC", "Intel"), ("ORCL", "Oracle"),
             ("CSCO", "Cisco"), ("ADBE", "Adobe"), ("PYPL", "PayPal"), ("SHOP", "Shopify"), ("UBER", "Uber"), ("SNOW", "Snowflake")]
CARRIERS = ["UPS", "FedEx", "DHL", "USPS", "Royal Mail", "PostNL"]
MERCHANTS = ["Whole Foods", "Shell", "Target", "Walgreens", "Starbucks", "Home Depot", "Best Buy", "Costco", "Trader Joe's", "IKEA"]
EVENTS = ["Budget Review", "Design Sync", "Quarterly Planning", "Hiring Panel", "Sprint Demo", "Vendor Call", "Board Prep",
          "Security Audit", "Launch Retro", "Team Offsite"]
ROOMS = ["Room 4B", "Room 12A", "Atlas Hall", "Orion Room", "Cedar Room", "Harbor Suite", "Lab 3", "Studio North"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy"]
USERS = ["ana", "bob", "chen", "dana", "eli", "fay", "gus", "ines"]
PROJECTS = ["reports", "project", "analytics", "backup", "website", "notebooks", "invoices", "scripts"]
FILE_STEMS = ["summary", "notes", "budget", "draft", "results", "config", "main", "export", "invoice", "readme", "data", "train"]
FILE_EXTS = ["csv", "txt", "py", "pdf", "json", "md", "log", "xlsx"]
MONTH_NAMES = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]


def _other(rng: random.Random, pool: list, current) -> object:
    choices = [p for p in pool if p != current]
    return rng.choice(choices)


def _fmt_date(d: date, style: str) -> str:
    if style == "iso":
        return d.isoformat()
    if style == "us":
        return f"{d.month:02d}/{d.day:02d}/{d.year}"
    if style == "long":
        return f"{MONTH_NAMES[d.month - 1]} {d.day}, {d.year}"
    if style == "short":
        return f"{MONTH_NAMES[d.month - 1]} {d.day}"
    if style == "abbr":
        return f"{MONTH_NAMES[d.month - 1][:3]} {d.day}"
    return f"{d.day} {MONTH_NAMES[d.month - 1]} {d.year}"  # "day"


def _date_slot(rng: random.Random, d: date) -> Slot:
    style = rng.choice(["iso", "us", "long", "short", "abbr", "day"])

    def corrupt(r: random.Random) -> str:
        shift = r.choice([-3, -2, -1, 1, 2, 3, 7, 30, -30])
        return _fmt_date(d + timedelta(days=shift), style)
    return Slot(_fmt_date(d, style), "date", corrupt)


def _num_text(v: float, decimals: int, commas: bool) -> str:
    return f"{v:,.{decimals}f}" if commas else f"{v:.{decimals}f}"


def _number_slot(v: float, decimals: int, *, prefix: str = "", suffix: str = "", commas: bool = False,
                 units: list[tuple[str, str]] | None = None) -> Slot:
    """A number as the answer writes it (``prefix``/``suffix``: its unit); ``units``: (prefix, suffix)
    pairs of other units to swap in."""

    def corrupt(r: random.Random) -> str:
        while True:
            factor = r.choice([0.5, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0])
            w = round(v * factor + r.choice([-3, -2, -1, 1, 2, 3]) * (10 ** -decimals if decimals else 1), decimals)
            if w > 0 and _num_text(w, decimals, commas) != _num_text(v, decimals, commas):
                return prefix + _num_text(w, decimals, commas) + suffix

    swap = None
    if units:
        def swap(r: random.Random) -> str:
            p, s = r.choice(units)
            return p + _num_text(v, decimals, commas) + s
    return Slot(prefix + _num_text(v, decimals, commas) + suffix, "number", corrupt, swap)


def _pick_slot(text: str, kind: str, pool: list) -> Slot:
    return Slot(text, kind, lambda r: str(_other(r, pool, text)))


def _time_text(minutes: int, style: str) -> str:
    h, m = divmod(minutes, 60)
    if style == "24":
        return f"{h:02d}:{m:02d}"
    return f"{(h - 1) % 12 + 1}:{m:02d} {'PM' if h >= 12 else 'AM'}"


def _time_slot(minutes: int, style: str) -> Slot:
    return Slot(_time_text(minutes, style), "date", lambda r: _time_text((minutes + r.choice([-90, -60, -30, 30, 60, 120])) % 1440, style))


# --------------------------------------------------------------------------- tools
def weather(rng: random.Random) -> tuple[str, dict[str, Slot], list[str], list[tuple[str, str]]]:
    city = rng.choice(CITIES)
    d = date(2024, 1, 1) + timedelta(days=rng.randrange(700))
    temp = rng.randrange(20, 100)
    high, low = temp + rng.randrange(2, 12), temp - rng.randrange(2, 15)
    hum, wind = rng.randrange(10, 95), rng.randrange(1, 30)
    cond = rng.choice(CONDITIONS)
    out = json.dumps({"tool": "get_weather", "city": city, "date": d.isoformat(), "temp_f": temp, "high_f": high, "low_f": low,
                      "humidity_pct": hum, "wind_mph": wind, "conditions": cond})
    f_units = [("", "°C"), ("", " K")]
    slots = {"city": _pick_slot(city, "entity", CITIES), "date": _date_slot(rng, d),
             "temp": _number_slot(temp, 0, suffix="°F", units=f_units), "high": _number_slot(high, 0, suffix="°F", units=f_units),
             "low": _number_slot(low, 0, suffix="°F", units=f_units), "hum": _number_slot(hum, 0, suffix="%"),
             "wind": _number_slot(wind, 0, suffix=" mph", units=[("", " km/h"), ("", " m/s")]),
             "cond": _pick_slot(cond, "entity", CONDITIONS)}
    templates = ["The weather in {city} on {date} is {cond} at {temp}, with a high of {high} and a low of {low}.",
                 "On {date}, {city} will be {cond}: {temp} now, humidity {hum} and wind at {wind}.",
                 "Forecast for {city} ({date}): {cond}, high {high}, low {low}, wind {wind}.",
                 "It is {temp} and {cond} in {city} today ({date}); humidity is {hum}.",
                 "{city} on {date}: expect a high of {high} and a low of {low}, with humidity around {hum}."]
    return out, slots, templates, [("high", "low"), ("temp", "high"), ("hum", "wind")]


def stock(rng: random.Random):
    ticker, name = rng.choice(COMPANIES)
    d = date(2024, 1, 1) + timedelta(days=rng.randrange(700))
    price = round(rng.uniform(5, 900), 2)
    prev = round(price * rng.uniform(0.9, 1.1), 2)
    change = round(abs(price - prev) / prev * 100, 2)
    vol = rng.randrange(100_000, 90_000_000)
    cap = round(rng.uniform(1, 3000), 1)
    out = (f"QUOTE {ticker} ({name}) as of {d.isoformat()} close\nlast: {price:.2f} USD\nprev_close: {prev:.2f} USD\n"
           f"change_pct: {'-' if price < prev else '+'}{change:.2f}\nvolume: {vol}\nmarket_cap_bn: {cap}")
    slots = {"ticker": Slot(ticker, "entity", lambda r: _other(r, [c[0] for c in COMPANIES], ticker)),
             "name": Slot(name, "entity", lambda r: _other(r, [c[1] for c in COMPANIES], name)),
             "date": _date_slot(rng, d),
             "price": _number_slot(price, 2, prefix="$", units=[("€", ""), ("£", "")]),
             "prev": _number_slot(prev, 2, prefix="$", units=[("€", ""), ("£", "")]),
             "change": _number_slot(change, 2, suffix="%"), "vol": _number_slot(vol, 0, commas=True, suffix=" shares"),
             "cap": _number_slot(cap, 1, prefix="$", suffix=" billion")}
    templates = ["{name} ({ticker}) closed at {price} on {date}, a move of {change} from {prev}.",
                 "As of {date}, {ticker} trades at {price} with volume of {vol}.",
                 "{ticker} last traded at {price}; the previous close was {prev} and {vol} changed hands.",
                 "On {date} {name} closed at {price} ({change}), giving a market cap of {cap}.",
                 "Shares of {name} ended {date} at {price}, versus {prev} the day before."]
    return out, slots, templates, [("price", "prev")]


def order(rng: random.Random):
    oid = f"ORD-{rng.randrange(10000, 99999)}"
    who = rng.choice(PEOPLE)
    items = rng.randrange(1, 9)
    total = round(rng.uniform(8, 2500), 2)
    carrier = rng.choice(CARRIERS)
    placed = date(2024, 1, 1) + timedelta(days=rng.randrange(700))
    shipped = placed + timedelta(days=rng.randrange(1, 6))
    weight = round(rng.uniform(0.2, 30), 1)
    out = json.dumps({"tool": "lookup_order", "order_id": oid, "customer": who, "items": items, "total": f"{total:.2f}",
                      "currency": "USD", "placed": placed.isoformat(), "shipped": shipped.isoformat(), "carrier": carrier,
                      "weight_kg": weight, "status": "shipped"})
    slots = {"oid": Slot(oid, "entity", lambda r: f"ORD-{r.randrange(10000, 99999)}"), "who": _pick_slot(who, "entity", PEOPLE),
             "items": _number_slot(items, 0, suffix=" items"), "total": _number_slot(total, 2, prefix="$", commas=True, units=[("€", ""), ("£", "")]),
             "carrier": _pick_slot(carrier, "entity", CARRIERS), "placed": _date_slot(rng, placed), "shipped": _date_slot(rng, shipped),
             "weight": _number_slot(weight, 1, suffix=" kg", units=[("", " lb"), ("", " g")])}
    templates = ["Order {oid} for {who} shipped on {shipped} via {carrier}; the total was {total}.",
                 "{who}'s order {oid} ({items}, {total}) was placed on {placed} and shipped with {carrier}.",
                 "Your order {oid} went out with {carrier} on {shipped}. It weighs {weight} and cost {total}.",
                 "Order {oid}: {items} totalling {total}, placed {placed}, shipped {shipped}.",
                 "The package for {who} ({weight}) left on {shipped} via {carrier}."]
    return out, slots, templates, [("placed", "shipped")]


def files(rng: random.Random):
    user, proj = rng.choice(USERS), rng.choice(PROJECTS)
    folder = f"/home/{user}/{proj}"
    names = rng.sample([f"{s}.{e}" for s in FILE_STEMS for e in FILE_EXTS], 4)
    sizes = [rng.randrange(2, 900) for _ in names]
    day = date(2024, 1, 1) + timedelta(days=rng.randrange(700))
    minutes = [rng.randrange(0, 1440) for _ in names]
    lines = [f"$ ls -l {folder}", f"total {sum(sizes)}"]
    for n, s, m in zip(names, sizes, minutes):
        lines.append(f"-rw-r--r-- 1 {user} {user} {s}K {MONTH_NAMES[day.month - 1][:3]} {day.day:2d} {_time_text(m, '24')} {n}")
    out = "\n".join(lines)
    big = max(range(len(names)), key=lambda i: sizes[i])
    others = [f"{s}.{e}" for s in FILE_STEMS for e in FILE_EXTS]
    slots = {"folder": Slot(folder, "entity", lambda r: f"/home/{_other(r, USERS, user)}/{proj}" if r.random() < 0.5 else f"/home/{user}/{_other(r, PROJECTS, proj)}"),
             "f0": _pick_slot(names[0], "entity", others), "f1": _pick_slot(names[1], "entity", others),
             "big": _pick_slot(names[big], "entity", others),
             "bigsize": _number_slot(sizes[big], 0, suffix=" KB", units=[("", " MB"), ("", " GB")]),
             "s0": _number_slot(sizes[0], 0, suffix=" KB", units=[("", " MB"), ("", " GB")]),
             "day": Slot(_fmt_date(day, "short"), "date", lambda r: _fmt_date(day + timedelta(days=r.choice([-2, -1, 1, 2, 3])), "short")),
             "t0": _time_slot(minutes[0], rng.choice(["24", "12"])), "owner": Slot(user, "entity", lambda r: _other(r, USERS, user))}
    templates = ["The folder {folder} holds {f0} and {f1}, among others; the largest file is {big} at {bigsize}.",
                 "{f0} in {folder} is {s0} and was last modified on {day} at {t0}.",
                 "In {folder}, {big} is the biggest file ({bigsize}); {f1} is also there.",
                 "All files in {folder} belong to {owner} and were modified on {day}; {f0} is {s0}.",
                 "Listing {folder}: {f0} ({s0}, modified {t0}) and {f1}."]
    return out, slots, templates, [("f0", "f1"), ("s0", "bigsize")]


def calendar(rng: random.Random):
    title, room = rng.choice(EVENTS), rng.choice(ROOMS)
    d = date(2024, 1, 1) + timedelta(days=rng.randrange(700))
    start = rng.randrange(8 * 2, 17 * 2) * 30
    length = rng.choice([30, 45, 60, 90])
    people = rng.sample(PEOPLE, 3)
    organiser = people[0]
    out = "\n".join(["BEGIN:VEVENT", f"SUMMARY:{title}", f"DTSTART:{d.isoformat()} {_time_text(start, '24')}",
                     f"DTEND:{d.isoformat()} {_time_text(start + length, '24')}", f"LOCATION:{room}", f"ORGANIZER:{organiser}",
                     "ATTENDEES:" + ", ".join(people), f"DURATION_MIN:{length}", "END:VEVENT"])
    style = rng.choice(["24", "12"])
    slots = {"title": _pick_slot(title, "entity", EVENTS), "room": _pick_slot(room, "entity", ROOMS), "date": _date_slot(rng, d),
             "start": _time_slot(start, style), "end": _time_slot(start + length, style),
             "len": _number_slot(length, 0, suffix=" minutes", units=[("", " hours"), ("", " seconds")]),
             "org": _pick_slot(organiser, "entity", PEOPLE), "p1": _pick_slot(people[1], "entity", PEOPLE)}
    templates = ["{title} is on {date} from {start} to {end} in {room}, organised by {org}.",
                 "You have {title} on {date} at {start} ({len}) with {p1}.",
                 "{org} set up {title} for {date}; it runs {len} in {room}.",
                 "Reminder: {title} starts at {start} on {date} in {room}.",
                 "On {date}, {title} with {org} and {p1} ends at {end}."]
    return out, slots, templates, [("start", "end"), ("org", "p1")]


def account(rng: random.Random):
    who = rng.choice(PEOPLE)
    acct = f"ACC{rng.randrange(100000, 999999)}"
    balance = round(rng.uniform(10, 20000), 2)
    rows = []
    d = date(2024, 1, 1) + timedelta(days=rng.randrange(700))
    merchants = rng.sample(MERCHANTS, 3)
    amounts = [round(rng.uniform(3, 400), 2) for _ in merchants]
    for i, (m, a) in enumerate(zip(merchants, amounts)):
        rows.append(f"{(d - timedelta(days=i)).isoformat()} | {m} | -{a:.2f}")
    out = f"account: {acct}\nholder: {who}\nbalance: {balance:.2f} USD\nrecent transactions:\n" + "\n".join(rows)
    slots = {"who": _pick_slot(who, "entity", PEOPLE), "acct": Slot(acct, "entity", lambda r: f"ACC{r.randrange(100000, 999999)}"),
             "bal": _number_slot(balance, 2, prefix="$", commas=True, units=[("€", ""), ("£", "")]),
             "m0": _pick_slot(merchants[0], "entity", MERCHANTS), "a0": _number_slot(amounts[0], 2, prefix="$", units=[("€", ""), ("£", "")]),
             "m1": _pick_slot(merchants[1], "entity", MERCHANTS), "a1": _number_slot(amounts[1], 2, prefix="$", units=[("€", ""), ("£", "")]),
             "d0": _date_slot(rng, d)}
    templates = ["{who}, your balance on account {acct} is {bal}; the last charge was {a0} at {m0} on {d0}.",
                 "Account {acct} holds {bal}. Recent spending: {a0} at {m0} and {a1} at {m1}.",
                 "The most recent transaction was {a0} at {m0} ({d0}); before that {a1} at {m1}.",
                 "Balance for {who}: {bal}. On {d0} you spent {a0} at {m0}.",
                 "{m1} charged {a1} and {m0} charged {a0}; {acct} now has {bal}."]
    return out, slots, templates, [("a0", "a1"), ("m0", "m1")]


TOOLS: dict[str, Callable] = {"weather": weather, "stock": stock, "order": order, "files": files, "calendar": calendar, "account": account}


# --------------------------------------------------------------------------- answers and corruptions
_FIELD = re.compile(r"\{(\w+)\}")


def render(template: str, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The template filled with ``values`` and where each field landed (char offsets)."""
    out, where, pos = [], {}, 0
    last = 0
    for m in _FIELD.finditer(template):
        lit = template[last:m.start()]
        out.append(lit)
        pos += len(lit)
        text = values[m.group(1)]
        where[m.group(1)] = (pos, pos + len(text))
        out.append(text)
        pos += len(text)
        last = m.end()
    out.append(template[last:])
    s = "".join(out)
    return s, where


def corrupt_answer(rng: random.Random, template: str, slots: dict[str, Slot], swaps: list[tuple[str, str]],
                   n: int = 1) -> tuple[str, list[tuple[int, int, str]]]:
    """``template`` filled with ``n`` of its values corrupted; the gold spans of the corrupted values."""
    used = _FIELD.findall(template)
    values = {k: s.text for k, s in slots.items()}
    kinds: dict[str, str] = {}
    usable_swaps = [(a, b) for a, b in swaps if a in used and b not in used and slots[a].kind == slots[b].kind
                    and slots[a].text != slots[b].text]
    for name in rng.sample(used, len(used)):
        if len(kinds) >= n:
            break
        slot = slots[name]
        choice = rng.random()
        if usable_swaps and choice < 0.2:
            a, b = rng.choice(usable_swaps)
            if a in kinds:
                continue
            values[a], kinds[a] = slots[b].text, "swap"
            usable_swaps = []
            continue
        if slot.unit_swap is not None and choice < 0.45:
            values[name], kinds[name] = slot.unit_swap(rng), "unit"
        else:
            new = slot.corrupt(rng)
            if new == slot.text:
                continue
            values[name], kinds[name] = new, slot.kind
    answer, where = render(template, values)
    return answer, sorted((*where[k], kinds[k]) for k in kinds)


def make_sessions(n_sessions: int, *, seed: int = 0, correct: int = 2, corrupted: int = 2) -> list[Pair]:
    """``n_sessions`` sessions (tools in turn), each with ``correct`` faithful and ``corrupted`` corrupted
    answers (one or two values replaced; gold spans exact). Deterministic in ``seed``."""
    rng = random.Random(seed)
    names = sorted(TOOLS)
    pairs: list[Pair] = []
    for i in range(n_sessions):
        tool = names[i % len(names)]
        context, slots, templates, swaps = TOOLS[tool](rng)
        sid = f"{tool}-{seed}-{i:05d}"
        chosen = rng.sample(templates, min(len(templates), correct + corrupted))
        while len(chosen) < correct + corrupted:
            chosen.append(rng.choice(templates))
        for t in chosen[:correct]:
            answer, _ = render(t, {k: s.text for k, s in slots.items()})
            pairs.append(Pair(sid, tool, context, answer, []))
        for t in chosen[correct:]:
            answer, spans = corrupt_answer(rng, t, slots, swaps, n=1 if rng.random() < 0.7 else 2)
            if spans:
                pairs.append(Pair(sid, tool, context, answer, spans))
    return pairs


def split_by_session(pairs: list[Pair], *, test_fraction: float = 0.25, seed: int = 0, salt: str = "") -> tuple[list[Pair], list[Pair]]:
    """(train, test): each session wholly on one side, chosen by a seeded hash of its id (stable when
    sessions are added or reordered). ``salt`` makes a split independent of another with the same seed: a
    split of the train side needs one, or its held-out share falls where the test share already was."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    key = f"{seed}\x1f{salt}\x1f" if salt else f"{seed}\x1f"

    def in_test(sid: str) -> bool:
        h = int.from_bytes(hashlib.sha256(f"{key}{sid}".encode()).digest()[:8], "big")
        return h / 2 ** 64 < test_fraction

    train = [p for p in pairs if not in_test(p.session_id)]
    test = [p for p in pairs if in_test(p.session_id)]
    return train, test
