"""Scoring for the reward server off its event loop, in worker processes, each sample under a deadline.

The server's event loop only reads bodies and answers: the JSON is parsed, checked and scored in a
worker process (``workers`` of them, started on first use and warmed up), so ``/health`` and other
requests are answered while a request is being scored, and no scoring step holds the server's GIL
(the workers also run at a lower CPU priority, ``WORKER_NICE``).
Each sample must be scored within ``sample_seconds`` of the previous one (the body's parsing within
``PARSE_SECONDS``); a worker that overruns is killed and replaced, the overrunning sample gets reward 0
with its reason, and the request's other samples are scored by the replacement. The scorers are
bounded by their own caps (``rewards/process.py``, ``rewards/math_answers.py``, ``remote_reward.py``);
the deadline is the backstop for what no cap foresaw (sympy evaluating a huge power, say).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import threading
from dataclasses import dataclass
from typing import Any

from tentalis_pipelines.rewards.remote_reward import QueryScore

# The default per-sample deadline: the reward server's promise is that no sample takes longer.
SAMPLE_SECONDS = 1.0
# Parsing and checking a body of up to the server's 64 MiB limit (json.loads runs at about 100 MB/s).
PARSE_SECONDS = 10.0
# A new worker imports the scorers and scores one symbolic answer before it takes requests.
START_SECONDS = 120.0
# Workers run below the server's CPU priority, so on a busy host /health is scheduled before scoring.
WORKER_NICE = 5
# JSON nested deeper than Python's recursion limit (about 1,000) makes json.loads raise RecursionError.
NESTING_HINT = "send a flat object {\"query\": [...], \"prompts\": [...], \"labels\": [...]}"


@dataclass(frozen=True)
class Refused:
    """A request that is not scored: its HTTP status and the message that names the problem and the fix."""

    status: int
    message: str


@dataclass(frozen=True)
class Scored:
    """A scored request: its samples (query, prompt, label as sent) and one score each, in order."""

    queries: list[str]
    prompts: list[str]
    labels: list[Any]
    scores: list[QueryScore]


def unscored(reason: str) -> QueryScore:
    """Reward 0 for a sample that could not be scored, with the reason (logged with the sample)."""
    return QueryScore(0.0, 0.0, 0.0, None, 0.0, 0, None, reason=reason)


def parse_body(raw: bytes) -> tuple[list[str], list[str], list[Any]] | Refused:
    """The (queries, prompts, labels as sent) of a request body, or why it is refused (400: not JSON,
    nested too deeply, a number too long to read; 422: breaks the contract)."""
    from tentalis_pipelines.rewards.remote_reward import RewardRequestError, parse_request

    try:
        body = json.loads(raw)
    except RecursionError:
        return Refused(400, f"the body is JSON nested too deeply to read: {NESTING_HINT}")
    except json.JSONDecodeError as exc:
        return Refused(400, f"the body is not JSON ({exc}): POST {{\"query\": [...], \"prompts\": [...], \"labels\": [...]}}")
    except UnicodeDecodeError as exc:
        return Refused(400, f"the body is not JSON ({exc}): send UTF-8 text")
    except ValueError as exc:  # Python refuses an integer of more than 4,300 digits
        return Refused(400, f"the body has a number too long to read ({exc}): send long labels as strings")
    try:
        queries, prompts, _ = parse_request(body)
    except RewardRequestError as exc:
        return Refused(422, str(exc))
    return queries, prompts, list(body["labels"])


# What scores one sample: "module:function" with score_query's signature (a test names a stand-in).
DEFAULT_SCORER = "tentalis_pipelines.rewards.remote_reward:score_query"


def _resolve(scorer: str):
    import importlib

    module, _, name = scorer.partition(":")
    return getattr(importlib.import_module(module), name)


def _score_each(conn, score_query, queries, prompts, labels) -> None:
    for q, p, lab in zip(queries, prompts, labels):
        try:
            s = score_query(q, p, str(lab))
        except Exception as exc:  # noqa: BLE001 — one sample's failure is its zero reward, not the request's 500
            s = unscored(f"scoring failed: {type(exc).__name__}")
        conn.send(("scored", s))


def _worker_main(conn, scorer: str) -> None:
    """A worker: warm up, then answer ("body", raw) and ("samples", q, p, labels) messages until the pipe closes."""
    from tentalis_pipelines.rewards.remote_reward import warm_up

    with contextlib.suppress(OSError):  # not permitted here: scoring still works, at the server's priority
        os.nice(WORKER_NICE)
    score_query = _resolve(scorer)
    warm_up()  # milliseconds when forked from the warmed forkserver; seconds when spawned
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the server went away
            return
        if msg[0] == "body":
            parsed = parse_body(msg[1])
            if isinstance(parsed, Refused):
                conn.send(("refused", parsed))
                continue
            conn.send(("parsed", *parsed))
            _score_each(conn, score_query, *parsed)
        elif msg[0] == "samples":
            _score_each(conn, score_query, *msg[1:])


class _Worker:
    def __init__(self, ctx, scorer: str) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, scorer), daemon=True, name="tentalis-reward-worker")
        self.proc.start()
        child.close()
        if not self.conn.poll(START_SECONDS) or self._recv()[0] != "ready":
            self.stop()
            raise RuntimeError(f"a reward worker did not start within {START_SECONDS:.0f} s")

    def _recv(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return ("dead",)

    def wait(self, seconds: float):
        """The worker's next message, or ("late",) when none came within ``seconds``, ("dead",) if it died."""
        return self._recv() if self.conn.poll(seconds) else ("late",)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()


