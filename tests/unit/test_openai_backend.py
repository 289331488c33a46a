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
from pathlib import Path
from typing import Any

import pytest

from tentalis_pipelines.inference.base import BackendNotAvailable, SamplingParams
from tentalis_pipelines.inference.factory import make_backend
from tentalis_pipelines.inference.openai_backend import (
    OpenAIBackend,
    OpenAIServerError,
    normalize_base_url,
    retry_after_seconds,
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
        # A short poll so shutdown() returns at once (the default 0.5 s would dominate these tests).
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

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
def test_retries_503_and_429_then_succeeds() -> None:
    def script(attempt: int, path: str, body: dict) -> Reply:
        if attempt == 1:
            return 503, {}, {"error": "loading model"}
        if attempt == 2:
            return 429, {"Retry-After": "0"}, {"error": "slow down"}
        return ok(["42"])

    with ScriptedServer(script) as srv:
        out = backend(srv.url).generate(["p"], P1)
    assert len(srv.requests) == 3
    assert [g.text for g in out[0]] == ["42"]




def test_retry_after_parsing() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past


def test_no_retry_on_400_and_the_error_names_url_and_status() -> None:
    with (
        ScriptedServer(lambda a, p, b: (400, {}, {"error": {"message": "prompt is too long"}})) as srv,
        pytest.raises(OpenAIServerError) as err,
    ):
        backend(srv.url).generate(["p"], P1)
    assert len(srv.requests) == 1
    msg = str(err.value)
    assert f"{srv.url}/completions" in msg and "HTTP 400" in msg and "prompt is too long" in msg
    assert err.value.status == 400


def test_retries_exhausted_gives_a_clear_error() -> None:
    with (
        ScriptedServer(lambda a, p, b: (502, {}, {"error": "bad gateway"})) as srv,
        pytest.raises(OpenAIServerError, match=r"failed after 3 attempts; last error: HTTP 502") as err,
    ):
        backend(srv.url, max_retries=2).generate(["p"], P1)
    assert len(srv.requests) == 3
    assert f"{srv.url}/completions" in str(err.value)


def test_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(OpenAIServerError, match=r"failed after 2 attempts") as err:
        backend(url, max_retries=1).generate(["p"], P1)
    assert url in str(err.value)


def test_timeouts_are_retried() -> None:
    with (
        ScriptedServer(lambda a, p, b: ok(["late"]), delay=0.5) as srv,
        pytest.raises(OpenAIServerError, match=r"failed after 2 attempts; last error: .*timed out"),
    ):
        backend(srv.url, max_retries=1, timeout=0.1).generate(["p"], P1)
    assert len(srv.requests) == 2


# --------------------------------------------------------------------------- concurrency and n
def test_concurrency_limit_is_respected() -> None:
    with ScriptedServer(lambda a, p, b: ok(["y"]), delay=0.1) as srv:
        out = backend(srv.url, max_concurrency=3).generate([f"p{i}" for i in range(12)], P1)
    assert len(srv.requests) == 12 and all(len(g) == 1 for g in out)
    assert srv.max_active == 3  # the limit is reached (requests run in parallel) and never passed


def test_missing_samples_are_requested_again_when_the_server_ignores_n() -> None:
    # llama.cpp's servers return one choice whatever n says
    with ScriptedServer(lambda a, p, b: ok([f"{b['prompt']}-seed{b['seed']}"])) as srv:
        be = backend(srv.url, max_concurrency=4)
        out = be.generate(["a", "b", "c"], SamplingParams(num_generations=4, seed=10, stop=()))
    assert be.server_ignores_n
    assert [len(g) for g in out] == [4, 4, 4]
    for prompt, gens in zip("abc", out):
        # every sample of a prompt comes from its own request and seed, in request order
        assert [g.text for g in gens] == [f"{prompt}-seed{s}" for s in (10, 11, 12, 13)]
    assert len(srv.completions()) == 12


def test_n_is_used_when_the_server_honours_it() -> None:
    with ScriptedServer(lambda a, p, b: ok([f"s{i}" for i in range(b["n"])])) as srv:
        be = backend(srv.url)
        out = be.generate(["a", "b"], SamplingParams(num_generations=3, stop=()))
    assert not be.server_ignores_n
    assert len(srv.completions()) == 2 and [len(g) for g in out] == [3, 3]
    assert [g.text for g in out[0]] == ["s0", "s1", "s2"]


def test_a_short_reply_with_several_choices_is_topped_up() -> None:
    # a server that caps n at 2: asked for 5, it needs three requests (2 + 2 + 1)
    with ScriptedServer(lambda a, p, b: ok(["t"] * min(2, b["n"]))) as srv:
        out = backend(srv.url).generate(["a"], SamplingParams(num_generations=5, stop=()))
    assert [b["n"] for b in srv.completions()] == [5, 3, 1]
    assert len(out[0]) == 5


# --------------------------------------------------------------------------- parsing
def test_request_carries_the_sampling_settings() -> None:
    with ScriptedServer(lambda a, p, b: ok(["z"])) as srv:
        backend(srv.url, api_key="sk-test").generate(
            ["hello"], SamplingParams(num_generations=1, max_new_tokens=7, temperature=0.3, top_p=0.9, seed=5, stop=("</answer>",)))
    body = srv.completions()[0]
    assert body == {"model": "m", "prompt": "hello", "n": 1, "max_tokens": 7, "temperature": 0.3, "top_p": 0.9,
                    "seed": 5, "stop": ["</answer>"], "logprobs": 0}


def test_logprobs_are_parsed_and_the_stop_string_is_put_back() -> None:
    def script(a: int, p: str, b: dict) -> Reply:
        reply = completion(["<answer>5</answer>"], logprobs=True)
        reply["choices"][0]["text"] = "<answer>5"  # the server cut the stop string; its tokens did not
        reply["usage"]["completion_tokens"] = 18
        return 200, {}, reply

    with ScriptedServer(script) as srv:
        (g,), = backend(srv.url).generate(["p"], SamplingParams(num_generations=1, temperature=1.0, stop=("</answer>",)))
    assert g.text == "<answer>5</answer>"
    assert g.logprobs == [-0.5] * 18
    assert g.token_ids == []  # no ids from the server and no tokenizer
    assert g.completion_tokens == 18 and g.prompt_tokens == 11
    assert g.finish_reason == "stop"


def test_raw_logprobs_are_dropped_unless_sampling_at_temperature_one() -> None:
    tempered = SamplingParams(num_generations=1, temperature=0.7, stop=())
    with ScriptedServer(lambda a, p, b: ok(["abc"], logprobs=True)) as srv:
        (raw,), = backend(srv.url).generate(["p"], tempered)
        (processed,), = backend(srv.url, server_logprobs="processed").generate(["p"], tempered)
    # the trainer reads them as log-probs at the sampling temperature: raw ones would be wrong there
    assert raw.logprobs is None and raw.completion_tokens == 3
    assert processed.logprobs == [-0.5] * 3


def test_token_ids_from_the_server_are_used() -> None:
    def script(a: int, p: str, b: dict) -> Reply:
        if b.get("return_token_ids"):  # vLLM >= 0.10: token ids beside the choice
            return ok(["ab"], logprobs=True, token_ids=[7, 8], finish="length")
        reply = completion(["ab"], logprobs=True)  # vLLM's return_tokens_as_token_ids
        reply["choices"][0]["logprobs"]["tokens"] = ["token_id:7", "token_id:8"]
        return 200, {}, reply

    with ScriptedServer(script) as srv:
        (g1,), = backend(srv.url, extra_body={"return_token_ids": True}).generate(["p"], P1)
        (g2,), = backend(srv.url).generate(["p"], P1)
    assert (g1.token_ids, g1.logprobs, g1.finish_reason) == ([7, 8], [-0.5, -0.5], "length")
    assert (g2.token_ids, g2.logprobs, g2.finish_reason) == ([7, 8], [-0.5, -0.5], "stop")


def test_stop_reason_puts_the_stop_string_back_without_logprobs() -> None:
    with ScriptedServer(lambda a, p, b: ok(["<answer>5"], stop_reason="</answer>")) as srv:
        (g,), = backend(srv.url, logprobs=False).generate(["p"], SamplingParams(num_generations=1, stop=("</answer>",)))
    assert g.text == "<answer>5</answer>" and g.logprobs is None
    assert "logprobs" not in srv.completions()[0]


class CharTokenizer:
    """One token per character (ids are code points), or per word with ``words``."""

    def __init__(self, words: bool = False):
        self.words = words

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        parts = text.split(" ") if self.words else list(text)
        return {"input_ids": [hash(p) % 1000 if self.words else ord(p) for p in parts]}

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(chr(i) for i in ids)


def test_retokenized_ids_keep_logprobs_only_when_they_match_the_sampled_tokens() -> None:
    with ScriptedServer(lambda a, p, b: ok(["hi there"], logprobs=True)) as srv:
        (g,), = backend(srv.url, tokenizer=CharTokenizer()).generate(["p"], P1)
        (w,), = backend(srv.url, tokenizer=CharTokenizer(words=True)).generate(["p"], P1)
    assert g.token_ids == [ord(c) for c in "hi there"] and g.logprobs == [-0.5] * 8
    # word-level ids are not the server's character tokens: the log-probs would be misaligned
    assert len(w.token_ids) == 2 and w.logprobs is None and w.completion_tokens == 8


def test_usage_gives_the_token_count_when_nothing_else_does() -> None:
    with ScriptedServer(lambda a, p, b: ok(["four tokens here ok"])) as srv:
        (g,), = backend(srv.url, logprobs=False).generate(["p"], P1)
    assert g.token_ids == [] and g.completion_tokens == len("four tokens here ok")


# --------------------------------------------------------------------------- adapters and wiring
def test_a_checkpoint_adapter_is_loaded_and_requested_by_name(tmp_path: Path) -> None:
    adapter = tmp_path / "ckpt-0001"
    adapter.mkdir()

    def script(a: int, p: str, b: dict) -> Reply:
        if p == "/v1/load_lora_adapter":
            return 200, {}, "Success: LoRA adapter 'ckpt-0001' added successfully."
        return ok(["x"])

    with ScriptedServer(script) as srv:
        be = backend(srv.url, adapter_dir=adapter)
        be.generate(["p"], P1)
        be.generate(["p"], P1)
    loads = [b for p, b in srv.requests if p == "/v1/load_lora_adapter"]
    assert loads == [{"lora_name": "ckpt-0001", "lora_path": str(adapter)}]
    assert [b["model"] for b in srv.completions()] == ["ckpt-0001", "ckpt-0001"]
    assert be.model_name == "m"


def test_a_server_that_cannot_load_adapters_refuses_to_sample_the_base_model(tmp_path: Path) -> None:
    with (
        ScriptedServer(lambda a, p, b: (404, {}, {"detail": "Not Found"})) as srv,
        pytest.raises(BackendNotAvailable, match="could not load it as a LoRA adapter"),
    ):
        backend(srv.url, adapter_dir=tmp_path / "ckpt-0002").generate(["p"], P1)
    assert srv.completions() == []


def test_make_backend_openai_needs_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(BackendNotAvailable, match="OPENAI_BASE_URL"):
        make_backend("openai")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    be = make_backend("openai", model_name="m")
    assert isinstance(be, OpenAIBackend) and be.base_url == "http://127.0.0.1:9/v1" and be.api_key == "sk-env"


def test_normalize_base_url() -> None:
    assert normalize_base_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000/v1"
    assert normalize_base_url("https://api.example.com/openai/v1") == "https://api.example.com/openai/v1"


def test_policy_resource_builds_the_openai_backend() -> None:
    from assets.resources import PolicyResource

    settings = PolicyResource(backend="openai", base_url="http://127.0.0.1:9/v1", served_model="served",
                              max_concurrency=3).settings()
    be = settings.make_backend(None)
    assert isinstance(be, OpenAIBackend)
    assert (be.base_url, be.served_model, be.max_concurrency, be.model_name) == (
        "http://127.0.0.1:9/v1", "served", 3, "SmolLM2-135M-Instruct")


def test_vllm_without_vllm_names_the_extra() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here")
    with pytest.raises(BackendNotAvailable, match=r"tentalis\[vllm\]"):
        make_backend("vllm", model_dir="unused")


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


@pytest.mark.integration
def test_llama_cpp_server_end_to_end(llama_server: str, embedded_model_dir: Path) -> None:
    from tentalis_pipelines.inference.prompts import render_prompt

    be = OpenAIBackend(embedded_model_dir, base_url=llama_server, model_name="SmolLM2-135M-Instruct", max_concurrency=2)
    prompts = [render_prompt(be.tokenizer, q) for q in ("What is 2 + 3?", "What is 7 * 6?")]
    # temperature 1: llama.cpp's log-probs are raw (untempered), so only there are they kept
    params = SamplingParams(num_generations=3, max_new_tokens=16, temperature=1.0, seed=1)
    out = be.generate(prompts, params)

    assert [len(g) for g in out] == [3, 3]
    assert be.server_ignores_n  # llama-cpp-python drops n: the backend asked again
    for g in (g for gens in out for g in gens):
        assert g.finish_reason in ("stop", "length")
        assert g.logprobs, "llama.cpp returned no token log-probs"
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert len(g.logprobs) == g.completion_tokens == len(g.token_ids)
        assert 0 < g.completion_tokens <= 16
        assert g.prompt_tokens > 0

    greedy = SamplingParams(num_generations=2, max_new_tokens=16, temperature=0.0, seed=3)
    first, second = be.generate(prompts, greedy), be.generate(prompts, greedy)
    texts = [[g.text for g in gens] for gens in first]
    assert texts == [[g.text for g in gens] for gens in second]
    assert all(len(set(t)) == 1 for t in texts)
    assert all(g.logprobs is None for gens in first for g in gens)  # raw log-probs, temperature != 1
