"""Any OpenAI-compatible server (vLLM, llama.cpp, SGLang, TGI, ...) through ``POST /v1/completions``.

Prompts arrive already rendered with the chat template, so the legacy text-completions endpoint is
used (a chat endpoint would apply a template a second time). The standard library's ``urllib`` does
the HTTP: no client library is needed, and each request runs in a worker thread.

What servers differ on, and how it is handled:

* ``n``: vLLM returns ``n`` choices; llama.cpp's servers ignore it and return one. Missing samples
  are requested again, one request each with its own seed, until every prompt has
  ``num_generations``.
* log-probs: ``logprobs: 0`` asks for the sampled token's log-probability only. llama.cpp, and vLLM
  by default, compute them from the raw logits (temperature 1), while the trainer uses them as the
  sampling policy's log-probs at the sampling temperature; so by default (``server_logprobs="raw"``)
  they are kept only when sampling at temperature 1. A vLLM server started with ``--logprobs-mode
  processed_logprobs`` returns them at the sampling temperature: say so with
  ``server_logprobs="processed"``.
* token ids: the ``tokens`` that come with the log-probs are strings; the ids come from the response
  when the server sends them (vLLM's ``return_token_ids``, or ``token_id:N`` strings with
  ``return_tokens_as_token_ids``; pass either in ``extra_body``), else from the local tokenizer. Ids re-tokenized locally are only kept next to the log-probs when each id decodes
  to the server's token string: the trainer pairs them one-to-one.
* stop strings: OpenAI-style servers cut the stop string from the text; the transformers backend
  keeps it (``</answer>`` is what the answer parser looks for), so it is put back.
* LoRA: a checkpoint adapter is loaded into the server with vLLM's ``POST /v1/load_lora_adapter``
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) and requested by name; a server without that endpoint
  fails with a clear error rather than sampling the base model under a checkpoint's name.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tentalis_pipelines.inference.base import BackendNotAvailable, Generation, SamplingParams
from tentalis_pipelines.redact import redact, register_secret

DEFAULT_MAX_CONCURRENCY = 8


class OpenAIServerError(RuntimeError):
    """A request that failed for good: a status that is not retried, or every retry used up."""

    def __init__(self, message: str, *, url: str, status: int | None = None):
        # A provider may echo the request (its Authorization header, an api_key) in its error body, and
        # the URL may carry user:password@: nothing of that may reach the event log or a table.
        super().__init__(redact(message))
        self.url, self.status = redact(url), status


@dataclass
class _Job:
    prompt_index: int
    n: int
    seed_offset: int


def normalize_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both become ``http://host:8000/v1`` (the
    OpenAI SDK's convention is a base URL that includes ``/v1``)."""
    url = url.strip().rstrip("/")
    if urllib.parse.urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either a number or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