class ScoringPool:
    """``workers`` scoring processes; :meth:`score` is blocking (run it in a thread) and thread-safe.
    ``scorer`` ("module:function", as ``score_query``) scores one sample."""

    def __init__(self, workers: int = 2, sample_seconds: float = SAMPLE_SECONDS, scorer: str = DEFAULT_SCORER) -> None:
        if workers < 1 or not sample_seconds > 0:
            raise ValueError(f"a scoring pool needs workers >= 1 and sample_seconds > 0 (got {workers}, {sample_seconds})")
        self.workers, self.sample_seconds, self.scorer = workers, sample_seconds, scorer
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = False
        self._ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")

    def _new(self) -> _Worker:
        w = _Worker(self._ctx, self.scorer)
        with self._lock:
            self._all.append(w)
        return w

    def _replace(self, w: _Worker) -> _Worker:
        w.stop()
        with self._lock:
            self._all.remove(w)
        return self._new()

    def start(self) -> None:
        """Start the workers now (else on the first request); idempotent."""
        with self._lock:
            if self._started:
                return
            self._started = True
            if self._ctx.get_start_method() == "forkserver":  # each worker forks with the scorers already imported
                self._ctx.set_forkserver_preload(["tentalis_pipelines.rewards.warm_scorers"])
        for _ in range(self.workers):
            self._idle.put(self._new())

    def close(self) -> None:
        """Stop every worker."""
        with self._lock:
            workers, self._all = list(self._all), []
        for w in workers:
            w.stop()

    def score(self, raw: bytes) -> Refused | Scored:
        """Parse, check and score the request body ``raw`` in a worker, each sample under the deadline."""
        self.start()
        w = self._idle.get()
        try:
            if not w.proc.is_alive():  # stopped when its replacement failed to start
                w = self._replace(w)
            w.conn.send(("body", raw))
            msg = w.wait(PARSE_SECONDS)
            if msg[0] == "refused":
                return msg[1]
            if msg[0] != "parsed":
                w = self._replace(w)
                return Refused(503, f"the body was not parsed within {PARSE_SECONDS:.0f} s: send fewer or shorter samples")
            queries, prompts, labels = msg[1:]
            scores: list[QueryScore] = []
            while len(scores) < len(queries):
                msg = w.wait(self.sample_seconds)
                if msg[0] == "scored":
                    scores.append(msg[1])
                    continue
                # This sample overran (or killed its worker): reward 0 with the reason; a fresh worker
                # scores the rest of the request.
                why = f"not scored within {self.sample_seconds:g} s" if msg[0] == "late" else "its scorer died"
                scores.append(unscored(why))
                w = self._replace(w)
                i = len(scores)
                if i < len(queries):
                    w.conn.send(("samples", queries[i:], prompts[i:], labels[i:]))
            return Scored(queries, prompts, labels, scores)
        finally:
            self._idle.put(w)
