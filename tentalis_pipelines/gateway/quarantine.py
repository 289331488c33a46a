"""What a key holder can make the gateway keep of the bodies it rejects.

A rejected review or Bridge payload is kept in ``quarantine`` (nothing a client sent is lost silently),
but a client that sends rejects in a loop must not grow that table without bound: one Delta commit and
up to a whole body per request. :class:`QuarantineGate` bounds both, per tenant:

* the raw text kept of one body is clipped to ``raw_chars`` characters (a marker says how long it was);
* at most ``per_minute`` rejects of one tenant are kept per minute (a token bucket: a burst of
  ``per_minute``, then one every ``60 / per_minute`` seconds). A reject over the rate is still answered
  with its 4xx error; it is only not kept, and counted in ``dropped`` (``/health``: ``quarantine_dropped``).

So one tenant adds at most about ``per_minute * raw_chars`` characters a minute (30 x 8 KiB by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class QuarantineGate:
    """A per-tenant token bucket for quarantine writes, and the clip applied to the raw text kept."""

    def __init__(self, per_minute: int = 30, raw_chars: int = 8192, *, clock: Callable[[], float] = time.monotonic):
        if isinstance(per_minute, bool) or not isinstance(per_minute, int) or per_minute < 0:
            raise ValueError(f"quarantine_per_minute must be an integer >= 0 (0 keeps no rejects); got {per_minute!r}")
        if isinstance(raw_chars, bool) or not isinstance(raw_chars, int) or raw_chars < 0:
            raise ValueError(f"quarantine_raw_chars must be an integer >= 0; got {raw_chars!r}")
        self.per_minute, self.raw_chars, self.clock = per_minute, raw_chars, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, when last refilled)
        self._lock = threading.Lock()
        self.dropped = 0  # rejects answered but not kept (over the rate)

    def admit(self, tenant: str | None) -> bool:
        """Whether one more reject of ``tenant`` may be kept now (takes a token when it may)."""
        if self.per_minute == 0:
            with self._lock:
                self.dropped += 1
            return False
        key = tenant or ""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - last) * self.per_minute / 60.0)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                self.dropped += 1
                return False
            self._buckets[key] = (tokens - 1.0, now)
            return True

    def clip(self, text: str) -> str:
        """``text`` cut to ``raw_chars`` characters, with a marker giving its full length when cut."""
        if len(text) <= self.raw_chars:
            return text
        return f"{text[:self.raw_chars]}...[clipped: {len(text)} characters in all, {self.raw_chars} kept]"
