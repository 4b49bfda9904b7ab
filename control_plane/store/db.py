"""SQLite store, the only module that opens the file: rollouts (state as JSON) with their deploy specs, every check
with its full evidence, events, an outbox of actions, the queue of manual commands, the worker leases and the webhook
delivery journal. Schema and migrations: control_plane/store/schema.py; JSON codec: control_plane/store/codec.py;
commands, leases and deliveries: control_plane/store/queues.py (objects over the same Database).

`save(rollout, actions)` writes, in ONE transaction: the new state (only if the stored version is still the one the
rollout was loaded at), the rollout's `new_checks` (primary key (rollout_id, seq): a check is never stored twice),
`new_events`, and `actions` as pending outbox rows. A crash before the commit leaves the old state, so the next
reconcile redoes the same check with the same seq; a crash after it leaves pending actions that the worker runs
(idempotently) before reconciling again. At most one active rollout per service. `create_rollout` writes a rollout
and its spec in one transaction. ":memory:" is a file like any other (one connection, the same schema).

The step's accumulated data (`Rollout.data`, every variant's bucket counts) has a row of its own (rollout_data), with
the rollout version that wrote it. The store remembers the data it last decoded or wrote per rollout and that
version: a save of the same data object (reconcile passes it through unchanged) does not rewrite the row, and a load
finding the remembered version reuses the decoded data instead of parsing it again. Both hold across processes: the
version is read from the file in the same statement or transaction.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from typing import Callable, Mapping, Sequence

from sits.control_plane.analysis import VariantData
from sits.control_plane.redact import redact
from sits.control_plane.rollout import ROLES, Action, Rollout
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.codec import (check_to_dict, data_from_dict, data_to_dict, nonfinite_to_strings,
                                       rollout_from_dict, state_to_dict)
from sits.control_plane.store.database import Database
from sits.control_plane.store.queues import (Commands, Deliveries, Engines, Leases, RolloutNotFoundError,
                                             Services, StoreConflictError)
from sits.control_plane.store.schema import StoreError


class Store:
    """`Store(path)`. Thread-safe: one connection behind a lock (Database); other processes may open the same file.
    Its queues are objects over the same connection: `commands`, `leases`, `deliveries`, `services`, `engines`
    (queues.py)."""

    def __init__(self, path: str, *, readonly: bool = False):
        self._db = Database(path, readonly=readonly)
        self.path, self.readonly = self._db.path, readonly   # readonly: no migration, no WAL (rollout list/show)
        self.migrated_from = self._db.migrated_from
        self._lock = self._db.lock
        self._data: dict[str, tuple[int, Mapping[str, VariantData]]] = {}   # id -> (row version, decoded data)
        self.commands = Commands(self._db)
        self.leases = Leases(self._db)
        self.deliveries = Deliveries(self._db)
        self.services = Services(self._db)
        self.engines = Engines(self._db)

    @property
    def damage(self) -> str | None:
        """Why the file is damaged (SQLite's quick_check at open, or a corruption error since), or None: while it is
        set, writes raise StoreDamagedError (control_plane/store/database.py)."""
        return self._db.damage

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- rollouts ---------------------------------------------------------------------------------------------
    def create_rollout(self, rollout: Rollout, spec: DeploySpec | None = None) -> Rollout:
        """The rollout (with its `new_events`) and its deploy spec, in one transaction."""
        now = time.time()
        try:
            with self._db.tx() as db:
                db.execute("INSERT INTO rollouts (id, service, phase, active, version, state, created_at, updated_at,"
                           " retry_of) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?)",
                           (rollout.id, rollout.service, rollout.phase.value, int(rollout.active),
                            json.dumps(state_to_dict(rollout)), now, now, rollout.retry_of))
                committed = self._write_data(db, rollout, 1, {})
                db.execute("INSERT INTO rollout_specs (rollout_id, body) VALUES (?, ?)",
                           (rollout.id, json.dumps((spec or DeploySpec()).to_dict())))
                self._insert_records(db, rollout, (), 1)
        except sqlite3.IntegrityError:
            raise StoreConflictError(self._create_conflict(rollout)) from None
        committed()
        return replace(rollout, version=1, new_checks=(), new_events=())

    def _create_conflict(self, rollout: Rollout) -> str:
        """Why a new rollout could not be stored, in the operator's words (never the database's)."""
        active = self._db.rows("SELECT id, phase FROM rollouts WHERE service = ? AND active = 1", (rollout.service,))
        if active:
            return (f"service {rollout.service!r} already has an active rollout, {active[0]['id']} "
                    f"({active[0]['phase']}): one rollout per service at a time; abort it or wait until it ends")
        return f"a rollout with id {rollout.id!r} already exists"

    def create(self, rollout: Rollout) -> Rollout:
        """create_rollout with the default DeploySpec."""
        return self.create_rollout(rollout)

    def retries_of(self, rollout_id: str) -> list[str]:
        """The rollouts created as retries of this one, oldest first."""
        return [r["id"] for r in self._db.rows("SELECT id FROM rollouts WHERE retry_of = ? ORDER BY created_at, id",
                                                (rollout_id,))]

    def spec(self, rollout_id: str) -> DeploySpec:
        rows = self._db.rows("SELECT body FROM rollout_specs WHERE rollout_id = ?", (rollout_id,))
        return DeploySpec.from_stored(json.loads(rows[0]["body"])) if rows else DeploySpec()

    _SELECT = ("SELECT r.state, r.version, d.version AS data_version, d.body AS data FROM rollouts r "
               "LEFT JOIN rollout_data d ON d.rollout_id = r.id")

    def get(self, rollout_id: str) -> Rollout:
        rows = self._db.rows(f"{self._SELECT} WHERE r.id = ?", (rollout_id,))
        if not rows:
            raise RolloutNotFoundError(f"no rollout {rollout_id!r}")
        return self._rollout(rows[0])

    def _rollout(self, row: sqlite3.Row) -> Rollout:
        state = json.loads(row["state"])
        dv = row["data_version"]
        if dv is None:
            return rollout_from_dict(state, row["version"], {})
        known = self._data.get(state["id"])
        if known is not None and known[0] == dv:
            return rollout_from_dict(state, row["version"], known[1])
        data = data_from_dict(json.loads(row["data"]))
        self._remember(state["id"], dv, data)
        return rollout_from_dict(state, row["version"], data)

    def _remember(self, rollout_id: str, version: int, data: Mapping[str, VariantData]) -> None:
        # bounded (~55 KiB per rollout of 3 variants x 4 histograms): the oldest entry goes; beyond 2,048 active
        # rollouts loads decode as they did before the cache
        if len(self._data) >= 2048 and rollout_id not in self._data:
            self._data.pop(next(iter(self._data)), None)
        self._data[rollout_id] = (version, data)

    def _write_data(self, db: sqlite3.Connection, r: Rollout, version: int, memo: dict) -> Callable[[], None]:
        """Make the rollout's data row hold r.data (in the open transaction): unchanged when it holds that very
        object already. Returns what to remember once the transaction committed."""
        row = db.execute("SELECT version FROM rollout_data WHERE rollout_id = ?", (r.id,)).fetchone()
        stored = None if row is None else row[0]
        known = self._data.get(r.id)
        if not r.data:
            if stored is not None:
                db.execute("DELETE FROM rollout_data WHERE rollout_id = ?", (r.id,))
            return lambda: self._data.pop(r.id, None)
        if known is not None and known[1] is r.data and known[0] == stored:
            return lambda: None
        db.execute("INSERT OR REPLACE INTO rollout_data (rollout_id, version, body) VALUES (?, ?, ?)",
                   (r.id, version, json.dumps(data_to_dict(r.data, memo))))
        return lambda: self._remember(r.id, version, r.data)

    @staticmethod
    def _where(active: bool | None, service: str | None, phase: str | None) -> tuple[str, list]:
        sql, args = " WHERE 1=1", []
        for col, val in (("active", None if active is None else int(active)), ("service", service),
                         ("phase", None if phase is None else getattr(phase, "value", phase))):
            if val is not None:
                sql += f" AND {col} = ?"
                args.append(val)
        return sql, args

    def list(self, *, active: bool | None = None, service: str | None = None, phase: str | None = None,
             limit: int = 1000, offset: int = 0) -> list[Rollout]:
        """Newest first."""
        where, args = self._where(active, service, phase)
        rows = self._db.rows(f"{self._SELECT} WHERE r.id IN (SELECT id FROM rollouts{where} ORDER BY created_at DESC, "
                          "id LIMIT ? OFFSET ?) ORDER BY r.created_at DESC, r.id", [*args, int(limit), int(offset)])
        return [self._rollout(r) for r in rows]

    def count(self, *, active: bool | None = None, service: str | None = None, phase: str | None = None) -> int:
        where, args = self._where(active, service, phase)
        return self._db.rows(f"SELECT COUNT(*) FROM rollouts{where}", args)[0][0]

    def active(self) -> list[Rollout]:
        """Every rollout the worker must keep reconciling (not SUCCEEDED / ROLLED_BACK / FAILED)."""
        return self.list(active=True)

    def active_ids(self) -> list[tuple[str, str]]:
        """(id, service) of every active rollout, in active()'s order, without reading any state."""
        return [(r["id"], r["service"]) for r in self._db.rows("SELECT id, service FROM rollouts WHERE active = 1 "
                                                            "ORDER BY created_at DESC, id")]

    def save(self, rollout: Rollout, actions: Sequence[Action] = ()) -> Rollout:
        """Persist a reconcile result (state, new checks, new events, pending actions) in one transaction.
        Raises StoreConflictError if the stored version is not `rollout.version` (someone else saved first)."""
        memo: dict[int, dict] = {}   # the checks' evidence and the step's data share their snapshots
        try:
            with self._db.tx() as db:
                cur = db.execute("UPDATE rollouts SET phase = ?, active = ?, version = version + 1, state = ?, "
                                 "updated_at = ? WHERE id = ? AND version = ?",
                                 (rollout.phase.value, int(rollout.active), json.dumps(state_to_dict(rollout)),
                                  time.time(), rollout.id, rollout.version))
                if cur.rowcount != 1:
                    exists = db.execute("SELECT version FROM rollouts WHERE id = ?", (rollout.id,)).fetchone()
                    if exists is None:
                        raise RolloutNotFoundError(f"no rollout {rollout.id!r}")
                    raise StoreConflictError(f"rollout {rollout.id!r} is at version {exists['version']}, "
                                             f"not {rollout.version}: reload and reconcile again")
                committed = self._write_data(db, rollout, rollout.version + 1, memo)
                self._insert_records(db, rollout, actions, rollout.version + 1, memo)
        except sqlite3.IntegrityError as e:
            raise StoreConflictError(f"rollout {rollout.id!r}: {e} (a check with that seq is already stored)") from None
        committed()
        return replace(rollout, version=rollout.version + 1, new_checks=(), new_events=())

    def _insert_records(self, db: sqlite3.Connection, r: Rollout, actions: Sequence[Action], version: int,
                        memo: dict | None = None) -> None:
        for c in r.new_checks:
            db.execute("INSERT INTO checks (rollout_id, seq, at, step, weight, outcome, decision, reason, evidence) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (r.id, c.seq, c.at, c.step, c.weight, c.verdict.outcome.value, c.decision.value,
                        c.verdict.reason, json.dumps(check_to_dict(r.id, c, memo))))
        for e in r.new_events:
            db.execute("INSERT INTO events (rollout_id, at, kind, phase, message, actor) VALUES (?, ?, ?, ?, ?, ?)",
                       (r.id, e.at, e.kind.value, e.phase.value, redact(e.message), e.actor))
        now = time.time()
        for a in actions:
            db.execute("INSERT INTO actions (rollout_id, version, kind, body, created_at) VALUES (?, ?, ?, ?, ?)",
                       (r.id, version, a.kind, json.dumps(nonfinite_to_strings(a.to_dict())), now))

    # ---- records ----------------------------------------------------------------------------------------------
    def checks(self, rollout_id: str, *, since_seq: int = 0, limit: int = 1000) -> list[dict]:
        rows = self._db.rows("SELECT evidence FROM checks WHERE rollout_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                          (rollout_id, since_seq, limit))
        return [json.loads(r["evidence"]) for r in rows]

    def check_summaries(self, rollout_id: str, *, since_seq: int = 0, limit: int = 1000) -> list[dict]:
        """seq, at, step, weight, outcome, decision, reason of each check, without the (large) evidence."""
        rows = self._db.rows("SELECT seq, at, step, weight, outcome, decision, reason FROM checks "
                          "WHERE rollout_id = ? AND seq > ? ORDER BY seq LIMIT ?", (rollout_id, since_seq, limit))
        return [dict(r) for r in rows]

    def check(self, rollout_id: str, seq: int) -> dict:
        rows = self._db.rows("SELECT evidence FROM checks WHERE rollout_id = ? AND seq = ?", (rollout_id, seq))
        if not rows:
            raise RolloutNotFoundError(f"no check {seq} for rollout {rollout_id!r}")
        return json.loads(rows[0]["evidence"])

    def events(self, rollout_id: str, *, limit: int = 1000, since_id: int = 0) -> list[dict]:
        """id, at, kind, phase, message, actor of each event, oldest first."""
        rows = self._db.rows("SELECT id, at, kind, phase, message, actor FROM events WHERE rollout_id = ? AND id > ? "
                          "ORDER BY id LIMIT ?", (rollout_id, since_id, limit))
        return [dict(r) for r in rows]

    # ---- action outbox ----------------------------------------------------------------------------------------
    def pending_actions(self, rollout_id: str) -> list[tuple[int, Action]]:
        """Actions saved but not yet marked done, oldest first: run them before reconciling this rollout again."""
        rows = self._db.rows("SELECT id, body FROM actions WHERE rollout_id = ? AND status = 'pending' ORDER BY id",
                          (rollout_id,))
        return [(r["id"], Action.from_dict(json.loads(r["body"]))) for r in rows]

    def mark_action(self, action_id: int, status: str = "done", error: str | None = None) -> None:
        """`status`: done, failed (for good: the next reconcile is told), or superseded (given way to a queued abort:
        neither done nor a failure; `error` says why)."""
        if status not in ("done", "failed", "superseded"):
            raise StoreError("action status must be 'done', 'failed' or 'superseded'")
        with self._db.tx() as db:
            db.execute("UPDATE actions SET status = ?, error = ?, done_at = ? WHERE id = ?",
                       (status, None if error is None else redact(error), time.time(), action_id))

    def failed_actions(self, rollout_id: str, version: int) -> tuple[str, ...]:
        """Kinds of the actions saved at that rollout version that failed for good, oldest first (what the next
        reconcile is told), without reading the rollout's whole outbox."""
        return tuple(kind for kind, _ in self.failures(rollout_id, version))

    def failures(self, rollout_id: str, version: int) -> tuple[tuple[str, str], ...]:
        """(kind, error) of each action saved at that rollout version that failed for good, oldest first."""
        return tuple((r["kind"], r["error"] or "") for r in self._db.rows(
            "SELECT kind, error FROM actions WHERE rollout_id = ? AND version = ? AND status = 'failed' ORDER BY id",
            (rollout_id, version)))

    def actions(self, rollout_id: str) -> list[dict]:
        rows = self._db.rows("SELECT id, version, kind, body, status, error, created_at, done_at FROM actions "
                          "WHERE rollout_id = ? ORDER BY id", (rollout_id,))
        return [dict(r, body=json.loads(r["body"])) for r in rows]

    # ---- for listings and the control plane's /metrics (computed at scrape time) -------------------------------
    def list_summaries(self, *, active: bool | None = None, service: str | None = None, phase: str | None = None,
                       limit: int = 1000, offset: int = 0) -> list[Rollout]:
        """list() without each rollout's step data (`data` empty: its rows are not read), for listings. The page is
        chosen on (created_at, id) alone, so only its rows' states are read."""
        where, args = self._where(active, service, phase)
        rows = self._db.rows("SELECT state, version FROM rollouts WHERE id IN "
                          f"(SELECT id FROM rollouts{where} ORDER BY created_at DESC, id LIMIT ? OFFSET ?) "
                          "ORDER BY created_at DESC, id", [*args, int(limit), int(offset)])
        return [rollout_from_dict(json.loads(r["state"]), r["version"], {}) for r in rows]

    def checks_without_buckets(self, rollout_id: str, *, since_seq: int = 0, limit: int = 1000) -> list[dict]:
        """checks() without the variants' bucket counts (SQLite drops them before Python parses the evidence): the
        verdict with every result, requests/errors/readiness per variant."""
        drop = ", ".join(f"'$.variants.{role}.histograms'" for role in ROLES)
        rows = self._db.rows(f"SELECT json_remove(evidence, {drop}) AS evidence FROM checks WHERE rollout_id = ? "
                          "AND seq > ? ORDER BY seq LIMIT ?", (rollout_id, since_seq, limit))
        return [json.loads(r["evidence"]) for r in rows]

    def rollout_index(self) -> list[dict]:
        """id, service, phase, active, created_at of every rollout, newest first (no state read: for /metrics)."""
        return [dict(r) for r in self._db.rows("SELECT id, service, phase, active, created_at FROM rollouts "
                                            "ORDER BY created_at DESC, id")]

    def specs(self, ids: Sequence[str]) -> dict[str, DeploySpec]:
        """id -> DeploySpec of these rollouts, in one query per 500 (listings); a rollout without one is left out."""
        out: dict[str, DeploySpec] = {}
        ids = list(ids)
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            rows = self._db.rows("SELECT rollout_id, body FROM rollout_specs WHERE rollout_id IN "
                              f"({', '.join('?' * len(chunk))})", chunk)
            out.update({r["rollout_id"]: DeploySpec.from_stored(json.loads(r["body"])) for r in rows})
        return out

    def progress(self, ids: Sequence[str]) -> dict[str, tuple[int, float]]:
        """id -> (weight, phase_since) of these rollouts, read by SQLite from their states."""
        out: dict[str, tuple[int, float]] = {}
        ids = list(ids)
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            rows = self._db.rows("SELECT id, json_extract(state, '$.weight') AS weight, json_extract(state, "
                              f"'$.phase_since') AS since FROM rollouts WHERE id IN ({', '.join('?' * len(chunk))})",
                              chunk)
            out.update({r["id"]: (int(r["weight"] or 0), float(r["since"] or 0.0)) for r in rows})
        return out

    def check_outcome_counts(self) -> dict[tuple[str, str], int]:
        """(service, outcome) -> checks stored."""
        rows = self._db.rows("SELECT r.service, c.outcome, SUM(c.n) AS n FROM (SELECT rollout_id, outcome, COUNT(*) AS n "
                          "FROM checks GROUP BY rollout_id, outcome) c JOIN rollouts r ON r.id = c.rollout_id "
                          "GROUP BY r.service, c.outcome")
        return {(r["service"], r["outcome"]): r["n"] for r in rows}

    def rollback_reasons(self) -> dict[tuple[str, str], int]:
        """(service, reason) -> rolled-back rollouts. reason: the deciding check's guard (crashing, not_ready, nan,
        error_rate), "checks_failed" or "inconclusive" when the last check decided the rollback, "aborted" when a
        manual abort was consumed, else "other" (deadline, readiness timeout, a failed action)."""
        rows = self._db.rows(
            "SELECT r.service, c.decision, c.outcome, json_extract(c.evidence, '$.verdict.guard') AS guard, "
            "EXISTS (SELECT 1 FROM commands m WHERE m.rollout_id = r.id AND m.command = 'abort' AND m.consumed_at "
            "IS NOT NULL) AS aborted FROM rollouts r LEFT JOIN checks c ON c.rollout_id = r.id AND c.seq = "
            "(SELECT MAX(seq) FROM checks WHERE rollout_id = r.id) WHERE r.phase = 'rolled_back'")
        out: dict[tuple[str, str], int] = {}
        for r in rows:
            if r["decision"] == "rollback":
                reason = r["guard"] or ("checks_failed" if r["outcome"] == "fail" else "inconclusive")
            else:
                reason = "aborted" if r["aborted"] else "other"
            out[(r["service"], reason)] = out.get((r["service"], reason), 0) + 1
        return out
