"""`tentalis data fetch` / `status` against a local HTTP server (127.0.0.1, a thread) standing in for
GitHub and the Hub through ``$TENTALIS_DATA_MIRROR``: verified, atomic, idempotent, and nothing left
behind by a mismatch or an HTTP error. The manifest is replaced by small fixture files, except where the
shared data copies check the real pinned digests and conversions."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from tentalis_pipelines import datasets
from tentalis_pipelines.datasets import DataFetchError, DataFile

DATA = Path(os.environ["TENTALIS_DATA_DIR"]) if os.environ.get("TENTALIS_DATA_DIR") else None
needs_data = pytest.mark.skipif(DATA is None or not (DATA / "gsm8k" / "test.jsonl").exists(),
                                reason="TENTALIS_DATA_DIR with the shared data copies is not set")

GSM8K_LINES = b'{"question": "What is 2 + 3?", "answer": "2 + 3 = 5\\n#### 5"}\n{"question": "What is 4 * 5?", "answer": "#### 20"}\n'
PB_RECORDS = [{"id": "gsm8k-0", "generator": "g", "problem": "Zoë has 3 apples.", "steps": ["a", "b"], "final_answer_correct": False, "label": 1}]
PB_SOURCE = json.dumps(PB_RECORDS, indent=4, ensure_ascii=False).encode()  # upstream: one pretty-printed array
PB_OUTPUT = (json.dumps(PB_RECORDS[0], ensure_ascii=False) + "\n").encode()
M5_SOURCE = b'{"unique_id": "test/a/1.json", "level": "Level 2", "subject": "Algebra", "answer": "4", "solution": "s", "problem": "p"}\n'
M5_OUTPUT = b'{"problem": "p", "solution": "s", "answer": "4", "subject": "Algebra", "level": 2, "unique_id": "test/a/1.json"}\n'


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


FIXTURE_MANIFEST = (
    DataFile("gsm8k", "gsm8k/test.jsonl", "https://raw.example.org/gsm/test.jsonl", _sha(GSM8K_LINES), len(GSM8K_LINES), 2),
    DataFile("math500", "math500/test.jsonl", "https://hub.example.org/m5/test.jsonl", _sha(M5_OUTPUT), len(M5_OUTPUT), 1,
             convert="math500"),
    DataFile("processbench", "processbench/gsm8k.jsonl", "https://raw.example.org/pb/gsm8k.json", _sha(PB_OUTPUT), len(PB_OUTPUT), 1,
             convert="json_array", source_sha256=_sha(PB_SOURCE)),
)
SOURCES = {"raw.example.org/gsm/test.jsonl": GSM8K_LINES, "hub.example.org/m5/test.jsonl": M5_SOURCE,
           "raw.example.org/pb/gsm8k.json": PB_SOURCE}


class Mirror:
    """A static HTTP server on 127.0.0.1 serving ``files`` ({"<host>/<path>": bytes}) and logging requests."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.requests: list[str] = []
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                key = urlsplit(self.path).path.lstrip("/")
                mirror.requests.append(key)
                body = mirror.files.get(key)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll so shutdown() returns at once (the default 0.5 s would dominate these tests).
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture()
def fixture_manifest(monkeypatch):
    monkeypatch.setattr(datasets, "MANIFEST", FIXTURE_MANIFEST)
    monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_fetch_verifies_converts_and_writes_every_file_then_a_rerun_downloads_nothing(tmp_path, fixture_manifest):
    root = tmp_path / "data"
    with Mirror(SOURCES) as m:
        out = datasets.fetch(root, mirror=m.url)
        assert [(o.file.path, o.action) for o in out] == [(f.path, "fetched") for f in FIXTURE_MANIFEST]
        assert (root / "gsm8k/test.jsonl").read_bytes() == GSM8K_LINES  # a copy: byte for byte
        assert (root / "math500/test.jsonl").read_bytes() == M5_OUTPUT  # rewritten in prm800k's form
        assert (root / "processbench/gsm8k.jsonl").read_bytes() == PB_OUTPUT  # array -> JSON Lines, UTF-8 kept
        assert _leftovers(root) == ["gsm8k/test.jsonl", "math500/test.jsonl", "processbench/gsm8k.jsonl"]
        assert len(m.requests) == 3
        again = datasets.fetch(root, mirror=m.url)
        assert [o.action for o in again] == ["present"] * 3 and len(m.requests) == 3  # verified locally, not fetched
        assert [s.state for s in datasets.status(root)] == ["present"] * 3
        # --force downloads again
        assert [o.action for o in datasets.fetch(root, ["gsm8k"], mirror=m.url, force=True)] == ["fetched"]
        assert len(m.requests) == 4


