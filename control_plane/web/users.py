"""Users and roles from the auth file, token checks, the failed-login limiter and revoked sessions. No Flask here.

Auth file (JSON or YAML): {"users": [{"name": "alice", "role": "operator", "token_sha256": "<hex sha256>"}]}.
Only hashes are stored; a token is checked by hashing it and comparing in constant time against every user.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import yaml

ROLES = ("viewer", "operator", "admin")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@-]{0,63}$")


class AuthFileError(ValueError):
    """The auth file is missing, unreadable or malformed (the message says where)."""


@dataclass(slots=True, frozen=True)
class User:
    name: str
    role: str

    def can(self, role: str) -> bool:
        """True if this user's role is at least `role` (viewer < operator < admin)."""
        return ROLES.index(self.role) >= ROLES.index(role)


# what every request acts as when the service runs without an auth file (loopback only)
LOCAL_USER = User("local", "admin")


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Users:
    """The users of one auth file; `authenticate(token)` -> User or None."""

    def __init__(self, entries: Iterable[tuple[str, str, str]]) -> None:
        self._by_hash: list[tuple[bytes, User]] = []
        seen: set[str] = set()
        for name, role, digest in entries:
            if name in seen:
                raise AuthFileError(f"user {name!r} appears twice")
            seen.add(name)
            self._by_hash.append((bytes.fromhex(digest), User(name, role)))

    @property
    def users(self) -> list[User]:
        return [u for _, u in self._by_hash]

    def get(self, name: str) -> User | None:
        return next((u for _, u in self._by_hash if u.name == name), None)

    def authenticate(self, token: str) -> User | None:
        if not isinstance(token, str) or not token:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for h, user in self._by_hash:   # no early exit: the time does not depend on which user matched
            if hmac.compare_digest(h, digest):
                found = user
        return found

    @classmethod
    def from_dict(cls, data, where: str = "auth file") -> "Users":
        if not isinstance(data, dict) or not isinstance(data.get("users"), list):
            raise AuthFileError(f'{where}: expected {{"users": [{{"name", "role", "token_sha256"}}, ...]}}')
        entries = []
        for i, u in enumerate(data["users"]):
            at = f"{where}: users[{i}]"
            if not isinstance(u, dict):
                raise AuthFileError(f"{at} must be an object")
            unknown = sorted(set(u) - {"name", "role", "token_sha256"})
            if unknown:
                raise AuthFileError(f"{at}: unknown field(s) {', '.join(unknown)} (plaintext tokens are not accepted: "
                                    "store token_sha256)")
            name, role, digest = u.get("name"), u.get("role"), u.get("token_sha256")
            if not isinstance(name, str) or not _NAME.match(name):
                raise AuthFileError(f"{at}: name must be 1-64 letters, digits, space or ._@-")
            if role not in ROLES:
                raise AuthFileError(f"{at}: role must be one of {', '.join(ROLES)}")
            if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
                raise AuthFileError(f"{at}: token_sha256 must be 64 hex digits (sha256 of the token)")
            entries.append((name, role, digest.lower()))
        if not entries:
            raise AuthFileError(f"{where}: no users")
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> "Users":
        p = Path(path)
        try:
            with open(p, "rb") as f:   # the mode of the file read (symlinks followed), not of a name checked apart
                mode = os.fstat(f.fileno()).st_mode
                raw = f.read()
        except OSError as e:
            raise AuthFileError(f"cannot read auth file {p}: {e.strerror}") from None
        if mode & 0o022:
            # whoever can write it can make themselves admin: refused, not warned (a warning scrolls by unread)
            raise AuthFileError(f"auth file {p} is writable by its group or by everyone (mode {stat.S_IMODE(mode):04o});"
                                f" make it writable by its owner only: chmod go-w {p}")
        try:
            text = raw.decode()
        except UnicodeDecodeError as e:
            raise AuthFileError(f"auth file {p} is not UTF-8 text: {e.reason}") from None
        try:
            # YAML is a superset of JSON: .yaml/.yml and anything else goes through the YAML parser
            data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        except ValueError as e:
            raise AuthFileError(f"auth file {p} is not valid JSON: {e}") from None
        except yaml.YAMLError as e:
            raise AuthFileError(f"auth file {p} is not valid YAML: {e}") from None
        return cls.from_dict(data, str(p))


