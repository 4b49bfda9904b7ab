"""The store's schema: the SQLite file's tables, its version (PRAGMA user_version) and the forward migrations.

A new file is created at version 1 and migrated forward like any older file, so every file reaches the current
schema by the same statements. Each migration runs in one transaction with the version bump: a crash leaves the file
at the version before. A file newer than this code is refused (downgrades would lose columns silently).

Version 1 (until 2026-12-01): rollouts, checks, events, actions; the worker and the webhook notifier added their own
tables in the same file when they ran (rollout_specs, commands with a `by` column, deliveries keyed by a JSON body).
Version 2: one owner (control_plane/store/db.py) for every table; events.actor (and kind "metrics" for metrics-source
errors, "window" before); commands.actor (was `by`); deliveries.rollout_id (was only inside the body); leases.
Version 3: indexes for listing rollouts newest first (all, per service, per phase): without them every listing
reads each row's large state to reach created_at (51 ms for the 50 newest of 1,000 rollouts, bench/api_latency.py);
checks(rollout_id, outcome), so counting checks by outcome does not read 100,000 evidence rows.
Version 4: rollout_data, the step's accumulated data (every variant's bucket counts, ~20 KiB) in a row of its own
instead of inside rollouts.state, with the rollout version that wrote it: a save whose data did not change leaves
the row alone, and a load whose row version it has seen reuses the decoded data (bench/control_plane_scale.py).
Version 5: services, where each service's traffic enters (its router's URL).
Version 6: rollouts.retry_of (the rollout a retry repeats; indexed: the detail page shows "retried as") and
rollout_engines, each rollout's engines (processes or pods) as the worker last saw them.
"""
from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from typing import Callable
from urllib.parse import quote

SCHEMA_VERSION = 6

