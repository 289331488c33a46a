"""A training run's progress, saved every few micro-steps, and the run yielding when asked.

Idle-window training (``stages/idle_window.py``) trains while the gateway is idle and stops as soon as
a request arrives. ``train_grpo`` takes a :class:`Checkpointing`:

* every ``every`` micro-steps (forward + backward of one micro-batch) it saves a :class:`Progress`:
  the trainable (LoRA) weights, AdamW's state, the gradients accumulated so far in the step in flight,
  the behaviour/reference log-probs fixed before the first update, the history, the position (iteration,
  optimizer step, micro-batch) and torch's RNG state. One ``torch.save`` into a temporary file, fsynced,
  then one ``os.replace``: a crash leaves the previous progress or the new one, never half of one;
* ``should_yield()`` is polled at every micro-step and, through forward hooks on the decoder layers and
  gradient hooks on their outputs, inside each forward and backward pass (at most every ``poll_s``), so
  the run stops within about one layer's compute. It raises :class:`Preempted`; the step in flight is
  abandoned (its partial gradients are never saved), and the next run resumes from the last save;
* ``resume`` continues from a saved progress. The rows, their order, the micro-batch plan and the
  fixed log-probs are the same, the RNG state is restored, so a run preempted any number of times
  ends with the same adapter as one that never stopped (``tests/test_idle_training.py``).

A progress is only valid for the same rows, config and starting state: :func:`fingerprint` names
them, and ``train_grpo`` refuses a progress whose fingerprint differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = 1


class Preempted(RuntimeError):
    """The run was asked to yield (a request arrived). ``saved`` is the position of the last saved
    progress (None: nothing saved by this run), ``micro_steps`` and ``steps`` what this run did."""

    def __init__(self, message: str, *, micro_steps: int = 0, steps: int = 0, saved: tuple[int, int, int] | None = None):
        super().__init__(message)
        self.micro_steps, self.steps, self.saved = micro_steps, steps, saved


class StaleProgress(ValueError):
    """A saved progress made for other rows, another config or another parent checkpoint."""


@dataclass
class Progress:
    """Where a run stands: the next micro-batch to run, at ``(iteration, step, micro)``, and the state
    that reaches it. ``grads`` hold the in-flight step's accumulated gradients (None at a step boundary)."""

    fingerprint: str
    iteration: int
    step: int
    micro: int
    params: dict[str, torch.Tensor]
    optimizer: dict
    grads: dict[str, torch.Tensor] | None
    totals: dict[str, float]
    history: list[dict]
    fixed: dict[tuple[int, int], dict[str, torch.Tensor | None]]
    rng: torch.Tensor
    micro_steps: int  # micro-steps done in every run of this progress together
    meta: dict[str, Any] = field(default_factory=dict)  # what the caller pinned (policy, rows, table versions)

    @property
    def position(self) -> tuple[int, int, int]:
        return (self.iteration, self.step, self.micro)


class ProgressStore:
    """One saved progress in one file, replaced atomically."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> Progress | None:
        """The saved progress, or None when there is none. A file that cannot be read raises ValueError
        naming it (delete it to start over)."""
        if not self.path.exists():
            return None
        try:
            raw = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one clear message
            raise ValueError(f"the training progress {self.path} cannot be read ({exc}): delete it to start the run over") from exc
        if raw.get("format") != FORMAT:
            raise ValueError(f"the training progress {self.path} has format {raw.get('format')!r}, expected {FORMAT}: delete it")
        raw.pop("format")
        return Progress(**raw)

    def save(self, progress: Progress) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                torch.save({"format": FORMAT, **progress.__dict__}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class Checkpointing:
    """How ``train_grpo`` saves its progress and when it yields.

    ``every``: micro-steps between saves (0: never save); ``should_yield``: polled as described in the
    module docstring (None: never yield); ``poll_s``: the least time between two polls inside a pass;
    ``resume``: the progress to continue from; ``meta``: stored with every save (the caller's pins)."""

    store: ProgressStore | None = None
    every: int = 4
    should_yield: Callable[[], bool] | None = None
    poll_s: float = 0.05
    resume: Progress | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # What this run did (read after it returns or raises Preempted).
    micro_steps: int = 0
    steps: int = 0
    saves: int = 0
    saved: tuple[int, int, int] | None = None
    _last_poll: float = 0.0

    def __post_init__(self):
        if self.every < 0:
            raise ValueError(f"every must be >= 0 micro-steps, got {self.every}")
        if self.every and self.store is None:
            raise ValueError("saving progress every few micro-steps needs a store")

    def check(self, force: bool = True) -> None:
        """Raise :class:`Preempted` when ``should_yield()`` says so (``force=False``: at most every ``poll_s``)."""
        if self.should_yield is None:
            return
        now = time.monotonic()
        if not force and now - self._last_poll < self.poll_s:
            return
        self._last_poll = now
        if self.should_yield():
            raise Preempted(f"yielded after {self.micro_steps} micro-steps ({self.steps} optimizer steps) of this run; "
                            f"last saved position {self.saved}", micro_steps=self.micro_steps, steps=self.steps, saved=self.saved)

    def install_hooks(self, model) -> list:
        """Poll inside forward and backward passes: a pre-hook on each decoder layer, and a gradient hook
        on each layer's output. Returns the handles (remove them when the run ends)."""
        if self.should_yield is None:
            return []
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")] or [model]

        def before(_module, _args):
            self.check(force=False)

        def after(_module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad: self.check(force=False))

        handles = []
        for layer in layers:
            handles.append(layer.register_forward_pre_hook(before))
            handles.append(layer.register_forward_hook(after))
        return handles


def fingerprint(samples, config_dict: dict, start_step: int, param_names: list[str], step_sizes: list[int]) -> str:
    """What a progress is valid for: the rows (tokens, advantages, old log-probs, temperatures, masks,
    in order), the training config, the chain's starting step, the adapter's parameters and the rows per
    optimizer step. The step plan is named apart from the config because code decides it: a progress
    saved under another split of the same rows (before ``trainer.step_sizes``, a full step and a
    remainder) points into other steps, so it must not resume."""
    h = hashlib.sha256()
    h.update(json.dumps({"config": config_dict, "start_step": start_step, "params": param_names, "step_sizes": step_sizes},
                        sort_keys=True, default=str).encode())
    for s in samples:
        h.update(json.dumps([s.prompt_ids, s.completion_ids, s.advantage, s.token_advantages, s.old_logps, s.temperature, s.loss_mask],
                            default=str).encode())
    return h.hexdigest()
