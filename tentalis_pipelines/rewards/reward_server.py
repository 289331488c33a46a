"""`tentalis reward-server`: OpenRLHF's remote reward contract over HTTP (FastAPI, as the gateway).

``POST /get_reward`` (the path of OpenRLHF's own ``serve_rm``; ``POST /`` answers the same) takes
``{"query", "prompts", "labels"}`` and answers ``{"rewards", "scores", "extra_logs"}``, scored by
``rewards/remote_reward.py``. A body that is not JSON (or nests too deeply, or holds a number too long
to read) gets 400, one that breaks the contract 422, each with ``{"error": "<what is wrong and the
fix>"}``; neither is scored or logged. Bodies are parsed and scored in worker processes, each sample
under a deadline (``rewards/score_pool.py``): the event loop stays free, so ``/health`` answers while a
request is scored, and a sample that overruns gets reward 0 with its reason. With ``log_path``,
every scored sample is appended to a JSONL file (one write per request, after the whole request scored:
a request is logged completely or not at all), so a run's rewards can be audited afterwards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tentalis_pipelines.rewards.remote_reward import contract_answer
from tentalis_pipelines.rewards.score_pool import SAMPLE_SECONDS, Refused, ScoringPool

# Bodies above this are refused before parsing (a batch of 4096 long samples fits).
MAX_BODY_BYTES = 64 * 1024 * 1024
# Scoring processes by default: two keep one request's slow sample from queueing the next.
DEFAULT_WORKERS = 2

log_ = logging.getLogger(__name__)


def create_app(log_path: str | Path | None = None, *, workers: int = DEFAULT_WORKERS, sample_seconds: float = SAMPLE_SECONDS,
               pool: ScoringPool | None = None):
    """The reward server's ASGI app; ``log_path``: the JSONL file scored samples are appended to (None: no
    log); ``workers`` scoring processes, each sample under ``sample_seconds`` (``rewards/score_pool.py``),
    or an existing ``pool`` (the app then leaves it running at shutdown)."""
    owned = pool is None
    pool = ScoringPool(workers, sample_seconds) if pool is None else pool

    @asynccontextmanager
    async def lifespan(_app):
        await asyncio.to_thread(pool.start)
        try:
            yield
        finally:
            if owned:
                pool.close()

    app = FastAPI(title="Tentalis reward server (OpenRLHF remote reward contract)", lifespan=lifespan)
    app.state.pool = pool
    # One thread per worker at most: requests beyond wait here, not in the default executor that the
    # log's writes also use.
    scoring = asyncio.Semaphore(pool.workers)
    lock = threading.Lock()
    log = None if log_path is None else Path(log_path)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)

    def refuse(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def append_log(lines: str) -> None:
        with lock, open(log, "a") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    async def get_reward(request: Request):  # Request resolved from the module's globals (FastAPI reads the hint)
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return refuse(413, f"the body has {len(raw)} bytes; at most {MAX_BODY_BYTES}: send fewer samples per request")
        # Parsed and scored in a worker process, off this event loop (see rewards/score_pool.py).
        async with scoring:
            result = await asyncio.to_thread(pool.score, raw)
        if isinstance(result, Refused):
            return refuse(result.status, result.message)
        scored = result.scores
        for i, s in enumerate(scored):
            if s.reason is not None:
                log_.warning("sample %d of a request scored 0: %s", i, s.reason)
        if log is not None:
            now = datetime.now(timezone.utc).isoformat()
            lines = "".join(json.dumps({"at": now, "prompt": p, "query": q, "label": lab, "reward": s.reward, "outcome": s.outcome,
                                        "format": s.format, "process": s.process, "manager": s.manager, "answer": s.answer,
                                        **({"reason": s.reason} if s.reason is not None else {})}) + "\n"
                            for q, p, lab, s in zip(result.queries, result.prompts, result.labels, scored))
            await asyncio.to_thread(append_log, lines)
        return JSONResponse(contract_answer(scored))

    app.post("/get_reward")(get_reward)
    app.post("/")(get_reward)

    @app.get("/health")
    async def health():
        return {"ok": True}

    return app
