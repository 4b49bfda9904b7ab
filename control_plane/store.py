"""SQLite store: rollouts (state as JSON), every check with its full evidence, events, and an outbox of actions.

`save(rollout, actions)` writes, in ONE transaction: the new state (only if the stored version is still the one the
rollout was loaded at), the rollout's `new_checks` (primary key (rollout_id, seq): a check is never stored twice),
`new_events`, and `actions` as pending outbox rows. A crash before the commit leaves the old state, so the next
reconcile redoes the same check with the same seq; a crash after it leaves pending actions that the worker runs
(idempotently) before reconciling again. At most one active rollout per service.
"""
from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Mapping, Sequence

from control_plane.analysis import HistogramSnapshot, Policy, VariantData
from control_plane.rollout import Action, Check, Phase, Rollout

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, service TEXT NOT NULL, phase TEXT NOT NULL, active INTEGER NOT NULL,
    version INTEGER NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS one_active_per_service ON rollouts(service) WHERE active = 1;
CREATE TABLE IF NOT EXISTS checks (
    rollout_id TEXT NOT NULL REFERENCES rollouts(id), seq INTEGER NOT NULL, at REAL NOT NULL, step INTEGER NOT NULL,
    weight INTEGER NOT NULL, outcome TEXT NOT NULL, decision TEXT NOT NULL, reason TEXT NOT NULL,
    evidence TEXT NOT NULL, PRIMARY KEY (rollout_id, seq));
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL REFERENCES rollouts(id), at REAL NOT NULL,
    kind TEXT NOT NULL, phase TEXT NOT NULL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL REFERENCES rollouts(id),
    version INTEGER NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
    error TEXT, created_at REAL NOT NULL, done_at REAL);
