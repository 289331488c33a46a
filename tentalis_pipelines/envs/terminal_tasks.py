"""Terminal tasks, generated: an instruction, an initial file tree and a final-state check.

The shape is Terminal-Bench's / Endless-Terminals': the agent starts in a directory holding the task's
files and works with shell commands; when it submits, a check decides. Two kinds of check, both plain
data (JSON) read by a Python function on the host, never by running anything from the tree:

* ``{"kind": "answer", "expected": "42"}``: the submitted answer equals ``expected`` after stripping
  surrounding whitespace (levels 1 and 2);
* ``{"kind": "tree", "rules": [...]}``: the final tree satisfies every rule (level 3): ``{"path": p,
  "file": text}`` (a regular file with that content; trailing newlines are not compared), ``{"path": p,
  "absent": true}``, ``{"path": p, "exists": true}``, ``{"path": p, "dir": true}``, ``{"path": p, "entries": [names]}`` (a directory
  holding exactly these names).

Levels: 0, the command is named (opt-in, never in the default levels): the instruction gives the exact
command to run and asks for its output to be submitted (``wc -l < notes.txt``, ``grep -c ERROR app.log``,
``cut -d, -f3 row.csv``, ``sed -n 4p poem.txt``, ``tail -n 1 queue.txt``, ``cat code.txt``), so an agent
has only to copy the command into a bash block and submit what it printed (or ``submit $(command)`` in
one turn): the curriculum's first step for a model that cannot yet choose commands (the embedded 135M
solves 0% of levels 1-3); 1, one command (count lines, count matching lines, the line that mentions a word, a field of a
line, the Nth line, the last line); 2, a pipeline or two steps (the most frequent entry, a column's sum,
files by extension, distinct values, the largest number, a field of the matching record); 3, file edits
in several steps (rename files, fix a config value, create a directory structure with content, move
the files that match, delete by extension, sort a file in place, replace a word).

Every task is seeded and deterministic (``generate_tasks(per_level, seed)``); the first
``test_per_level`` tasks of each level are the held-out split (the same ones whatever ``per_level``),
the rest train. Each task carries a known solution (shell commands, the last one ``submit``) that the
oracle agent replays; tests run every generated task's solution through the real sandbox.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tentalis_pipelines.envs.base import Verdict

ENVIRONMENT = "terminal"
LEVELS = (1, 2, 3)  # the default levels (generation, the benchmark's levels 1-3)
ALL_LEVELS = (0, *LEVELS)  # level 0 is opt-in: ask for it by name (``levels=(0,)``, ``--levels 0``)
DEFAULT_PER_LEVEL = 80
DEFAULT_TEST_PER_LEVEL = 30

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "karl", "lena",
         "mike", "nina", "oscar", "peggy", "quinn", "rosa", "sam", "tina", "uma", "victor", "wendy", "xavier",
         "yara", "zack", "amir", "bella", "chen", "dina", "emil", "fiona", "gus", "hana", "igor", "jana"]
CITIES = ["Lisbon", "Paris", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Warsaw", "Oslo", "Dublin",
          "Athens", "Zurich", "Munich", "Lyon", "Porto", "Seville", "Milan", "Krakow", "Bergen", "Ghent",
          "Tallinn", "Riga", "Vilnius", "Sofia", "Bucharest", "Budapest", "Zagreb", "Helsinki", "Geneva", "Nice"]
WORDS = ["apple", "river", "stone", "cloud", "green", "table", "light", "paper", "music", "garden", "window",
         "silver", "forest", "bridge", "candle", "pocket", "rabbit", "summer", "winter", "yellow", "planet",
         "ocean", "thunder", "velvet", "marble", "copper", "meadow", "harbor", "lantern", "orchard", "pepper",
         "quartz", "saddle", "timber", "violet", "walnut", "anchor", "basket", "ladder", "mirror", "needle"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown", "grey",
          "teal", "navy", "olive", "maroon", "gold"]
ITEMS = ["bolt", "nut", "screw", "nail", "washer", "hinge", "spring", "gear", "valve", "clamp", "pulley",
         "rivet", "bracket", "spacer", "bearing"]
EXTS = ["py", "txt", "md", "json", "csv", "log", "sh", "cfg"]


@dataclass(frozen=True)
class TerminalTask:
    """One terminal task. ``tree``: relative path -> text (a path ending in ``/`` is an empty directory);
    ``check``: the final-state check (module doc); ``solution``: commands that solve it, the last one
    ``submit`` (with the answer for answer tasks)."""

    task_id: str
    level: int
    family: str
    instruction: str
    tree: dict[str, str]
    check: dict
    solution: list[str]
    split: str = "train"
    seed: int = 0
    metadata: dict = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return str(self.check["kind"])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TerminalTask:
        return cls(**d)

    def task_row(self) -> dict:
        """The task as the ``tasks`` table holds tasks: prompt = the instruction, reference = the check
        (JSON), metadata = level, family, split, tree and solution (JSON)."""
        meta = {"level": self.level, "family": self.family, "split": self.split, "seed": self.seed,
                "tree": self.tree, "solution": self.solution, **self.metadata}
        return {"task_id": self.task_id, "environment": ENVIRONMENT, "prompt": self.instruction,
                "reference": json.dumps(self.check, sort_keys=True), "metadata": json.dumps(meta, sort_keys=True)}

    @classmethod
    def from_task_row(cls, row: dict) -> TerminalTask:
        meta = json.loads(row["metadata"])
        extra = {k: v for k, v in meta.items() if k not in ("level", "family", "split", "seed", "tree", "solution")}
        return cls(task_id=row["task_id"], level=int(meta["level"]), family=meta["family"], instruction=row["prompt"],
                   tree=dict(meta["tree"]), check=json.loads(row["reference"]), solution=list(meta["solution"]),
                   split=meta.get("split", "train"), seed=int(meta.get("seed", 0)), metadata=extra)


# Shell words that say nothing about which tool a task needs (navigation, looking, control flow).
_NOT_TOOLS = frozenset({"cd", "ls", "cat", "for", "do", "done", "if", "then", "fi", "while", "submit", "echo", "true"})


def solution_tools(solution: list[str]) -> list[str]:
    """The programs a known solution uses (the first word of each command of each pipeline or list, in
    order, without navigation, ``cat``/``ls`` and ``submit``): what a manager may name in a hint ("the
    tool for it: wc") without giving the answer or the whole command."""
    tools: list[str] = []
    for command in solution:
        for part in re.split(r"\|\||&&|[|;]", command):
            words = part.strip().split()
            if words and words[0] in ("do", "then"):  # a loop's or a branch's body: its own first word
                words = words[1:]
            word = words[0] if words else ""
            if word and re.fullmatch(r"[A-Za-z][\w.+-]*", word) and word not in _NOT_TOOLS and word not in tools:
                tools.append(word)
    return tools


# --------------------------------------------------------------------------- checks
def file_text(entry: dict | None) -> str | None:
    """A snapshot entry's content as text (None unless it is a regular file read in full)."""
    if not entry or entry.get("type") != "file" or entry.get("truncated"):
        return None
    if "text" in entry:
        return str(entry["text"])
    return bytes.fromhex(entry.get("hex", "")).decode("utf-8", errors="replace")


def check_answer(check: dict, answer: str | None) -> Verdict:
    if answer is None:
        return Verdict(False, 0.0, "no answer was submitted")
    expected = str(check["expected"]).strip()
    got = answer.strip()
    if got == expected:
        return Verdict(True, 1.0, "correct answer")
    return Verdict(False, 0.0, f"answer {got[:80]!r} is not the expected one")


def check_tree(check: dict, tree: dict[str, dict]) -> Verdict:
    """The final tree (a sandbox snapshot: path -> entry) against the rules; the first broken rule is the
    detail."""
    for rule in check["rules"]:
        path = rule["path"]
        entry = tree.get(path)
        if rule.get("absent"):
            if entry is not None:
                return Verdict(False, 0.0, f"{path} should not exist")
        elif rule.get("exists"):  # anything at all (a file or a folder): bring-your-own task files' {"exists": true}
            if entry is None:
                return Verdict(False, 0.0, f"{path} should exist")
        elif rule.get("dir"):
            if entry is None or entry.get("type") != "dir":
                return Verdict(False, 0.0, f"{path} should be a directory")
        elif "entries" in rule:
            if entry is None or entry.get("type") != "dir":
                return Verdict(False, 0.0, f"{path} should be a directory")
            prefix = path.rstrip("/") + "/"
            names = sorted(p[len(prefix):] for p in tree if p.startswith(prefix) and "/" not in p[len(prefix):])
            if names != sorted(rule["entries"]):
                return Verdict(False, 0.0, f"{path} should hold exactly {sorted(rule['entries'])}, it holds {names[:20]}")
        elif "file" in rule:
            text = file_text(entry)
            if text is None:
                return Verdict(False, 0.0, f"{path} should be a file")
            if text.rstrip("\n") != str(rule["file"]).rstrip("\n"):
                return Verdict(False, 0.0, f"{path} does not have the expected content")
        else:
            raise ValueError(f"unknown rule {rule}")
    return Verdict(True, 1.0, "final state matches")


def verify(task: TerminalTask, answer: str | None, tree: dict[str, dict] | None) -> Verdict:
    """The final check of ``task``: the submitted ``answer`` for answer tasks, the final ``tree`` for edits."""
    if task.kind == "answer":
        return check_answer(task.check, answer)
    if tree is None:
        return Verdict(False, 0.0, "the final tree could not be read")
    return check_tree(task.check, tree)


# --------------------------------------------------------------------------- generators
def _lines_of_words(rng: random.Random, n: int, lo: int = 2, hi: int = 6) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def _fname(rng: random.Random, choices: list[str]) -> str:
    return rng.choice(choices)


def _answer(instruction: str, tree: dict, expected: object, look: str) -> tuple[str, dict, dict, list[str]]:
    expected = str(expected)
    return instruction, tree, {"kind": "answer", "expected": expected}, [look, f"submit {expected}"]


# level 0 ---------------------------------------------------------------------
def _named(command: str, what: str, tree: dict, expected: object) -> tuple[str, dict, dict, list[str]]:
    return _answer(f"Run the command `{command}` and submit {what} with submit.", tree, expected, command)


def _run_wc(rng):
    f = _fname(rng, ["notes.txt", "list.txt", "data.txt", "todo.txt", "words.txt"])
    lines = _lines_of_words(rng, rng.randint(3, 30))
    return _named(f"wc -l < {f}", "the number it prints", {f: "\n".join(lines) + "\n"}, len(lines))


def _run_grep_count(rng):
    f = _fname(rng, ["server.log", "app.log", "events.log"])
    level = rng.choice(["ERROR", "WARN", "INFO"])
    n = rng.randint(5, 30)
    lines = [f"{rng.randint(10, 23)}:{rng.randint(10, 59)} {rng.choice(['INFO', 'DEBUG', 'ERROR', 'WARN'])} "
             f"{rng.choice(WORDS)}" for _ in range(n)]
    if not any(level in ln for ln in lines):
        lines[rng.randrange(n)] = f"12:00 {level} {rng.choice(WORDS)}"
    return _named(f"grep -c {level} {f}", "the number it prints", {f: "\n".join(lines) + "\n"},
                  sum(level in ln for ln in lines))


def _run_cut(rng):
    f = _fname(rng, ["row.csv", "record.csv", "entry.csv"])
    fields = [rng.choice(WORDS) if rng.random() < 0.6 else str(rng.randint(1, 999)) for _ in range(rng.randint(3, 7))]
    k = rng.randint(1, len(fields))
    return _named(f"cut -d, -f{k} {f}", "the value it prints", {f: ",".join(fields) + "\n"}, fields[k - 1])


def _run_sed(rng):
    f = _fname(rng, ["poem.txt", "story.txt", "lines.txt"])
    lines = _lines_of_words(rng, rng.randint(5, 20), 1, 3)
    k = rng.randint(2, len(lines))
    return _named(f"sed -n {k}p {f}", "the line it prints", {f: "\n".join(lines) + "\n"}, lines[k - 1])


def _run_tail(rng):
    f = _fname(rng, ["queue.txt", "history.txt", "journal.txt"])
    lines = _lines_of_words(rng, rng.randint(3, 20), 1, 3)
    return _named(f"tail -n 1 {f}", "the line it prints", {f: "\n".join(lines) + "\n"}, lines[-1])


def _run_cat(rng):
    f = _fname(rng, ["code.txt", "secret.txt", "key.txt", "token.txt"])
    value = rng.choice([str(rng.randint(100, 99999)), f"{rng.choice(WORDS)}{rng.randint(1, 99)}"])
    return _named(f"cat {f}", "what it prints", {f: value + "\n", "readme.txt": f"{rng.choice(WORDS)} {rng.choice(WORDS)}\n"},
                  value)


# level 1 ---------------------------------------------------------------------
def _count_lines(rng):
    f = _fname(rng, ["notes.txt", "list.txt", "data.txt", "todo.txt", "words.txt"])
    lines = _lines_of_words(rng, rng.randint(4, 40))
    return _answer(f"How many lines does the file {f} have? Submit the number.", {f: "\n".join(lines) + "\n"},
                   len(lines), f"wc -l < {f}")


def _count_matching(rng):
    f = _fname(rng, ["server.log", "app.log", "events.log"])
    level = rng.choice(["ERROR", "WARN"])
    n = rng.randint(6, 40)
    lines = [f"{rng.randint(10, 23)}:{rng.randint(10, 59)} {rng.choice(['INFO', 'DEBUG', 'ERROR', 'WARN'])} "
             f"{rng.choice(WORDS)} {rng.choice(WORDS)}" for _ in range(n)]
    if not any(level in ln for ln in lines):
        lines[rng.randrange(n)] = f"12:00 {level} {rng.choice(WORDS)}"
    count = sum(level in ln for ln in lines)
    return _answer(f"How many lines of {f} contain the word {level}? Submit the number.", {f: "\n".join(lines) + "\n"},
                   count, f"grep -c {level} {f}")


def _find_line(rng):
    f = _fname(rng, ["people.txt", "staff.txt", "members.txt"])
    names = rng.sample(NAMES, rng.randint(5, 15))
    cities = rng.sample(CITIES, len(names))
    lines = [f"{n} {rng.randint(18, 80)} {c}" for n, c in zip(names, cities)]
    target = rng.randrange(len(lines))
    return _answer(f"Which line of {f} mentions {cities[target]}? Submit the whole line.", {f: "\n".join(lines) + "\n"},
                   lines[target], f"grep {cities[target]} {f}")


def _nth_field(rng):
    f = _fname(rng, ["record.csv", "row.csv", "entry.csv"])
    fields = [rng.choice(WORDS) if rng.random() < 0.6 else str(rng.randint(1, 999)) for _ in range(rng.randint(5, 9))]
    k = rng.randint(2, len(fields))
    return _answer(f"The file {f} holds one line of comma-separated values. What is field number {k} of that line? "
                   "Submit the value.", {f: ",".join(fields) + "\n"}, fields[k - 1], f"cut -d, -f{k} {f}")


def _line_n(rng):
    f = _fname(rng, ["poem.txt", "story.txt", "lines.txt"])
    lines = _lines_of_words(rng, rng.randint(8, 30))
    k = rng.randint(2, len(lines) - 1)
    return _answer(f"What is line {k} of {f}? Submit that line.", {f: "\n".join(lines) + "\n"}, lines[k - 1],
                   f"sed -n {k}p {f}")


def _last_line(rng):
    f = _fname(rng, ["history.txt", "journal.txt", "queue.txt"])
    lines = _lines_of_words(rng, rng.randint(5, 40))
    return _answer(f"What is the last line of {f}? Submit that line.", {f: "\n".join(lines) + "\n"}, lines[-1],
                   f"tail -n 1 {f}")


# level 2 ---------------------------------------------------------------------
def _top_entry(rng):
    f = _fname(rng, ["visits.log", "logins.txt", "votes.txt"])
    names = rng.sample(NAMES, rng.randint(4, 9))
    counts = rng.sample(range(1, 15), len(names))  # distinct counts: one clear winner
    lines = [n for n, c in zip(names, counts) for _ in range(c)]
    rng.shuffle(lines)
    top = names[counts.index(max(counts))]
    return _answer(f"Each line of {f} is a name. Which name appears most often? Submit the name.",
                   {f: "\n".join(lines) + "\n"}, top, f"sort {f} | uniq -c | sort -rn | head -n 1")


def _sum_column(rng):
    f = _fname(rng, ["sales.csv", "orders.csv", "stock.csv"])
    items = rng.sample(ITEMS, rng.randint(3, 10))
    rows = [(i, rng.randint(1, 99), rng.randint(1, 500)) for i in items]
    col, idx = rng.choice([("qty", 1), ("price", 2)])
    text = "item,qty,price\n" + "".join(f"{i},{q},{p}\n" for i, q, p in rows)
    total = sum(r[idx] for r in rows)
    return _answer(f"{f} is a CSV file with a header line item,qty,price. What is the sum of the {col} column? "
                   "Submit the number.", {f: text}, total,
                   f"awk -F, 'NR > 1 {{ s += ${idx + 1} }} END {{ print s }}' {f}")


def _count_ext(rng):
    ext = rng.choice(["py", "txt", "md", "json"])
    tree: dict[str, str] = {}
    dirs = ["src", "src/core", "src/util", "src/app/views", "src/tests"]
    for _ in range(rng.randint(6, 20)):
        d = rng.choice(dirs)
        e = rng.choice(EXTS)
        tree[f"{d}/{rng.choice(WORDS)}_{rng.randint(1, 99)}.{e}"] = rng.choice(WORDS) + "\n"
    if not any(p.endswith("." + ext) for p in tree):
        tree[f"src/{rng.choice(WORDS)}.{ext}"] = "x\n"
    count = sum(p.endswith("." + ext) for p in tree)
    return _answer(f"How many files ending in .{ext} are there in the directory src and its subdirectories? "
                   "Submit the number.", tree, count, f"find src -name '*.{ext}' | wc -l")


def _unique_count(rng):
    f = _fname(rng, ["colors.txt", "paint.txt", "flags.txt"])
    pool = rng.sample(COLORS, rng.randint(3, 10))
    lines = pool + [rng.choice(pool) for _ in range(rng.randint(3, 25))]
    rng.shuffle(lines)
    return _answer(f"Each line of {f} is a colour. How many different colours does it list? Submit the number.",
                   {f: "\n".join(lines) + "\n"}, len(set(lines)), f"sort -u {f} | wc -l")


def _max_value(rng):
    f = _fname(rng, ["numbers.txt", "scores.txt", "readings.txt"])
    nums = rng.sample(range(1, 5000), rng.randint(5, 30))
    return _answer(f"Each line of {f} is a whole number. What is the largest one? Submit it.",
                   {f: "\n".join(map(str, nums)) + "\n"}, max(nums), f"sort -n {f} | tail -n 1")


def _field_of_match(rng):
    f = _fname(rng, ["users.csv", "contacts.csv", "accounts.csv"])
    names = rng.sample(NAMES, rng.randint(4, 12))
    rows = [(n, rng.randint(18, 80), f"{n}{rng.randint(1, 99)}@{rng.choice(['example.com', 'mail.org', 'work.net'])}")
            for n in names]
    target = rng.choice(rows)
    text = "name,age,email\n" + "".join(f"{n},{a},{e}\n" for n, a, e in rows)
    return _answer(f"{f} is a CSV file with a header line name,age,email. What is the email address of {target[0]}? "
                   "Submit it.", {f: text}, target[2], f"grep '^{target[0]},' {f} | cut -d, -f3")


# level 3 ---------------------------------------------------------------------
def _edit(instruction: str, tree: dict, rules: list[dict], commands: list[str]) -> tuple[str, dict, dict, list[str]]:
    return instruction, tree, {"kind": "tree", "rules": rules}, [*commands, "submit"]


def _rename_ext(rng):
    d = rng.choice(["docs", "notes", "pages"])
    names = rng.sample(WORDS, rng.randint(2, 6))
    tree = {f"{d}/{n}.txt": f"{n} {rng.choice(WORDS)}\n" for n in names}
    keep = f"{d}/{rng.choice([w for w in WORDS if w not in names])}.md"
    tree[keep] = "already markdown\n"
    rules = [{"path": d, "entries": sorted([f"{n}.md" for n in names] + [keep.split("/")[1]])}]
    rules += [{"path": f"{d}/{n}.md", "file": tree[f"{d}/{n}.txt"]} for n in names]
    rules += [{"path": keep, "file": tree[keep]}]
    return _edit(f"Rename every file in the directory {d} that ends in .txt so that it ends in .md instead "
                 "(keep the contents). When you are done, run submit.", tree, rules,
                 [f"cd {d} && for f in *.txt; do mv \"$f\" \"${{f%.txt}}.md\"; done", f"ls {d}"])


def _fix_config(rng):
    f = rng.choice(["app.conf", "server.cfg", "settings.ini"])
    key = rng.choice(["port", "timeout", "workers", "retries", "level"])
    old, new = rng.sample(range(2, 9999), 2)
    others = rng.sample(["host", "user", "mode", "cache", "region", "debug", "name", "path"], rng.randint(2, 5))
    pairs = [(k, rng.choice(WORDS)) for k in others] + [(key, str(old))]
    rng.shuffle(pairs)
    before = "".join(f"{k}={v}\n" for k, v in pairs)
    after = "".join(f"{k}={new if k == key else v}\n" for k, v in pairs)
    return _edit(f"In the file {f}, change the value of {key} from {old} to {new}. Leave every other line as it is. "
                 "When you are done, run submit.", {f: before}, [{"path": f, "file": after}],
                 [f"sed -i 's/^{key}={old}$/{key}={new}/' {f}", f"cat {f}"])


def _make_structure(rng):
    root = rng.choice(["project", "site", "tool", "game"])
    subs = sorted(rng.sample(["src", "tests", "docs", "data", "bin", "config"], rng.randint(2, 3)))
    title = rng.choice(WORDS)
    listing = " and ".join(f"{root}/{s}" for s in subs)
    rules = [{"path": root, "dir": True}, *({"path": f"{root}/{s}", "dir": True} for s in subs),
             {"path": f"{root}/README.md", "file": f"# {title}\n"}]
    return _edit(f"Create the directories {listing}, and a file {root}/README.md that holds the single line "
                 f"# {title} (nothing else). When you are done, run submit.", {"notes.txt": "start here\n"}, rules,
                 [f"mkdir -p {' '.join(f'{root}/{s}' for s in subs)}", f"echo '# {title}' > {root}/README.md"])


def _move_matching(rng):
    names = rng.sample(WORDS, rng.randint(3, 7))
    hot = set(rng.sample(names, rng.randint(1, len(names) - 1)))
    tree = {}
    for n in names:
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        if n in hot:
            words.insert(rng.randrange(len(words) + 1), "urgent")
        tree[f"inbox/{n}.txt"] = " ".join(words) + "\n"
    rules = [{"path": "urgent", "entries": sorted(f"{n}.txt" for n in hot)},
             {"path": "inbox", "entries": sorted(f"{n}.txt" for n in names if n not in hot)}]
    rules += [{"path": f"urgent/{n}.txt" if n in hot else f"inbox/{n}.txt", "file": tree[f"inbox/{n}.txt"]} for n in names]
    return _edit("Move every file in the directory inbox that contains the word urgent into a new directory "
                 "named urgent. Leave the other files where they are. When you are done, run submit.", tree, rules,
                 ["mkdir -p urgent", "grep -lw urgent inbox/* | xargs -I{} mv {} urgent/", "ls inbox urgent"])


def _delete_ext(rng):
    ext = rng.choice(["tmp", "bak", "o"])
    tree = {}
    for _ in range(rng.randint(4, 12)):
        d = rng.choice(["build", "build/lib", "build/obj"])
        e = rng.choice([ext, "c", "h", "txt"])
        tree[f"{d}/{rng.choice(WORDS)}{rng.randint(1, 99)}.{e}"] = rng.choice(WORDS) + "\n"
    if not any(p.endswith("." + ext) for p in tree):
        tree[f"build/{rng.choice(WORDS)}.{ext}"] = "junk\n"
    if all(p.endswith("." + ext) for p in tree):
        tree["build/main.c"] = "int main(void) { return 0; }\n"
    rules = [{"path": p, "absent": True} if p.endswith("." + ext) else {"path": p, "file": t} for p, t in sorted(tree.items())]
    return _edit(f"Delete every file ending in .{ext} in the directory build and its subdirectories. Keep all the "
                 "other files. When you are done, run submit.", tree, rules,
                 [f"find build -name '*.{ext}' -delete", "find build -type f"])


def _sort_in_place(rng):
    f = rng.choice(["names.txt", "guests.txt", "team.txt"])
    names = rng.sample(NAMES, rng.randint(5, 15))
    if names == sorted(names):
        names.reverse()
    return _edit(f"Sort the lines of {f} in alphabetical order and save the result back into {f}. "
                 "When you are done, run submit.", {f: "\n".join(names) + "\n"},
                 [{"path": f, "file": "\n".join(sorted(names)) + "\n"}], [f"sort {f} -o {f}", f"cat {f}"])


def _replace_word(rng):
    f = rng.choice(["story.txt", "letter.txt", "report.txt"])
    old, new = rng.sample(["cat", "dog", "fox", "owl", "bee", "elk"], 2)
    lines = []
    for _ in range(rng.randint(3, 10)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 7))]
        if rng.random() < 0.6:
            words.insert(rng.randrange(len(words) + 1), old)
        lines.append(" ".join(words))
    if not any(old in ln.split() for ln in lines):
        lines[0] = f"{old} {lines[0]}"
    after = [" ".join(new if w == old else w for w in ln.split()) for ln in lines]
    return _edit(f"In {f}, replace every occurrence of the word {old} with {new}. When you are done, run submit.",
                 {f: "\n".join(lines) + "\n"}, [{"path": f, "file": "\n".join(after) + "\n"}],
                 [f"sed -i 's/\\b{old}\\b/{new}/g' {f}", f"cat {f}"])


