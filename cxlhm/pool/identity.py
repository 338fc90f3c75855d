"""Who a host is: one secret key per host, bound to the host's name and its tenants.

The service keeps, per host name, a 32-byte key and the tenants granted to it; with a
state folder they live in <state>/hosts/<name>.key (mode 0600) and <state>/grants.json,
made by `cxlhm device grant` or `cxlhm device serve --grant`. A host proves who it is by
answering a fresh challenge with HMAC-SHA256(its key, challenge + name): the service
checks the proof with the key of the name claimed, so a host that knows only its own key
can only be itself, and gets only that name's tenants.

Without any grant the pool is open: every host proving the pool-wide key
(<state>/authkey) may attach any tenant under any name.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
from pathlib import Path

from cxlhm.pool import statefiles

KEY_BYTES = 32
MIN_KEY_BYTES = 16
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\Z")
_DOMAIN = b"cxlhm-pool-attach\0"


class IdentityError(ValueError):
    pass


def check_name(name: str, what: str = "host") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise IdentityError(f"{what} name {name!r}: 1-64 of A-Z a-z 0-9 . _ - (not starting with '.' or '-')")
    return name


def proof(key: bytes, challenge: bytes, name: str) -> bytes:
    return hmac.new(key, _DOMAIN + challenge + name.encode(), hashlib.sha256).digest()


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def load_key(path: Path) -> bytes:
    """A key file: refused when empty or short (a start interrupted on a full disk)."""
    key = statefiles.read_file(path, 4096)
    if len(key) < MIN_KEY_BYTES:
        raise IdentityError(f"{path} holds {len(key)} bytes, not a key (at least {MIN_KEY_BYTES}); "
                            "remove it to have a new one made")
    return key


def key_file(path: Path) -> bytes:
    """The key in `path`, made (atomically, 0600) if there is none."""
    if not path.exists() and not path.is_symlink():
        statefiles.write_atomic(path, new_key())
    return load_key(path)


class Identities:
    """Host name -> (key, granted tenants); `pool_key` for an open pool (no grants)."""

    def __init__(self, state_dir: Path | None = None, grants: dict[str, list[str]] | None = None,
                 pool_key: bytes | None = None):
        self.state_dir = state_dir
        self._grant_lock = threading.Lock()
        self.keys: dict[str, bytes] = {}
        self.grants: dict[str, list[str]] = {}
        if pool_key is not None and len(pool_key) < MIN_KEY_BYTES:
            raise IdentityError(f"the pool key has {len(pool_key)} bytes; at least {MIN_KEY_BYTES} are needed")
        self.pool_key = pool_key
        if state_dir is not None and (state_dir / "grants.json").exists():
            self._load()
        for host, tenants in (grants or {}).items():
            self.grant(host, tenants, save=False)
        if grants:
            self._save()

    @property
    def open(self) -> bool:
        return not self.grants

    def _load(self) -> None:
        path = self.state_dir / "grants.json"
        try:
            saved = json.loads(statefiles.read_file(path))
            grants = {check_name(h): [check_name(t, "tenant") for t in ts] for h, ts in saved.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise IdentityError(f"{path}: not a grants file ({exc})") from None
        for host, tenants in grants.items():
            self.grants[host] = tenants
            self.keys[host] = load_key(self._key_path(host))

    def _key_path(self, host: str) -> Path:
        return self.state_dir / "hosts" / f"{host}.key"

    def _save(self) -> None:
        if self.state_dir is not None:
            statefiles.write_atomic(self.state_dir / "grants.json", json.dumps(self.grants, indent=1).encode())

    def grant(self, host: str, tenants: list[str], *, save: bool = True) -> bytes:
        """Grant `tenants` to `host` (added to what it had); returns its key, made if new.
        Grants are made one at a time, under a lock of their own (attaches only read)."""
        check_name(host)
        for t in tenants:
            check_name(t, "tenant")
        with self._grant_lock:
            return self._grant(host, tenants, save)

    def _grant(self, host: str, tenants: list[str], save: bool) -> bytes:
        if host not in self.keys:
            if self.state_dir is not None:
                folder = self.state_dir / "hosts"
                folder.mkdir(mode=0o700, exist_ok=True)
                statefiles.check_folder(folder)
                self.keys[host] = key_file(self._key_path(host))
            else:
                self.keys[host] = new_key()
        have = self.grants.setdefault(host, [])
        have.extend(t for t in tenants if t not in have)
        if save:
            self._save()
        return self.keys[host]

    def key_for(self, host: str) -> bytes | None:
        """The key a host named `host` must prove (None: it cannot attach)."""
        return self.keys.get(host, self.pool_key if self.open else None)

    def verify(self, host: str, challenge: bytes, answer: bytes) -> bool:
        key = self.key_for(host)
        return key is not None and hmac.compare_digest(proof(key, challenge, host), answer)

    def allowed(self, host: str, tenants: list[str]) -> list[str]:
        """The tenants of `tenants` this (proven) host may not attach."""
        if self.open:
            return []
        have = self.grants.get(host, [])
        return [t for t in tenants if t not in have]