CREATE INDEX IF NOT EXISTS actions_pending ON actions(rollout_id, status);
"""


class StoreError(Exception):
    """A store operation failed."""


class RolloutNotFoundError(StoreError, KeyError):
    """No rollout with that id."""


class StoreConflictError(StoreError):
    """The rollout changed since it was loaded, or the service already has an active rollout, or the id exists."""


# ---- JSON codec ---------------------------------------------------------------------------------------------------
def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become Prometheus' strings ("NaN", "+Inf", "-Inf")."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+Inf" if x > 0 else "-Inf")
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def variant_to_dict(v: VariantData) -> dict:
    return {"histograms": {k: h.to_dict() for k, h in v.histograms.items()}, "requests": v.requests,
            "errors": v.errors, "ready": v.ready, "crashing": v.crashing}


def variant_from_dict(d: Mapping) -> VariantData:
    return VariantData({k: HistogramSnapshot.from_dict(h) for k, h in d["histograms"].items()}, float(d["requests"]),
                       float(d["errors"]), bool(d["ready"]), bool(d["crashing"]))


_STATE_FIELDS = ("reason", "created_at", "phase_since", "started_at", "paused_total_s", "awaiting_promotion", "step",
                 "weight", "warmup_until", "last_check_at", "checks", "step_checks", "consecutive_failures",
                 "consecutive_inconclusive", "data_since", "observed_until", "excluded_requests", "source",
                 "correctness_step", "correctness_at")


def rollout_to_dict(r: Rollout) -> dict:
    d = {"id": r.id, "service": r.service, "canary_kernels": r.canary_kernels,
         "production_kernels": r.production_kernels, "policy": r.policy.to_dict(), "phase": r.phase.value,
         "paused_from": r.paused_from.value if r.paused_from else None, "queries": dict(r.queries),
         "data": {role: variant_to_dict(v) for role, v in r.data.items()}}
    d.update({k: getattr(r, k) for k in _STATE_FIELDS})
    return _clean(d)


def rollout_from_dict(d: Mapping, version: int = 0) -> Rollout:
    kw = {k: d[k] for k in _STATE_FIELDS if k in d}
    for k in ("created_at", "phase_since", "paused_total_s", "warmup_until", "last_check_at", "excluded_requests"):
        kw[k] = float(kw[k])
    for k in ("started_at", "data_since", "observed_until", "correctness_at"):
        kw[k] = _f(kw.get(k))
    return Rollout(id=d["id"], service=d["service"], canary_kernels=d["canary_kernels"],
                   production_kernels=d["production_kernels"], policy=Policy.from_dict(d["policy"]),
                   phase=Phase(d["phase"]), paused_from=Phase(d["paused_from"]) if d.get("paused_from") else None,
                   queries=dict(d.get("queries", {})),
                   data={role: variant_from_dict(v) for role, v in d.get("data", {}).items()}, version=version, **kw)


def check_to_dict(rollout_id: str, c: Check) -> dict:
    """The evidence of one check: raw bucket counts per variant, the queries, estimates, bounds, verdict, decision."""
    return _clean({"rollout_id": rollout_id, "seq": c.seq, "at": c.at, "step": c.step, "weight": c.weight,
                   "window_start": c.window_start, "window_end": c.window_end, "source": c.source,
                   "queries": dict(c.queries), "decision": c.decision, "verdict": c.verdict.to_dict(),
                   "variants": {role: variant_to_dict(v) for role, v in c.data.items()}})


class Store:
    """`Store(path)`; ":memory:" works for tests. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: str):
        self.path = str(path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version} is newer than this code's {SCHEMA_VERSION}")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ---- rollouts ---------------------------------------------------------------------------------------------
    def create(self, rollout: Rollout) -> Rollout:
        now = time.time()
        try:
            with self._tx() as db:
                db.execute("INSERT INTO rollouts (id, service, phase, active, version, state, created_at, updated_at)"
                           " VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                           (rollout.id, rollout.service, rollout.phase.value, int(rollout.active),
                            json.dumps(rollout_to_dict(rollout)), now, now))
                self._insert_records(db, rollout, (), 1)
        except sqlite3.IntegrityError as e:
            raise StoreConflictError(f"rollout {rollout.id!r} exists or service {rollout.service!r} already has an "
                                     f"active rollout ({e})") from None
        return replace(rollout, version=1, new_checks=(), new_events=())

    def get(self, rollout_id: str) -> Rollout:
        with self._lock:
            row = self._db.execute("SELECT state, version FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r}")
        return rollout_from_dict(json.loads(row["state"]), row["version"])

    def list(self, *, active: bool | None = None, service: str | None = None, limit: int = 1000) -> list[Rollout]:
        sql, args = "SELECT state, version FROM rollouts WHERE 1=1", []
        if active is not None:
            sql += " AND active = ?"
            args.append(int(active))
        if service is not None:
            sql += " AND service = ?"
            args.append(service)
        sql += " ORDER BY created_at DESC, id LIMIT ?"
        args.append(int(limit))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [rollout_from_dict(json.loads(r["state"]), r["version"]) for r in rows]

    def active(self) -> list[Rollout]:
        """Every rollout the worker must keep reconciling (not SUCCEEDED / ROLLED_BACK / FAILED)."""
        return self.list(active=True)

    def save(self, rollout: Rollout, actions: Sequence[Action] = ()) -> Rollout:
        """Persist a reconcile result (state, new checks, new events, pending actions) in one transaction.
        Raises StoreConflictError if the stored version is not `rollout.version` (someone else saved first)."""
        try:
            with self._tx() as db:
                cur = db.execute("UPDATE rollouts SET phase = ?, active = ?, version = version + 1, state = ?, "
                                 "updated_at = ? WHERE id = ? AND version = ?",
                                 (rollout.phase.value, int(rollout.active), json.dumps(rollout_to_dict(rollout)),
                                  time.time(), rollout.id, rollout.version))
                if cur.rowcount != 1:
                    exists = db.execute("SELECT version FROM rollouts WHERE id = ?", (rollout.id,)).fetchone()
                    if exists is None:
                        raise RolloutNotFoundError(f"no rollout {rollout.id!r}")
                    raise StoreConflictError(f"rollout {rollout.id!r} is at version {exists['version']}, "
                                             f"not {rollout.version}: reload and reconcile again")
                self._insert_records(db, rollout, actions, rollout.version + 1)
        except sqlite3.IntegrityError as e:
            raise StoreConflictError(f"rollout {rollout.id!r}: {e} (a check with that seq is already stored)") from None
        return replace(rollout, version=rollout.version + 1, new_checks=(), new_events=())

    def _insert_records(self, db: sqlite3.Connection, r: Rollout, actions: Sequence[Action], version: int) -> None:
        for c in r.new_checks:
            db.execute("INSERT INTO checks (rollout_id, seq, at, step, weight, outcome, decision, reason, evidence) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (r.id, c.seq, c.at, c.step, c.weight, c.verdict.outcome.value, c.decision, c.verdict.reason,
                        json.dumps(check_to_dict(r.id, c))))
        for e in r.new_events:
            db.execute("INSERT INTO events (rollout_id, at, kind, phase, message) VALUES (?, ?, ?, ?, ?)",
                       (r.id, e.at, e.kind, e.phase.value, e.message))
        now = time.time()
        for a in actions:
            db.execute("INSERT INTO actions (rollout_id, version, kind, body, created_at) VALUES (?, ?, ?, ?, ?)",
                       (r.id, version, a.kind, json.dumps(_clean(a.to_dict())), now))

    # ---- records ----------------------------------------------------------------------------------------------
    def checks(self, rollout_id: str, *, since_seq: int = 0, limit: int = 1000) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT evidence FROM checks WHERE rollout_id = ? AND seq > ? ORDER BY seq "
                                    "LIMIT ?", (rollout_id, since_seq, limit)).fetchall()
        return [json.loads(r["evidence"]) for r in rows]

    def check_summaries(self, rollout_id: str, *, since_seq: int = 0, limit: int = 1000) -> list[dict]:
        """seq, at, step, weight, outcome, decision, reason of each check, without the (large) evidence."""
        with self._lock:
            rows = self._db.execute("SELECT seq, at, step, weight, outcome, decision, reason FROM checks "
                                    "WHERE rollout_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                                    (rollout_id, since_seq, limit)).fetchall()
        return [dict(r) for r in rows]

    def check(self, rollout_id: str, seq: int) -> dict:
        with self._lock:
            row = self._db.execute("SELECT evidence FROM checks WHERE rollout_id = ? AND seq = ?",
                                   (rollout_id, seq)).fetchone()
        if row is None:
            raise RolloutNotFoundError(f"no check {seq} for rollout {rollout_id!r}")
        return json.loads(row["evidence"])

    def events(self, rollout_id: str, *, limit: int = 1000) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT id, at, kind, phase, message FROM events WHERE rollout_id = ? ORDER BY id "
                                    "LIMIT ?", (rollout_id, limit)).fetchall()
        return [dict(r) for r in rows]

    # ---- action outbox ----------------------------------------------------------------------------------------
    def pending_actions(self, rollout_id: str) -> list[tuple[int, Action]]:
        """Actions saved but not yet marked done, oldest first: run them before reconciling this rollout again."""
        with self._lock:
            rows = self._db.execute("SELECT id, body FROM actions WHERE rollout_id = ? AND status = 'pending' "
                                    "ORDER BY id", (rollout_id,)).fetchall()
        return [(r["id"], Action.from_dict(json.loads(r["body"]))) for r in rows]

    def mark_action(self, action_id: int, status: str = "done", error: str | None = None) -> None:
        if status not in ("done", "failed"):
            raise StoreError("action status must be 'done' or 'failed'")
        with self._tx() as db:
            db.execute("UPDATE actions SET status = ?, error = ?, done_at = ? WHERE id = ?",
                       (status, error, time.time(), action_id))

    def actions(self, rollout_id: str) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT id, version, kind, body, status, error, created_at, done_at FROM actions "
                                    "WHERE rollout_id = ? ORDER BY id", (rollout_id,)).fetchall()
        return [dict(r, body=json.loads(r["body"])) for r in rows]
