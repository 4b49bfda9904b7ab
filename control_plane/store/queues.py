"""The store's queues and small tables, each an object over the store's Database (`store.commands`,
`store.leases`, `store.deliveries`, `store.services`): manual commands left by the CLI / API for the worker, the
worker leases, the webhook delivery journal of adapters/notify.py, and where each service's traffic enters."""
from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Mapping, Sequence

from sits.control_plane.errors import ConflictError, NotFoundError
from sits.control_plane.rollout import Command
from sits.control_plane.store.database import Database
from sits.control_plane.store.schema import StoreError


class RolloutNotFoundError(StoreError, NotFoundError):
    """No rollout with that id."""


class StoreConflictError(StoreError, ConflictError):
    """The rollout changed since it was loaded, or the service already has an active rollout, or the id exists."""


def _command(command: Command | str) -> Command:
    try:
        return Command(command)
    except ValueError:
        raise StoreError(f"unknown command {command!r}; use one of {', '.join(c.value for c in Command)}") from None


class Commands:
    """Manual commands: left by the CLI / API, consumed by the worker after the state they produced is saved."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add(self, rollout_id: str, command: Command | str, actor: str, *, reuse_pending: bool = False) -> int:
        """Queue a command; its id. With reuse_pending, the same command already queued (not yet consumed) is
        returned instead of a second one. RolloutNotFoundError if there is no such rollout."""
        command = _command(command)
        with self._db.tx() as db:
            if db.execute("SELECT 1 FROM rollouts WHERE id = ?", (rollout_id,)).fetchone() is None:
                raise RolloutNotFoundError(f"no rollout {rollout_id!r}")
            if reuse_pending:
                row = db.execute("SELECT id FROM commands WHERE rollout_id = ? AND command = ? AND consumed_at IS NULL"
                                 " ORDER BY id LIMIT 1", (rollout_id, command.value)).fetchone()
                if row is not None:
                    return row["id"]
            return db.execute("INSERT INTO commands (rollout_id, command, actor, created_at) VALUES (?, ?, ?, ?)",
                              (rollout_id, command.value, actor, time.time())).lastrowid

    def next(self, rollout_id: str) -> tuple[int, Command, str] | None:
        """The oldest unconsumed command: (command_id, command, actor)."""
        rows = self._db.rows("SELECT id, command, actor FROM commands WHERE rollout_id = ? AND consumed_at IS NULL "
                          "ORDER BY id LIMIT 1", (rollout_id,))
        return (rows[0]["id"], Command(rows[0]["command"]), rows[0]["actor"]) if rows else None

    def consume(self, command_id: int) -> None:
        with self._db.tx() as db:
            db.execute("UPDATE commands SET consumed_at = ? WHERE id = ?", (time.time(), command_id))

    def pending(self, rollout_id: str) -> list[dict]:
        """Queued, not yet consumed commands, oldest first: id, command, actor, created_at."""
        rows = self._db.rows("SELECT id, command, actor, created_at FROM commands WHERE rollout_id = ? AND consumed_at "
                          "IS NULL ORDER BY id", (rollout_id,))
        return [dict(r) for r in rows]

class Leases:
    """Which worker drives a rollout: a lease per rollout, taken and renewed with an expiry."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def acquire(self, rollout_id: str, owner: str, ttl_s: float, now: float) -> bool:
        """Take (or renew) the rollout's lease until now + ttl_s: True if `owner` holds it afterwards, i.e. it was
        free, expired or already `owner`'s."""
        with self._db.tx() as db:
            return self._take_lease(db, rollout_id, owner, ttl_s, now)

    def acquire_many(self, rollout_ids: Sequence[str], owner: str, ttl_s: float, now: float) -> set[str]:
        """acquire for many rollouts in one transaction (one commit per worker round, not one per rollout):
        the ids `owner` holds afterwards."""
        if not rollout_ids:
            return set()
        with self._db.tx() as db:
            return {rid for rid in rollout_ids if self._take_lease(db, rid, owner, ttl_s, now)}

    @staticmethod
    def _take_lease(db: sqlite3.Connection, rollout_id: str, owner: str, ttl_s: float, now: float) -> bool:
        row = db.execute("SELECT owner, expires_at FROM leases WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is not None and row["owner"] != owner and row["expires_at"] > now:
            return False
        if row is not None and row["owner"] == owner:
            db.execute("UPDATE leases SET expires_at = ? WHERE rollout_id = ?", (now + ttl_s, rollout_id))
        else:
            db.execute("INSERT OR REPLACE INTO leases (rollout_id, owner, expires_at, acquired_at) "
                       "VALUES (?, ?, ?, ?)", (rollout_id, owner, now + ttl_s, now))
        return True

    def release(self, rollout_id: str, owner: str) -> None:
        """Give the lease up (if `owner` holds it) so another worker takes over without waiting for expiry."""
        with self._db.tx() as db:
            db.execute("DELETE FROM leases WHERE rollout_id = ? AND owner = ?", (rollout_id, owner))

    def get(self, rollout_id: str) -> tuple[str, float] | None:
        """(owner, expires_at), or None if no worker holds it."""
        rows = self._db.rows("SELECT owner, expires_at FROM leases WHERE rollout_id = ?", (rollout_id,))
        return (rows[0]["owner"], rows[0]["expires_at"]) if rows else None

class Deliveries:
    """The webhook delivery journal (adapters/notify.py DeliveryJournal): one durable queue per webhook `target`."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def record(self, target: str, key: str, rollout_id: str, body: Mapping[str, Any], *,
                        limit: int) -> bool | None:
        """Queue a delivery: True; None if (target, key) is already queued or done (a replay); False if `limit`
        deliveries to target are pending."""
        with self._db.tx() as db:
            pending = db.execute("SELECT COUNT(*) FROM deliveries WHERE target = ? AND status = 'pending'",
                                 (target,)).fetchone()[0]
            if pending >= limit:
                return False
            cur = db.execute("INSERT OR IGNORE INTO deliveries (target, key, rollout_id, body, created_at) "
                             "VALUES (?, ?, ?, ?, ?)", (target, key, rollout_id, json.dumps(body), time.time()))
            return True if cur.rowcount else None

    def next(self, target: str) -> tuple[int, dict] | None:
        """The oldest pending delivery to target: (delivery id, body)."""
        rows = self._db.rows("SELECT id, body FROM deliveries WHERE target = ? AND status = 'pending' ORDER BY id "
                          "LIMIT 1", (target,))
        return (rows[0]["id"], json.loads(rows[0]["body"])) if rows else None

    def finish(self, delivery_id: int, status: str, attempts: int, error: str | None) -> None:
        """status: "sent" or "failed"; attempts made by this try (added to the row's)."""
        with self._db.tx() as db:
            db.execute("UPDATE deliveries SET status = ?, attempts = attempts + ?, error = ?, done_at = ? WHERE id = ?",
                       (status, attempts, error, time.time(), delivery_id))

    def pending(self, target: str) -> int:
        return self._db.rows("SELECT COUNT(*) FROM deliveries WHERE target = ? AND status = 'pending'", (target,))[0][0]

    def of_rollout(self, rollout_id: str) -> list[dict]:
        """The rollout's journaled notifications, oldest first: event, at, key, webhook (the target: a hash of the
        URL), status, attempts, error, done_at."""
        rows = self._db.rows("SELECT target, body, status, attempts, error, done_at FROM deliveries WHERE rollout_id = ? "
                          "ORDER BY id", (rollout_id,))
        out = []
        for r in rows:
            n = json.loads(r["body"])
            out.append({"event": n["event"], "at": n["at"], "key": n["key"], "webhook": r["target"],
                        "status": r["status"], "attempts": r["attempts"], "error": r["error"],
                        "done_at": r["done_at"]})
        return out


class Services:
    """Where each service's traffic enters (its router's URL), as the worker last deployed it: the views show it
    without asking the deployer."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def set_router(self, service: str, url: str, now: float | None = None) -> None:
        with self._db.tx() as db:
            db.execute("INSERT INTO services (service, router_url, updated_at) VALUES (?, ?, ?) ON CONFLICT(service) "
                       "DO UPDATE SET router_url = excluded.router_url, updated_at = excluded.updated_at",
                       (service, url, time.time() if now is None else now))

    def routers(self) -> dict[str, str]:
        return {r["service"]: r["router_url"] for r in self._db.rows("SELECT service, router_url FROM services")}


class Engines:
    """Each rollout's engines (the deployer's replicas(): processes or pods, with readiness, restarts and the last
    log line) as the worker last saw them: the detail page lists them without asking the deployer, and keeps the
    last sight of them once the rollout ended."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def put(self, rollout_id: str, engines: list[dict], observed_at: float) -> None:
        with self._db.tx() as db:
            db.execute("INSERT INTO rollout_engines (rollout_id, body, observed_at) VALUES (?, ?, ?) "
                       "ON CONFLICT(rollout_id) DO UPDATE SET body = excluded.body, observed_at = excluded.observed_at",
                       (rollout_id, json.dumps(engines), observed_at))

    def get(self, rollout_id: str) -> tuple[list[dict], float] | None:
        """(engines, when observed), or None when the worker has not listed them yet."""
        rows = self._db.rows("SELECT body, observed_at FROM rollout_engines WHERE rollout_id = ?", (rollout_id,))
        return (json.loads(rows[0]["body"]), rows[0]["observed_at"]) if rows else None