class OpenAIBackend:
    """Samples from an OpenAI-compatible server; see the module docstring for server differences.

    ``model_dir`` (or ``tokenizer``) gives the tokenizer that renders prompts and, when the server
    sends no token ids, tokenizes completions. ``served_model`` is the ``model`` sent to the server
    (default ``model_name``); ``model_name`` is what the rollouts table records.
    """

    name = "openai"

    def __init__(
        self,
        model_dir: Path | str | None = None,
        adapter_dir: Path | str | None = None,
        *,
        model_name: str | None = None,
        served_model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        timeout: float = 300.0,
        max_retries: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        max_retry_after: float = 300.0,
        logprobs: bool = True,
        server_logprobs: str = "raw",
        extra_body: dict[str, Any] | None = None,
        tokenizer: Any = None,
    ):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise BackendNotAvailable(
                "backend 'openai' needs a server: set base_url (PolicyResource.base_url) or OPENAI_BASE_URL, "
                "e.g. http://localhost:8000/v1"
            )
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = normalize_base_url(base_url)
        # The key is read from the environment, not from resource config, so it never shows in the UI.
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        register_secret(self.api_key)
        if tokenizer is None and model_dir is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer = tokenizer
        self.model_name = model_name or (Path(model_dir).name if model_dir else "default")
        self.served_model = served_model or self.model_name
        self.adapter_dir = Path(adapter_dir) if adapter_dir else None
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base, self.backoff_max, self.max_retry_after = backoff_base, backoff_max, max_retry_after
        if server_logprobs not in ("raw", "processed"):
            raise ValueError(f"server_logprobs must be 'raw' or 'processed', got {server_logprobs!r}")
        self.logprobs = logprobs
        self.server_logprobs = server_logprobs
        self.extra_body = dict(extra_body or {})
        self._rng = random.Random()
        self._adapter_loaded = False
        # Learned from the first short answer: the server returns one choice whatever ``n`` says.
        self.server_ignores_n = False

    # ------------------------------------------------------------------ HTTP
    def _request(self, path: str, body: dict[str, Any]) -> bytes:
        """POST ``body`` as JSON with retries (connection errors, timeouts, 408, 429, 5xx; exponential
        backoff with jitter, ``Retry-After`` honoured); any other status fails at once."""
        url = self.base_url + path
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            attempt += 1
            status: int | None = None
            retry_after: float | None = None
            try:
                req = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return resp.read()
            except urllib.error.HTTPError as e:
                status = e.code
                detail = _excerpt(e)
                if not _retryable(status):
                    raise OpenAIServerError(f"POST {url} returned HTTP {status} (not retried): {detail}",
                                            url=url, status=status) from None
                retry_after = retry_after_seconds(e.headers.get("Retry-After") if e.headers else None)
                failure = f"HTTP {status}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
                reason = getattr(e, "reason", None) or e
                failure = f"{type(e).__name__}: {reason}"
            if attempt > self.max_retries:
                raise OpenAIServerError(f"POST {url} failed after {attempt} attempts; last error: {failure}",
                                        url=url, status=status)
            time.sleep(self._delay(attempt, retry_after))

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        cap = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        # "Equal jitter": never less than half the backoff, spread so that clients do not retry in step.
        return cap / 2 + self._rng.uniform(0, cap / 2)

    def _ensure_adapter(self) -> None:
        if self.adapter_dir is None or self._adapter_loaded:
            return
        name = self.adapter_dir.name
        try:
            self._request("/load_lora_adapter", {"lora_name": name, "lora_path": str(self.adapter_dir)})
        except OpenAIServerError as e:
            # vLLM answers 400 "... has already been loaded" for a second load of the same name.
            if not (e.status == 400 and "already" in str(e).lower()):
                raise BackendNotAvailable(
                    f"the policy is checkpoint {name!r} ({self.adapter_dir}) but the server at {self.base_url} "
                    f"could not load it as a LoRA adapter ({e}). Serve it with vLLM (--enable-lora, "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, the same filesystem), or use backend "
                    "'transformers' or 'vllm'"
                ) from e
        self.served_model = name
        self._adapter_loaded = True

    # ------------------------------------------------------------------ sampling
    def _complete(self, prompt: str, n: int, seed: int, params: SamplingParams) -> tuple[dict[str, Any], float]:
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": prompt,
            "n": n,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": seed,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if self.logprobs:
            body["logprobs"] = 0  # the sampled token's log-prob, no alternatives
        body.update(self.extra_body)
        t0 = time.perf_counter()
        raw = self._request("/completions", body)
        seconds = time.perf_counter() - t0
        try:
            return json.loads(raw), seconds
        except json.JSONDecodeError:
            raise OpenAIServerError(f"POST {self.base_url}/completions returned a body that is not JSON: "
                                    f"{raw[:200]!r}", url=self.base_url + "/completions") from None

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        """Each token-id prompt's per-token log-probs under the served model, from position 1 on (the
        first token has none), at temperature 1: the legacy API's ``echo`` with ``logprobs``, as vLLM and
        this project's gateway answer it (``max_tokens`` 1, the generated token is dropped; vLLM refuses
        0). A server that echoes no prompt log-probs (llama.cpp's) fails with a clear error. Requests run
        ``max_concurrency`` at a time."""

        def one(ids: list[int]) -> list[float]:
            body = {"model": self.served_model, "prompt": list(ids), "max_tokens": 1, "echo": True, "logprobs": 0,
                    "temperature": 1.0, **self.extra_body}
            url = self.base_url + "/completions"
            try:
                choice = json.loads(self._request("/completions", body))["choices"][0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError):
                raise OpenAIServerError(f"POST {url} (echo) returned no choice", url=url) from None
            lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
            if len(lps) < len(ids) or any(x is None for x in lps[1:len(ids)]):
                raise OpenAIServerError(
                    f"POST {url} echoed {len(lps)} log-probs for a prompt of {len(ids)} tokens: the server does not return "
                    "prompt log-probs (vLLM does with echo; llama.cpp's server does not), so it cannot be an OPD teacher", url=url)
            return [float(x) for x in lps[1:len(ids)]]

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(one, prompts))

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        """``num_generations`` samples per prompt, with at most ``max_concurrency`` requests in flight."""
        self._ensure_adapter()
        want = params.num_generations
        got: list[list[tuple[int, int, Generation]]] = [[] for _ in prompts]
        next_offset = [0] * len(prompts)
        prompt_tokens: dict[int, int] = {}
        queue: deque[_Job] = deque()
        for i in range(len(prompts)):
            queue.append(_Job(i, want, next_offset[i]))
            next_offset[i] += 1

        def enqueue_missing(i: int) -> None:
            missing = want - len(got[i])
            # A server that ignores ``n`` gets one request per missing sample, so they run in parallel.
            for n in [1] * missing if self.server_ignores_n else [missing]:
                queue.append(_Job(i, n, next_offset[i]))
                next_offset[i] += 1

        pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="openai-backend")
        in_flight: dict[Future, _Job] = {}
        try:
            while queue or in_flight:
                while queue and len(in_flight) < self.max_concurrency:
                    job = queue.popleft()
                    if self.server_ignores_n and job.n > 1:
                        queue.appendleft(_Job(job.prompt_index, job.n - 1, next_offset[job.prompt_index]))
                        next_offset[job.prompt_index] += 1
                        job = _Job(job.prompt_index, 1, job.seed_offset)
                    fut = pool.submit(self._complete, prompts[job.prompt_index], job.n, params.seed + job.seed_offset, params)
                    in_flight[fut] = job
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for fut in done:
                    job = in_flight.pop(fut)
                    response, seconds = fut.result()
                    i = job.prompt_index
                    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
                    if not choices:
                        raise OpenAIServerError(f"POST {self.base_url}/completions returned no choices",
                                                url=self.base_url + "/completions")
                    if len(choices) < job.n and len(choices) == 1:
                        self.server_ignores_n = True
                    usage = response.get("usage") or {}
                    if i not in prompt_tokens:
                        prompt_tokens[i] = usage.get("prompt_tokens") or self._count_tokens(prompts[i])
                    for c in choices:
                        gen = self._parse_choice(c, params, usage if len(choices) == 1 else None)
                        gen.prompt_tokens = prompt_tokens[i]
                        gen.seconds = seconds / len(choices)
                        got[i].append((job.seed_offset, c.get("index", 0), gen))
                    if len(got[i]) < want and not any(j.prompt_index == i for j in [*queue, *in_flight.values()]):
                        enqueue_missing(i)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        # Ordered by request and choice index, so a deterministic server gives a deterministic order.
        return [[g for _, _, g in sorted(gs, key=lambda x: (x[0], x[1]))[:want]] for gs in got]

    def _count_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return 0
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _decode_each(self, token_ids: list[int]) -> list[str]:
        # No space clean-up: the server's token strings are the raw pieces.
        return [self.tokenizer.decode([t], clean_up_tokenization_spaces=False) for t in token_ids]

    def _parse_choice(self, choice: dict[str, Any], params: SamplingParams, usage: dict[str, Any] | None) -> Generation:
        text = choice.get("text") or ""
        finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
        lp = choice.get("logprobs") or {}
        tokens: list[str] | None = lp.get("tokens")
        token_logprobs = lp.get("token_logprobs")
        logprobs = ([float(x) for x in token_logprobs]
                    if token_logprobs and all(x is not None for x in token_logprobs) else None)

        if finish_reason == "stop" and params.stop:
            text = _restore_stop(text, tokens, choice.get("stop_reason"), params.stop)

        if logprobs is not None and self.server_logprobs == "raw" and params.temperature != 1.0:
            logprobs = None  # raw log-probs are not the tempered sampling distribution's (module docstring)

        token_ids: list[int] | None = choice.get("token_ids")
        if token_ids is None and tokens and all(t.startswith("token_id:") for t in tokens):
            token_ids = [int(t.removeprefix("token_id:")) for t in tokens]
        exact_ids = token_ids is not None
        if token_ids is None and self.tokenizer is not None:
            token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            # Re-tokenized text need not be the token sequence the server sampled; log-probs next to
            # the wrong ids would corrupt the trainer's importance ratios, so they are kept only when
            # every id decodes to the server's token string.
            if logprobs is not None and not (tokens and self._decode_each(token_ids) == tokens):
                logprobs = None
        token_ids = list(token_ids or [])
        if logprobs is not None and exact_ids and len(logprobs) != len(token_ids):
            logprobs = None

        if token_logprobs:
            completion_tokens = len(token_logprobs)
        elif exact_ids or usage is None or "completion_tokens" not in usage:
            completion_tokens = len(token_ids)
        else:
            completion_tokens = int(usage["completion_tokens"])
        return Generation(text=text, token_ids=token_ids, finish_reason=finish_reason, prompt_tokens=0,
                          seconds=0.0, logprobs=logprobs, completion_tokens=completion_tokens)


def _restore_stop(text: str, tokens: list[str] | None, stop_reason: Any, stops: tuple[str, ...]) -> str:
    """Put back the stop string the server cut. With token strings, the text becomes exactly what the
    sampled tokens decode to (as the transformers backend gives); else vLLM's ``stop_reason`` says
    which stop string matched."""
    if tokens:
        joined = "".join(tokens)
        if len(joined) > len(text) and joined.startswith(text) and any(joined[len(text):].startswith(s) for s in stops):
            return joined
    if isinstance(stop_reason, str) and stop_reason in stops and not text.endswith(stop_reason):
        return text + stop_reason
    return text


def _excerpt(e: urllib.error.HTTPError, limit: int = 300) -> str:
    try:
        body = e.read().decode("utf-8", "replace").strip()
    except Exception:  # the body is only for the message; a broken one must not hide the status
        body = ""
    return (body[:limit] + "...") if len(body) > limit else (body or e.reason or "")