def test_a_checksum_mismatch_fails_naming_the_file_and_both_digests_and_leaves_nothing(tmp_path, fixture_manifest):
    root = tmp_path / "data"
    tampered = GSM8K_LINES.replace(b"#### 5", b"#### 6")
    with Mirror({**SOURCES, "raw.example.org/gsm/test.jsonl": tampered}) as m, pytest.raises(DataFetchError) as exc:
        datasets.fetch(root, ["gsm8k"], mirror=m.url)
    msg = str(exc.value)
    assert msg.startswith("gsm8k/test.jsonl: sha256 mismatch")
    assert f"expected {_sha(GSM8K_LINES)}, got {_sha(tampered)}" in msg and "deleted" in msg
    assert _leftovers(root) == []  # no partial download, no temp file, no target
    # a converted file: the upstream digest is checked before conversion
    bad_array = PB_SOURCE.replace(b'"label": 1', b'"label": 0')
    with Mirror({**SOURCES, "raw.example.org/pb/gsm8k.json": bad_array}) as m, pytest.raises(DataFetchError, match=rf"processbench/gsm8k.jsonl: sha256 mismatch .* expected {_sha(PB_SOURCE)}, got {_sha(bad_array)}"):
        datasets.fetch(root, ["processbench"], mirror=m.url)
    # ... and the converted output where no upstream digest is pinned
    bad_m5 = M5_SOURCE.replace(b'"answer": "4"', b'"answer": "5"')
    with Mirror({**SOURCES, "hub.example.org/m5/test.jsonl": bad_m5}) as m, pytest.raises(DataFetchError, match=rf"math500/test.jsonl: sha256 mismatch of the math500 conversion .* expected {_sha(M5_OUTPUT)}"):
        datasets.fetch(root, ["math500"], mirror=m.url)
    # ... and a download that is not the expected format at all
    with Mirror({**SOURCES, "hub.example.org/m5/test.jsonl": b"<html>rate limited</html>"}) as m, pytest.raises(DataFetchError, match=r"math500/test.jsonl \(from .*\): the download is not in the expected format"):
        datasets.fetch(root, ["math500"], mirror=m.url)
    assert _leftovers(root) == []


def test_a_404_is_a_clear_error_and_leaves_nothing(tmp_path, fixture_manifest):
    root = tmp_path / "data"
    with Mirror({k: v for k, v in SOURCES.items() if "m5" not in k}) as m, pytest.raises(DataFetchError, match=r"^math500/test.jsonl: GET http://127\.0\.0\.1:\d+/hub\.example\.org/m5/test\.jsonl answered HTTP 404"):
        datasets.fetch(root, ["math500"], mirror=m.url)
    assert _leftovers(root) == []


def test_a_file_of_the_users_own_is_not_replaced_without_force(tmp_path, fixture_manifest):
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "gsm8k/test.jsonl").write_bytes(b'{"question": "mine", "answer": "#### 1"}\n')
    with Mirror(SOURCES) as m:
        with pytest.raises(DataFetchError, match=r"gsm8k/test.jsonl is there with sha256 \w+, not the pinned .*--force replaces it"):
            datasets.fetch(root, ["gsm8k"], mirror=m.url)
        assert m.requests == []
        assert [s.state for s in datasets.status(root, ["gsm8k"])] == ["differs"]
        datasets.fetch(root, ["gsm8k"], mirror=m.url, force=True)
    assert (root / "gsm8k/test.jsonl").read_bytes() == GSM8K_LINES


def test_the_cli_fetches_into_tentalis_data_dir_from_the_mirror_variable_and_reports_status(tmp_path, fixture_manifest, monkeypatch):
    from tentalis_pipelines.cli import app

    runner = CliRunner()
    root = tmp_path / "data"
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(root))
    out = runner.invoke(app, ["data", "status", "--format", "json"])
    assert out.exit_code == 0 and {f["state"] for f in json.loads(out.stdout)["files"]} == {"missing"}
    with Mirror(SOURCES) as m:
        monkeypatch.setenv(datasets.MIRROR_ENV, m.url)
        out = runner.invoke(app, ["data", "fetch", "--only", "gsm8k,processbench"])
        assert out.exit_code == 0, out.output
        assert sorted(m.requests) == ["raw.example.org/gsm/test.jsonl", "raw.example.org/pb/gsm8k.json"]
        out = runner.invoke(app, ["data", "status", "--format", "json"])
        assert {f["file"]: f["state"] for f in json.loads(out.stdout)["files"]} == {
            "gsm8k/test.jsonl": "present", "math500/test.jsonl": "missing", "processbench/gsm8k.jsonl": "present"}
        m.files.pop("hub.example.org/m5/test.jsonl")
        out = runner.invoke(app, ["data", "fetch"])  # the two present files are skipped, the missing one 404s
        assert out.exit_code == 1 and "math500/test.jsonl" in out.output and "HTTP 404" in out.output
        assert " ".join(out.output.split()).count("= present") == 2
    out = runner.invoke(app, ["data", "fetch", "--only", "gsm9k"])
    assert out.exit_code == 2 and "unknown dataset(s) gsm9k" in out.output


def test_data_fetch_defaults_to_the_home_data_folder_which_tentalis_then_reads(home, fixture_manifest, monkeypatch):
    from tentalis_pipelines.settings import data_dir, data_fetch_dir

    monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    assert data_dir() is None and data_fetch_dir() == home.resolve() / "data"
    with Mirror(SOURCES) as m:
        datasets.fetch(data_fetch_dir(), ["gsm8k"], mirror=m.url)
    assert data_dir() == home.resolve() / "data"


@needs_data
def test_the_pinned_digests_and_conversions_reproduce_the_shared_copies(tmp_path, monkeypatch):
    """The real manifest: the shared GSM8K and MATH-500 copies served as upstream verify, and the
    ProcessBench conversion turns an array of the shared records back into the shared file."""
    monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)
    real = [f for f in datasets.MANIFEST if f.dataset in ("gsm8k", "math500")]
    files = {urlsplit(f.url).netloc + urlsplit(f.url).path: (DATA / f.path).read_bytes() for f in real}
    with Mirror(files) as m:
        out = datasets.fetch(tmp_path, ["gsm8k", "math500"], mirror=m.url)
    assert [o.action for o in out] == ["fetched"] * 3
    for f in datasets.MANIFEST:
        shared = (DATA / f.path).read_bytes()
        assert (_sha(shared), len(shared), len(shared.splitlines())) == (f.sha256, f.size, f.records), f.path
        if f.convert == "json_array":
            array = json.dumps([json.loads(line) for line in shared.decode().splitlines()], indent=2).encode()
            assert datasets.convert_bytes("json_array", array, f.path) == shared
