"""Generated BFCL training tasks: new initial states and goals on BFCL's own simulators.

Each task is a :class:`~tentalis_pipelines.envs.bfcl.BfclTask`: user turns, an initial configuration of
the simulators (a fresh file tree for ``GorillaFileSystem``, a fresh user directory and a logged-in user
for ``MessageAPI``), and the ground-truth calls per turn. The expected final state is not written down:
BFCL's checker runs the ground-truth calls on fresh simulators and compares the states (public
attributes) and the results after every turn, exactly as for the official items, so a generated task is
checked by the same code (``bfcl.check``). Every task is seeded and deterministic (``generate_tasks``);
the oracle (the ground truth replayed in the model's format) passes each one and a do-nothing agent fails
each one (tests over every generated task).

Levels:

1. one call, one user turn: make a directory, create a file, show a file, count a file's lines, send a
   message to a user id;
2. two or three calls in one user turn: create a file in a sub-directory and write text into it, move a
   file into a directory inside another, grep a file in a sub-directory, count a file's words in a
   sub-directory, send a message to a user by name (look the id up first);
3. two user turns: make a directory and copy a file into it, then sort the copy there; write a file in a
   sub-directory, then count its lines; send a message by name, then list the messages sent.

The first ``test_per_level`` tasks of each level are the held-out split (the same ones whatever
``per_level``); the rest train. The official ``multi_turn_base`` items are never generated (different
goals and states), and the contamination guard (``contamination.py``, benchmark ``bfcl``) refuses a
batch that reproduces one.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from tentalis_pipelines.envs.bfcl import BfclTask

LEVELS = (1, 2, 3)
DEFAULT_PER_LEVEL = 80
DEFAULT_TEST_PER_LEVEL = 30
FS = "GorillaFileSystem"
MSG = "MessageAPI"

ROOTS = ["workspace", "home", "projects", "office", "lab", "studio", "archive_root", "team"]
DIRS = ["docs", "notes", "reports", "drafts", "backup", "data", "photos", "music", "logs", "src", "tests", "papers",
        "invoices", "letters", "plans", "recipes"]
STEMS = ["summary", "budget", "todo", "readme", "journal", "agenda", "ideas", "minutes", "schedule", "contacts",
         "inventory", "results", "memo", "outline", "draft", "list"]
EXTS = ["txt", "md", "csv", "log"]
WORDS = ["apple", "river", "stone", "cloud", "green", "table", "light", "paper", "music", "garden", "window", "silver",
         "forest", "bridge", "candle", "pocket", "rabbit", "summer", "winter", "yellow", "planet", "ocean", "thunder",
         "velvet", "marble", "copper", "meadow", "harbor", "lantern", "orchard"]
PEOPLE = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Karl", "Lena", "Mike",
          "Nina", "Oscar", "Peggy", "Quinn", "Rosa", "Sam", "Tina"]
MESSAGES = ["The meeting moved to Friday.", "Please review the draft.", "Lunch at noon?", "The build is green again.",
            "Can you send the invoice?", "I will be late today.", "Thanks for the help!", "The report is ready.",
            "Call me when you can.", "See you at the station."]


def _fname(rng: random.Random) -> str:
    return f"{rng.choice(STEMS)}_{rng.randint(1, 99)}.{rng.choice(EXTS)}"


def _text(rng: random.Random, lines: int) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(lines))


def _file(content: str) -> dict:
    return {"type": "file", "content": content}


def _dir(contents: dict) -> dict:
    return {"type": "directory", "contents": contents}


def _tree(rng: random.Random, *, subdirs: int = 2, files: int = 2) -> tuple[str, dict, list[str], list[str]]:
    """(root name, root contents, top-level file names, sub-directory names): a small random tree, each
    sub-directory holding one or two files of its own."""
    root = rng.choice(ROOTS)
    dirs = rng.sample(DIRS, subdirs)
    names: list[str] = []
    contents: dict = {}
    while len(names) < files:
        n = _fname(rng)
        if n not in names:
            names.append(n)
    for n in names:
        contents[n] = _file(_text(rng, rng.randint(2, 6)))
    for d in dirs:
        inner = {}
        for _ in range(rng.randint(1, 2)):
            inner[_fname(rng)] = _file(_text(rng, rng.randint(2, 5)))
        contents[d] = _dir(inner)
    return root, contents, names, dirs


def _fs(root: str, contents: dict) -> dict:
    return {FS: {"root": {root: _dir(contents)}}}


def _new_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        n = _fname(rng)
        if n not in taken:
            return n


def _messaging(rng: random.Random) -> tuple[dict, dict[str, str], str]:
    """(MessageAPI config, name -> id, the logged-in user's id): a fresh user directory, one user logged in."""
    people = rng.sample(PEOPLE, 5)
    ids = {p: f"USR{rng.randint(100, 999)}{i}" for i, p in enumerate(people)}
    me = ids[people[0]]
    config = {MSG: {"user_count": len(ids), "user_map": ids, "inbox": [{ids[people[1]]: rng.choice(MESSAGES)}],
                    "message_count": 1, "current_user": me, "random_seed": rng.randint(1, 10**6)}}
    return config, ids, me


Spec = tuple[list[str], dict, list[str], list[list[str]]]  # turns, initial config, classes, ground truth


# --------------------------------------------------------------------------- level 1
def _mkdir(rng: random.Random) -> Spec:
    root, contents, _, dirs = _tree(rng)
    new = rng.choice([d for d in DIRS if d not in dirs])
    return ([f"Create a new directory named '{new}' in the current directory."], _fs(root, contents), [FS],
            [[f"mkdir(dir_name='{new}')"]])


def _touch(rng: random.Random) -> Spec:
    root, contents, names, _ = _tree(rng)
    new = _new_name(rng, set(names))
    return [f"Create an empty file called '{new}' here."], _fs(root, contents), [FS], [[f"touch(file_name='{new}')"]]


def _cat(rng: random.Random) -> Spec:
    root, contents, names, _ = _tree(rng)
    f = rng.choice(names)
    return [f"Show me what is written in '{f}'."], _fs(root, contents), [FS], [[f"cat(file_name='{f}')"]]


def _wc_lines(rng: random.Random) -> Spec:
    root, contents, names, _ = _tree(rng)
    f = rng.choice(names)
    return [f"How many lines does '{f}' have?"], _fs(root, contents), [FS], [[f"wc(file_name='{f}', mode='l')"]]


def _send_id(rng: random.Random) -> Spec:
    config, ids, me = _messaging(rng)
    to = rng.choice([i for i in ids.values() if i != me])
    msg = rng.choice(MESSAGES)
    return ([f"Send the message '{msg}' to the user with id {to}."], config, [MSG],
            [[f"send_message(receiver_id='{to}', message={msg!r})"]])


# --------------------------------------------------------------------------- level 2
def _write_in_dir(rng: random.Random) -> Spec:
    root, contents, _, dirs = _tree(rng)
    d = rng.choice(dirs)
    new = _new_name(rng, set(contents[d]["contents"]))
    text = " ".join(rng.choice(WORDS) for _ in range(4))
    return ([f"In the '{d}' directory, create a file named '{new}' and write '{text}' into it."], _fs(root, contents),
            [FS], [[f"cd(folder='{d}')", f"touch(file_name='{new}')", f"echo(content='{text}', file_name='{new}')"]])


def _move_inside(rng: random.Random) -> Spec:
    root, contents, _, dirs = _tree(rng)
    outer = rng.choice(dirs)
    inner = rng.choice([d for d in DIRS if d not in dirs])
    contents[outer]["contents"][inner] = _dir({})
    f = rng.choice([n for n, v in contents[outer]["contents"].items() if v["type"] == "file"])
    return ([f"Go into the '{outer}' folder and move '{f}' into its '{inner}' directory."], _fs(root, contents), [FS],
            [[f"cd(folder='{outer}')", f"mv(source='{f}', destination='{inner}')"]])


def _grep_in_dir(rng: random.Random) -> Spec:
    root, contents, _, dirs = _tree(rng)
    d = rng.choice(dirs)
    f = rng.choice(list(contents[d]["contents"]))
    word = rng.choice(contents[d]["contents"][f]["content"].split())
    return ([f"Find the lines of '{f}' in the '{d}' folder that mention '{word}'."], _fs(root, contents), [FS],
            [[f"cd(folder='{d}')", f"grep(file_name='{f}', pattern='{word}')"]])


def _wc_words_in_dir(rng: random.Random) -> Spec:
    root, contents, _, dirs = _tree(rng)
    d = rng.choice(dirs)
    f = rng.choice(list(contents[d]["contents"]))
    return ([f"How many words are in '{f}', which is in the '{d}' folder?"], _fs(root, contents), [FS],
            [[f"cd(folder='{d}')", f"wc(file_name='{f}', mode='w')"]])


def _send_name(rng: random.Random) -> Spec:
    config, ids, me = _messaging(rng)
    name = rng.choice([p for p, i in ids.items() if i != me])
    msg = rng.choice(MESSAGES)
    return ([f"Send '{msg}' to {name}. You may need to look up their user id first."], config, [MSG],
            [[f"get_user_id(user='{name}')", f"send_message(receiver_id='{ids[name]}', message={msg!r})"]])


# --------------------------------------------------------------------------- level 3
def _copy_then_sort(rng: random.Random) -> Spec:
    root, contents, names, dirs = _tree(rng)
    new = rng.choice([d for d in DIRS if d not in dirs])
    f = rng.choice(names)
    return ([f"Create a directory called '{new}' and copy '{f}' into it.", f"Now go into '{new}' and sort the copy of '{f}' there."],
            _fs(root, contents), [FS],
            [[f"mkdir(dir_name='{new}')", f"cp(source='{f}', destination='{new}')"], [f"cd(folder='{new}')", f"sort(file_name='{f}')"]])


def _write_then_count(rng: random.Random) -> Spec:
    root, contents, _, dirs = _tree(rng)
    d = rng.choice(dirs)
    new = _new_name(rng, set(contents[d]["contents"]))
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7)))
    return ([f"Create a file named '{new}' inside the '{d}' directory and write '{text}' into it.",
             f"How many words does '{new}' hold now?"], _fs(root, contents), [FS],
            [[f"cd(folder='{d}')", f"touch(file_name='{new}')", f"echo(content='{text}', file_name='{new}')"],
             [f"wc(file_name='{new}', mode='w')"]])


