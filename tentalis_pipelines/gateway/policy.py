"""The policy the gateway serves, switched when the serving pointer moves.

``PolicyHolder`` loads the serving checkpoint (the ``serving`` table's newest row: base model plus that
LoRA adapter, or the base model) and polls the pointer. When it moves (promote, rollback), the new
policy is loaded in the background and then swapped in with one reference assignment: a request takes
its ``Policy`` once, when it starts, and finishes on it, so requests in flight finish on the old
policy and every turn records the version that answered it. The old model is freed when its last
request lets go of it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training.serving import serving_policy

log = logging.getLogger(__name__)


@dataclass
class Policy:
    """One loaded policy: the model, its tokenizer and the version that goes on every turn it answers.
    ``lock`` serialises forward passes on this model (the batcher holds it for each decoding step);
    ``batcher`` is the continuous-batching scheduler (``gateway.sampler.batcher_for``), created on first
    use, with ``max_batch_rows`` rows at most."""

    version: str
    model: Any
    tokenizer: Any
    adapter_dir: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    max_batch_rows: int = 64
    batcher: Any = field(default=None, repr=False)


def load_policy_version(model_dir: Path, version: str, adapter_dir: str | None, *, device: str = "auto", dtype: str = "auto",
                        max_batch_rows: int = 64) -> Policy:
    from tentalis_pipelines.inference.transformers_backend import load_policy

    model, tokenizer = load_policy(Path(model_dir), Path(adapter_dir) if adapter_dir else None, device=device, dtype=dtype)
    return Policy(version=version, model=model, tokenizer=tokenizer, adapter_dir=adapter_dir, max_batch_rows=max_batch_rows)


class PolicyHolder:
    """The current policy, reloaded when the serving pointer moves (polled every ``poll_seconds``)."""

    def __init__(self, lake: Lakehouse, model_dir: Path, *, poll_seconds: float = 2.0, device: str = "auto", dtype: str = "auto",
                 max_batch_rows: int = 64):
        self.lake, self.model_dir = lake, Path(model_dir)
        self.poll_seconds, self.device, self.dtype = poll_seconds, device, dtype
        self.max_batch_rows = max_batch_rows
        self._policy: Policy | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.switches: list[tuple[str, str]] = []  # (from, to), for /health and tests
        self.last_error: str | None = None

    def current(self) -> Policy:
        policy = self._policy
        if policy is None:
            raise RuntimeError("no policy loaded yet")
        return policy

    def load(self) -> Policy:
        """Load what the serving pointer names now (raises ``ServingError`` if its adapter is gone)."""
        version, adapter = serving_policy(self.lake)
        self._policy = load_policy_version(self.model_dir, version, adapter, device=self.device, dtype=self.dtype,
                                          max_batch_rows=self.max_batch_rows)
        return self._policy

    def refresh(self) -> bool:
        """Switch to the serving pointer's policy if it moved; True when it switched. A pointer that
        names an unloadable checkpoint keeps the current policy serving and records the error."""
        try:
            version, adapter = serving_policy(self.lake)
        except Exception as exc:  # noqa: BLE001 - reported on /health; the old policy keeps serving
            self.last_error = str(exc)
            log.error("serving pointer cannot be loaded, still serving %s: %s", self._policy and self._policy.version, exc)
            return False
        old = self._policy
        if old is not None and old.version == version:
            return False
        new = load_policy_version(self.model_dir, version, adapter, device=self.device, dtype=self.dtype,
                                          max_batch_rows=self.max_batch_rows)
        self._policy = new  # requests that already hold `old` finish on it
        self.last_error = None
        self.switches.append((old.version if old else "", version))
        log.info("serving policy switched: %s -> %s", old.version if old else None, version)
        return True

    def start(self) -> None:
        if self._thread is None and self.poll_seconds > 0:
            self._thread = threading.Thread(target=self._run, name="tentalis-policy-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep watching
                self.last_error = str(exc)
                log.exception("policy refresh failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
