"""API keys and tenants.

``tentalis keys create --tenant T`` makes a key, prints it once and stores only its sha256 in
``$TENTALIS_HOME/gateway/keys.json`` (mode 0600, written atomically). A request's
``Authorization: Bearer <key>`` names its tenant; every row it lands carries that tenant, and it sees
and reviews only that tenant's sessions. The key itself is never stored, logged or written to a
table: it is registered with ``redact`` so a log line that somehow held it is masked. ``--no-auth``
(local use) puts every request in tenant ``local``.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LOCAL_TENANT = "local"
KEY_PREFIX = "sk-tnt-"  # "sk-..." is also masked by redact's pattern, registered or not
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AuthError(Exception):
    """No key, or a key that names no tenant (HTTP 401)."""


def keys_path(home: Path) -> Path:
    return Path(home) / "gateway" / "keys.json"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def validate_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        raise ValueError(f"invalid tenant {tenant!r}: use 1-64 characters from [A-Za-z0-9._-], starting with a letter or digit")
    return tenant


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return list(json.loads(path.read_text() or "{}").get("keys", []))


def _write(path: Path, keys: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"keys": keys}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    os.chmod(path, 0o600)


def create_key(home: Path, tenant: str, *, name: str | None = None) -> tuple[str, dict[str, Any]]:
    """A new key for ``tenant``: (the key, shown once; its stored record, which holds only the hash)."""
    validate_tenant(tenant)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    path = keys_path(home)
    record = {"key_id": "key_" + secrets.token_hex(6), "tenant": tenant, "name": name or "", "sha256": hash_key(key),
              "prefix": key[: len(KEY_PREFIX) + 4], "created_at": datetime.now(timezone.utc).isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:  # concurrent `keys create` runs add, never overwrite
        fcntl.flock(lock, fcntl.LOCK_EX)
        keys = _read(path)
        keys.append(record)
        _write(path, keys)
    return key, record


def list_keys(home: Path) -> list[dict[str, Any]]:
    """The stored key records (id, tenant, name, the key's first characters, created_at; never a key)."""
    return [{k: v for k, v in r.items() if k != "sha256"} for r in _read(keys_path(home))]


class KeyStore:
    """Resolves bearer keys to tenants; re-reads keys.json when it changes (keys made while serving work)."""

    def __init__(self, home: Path):
        self.path = keys_path(home)
        self._mtime: float | None = None
        self._by_hash: dict[str, str] = {}
        self._lock = threading.Lock()

    def _reload(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self._mtime:
            return
        with self._lock:
            self._by_hash = {r["sha256"]: r["tenant"] for r in _read(self.path)} if mtime is not None else {}
            self._mtime = mtime

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of an ``Authorization: Bearer <key>`` header, or ``AuthError``."""
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("missing API key: send Authorization: Bearer <key> (make one with `tentalis keys create --tenant T`)")
        key = authorization[7:].strip()
        self._reload()
        digest = hash_key(key)
        for stored, tenant in self._by_hash.items():
            if hmac.compare_digest(stored, digest):
                from tentalis_pipelines.redact import register_secret

                register_secret(key)
                return tenant
        raise AuthError("invalid API key")