def _send_then_list(rng: random.Random) -> Spec:
    config, ids, me = _messaging(rng)
    name = rng.choice([p for p, i in ids.items() if i != me])
    msg = rng.choice(MESSAGES)
    return ([f"Please message {name}: '{msg}'", "Now show me all the messages I have sent."], config, [MSG],
            [[f"get_user_id(user='{name}')", f"send_message(receiver_id='{ids[name]}', message={msg!r})"],
             ["view_messages_sent()"]])


Generator = Callable[[random.Random], Spec]
FAMILIES: dict[int, dict[str, Generator]] = {
    1: {"mkdir": _mkdir, "touch": _touch, "cat": _cat, "wc_lines": _wc_lines, "send_id": _send_id},
    2: {"write_in_dir": _write_in_dir, "move_inside": _move_inside, "grep_in_dir": _grep_in_dir,
        "wc_words_in_dir": _wc_words_in_dir, "send_name": _send_name},
    3: {"copy_then_sort": _copy_then_sort, "write_then_count": _write_then_count, "send_then_list": _send_then_list},
}


def make_task(level: int, index: int, *, seed: int = 0, test_per_level: int = DEFAULT_TEST_PER_LEVEL) -> BfclTask:
    """Task ``index`` of ``level`` (families in turn); the same arguments always give the same task."""
    if level not in FAMILIES:
        raise ValueError(f"BFCL task level {level!r}: choose from {', '.join(map(str, FAMILIES))}")
    families = FAMILIES[level]
    family = list(families)[index % len(families)]
    rng = random.Random(f"tentalis-bfcl:{seed}:{level}:{index}")
    turns, config, classes, truth = families[family](rng)
    return BfclTask(task_id=f"bfcl_s{seed}_l{level}_{index:04d}_{family}", turns=turns, initial_config=config,
                    involved_classes=classes, ground_truth=truth, level=level, family=family,
                    split="test" if index < test_per_level else "train", seed=seed)


def generate_tasks(per_level: int = DEFAULT_PER_LEVEL, *, seed: int = 0, levels: tuple[int, ...] = LEVELS,
                   test_per_level: int = DEFAULT_TEST_PER_LEVEL) -> list[BfclTask]:
    """``per_level`` tasks of each level (default 80 x 3); the first ``test_per_level`` of each are held out."""
    return [make_task(level, i, seed=seed, test_per_level=test_per_level) for level in levels for i in range(per_level)]


def split_counts(tasks: list[BfclTask]) -> dict[tuple[int, str], int]:
    return dict(Counter((t.level, t.split) for t in tasks))