# level 1, in other words ------------------------------------------------------
# The paraphrased held-out split (``wording="paraphrased"``): the same six kinds, each asked in other
# words, over other file names and other contents, so a benchmark on it tells how much of what a
# policy learned on the default wording survives a change of wording. Never used for training.
def _p_count_lines(rng):
    f = _fname(rng, ["inventory.lst", "guests.dat", "backlog.text", "cities.out"])
    lines = [f"{rng.choice(CITIES)} {rng.choice(ITEMS)}" for _ in range(rng.randint(4, 40))]
    return _answer(f"Tell me the line count of {f}: submit how many lines it contains.", {f: "\n".join(lines) + "\n"},
                   len(lines), f"wc -l < {f}")


def _p_count_matching(rng):
    f = _fname(rng, ["daemon.out", "cron.txt", "worker.trace"])
    tag = rng.choice(["FAIL", "TIMEOUT"])
    n = rng.randint(6, 40)
    lines = [f"[{rng.choice(['OK', 'FAIL', 'TIMEOUT', 'RETRY'])}] job-{rng.randint(1, 999)} {rng.choice(ITEMS)}" for _ in range(n)]
    if not any(tag in ln for ln in lines):
        lines[rng.randrange(n)] = f"[{tag}] job-1 {rng.choice(ITEMS)}"
    count = sum(tag in ln for ln in lines)
    return _answer(f"Count the entries in {f} that include {tag} and submit that count.", {f: "\n".join(lines) + "\n"},
                   count, f"grep -c {tag} {f}")