_V1 = """
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


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def _v1_to_v2(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT ''")
    # metrics-source errors get their own kind (EventKind.METRICS); v1 filed them under "window"
    db.execute("UPDATE events SET kind = 'metrics' WHERE kind = 'window' AND message LIKE 'metrics source:%'")
    # worker.SideTables' tables, created here when no worker ever ran on the file
    db.execute("CREATE TABLE IF NOT EXISTS rollout_specs (rollout_id TEXT PRIMARY KEY, body TEXT NOT NULL)")
    if "by" in _columns(db, "commands"):
        db.execute("ALTER TABLE commands RENAME COLUMN by TO actor")
    db.execute("CREATE TABLE IF NOT EXISTS commands (id INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, "
               "command TEXT NOT NULL, actor TEXT NOT NULL, created_at REAL NOT NULL, consumed_at REAL)")
    db.execute("CREATE INDEX IF NOT EXISTS commands_pending ON commands(rollout_id, consumed_at, id)")
    # adapters/notify.py's journal; the rollout id moves out of the JSON body into a column of its own
    db.execute("CREATE TABLE IF NOT EXISTS deliveries (id INTEGER PRIMARY KEY AUTOINCREMENT, target TEXT NOT NULL, "
               "key TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', "
               "attempts INTEGER NOT NULL DEFAULT 0, error TEXT, created_at REAL NOT NULL, done_at REAL, "
               "UNIQUE (target, key))")
    db.execute("CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries(target, status, id)")
    db.execute("ALTER TABLE deliveries ADD COLUMN rollout_id TEXT NOT NULL DEFAULT ''")
    for row_id, body in db.execute("SELECT id, body FROM deliveries").fetchall():
        db.execute("UPDATE deliveries SET rollout_id = ? WHERE id = ?", (json.loads(body).get("rollout_id", ""),
                                                                         row_id))
    db.execute("CREATE INDEX deliveries_rollout ON deliveries(rollout_id, id)")
    db.execute("CREATE TABLE leases (rollout_id TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL, "
               "acquired_at REAL NOT NULL)")


def _v2_to_v3(db: sqlite3.Connection) -> None:
    db.execute("CREATE INDEX rollouts_newest ON rollouts(created_at DESC, id)")
    db.execute("CREATE INDEX rollouts_service_newest ON rollouts(service, created_at DESC, id)")
    db.execute("CREATE INDEX rollouts_phase_newest ON rollouts(phase, created_at DESC, id)")
    db.execute("CREATE INDEX checks_outcome ON checks(rollout_id, outcome)")   # /metrics counts without the evidence


def _v3_to_v4(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE rollout_data (rollout_id TEXT PRIMARY KEY REFERENCES rollouts(id), "
               "version INTEGER NOT NULL, body TEXT NOT NULL)")
    # no row: no data yet in this step (the state's "data" was {})
    db.execute("INSERT INTO rollout_data (rollout_id, version, body) SELECT id, version, json_extract(state, '$.data') "
               "FROM rollouts WHERE json_type(state, '$.data') = 'object' AND json_extract(state, '$.data') != '{}'")
    db.execute("UPDATE rollouts SET state = json_remove(state, '$.data') WHERE json_type(state, '$.data') IS NOT NULL")


def _v4_to_v5(db: sqlite3.Connection) -> None:
    # where each service's traffic enters (the worker writes it after a deploy; views read it, never the deployer)
    db.execute("CREATE TABLE services (service TEXT PRIMARY KEY, router_url TEXT NOT NULL, updated_at REAL NOT NULL)")


def _v5_to_v6(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE rollouts ADD COLUMN retry_of TEXT REFERENCES rollouts(id)")
    db.execute("CREATE INDEX rollouts_retry_of ON rollouts(retry_of) WHERE retry_of IS NOT NULL")
    # the deployer's replicas() of the rollout's service, written by the worker; views read it, never the deployer
    db.execute("CREATE TABLE rollout_engines (rollout_id TEXT PRIMARY KEY REFERENCES rollouts(id), "
               "body TEXT NOT NULL, observed_at REAL NOT NULL)")


# MIGRATIONS[v] takes a file from version v to v + 1
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                                               4: _v4_to_v5, 5: _v5_to_v6}


class StoreError(Exception):
    """A store operation failed."""


class StoreUnavailableError(StoreError):
    """The store cannot serve this now: nothing of the operation was stored (the API answers 503, the worker waits)."""


class StoreWriteError(StoreUnavailableError):
    """The store's file cannot be written now (disk full, read-only, I/O error, locked past the timeout): the
    transaction was rolled back and nothing of it is stored."""


class StoreDamagedError(StoreUnavailableError):
    """The store's file is damaged (SQLite's quick_check at start, or a "malformed" / "not a database" error since):
    nothing more is written to it until it is restored from a backup (docs/security.md#backup-and-restore)."""


class SchemaError(StoreError):
    """The file's schema cannot be used by this code (it is newer)."""


def migrate(db: sqlite3.Connection, name: str, readonly: bool = False) -> int:
    """Bring the file to SCHEMA_VERSION; returns the version it had. `db` is in autocommit mode. Read-only: only
    checks that the file is at SCHEMA_VERSION."""
    try:
        return _migrate(db, name, readonly)
    except sqlite3.Error as e:   # not a database, truncated, read-only, locked: one line, never a traceback
        raise StoreError(f"store {name}: {_why(e, readonly)}") from None


def _why(e: sqlite3.Error, readonly: bool) -> str:
    text = str(e)
    if readonly and ("readonly" in text or "unable to open" in text):
        return f"{text} (cannot read the file)"
    if "readonly" in text or "unable to open" in text:
        return f"{text} (the file or its directory is not writable: this command writes; list and show only read)"
    if "not a database" in text or "malformed" in text:
        return f"{text} (not a SITS store, or a damaged one)"
    return text


def write_problem(path: str) -> str | None:
    """Why the store's directory takes no write now, in the OS's words ("Read-only file system", "No space left on
    device"), or None: SQLite reports EROFS as "disk I/O error", which names no cause. Probes with a 1-byte file."""
    if path == ":memory:":
        return None
    try:
        fd, probe = tempfile.mkstemp(prefix=".sits-store-probe-", dir=os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        return e.strerror
    try:
        os.write(fd, b"\0")
        os.fsync(fd)
        return None
    except OSError as e:
        return e.strerror
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass


def _migrate(db: sqlite3.Connection, name: str, readonly: bool) -> int:
    if readonly:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise SchemaError(f"store {name}: schema version {version}, this code reads {SCHEMA_VERSION}; open it "
                              "with a writable command once (e.g. `sits-control worker`) to migrate it")
        return version
    db.execute("BEGIN IMMEDIATE")   # two processes opening one new file: the second waits, then sees it migrated
    try:
        found = version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaError(f"{name}: schema version {version} is newer than this code's {SCHEMA_VERSION}")
        if version == 0:
            for stmt in filter(str.strip, _V1.split(";")):
                db.execute(stmt)
            version = 1
        while version < SCHEMA_VERSION:
            MIGRATIONS[version](db)
            version += 1
        db.execute(f"PRAGMA user_version = {version}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return found


_DAMAGED_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)   # primary result codes (low byte)


def is_damage(e: sqlite3.Error) -> bool:
    """SQLite reports the file itself as damaged (SQLITE_CORRUPT or SQLITE_NOTADB, extended codes included)."""
    code = getattr(e, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DAMAGED_CODES


def connect(path: str, readonly: bool = False, *, damaged_ok: bool = False) -> sqlite3.Connection:
    """A connection to the store's file (":memory:" included: same pragmas, same schema) in autocommit mode;
    transactions are explicit (BEGIN IMMEDIATE). Read-only: the file must exist; nothing is written (no WAL switch),
    so a read-only file or directory can still be listed. StoreError (one line) when the file cannot be used.
    `damaged_ok` (writable only): a file SQLite calls damaged is still opened, for the caller's quick_check to name
    the damage (a service on it stays up and says why it is not ready)."""
    try:
        if not readonly or path == ":memory:":
            return _open(path, path, writable=True, damaged_ok=damaged_ok)
        try:
            return _open(path, f"file:{quote(path)}?mode=ro", writable=False)
        except sqlite3.OperationalError:
            # a WAL file in a directory we may not write: SQLite cannot create the -shm it reads through, so read
            # the file as it is (a store nobody can write has no writer whose -wal would be missed)
            return _open(path, f"file:{quote(path)}?mode=ro&immutable=1", writable=False)
    except sqlite3.Error as e:
        raise StoreError(f"store {path}: {_why(e, readonly)}") from None


def _open(path: str, target: str, writable: bool, damaged_ok: bool = False) -> sqlite3.Connection:
    db = sqlite3.connect(target, uri=not writable, check_same_thread=False, isolation_level=None, timeout=30.0)
    try:
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA foreign_keys = ON")
        if writable:
            db.execute("PRAGMA journal_mode = WAL")   # ":memory:" answers "memory" and stays as it is
            db.execute("PRAGMA synchronous = FULL")
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()   # reads the header: garbage fails here
    except sqlite3.DatabaseError as e:
        if damaged_ok and is_damage(e):
            return db
        db.close()
        raise
    except BaseException:
        db.close()
        raise
    return db
