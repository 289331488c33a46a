"""The benchmark data files: where each comes from, its pinned sha256, and ``tentalis data fetch``.

The loaders read plain JSON Lines under the data folder (``$TENTALIS_DATA_DIR``, see
:func:`tentalis_pipelines.settings.data_dir`)::

    gsm8k/train.jsonl, gsm8k/test.jsonl         GSM8K (the training split feeds `--task-source gsm8k`)
    math500/test.jsonl                          MATH-500
    processbench/{gsm8k,math,olympiadbench,omnimath}.jsonl   ProcessBench (the judge PRM's benchmark)

Nothing here runs unless a user asks (``tentalis data fetch``): the pipeline never downloads. Every file is
verified against the digest pinned in :data:`MANIFEST`, of the file *as written* (after conversion, where
the upstream format differs); a file whose upstream bytes are pinned too (``source_sha256``) is checked
before conversion as well. A mismatch deletes the download and fails naming the file, the expected and the
actual digest. Files are written to a temporary name in the target folder and renamed into place, so a
reader sees a whole file or none; files already there with the right digest are left alone.

``$TENTALIS_DATA_MIRROR`` (or ``--mirror``) replaces the upstream hosts: a file is fetched from
``<mirror>/<upstream host><upstream path>`` (``<mirror>/raw.githubusercontent.com/openai/...``), for a
machine behind a proxy cache, and for the tests' local HTTP server.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

MIRROR_ENV = "TENTALIS_DATA_MIRROR"
DATASETS = ("gsm8k", "math500", "processbench")
_GSM8K = "https://raw.githubusercontent.com/openai/grade-school-math/3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/data"
_MATH500 = "https://huggingface.co/datasets/HuggingFaceH4/MATH-500/resolve/ff5b20257d8185524591543f8ff5993951537bb8"
_PROCESSBENCH = "https://raw.githubusercontent.com/QwenLM/ProcessBench/ee5ae00f2d32205df00655cf9ebbc3caddce0646/dataset"
MATH500_KEYS = ("problem", "solution", "answer", "subject", "level", "unique_id")


class DataFetchError(RuntimeError):
    """A benchmark file could not be fetched (HTTP error, digest mismatch, unusable upstream format)."""


@dataclass(frozen=True)
class DataFile:
    """One file of the data folder: where it comes from and what it must hash to once written."""

    dataset: str
    path: str  # under the data folder, as the loaders read it
    url: str  # upstream, at a pinned commit or revision
    sha256: str  # of the file as written (after ``convert``)
    size: int
    records: int
    convert: str = "copy"  # copy | math500 | json_array (see :func:`convert_bytes`)
    source_sha256: str | None = None  # of the upstream bytes, where they differ from the file and are known


# How each digest was obtained (no network here: every one is of a copy in the shared data folder, whose
# README records the provenance; `sha256sum` of those copies gives the `sha256` column):
# * GSM8K: the shared copies are byte-for-byte the upstream files at commit 3101c7d5 of openai/grade-school-math
#   (their `git hash-object` equals the upstream blob ids e4c2ff49… and 7d97154b…), so `sha256` is also the
#   digest of the download itself.
# * MATH-500: the shared copy is byte-identical to openai/prm800k's math_splits/test.jsonl (its sha256 is
#   that file's Git LFS oid). The download comes from HuggingFaceH4/MATH-500 (revision ff5b2025, test.jsonl
#   unchanged since it was uploaded in 2343f79), whose serialisation could not be checked offline, so it is
#   rewritten into prm800k's exact form (`convert="math500"`: the same rewriting is the identity on the
#   shared copy) and the digest of that output is verified. A content difference fails the check.
# * ProcessBench: upstream is one JSON array per split in the history of QwenLM/ProcessBench (commit
#   ee5ae00f, dataset/*.json; the data moved to the Hub in 606615c). `source_sha256` is of those blobs
#   (computed here from the stored git history), `sha256` of the JSON Lines the conversion writes (each
#   record `json.dumps(record, ensure_ascii=False)`, one per line); converting the blobs here reproduced the
#   shared copies byte for byte. Not the Hub copy (Qwen/ProcessBench): its later "fix annotation" commit
#   changed math.json, so its bytes are neither these nor pinned anywhere this code could check.
MANIFEST: tuple[DataFile, ...] = (
    DataFile("gsm8k", "gsm8k/train.jsonl", f"{_GSM8K}/train.jsonl",
             "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465", 4166206, 7473),
    DataFile("gsm8k", "gsm8k/test.jsonl", f"{_GSM8K}/test.jsonl",
             "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14", 749738, 1319),
    DataFile("math500", "math500/test.jsonl", f"{_MATH500}/test.jsonl",
             "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132", 446564, 500, convert="math500"),
    DataFile("processbench", "processbench/gsm8k.jsonl", f"{_PROCESSBENCH}/gsm8k.json",
             "47171087a5d94d2f235d22d78e20b967076d38ab4642dd9fd39964b31887f5be", 547049, 400, convert="json_array",
             source_sha256="fb1c59dfd1e83e1c5a48dbe598db27e4bc0b8bc524a09445f2d4b69178f61349"),
    DataFile("processbench", "processbench/math.jsonl", f"{_PROCESSBENCH}/math.json",
             "db015d520131d2bfd81552ac9a7b5217eec22d7d840e3800f0dae9a1620ee184", 1862746, 1000, convert="json_array",
             source_sha256="520ae64463d6ceb4bf13af31693389a5d5b14934cdad3468193dea4a5ceb0414"),
    DataFile("processbench", "processbench/olympiadbench.jsonl", f"{_PROCESSBENCH}/olympiadbench.json",
             "d5d5adf6e8572e93ac320d3f52c700ed8b15d75851506d3c332d31b19ee5a44c", 2719039, 1000, convert="json_array",
             source_sha256="e9d801c9f3c03f949adbfa08e90cb21ad85c0b9224bc5e98326f8215c218aa55"),
    DataFile("processbench", "processbench/omnimath.jsonl", f"{_PROCESSBENCH}/omnimath.json",
             "c3c0ea2ed92942d88772d3c6f9005390f1b6189a241fd8f76f47c8b8289f78fa", 2756124, 1000, convert="json_array",
             source_sha256="e8d7cf4512c82168dae2fe48b1718069a3002e7910af1d180a27ee0d9948ba47"),
)


def parse_only(raw: str | None) -> tuple[str, ...]:
    """``--only gsm8k,math500`` as dataset names (all of them when empty); an unknown name is an error."""
    names = tuple(dict.fromkeys(n.strip() for n in (raw or "").split(",") if n.strip()))
    bad = [n for n in names if n not in DATASETS]
    if bad:
        raise ValueError(f"unknown dataset(s) {', '.join(bad)}: choose from {', '.join(DATASETS)} (comma-separated)")
    return names or DATASETS


def files_of(datasets: Iterable[str]) -> list[DataFile]:
    wanted = set(datasets)
    return [f for f in MANIFEST if f.dataset in wanted]


def source_url(f: DataFile, mirror: str | None = None) -> str:
    """The upstream URL, or ``<mirror>/<host><path>`` when a mirror is given (``$TENTALIS_DATA_MIRROR``)."""
    mirror = mirror if mirror is not None else os.environ.get(MIRROR_ENV, "").strip() or None
    if not mirror:
        return f.url
    parts = urlsplit(f.url)
    return f"{mirror.rstrip('/')}/{parts.netloc}{parts.path}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------- conversions
def _math500_level(value) -> int:
    text = str(value).strip()
    return int(text.removeprefix("Level").strip())


def convert_bytes(kind: str, raw: bytes, where: str) -> bytes:
    """The file to write from the upstream bytes: ``copy`` as is; ``math500`` every JSON Lines record
    rewritten as prm800k's math_splits/test.jsonl writes it (keys ``problem, solution, answer, subject,
    level, unique_id``, ``level`` an integer, ``json.dumps`` defaults); ``json_array`` one JSON array
    written as one record per line (``ensure_ascii=False``, key and record order kept)."""
    if kind == "copy":
        return raw
    try:
        text = raw.decode("utf-8")
        if kind == "json_array":
            records = json.loads(text)
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise ValueError("expected one JSON array of objects")
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
        if kind == "math500":
            out = []
            for line in text.splitlines():
                if line.strip():
                    r = json.loads(line)
                    out.append(json.dumps({k: (_math500_level(r[k]) if k == "level" else r[k]) for k in MATH500_KEYS}) + "\n")
            return "".join(out).encode("utf-8")
    except (ValueError, KeyError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataFetchError(f"{where}: the download is not in the expected format ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"unknown conversion {kind!r}")


# ----------------------------------------------------------------------------------------- fetching
@dataclass
class FetchOutcome:
    file: DataFile
    path: Path
    action: str  # fetched | present


def _download(url: str, dest: Path, timeout: float) -> str:
    """Stream ``url`` into ``dest``; returns the sha256 of the bytes. Raises :class:`DataFetchError`."""
    request = urllib.request.Request(url, headers={"User-Agent": "tentalis-data-fetch"})
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp, dest.open("wb") as out:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise DataFetchError(f"GET {url} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DataFetchError(f"GET {url} failed ({reason}): without internet access, copy the data folder from a "
                             f"machine that has it, or point {MIRROR_ENV} at a mirror") from None
    return h.hexdigest()


def _write_atomic(target: Path, data: bytes) -> None:
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def fetch_file(f: DataFile, dest: Path, *, mirror: str | None = None, force: bool = False, timeout: float = 60.0) -> FetchOutcome:
    """Fetch one file into ``dest`` (skipped when already there with the pinned digest). Raises
    :class:`DataFetchError` naming the file; nothing is left behind on failure."""
    target = dest / f.path
    if target.exists() and not force:
        actual = sha256_file(target)
        if actual == f.sha256:
            return FetchOutcome(f, target, "present")
        raise DataFetchError(f"{target} is there with sha256 {actual}, not the pinned {f.sha256} (a copy of your own, or "
                             "a different version): --force replaces it")
    url = source_url(f, mirror)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.parent / f".{target.name}.{os.getpid()}.part"
    try:
        try:
            got = _download(url, part, timeout)
        except DataFetchError as exc:
            raise DataFetchError(f"{f.path}: {exc}") from None
        if f.source_sha256 is not None and got != f.source_sha256:
            raise DataFetchError(f"{f.path}: sha256 mismatch of the download from {url}: expected {f.source_sha256}, "
                                 f"got {got}; the download was deleted")
        if f.convert == "copy":
            actual = got
            if actual == f.sha256:
                part.replace(target)  # same folder: an atomic rename
        else:
            data = convert_bytes(f.convert, part.read_bytes(), f"{f.path} (from {url})")
            actual = hashlib.sha256(data).hexdigest()
            if actual == f.sha256:
                _write_atomic(target, data)
        if actual != f.sha256:
            what = "the download" if f.convert == "copy" else f"the {f.convert} conversion of the download"
            raise DataFetchError(f"{f.path}: sha256 mismatch of {what} from {url}: expected {f.sha256}, got {actual}; "
                                 "the download was deleted")
    finally:
        part.unlink(missing_ok=True)
    return FetchOutcome(f, target, "fetched")


def fetch(dest: Path, datasets: Sequence[str] = DATASETS, *, mirror: str | None = None, force: bool = False,
          timeout: float = 60.0, on_file: Callable[[FetchOutcome], None] | None = None) -> list[FetchOutcome]:
    """Fetch every file of ``datasets`` into ``dest``. A file that fails does not stop the others (each
    one written was verified); then :class:`DataFetchError` names every failure, one per line."""
    out, failures = [], []
    for f in files_of(datasets):
        try:
            outcome = fetch_file(f, dest, mirror=mirror, force=force, timeout=timeout)
        except DataFetchError as exc:
            failures.append(str(exc))
            continue
        out.append(outcome)
        if on_file:
            on_file(outcome)
    if failures:
        raise DataFetchError("\n".join(failures))
    return out


# ----------------------------------------------------------------------------------------- status
@dataclass
class FileStatus:
    file: DataFile
    path: Path
    state: str  # present | missing | differs (there, but not the pinned digest) | unreadable

    def as_dict(self) -> dict:
        return {"dataset": self.file.dataset, "file": self.file.path, "path": str(self.path), "state": self.state}


def status(root: Path | None, datasets: Sequence[str] = DATASETS) -> list[FileStatus]:
    """Each manifest file's state under ``root`` (all missing when there is no data folder)."""
    out = []
    for f in files_of(datasets):
        path = (root / f.path) if root is not None else Path(f.path)
        if root is None or not path.exists():
            state = "missing"
        else:
            try:
                state = "present" if path.is_file() and sha256_file(path) == f.sha256 else "differs"
            except OSError:
                state = "unreadable"
        out.append(FileStatus(f, path, state))
    return out