def _p_find_line(rng):
    f = _fname(rng, ["roster.dat", "crew.lst", "directory.text"])
    names = rng.sample(NAMES, rng.randint(5, 15))
    colors = rng.sample(COLORS, len(names)) if len(names) <= len(COLORS) else [rng.choice(COLORS) for _ in names]
    lines = [f"{n.capitalize()}: likes {c}, badge {rng.randint(100, 999)}" for n, c in zip(names, colors)]
    target = rng.randrange(len(lines))
    who = names[target].capitalize()
    return _answer(f"Find the entry for {who} in {f} and submit it exactly as written.", {f: "\n".join(lines) + "\n"},
                   lines[target], f"grep {who} {f}")


def _p_nth_field(rng):
    f = _fname(rng, ["sample.dat", "fields.txt", "tuple.out"])
    fields = [rng.choice(ITEMS + CITIES) if rng.random() < 0.6 else str(rng.randint(1, 9999)) for _ in range(rng.randint(5, 9))]
    k = rng.randint(2, len(fields))
    ordinal = {2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth", 7: "seventh", 8: "eighth", 9: "ninth"}[k]
    return _answer(f"{f} contains a single comma-delimited record. Submit its {ordinal} value.", {f: ",".join(fields) + "\n"},
                   fields[k - 1], f"cut -d, -f{k} {f}")


def _p_line_n(rng):
    f = _fname(rng, ["verses.dat", "chapter.text", "script.lst"])
    lines = [" ".join(rng.choice(CITIES + ITEMS) for _ in range(rng.randint(2, 5))) for _ in range(rng.randint(8, 30))]
    k = rng.randint(2, len(lines) - 1)
    return _answer(f"Submit the text found on line number {k} of the file {f}.", {f: "\n".join(lines) + "\n"},
                   lines[k - 1], f"sed -n {k}p {f}")


def _p_last_line(rng):
    f = _fname(rng, ["audit.trail", "changes.dat", "feed.lst"])
    lines = [f"{rng.choice(NAMES)} {rng.choice(['added', 'removed', 'moved'])} {rng.choice(ITEMS)}" for _ in range(rng.randint(5, 40))]
    return _answer(f"Look at the end of {f} and submit its final entry (the last line).", {f: "\n".join(lines) + "\n"},
                   lines[-1], f"tail -n 1 {f}")


Generator = Callable[[random.Random], tuple[str, dict, dict, list[str]]]
FAMILIES: dict[int, dict[str, Generator]] = {
    0: {"run_wc": _run_wc, "run_grep_count": _run_grep_count, "run_cut": _run_cut, "run_sed": _run_sed,
        "run_tail": _run_tail, "run_cat": _run_cat},
    1: {"count_lines": _count_lines, "count_matching": _count_matching, "find_line": _find_line,
        "nth_field": _nth_field, "line_n": _line_n, "last_line": _last_line},
    2: {"top_entry": _top_entry, "sum_column": _sum_column, "count_ext": _count_ext, "unique_count": _unique_count,
        "max_value": _max_value, "field_of_match": _field_of_match},
    3: {"rename_ext": _rename_ext, "fix_config": _fix_config, "make_structure": _make_structure,
        "move_matching": _move_matching, "delete_ext": _delete_ext, "sort_in_place": _sort_in_place,
        "replace_word": _replace_word},
}
# The same kinds in other words (held-out evaluation only; see the section above): level -> family -> generator.
PARAPHRASED: dict[int, dict[str, Generator]] = {
    1: {"count_lines": _p_count_lines, "count_matching": _p_count_matching, "find_line": _p_find_line,
        "nth_field": _p_nth_field, "line_n": _p_line_n, "last_line": _p_last_line},
}
WORDINGS = ("default", "paraphrased")


def make_task(level: int, index: int, *, seed: int = 0, test_per_level: int = DEFAULT_TEST_PER_LEVEL,
              family: str | None = None, wording: str = "default") -> TerminalTask:
    """Task ``index`` of ``level`` (families in turn, or always ``family`` when given); the same
    arguments always give the same task. ``wording="paraphrased"``: the same kind asked in other words
    over other files (:data:`PARAPHRASED`, level 1 only)."""
    if wording not in WORDINGS:
        raise ValueError(f"wording must be one of {WORDINGS}, got {wording!r}")
    table = FAMILIES if wording == "default" else PARAPHRASED
    if level not in table:
        raise ValueError(f"level {level} has no {wording} tasks (levels: {sorted(table)})")
    families = table[level]
    if family is not None and family not in families:
        raise ValueError(f"level {level} has no task kind {family!r} (kinds: {', '.join(families)})")
    # the round-robin default keeps the seed string every stored task was generated with
    salt = "" if wording == "default" and family is None else f":{wording}:{family}"
    family = family or list(families)[index % len(families)]
    rng = random.Random(f"tentalis-terminal:{seed}:{level}:{index}{salt}")
    instruction, tree, check, solution = families[family](rng)
    suffix = "" if wording == "default" else "-para"
    return TerminalTask(task_id=f"terminal-s{seed}-l{level}-{index:04d}-{family}{suffix}", level=level, family=family,
                        instruction=instruction, tree=tree, check=check, solution=solution,
                        split="test" if index < test_per_level else "train", seed=seed,
                        metadata={} if wording == "default" else {"wording": wording})


def generate_tasks(per_level: int = DEFAULT_PER_LEVEL, *, seed: int = 0, levels: tuple[int, ...] = LEVELS,
                   test_per_level: int = DEFAULT_TEST_PER_LEVEL) -> list[TerminalTask]:
    """``per_level`` tasks of each level (default 80 x 3 = 240, levels 1-3; level 0 only when asked for):
    the first ``test_per_level`` of each level are the held-out split."""
    return [make_task(level, i, seed=seed, test_per_level=test_per_level) for level in levels for i in range(per_level)]


def split_counts(tasks: list[TerminalTask]) -> dict[tuple[int, str], int]:
    return dict(Counter((t.level, t.split) for t in tasks))
