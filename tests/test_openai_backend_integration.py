"""The OpenAI-compatible backend against scripted local HTTP servers, and (integration) a real
llama.cpp server (llama-cpp-python) serving the embedded SmolLM2 GGUF."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.openai_backend import (
    OpenAIBackend,
)

Reply = tuple[int, dict[str, str], Any]  # status, headers, JSON payload (or raw str)


class ScriptedServer:
    """A threaded HTTP server whose replies come from ``script(attempt, path, body)``; it records
    every request and the most requests it ever had in progress at once."""

    def __init__(self, script: Callable[[int, str, dict], Reply], delay: float = 0.0):
        self.script, self.delay = script, delay
        self.requests: list[tuple[str, dict]] = []
        self.active = self.max_active = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with server.lock:
                    server.requests.append((self.path, body))
                    attempt = len(server.requests)
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                try:
                    time.sleep(server.delay)
                    status, headers, payload = server.script(attempt, self.path, body)
                finally:
                    with server.lock:
                        server.active -= 1
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out leaves a broken pipe behind: expected here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def completions(self) -> list[dict]:
        return [b for p, b in self.requests if p == "/v1/completions"]


def completion(texts: list[str], *, finish: str = "stop", logprobs: bool = False, **extra: Any) -> dict:
    """A /v1/completions reply; with ``logprobs`` each character is one token of log-prob -0.5."""
    choices = []
    for i, t in enumerate(texts):
        c: dict[str, Any] = {"index": i, "text": t, "finish_reason": finish, **extra}
        if logprobs:
            c["logprobs"] = {"tokens": list(t), "token_logprobs": [-0.5] * len(t), "top_logprobs": None,
                             "text_offset": list(range(len(t)))}
        choices.append(c)
    return {"object": "text_completion", "choices": choices,
            "usage": {"prompt_tokens": 11, "completion_tokens": sum(len(t) for t in texts)}}


def ok(texts: list[str], **kw: Any) -> Reply:
    return 200, {}, completion(texts, **kw)


def backend(url: str, **kw: Any) -> OpenAIBackend:
    kw = {"backoff_base": 0.01, "backoff_max": 0.05, "max_retries": 4, **kw}
    return OpenAIBackend(base_url=url, model_name="m", **kw)


# Temperature 1: the scripted servers stand for servers with raw log-probs, which are kept only there.
P1 = SamplingParams(num_generations=1, max_new_tokens=8, temperature=1.0, stop=())


# --------------------------------------------------------------------------- retries


def test_retry_after_is_honoured() -> None:
    def script(attempt: int, path: str, body: dict) -> Reply:
        return (429, {"Retry-After": "1"}, {"error": "rate limited"}) if attempt == 1 else ok(["x"])

    with ScriptedServer(script) as srv:
        t0 = time.perf_counter()
        backend(srv.url).generate(["p"], P1)
        waited = time.perf_counter() - t0
    assert len(srv.requests) == 2
    assert waited >= 0.95  # the backoff alone would be ~0.01 s












# --------------------------------------------------------------------------- concurrency and n








# --------------------------------------------------------------------------- parsing










class CharTokenizer:
    """One token per character (ids are code points), or per word with ``words``."""

    def __init__(self, words: bool = False):
        self.words = words

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        parts = text.split(" ") if self.words else list(text)
        return {"input_ids": [hash(p) % 1000 if self.words else ord(p) for p in parts]}

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(chr(i) for i in ids)






# --------------------------------------------------------------------------- adapters and wiring












# --------------------------------------------------------------------------- a real llama.cpp server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: make test-server (or pip install -e '.[server]')")
    from tentalis_pipelines.inference.models import embedded_gguf

    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_gguf()), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "2048", "--verbose", "False"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama_cpp.server did not answer /v1/models within 60 s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


