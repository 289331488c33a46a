"""`tentalis reward-server`: OpenRLHF's remote reward contract over HTTP (FastAPI, as the gateway).

``POST /get_reward`` (the path of OpenRLHF's own ``serve_rm``; ``POST /`` answers the same) takes
``{"query", "prompts", "labels"}`` and answers ``{"rewards", "scores", "extra_logs"}``, scored by
``rewards/remote_reward.py``. A body that is not JSON gets 400, one that breaks the contract 422, each
with ``{"error": "<what is wrong and the fix>"}``; neither is scored or logged. With ``log_path``,
every scored sample is appended to a JSONL file (one write per request, after the whole request scored:
a request is logged completely or not at all), so a run's rewards can be audited afterwards.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tentalis_pipelines.rewards.remote_reward import RewardRequestError, score_request

# Bodies above this are refused before parsing (a batch of 4096 long samples fits).
MAX_BODY_BYTES = 64 * 1024 * 1024


def create_app(log_path: str | Path | None = None):
    """The reward server's ASGI app; ``log_path``: the JSONL file scored samples are appended to (None: no log)."""
    app = FastAPI(title="Tentalis reward server (OpenRLHF remote reward contract)")
    lock = threading.Lock()
    log = None if log_path is None else Path(log_path)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)

    def refuse(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    async def get_reward(request: Request):  # Request resolved from the module's globals (FastAPI reads the hint)
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return refuse(413, f"the body has {len(raw)} bytes; at most {MAX_BODY_BYTES}: send fewer samples per request")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return refuse(400, f"the body is not JSON ({exc}): POST {{\"query\": [...], \"prompts\": [...], \"labels\": [...]}}")
        try:
            answer, scored = score_request(body)
        except RewardRequestError as exc:
            return refuse(422, str(exc))
        if log is not None:
            now = datetime.now(timezone.utc).isoformat()
            lines = "".join(json.dumps({"at": now, "prompt": p, "query": q, "label": lab, "reward": s.reward, "outcome": s.outcome,
                                        "format": s.format, "process": s.process, "manager": s.manager, "answer": s.answer}) + "\n"
                            for q, p, lab, s in zip(body["query"], body["prompts"], body["labels"], scored))
            with lock, open(log, "a") as fh:
                fh.write(lines)
                fh.flush()
                os.fsync(fh.fileno())
        return JSONResponse(answer)

    app.post("/get_reward")(get_reward)
    app.post("/")(get_reward)

    @app.get("/health")
    async def health():
        return {"ok": True}

    return app
