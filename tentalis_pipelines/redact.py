"""Secrets out of error messages and log lines.

A provider can echo the request back in an error body (the ``Authorization`` header, an ``api_key``
field), and a base URL can carry ``user:password@``. Those texts end up in exceptions, and exceptions end
up in Dagster's event log, the console and tables. :func:`redact` removes:

* every registered secret value (:func:`register_secret`: the API keys Tentalis' clients were given)
  and the values of environment variables whose names say they hold one (``*API_KEY*``, ``*TOKEN*``,
  ``*SECRET*``, ``*PASSWORD*``);
* ``Bearer …`` / ``Basic …`` credentials, ``api_key=…``-style pairs (JSON, query strings, headers),
  OpenAI-style ``sk-…`` keys;
* URL userinfo (``https://user:pass@host`` becomes ``https://***@host``).

:class:`RedactingFilter` applies it to every log record it sees; :func:`install_log_filter` puts one on
the root logger's handlers and on the ``dagster`` and ``tentalis_pipelines`` loggers.
"""

from __future__ import annotations

import logging
import os
import re
import threading

MASK = "***"
_MIN_SECRET_CHARS = 6  # shorter values would mask ordinary words

_registered: set[str] = set()
_lock = threading.Lock()

_SECRET_ENV = re.compile(r"API[_-]?KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_PATTERNS = [
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{4,}"), rf"\1 {MASK}"),
    (re.compile(r"""(?i)(["']?(?:x-)?(?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password|authorization)["']?\s*[:=]\s*["']?)"""
                r"""([^"'\s,;&}]{4,})"""), rf"\1{MASK}"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), f"sk-{MASK}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+(?::[^/\s@]*)?@"), rf"\1{MASK}@"),
]


def register_secret(value: str | None) -> None:
    """Remember a secret value (an API key given to a client) so that :func:`redact` masks it anywhere."""
    if value and len(value) >= _MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value)


def _secret_values() -> list[str]:
    env = [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and v and len(v) >= _MIN_SECRET_CHARS]
    with _lock:
        values = set(env) | _registered
    return sorted(values, key=len, reverse=True)  # longest first: a key that contains another


def redact(text: str) -> str:
    """``text`` with every secret this module knows of, and every credential-shaped substring, masked."""
    if not text:
        return text
    for value in _secret_values():
        text = text.replace(value, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message (and drops its args, already applied)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string is not ours to fix here
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_installed = False


def install_log_filter() -> None:
    """Redact every record that reaches the root logger's handlers, or the dagster/tentalis loggers."""
    global _installed
    if _installed:
        return
    flt = RedactingFilter()
    for name in ("", "dagster", "tentalis_pipelines"):
        logger = logging.getLogger(name)
        logger.addFilter(flt)
        for handler in logger.handlers:
            handler.addFilter(flt)
    _installed = True