class LoginLimiter:
    """Failed logins, per client address, with exponential backoff; known (user, address) pairs pass a lock-out.

    A wrong token names no user, so failures count against the address: `limit` of them within `window_s` lock the
    address for `window_s`, the next lock-out twice as long, and so on up to `max_lock_s` (the count of lock-outs is
    forgotten after `max_lock_s` without a failure). While an address is locked, a right token is accepted only for
    a user who has logged in from that address before (`succeeded`, remembered `remember_s`): one anonymous caller
    sharing an address (a NAT, a proxy) cannot lock out its regular users, and a guess made during the lock-out
    cannot succeed for a user who never came from there. `retry_after(addr, user)` > 0 while that caller waits."""

    def __init__(self, limit: int = 5, window_s: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 max_lock_s: float = 3600.0, remember_s: float = 30 * 86400.0, max_entries: int = 10000) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self.max_lock_s, self.remember_s, self.max_entries = max_lock_s, remember_s, max_entries
        self._fails: dict[str, deque[float]] = {}
        self._locked: dict[str, tuple[float, int, float]] = {}   # addr -> (locked until, lock-outs, last failure)
        self._known: dict[tuple[str, str], float] = {}           # (user, addr) -> remembered until
        self._lock = threading.Lock()

    def _recent(self, addr: str, now: float) -> deque[float]:
        q = self._fails.setdefault(addr, deque())
        while q and q[0] <= now - self.window_s:
            q.popleft()
        return q

    def retry_after(self, addr: str, user: str | None = None) -> float:
        now = self.clock()
        with self._lock:
            until = self._locked.get(addr, (0.0, 0, 0.0))[0]
            if until <= now:
                return 0.0
            if user is not None and self._known.get((user, addr), 0.0) > now:
                return 0.0
            return until - now

    def failed(self, addr: str) -> None:
        now = self.clock()
        with self._lock:
            q = self._recent(addr, now)
            q.append(now)
            until, strikes, last = self._locked.get(addr, (0.0, 0, 0.0))
            if now - last > self.max_lock_s + self.window_s:
                strikes = 0
            if len(q) >= self.limit:
                until = now + min(self.window_s * 2 ** strikes, self.max_lock_s)
                strikes += 1
                q.clear()
            self._locked[addr] = (until, strikes, now)
            if len(self._fails) > self.max_entries or len(self._locked) > self.max_entries:
                self._prune(now)

    def succeeded(self, addr: str, user: str | None = None) -> None:
        now = self.clock()
        with self._lock:
            if user is not None:
                self._known[(user, addr)] = now + self.remember_s
                if len(self._known) > self.max_entries:
                    self._prune(now)
            if self._locked.get(addr, (0.0, 0, 0.0))[0] <= now:   # a success does not lift a running lock-out
                self._fails.pop(addr, None)

    def _prune(self, now: float) -> None:
        """Bounded memory under a spray of addresses: drop what no longer matters, then the oldest."""
        self._fails = {a: q for a, q in self._fails.items() if q and q[-1] > now - self.window_s}
        self._locked = {a: v for a, v in self._locked.items()
                        if v[0] > now or now - v[2] <= self.max_lock_s + self.window_s}
        self._known = {k: t for k, t in self._known.items() if t > now}
        for table in (self._fails, self._locked, self._known):
            while len(table) > self.max_entries:
                del table[next(iter(table))]


class SessionRevocations:
    """Session ids ended by logout, each kept until its cookie would have expired anyway (`max_age_s`), so a copy of
    the cookie replayed later is refused. Per process and in memory: another replica, or this one after a restart,
    does not know them (rotate SITS_SECRET_KEY to end every session everywhere; docs/security.md)."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic, limit: int = 100000) -> None:
        self.max_age_s, self.clock, self.limit = max_age_s, clock, limit
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def revoke(self, sid: str) -> None:
        now = self.clock()
        with self._lock:
            if len(self._until) >= self.limit:   # bounded: forget the ones whose cookies have expired
                self._until = {k: t for k, t in self._until.items() if t > now}
            self._until[sid] = now + self.max_age_s

    def revoked(self, sid: str) -> bool:
        with self._lock:
            until = self._until.get(sid)
        return until is not None and until > self.clock()
