"""Each per-request sampling setting reaches the sampler on the batched path, end to end (issue 73): a
real gateway (uvicorn on a socket, in this process) serving the tiny random model, checked against hand
computations with the same weights: temperature 0 is greedy (not "unset"), a tiny top-p is greedy too,
``max_tokens`` is the exact count at the boundary 1, ``n`` choices, the same seed repeats and another
does not, and with several stop strings the text ends before the first one the model writes, whichever
its place in the list. The calls run at once, so they decode in one batch. Also over that socket: a
chunked body past the limit is refused before the client has sent it all."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tentalis_pipelines.gateway.app import GatewayConfig, create_app

PROMPT = [504, 3250, 314, 253, 1345, 28, 284, 2915]  # token ids: what the sampler gets, exactly


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    import uvicorn

    home = tmp_path_factory.mktemp("gw-sampling")
    cfg = GatewayConfig(home=home, lakehouse=home / "lake", model_dir=tiny_model_dir, no_auth=True, device="cpu",
                        dtype="float32", flush_interval=0.2, poll_seconds=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and thread.is_alive(), "the gateway did not start"
        time.sleep(0.2)
    yield url, port
    server.should_exit = True
    thread.join(timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Greedy decoding by hand (argmax of a full forward pass per token, stopping at EOS) and the tokenizer."""
    import torch
    from transformers import AutoTokenizer

    from tentalis_pipelines.inference.transformers_backend import eos_ids, load_policy

    model, _ = load_policy(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = set(eos_ids(model, tok))

    def greedy(prompt: list[int], k: int) -> list[int]:
        ids: list[int] = []
        with torch.no_grad():
            for _ in range(k):
                nxt = int(model(torch.tensor([prompt + ids])).logits[0, -1].float().argmax())
                if nxt in eos:
                    break
                ids.append(nxt)
        return ids

    return greedy, tok


def complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": "tentalis", "prompt": PROMPT, "return_token_ids": True, **body},
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _stops_for(tok, ids: list[int]) -> tuple[list[str], str]:
    """Three stop strings for the reply ``ids``: one the model writes late, one it writes early, one
    it never writes, in that order; and the text the reply must end with (cut before the early one).
    A decoder that honoured only the first stop string would cut later; only the last, not at all."""

    def cut(stops: list[str]) -> str | None:  # the contract: stop at the first step whose text holds a stop string
        for k in range(1, len(ids) + 1):
            text = tok.decode(ids[:k], skip_special_tokens=True)
            hits = [text.find(s) for s in stops if s in text]
            if hits:
                return text[:min(hits)]
        return None

    pieces = [tok.decode([i]) for i in ids]
    for a in range(1, len(ids)):
        early = pieces[a].strip()
        if len(early) < 2 or not early.isascii():
            continue
        for b in range(len(ids) - 1, a + 1, -1):
            late = pieces[b].strip()
            if len(late) < 2 or not late.isascii() or late == early:
                continue
            stops = [late, early, "\x07never\x07"]
            want, late_only = cut(stops), cut([late])
            if want is not None and late_only is not None and len(want) < len(late_only):
                return stops, want
    raise AssertionError(f"the reply {pieces} has no two distinct ASCII pieces to stop on: pick another seed")


def test_every_per_request_setting_reaches_the_sampler_in_one_batch(served, reference):
    url, _ = served
    greedy, tok = reference
    want = greedy(PROMPT, 12)
    assert len(want) == 12, "the tiny model wrote EOS early; the checks below need 12 tokens"
    # The tiny model's greedy reply repeats one token: the stop strings are taken from a seeded reply instead.
    sampled = complete(url, temperature=1.0, max_tokens=12, seed=77)["choices"][0]["token_ids"]
    stops, stopped_text = _stops_for(tok, sampled)
    cases = {
        "greedy": dict(temperature=0, max_tokens=12, seed=1),
        "greedy-other-seed": dict(temperature=0, max_tokens=12, seed=2),
        "tiny-top-p": dict(temperature=1.0, top_p=1e-9, max_tokens=12, seed=3),
        "one-token": dict(temperature=0, max_tokens=1),
        "n3": dict(temperature=1.0, n=3, max_tokens=6, seed=4),
        "stops": dict(temperature=1.0, max_tokens=12, seed=77, stop=stops),
        "seeded": dict(temperature=1.0, max_tokens=8, seed=1234),
    }
    barrier = threading.Barrier(len(cases))

    def call(name: str) -> dict:
        barrier.wait()
        return complete(url, **cases[name])

    with ThreadPoolExecutor(len(cases)) as pool:
        out = dict(zip(cases, pool.map(call, cases)))
    assert httpx.get(url + "/health").json()["batching"]["peak_rows"] >= 2  # decoded side by side
    ids = {name: [c["token_ids"] for c in r["choices"]] for name, r in out.items()}
    # temperature 0 is greedy, whatever the seed: not "unset" (1.0)
    assert ids["greedy"] == ids["greedy-other-seed"] == [want]
    assert out["greedy"]["choices"][0]["finish_reason"] == "length"
    # top_p reaches the sampler: a nucleus of one token is greedy at temperature 1
    assert ids["tiny-top-p"] == [want]
    # max_tokens at its boundary: exactly one token
    assert ids["one-token"] == [want[:1]] and out["one-token"]["usage"]["completion_tokens"] == 1
    # n: three choices of exactly max_tokens each, not three copies
    assert len(ids["n3"]) == 3 and all(len(c) == 6 for c in ids["n3"]) and len({tuple(c) for c in ids["n3"]}) == 3
    assert sorted(c["index"] for c in out["n3"]["choices"]) == [0, 1, 2]
    # several stop strings: cut before the first one written, whatever its place in the list
    (choice,) = out["stops"]["choices"]
    assert (choice["text"], choice["finish_reason"]) == (stopped_text, "stop")
    # the seed: the same seed repeats (decoded alone now), another seed and no seed do not
    again = complete(url, **cases["seeded"])
    assert [c["token_ids"] for c in again["choices"]] == ids["seeded"]
    other = complete(url, **{**cases["seeded"], "seed": 1235})
    unseeded = [complete(url, temperature=1.0, max_tokens=8)["choices"][0]["token_ids"] for _ in range(2)]
    assert other["choices"][0]["token_ids"] != ids["seeded"][0] and unseeded[0] != unseeded[1]


def test_chat_settings_reach_the_sampler_too(served, reference):
    """The chat endpoint's own path: temperature 0 with max_completion_tokens (over max_tokens) is the
    greedy reply of the templated prompt, cut at exactly that many tokens."""
    url, _ = served
    greedy, tok = reference
    messages = [{"role": "user", "content": "Name three colours."}]
    r = httpx.post(url + "/v1/chat/completions", json={"model": "tentalis", "messages": messages, "temperature": 0, "max_tokens": 9,
                                                       "max_completion_tokens": 5, "return_token_ids": True}, timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    prompt = body["prompt_token_ids"]
    assert tok.decode(prompt).endswith("Name three colours.<|im_end|>\n<|im_start|>assistant\n")
    assert body["choices"][0]["token_ids"] == greedy(prompt, 5)
    assert (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]) == (5, "length")


@pytest.mark.parametrize("payload,status,param", [
    ({"seed": 10**30}, 422, "seed"),  # a JSON integer no generator takes: was a 500 mid-request
    ({"seed": 2**63}, 422, "seed"),
    ({"max_tokens": True}, 422, "max_tokens"),
    ({"prompt": "caf\udce9"}, 400, "prompt"),  # a lone surrogate: was a 500 in the tokenizer
])
def test_foreign_values_are_4xx_naming_the_field_on_the_model(served, payload, status, param):
    url, _ = served
    raw = json.dumps({"model": "tentalis", "prompt": PROMPT, "max_tokens": 2, **payload})
    r = httpx.post(url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert (r.status_code, r.json()["error"]["param"]) == (status, param), r.text


def test_a_chunked_body_past_the_limit_is_refused_before_it_is_all_sent(served):
    """6 MiB announced by nothing (Transfer-Encoding: chunked): the old gateway read it whole (and
    tokenised it). Here the client sends a little over the 4 MiB limit and then waits, holding the rest:
    the 413 must come while the body is unfinished, so the server stopped reading at the limit."""
    _, port = served
    limit = GatewayConfig(home=".", lakehouse=".").max_body_bytes
    head = b'{"model": "tentalis", "prompt": "'
    chunk = b"a" * 65536
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        s.sendall(b"%x\r\n%s\r\n" % (len(head), head))
        sent = len(head)
        while sent <= limit + len(chunk):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        reply = b""
        while b"\r\n\r\n" not in reply or b"request_too_large" not in reply:
            got = s.recv(65536)  # a server still reading waits for the rest: this times out (60 s) and fails
            if not got:
                break
            reply += got
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert b"request_too_large" in reply
