"""The store's one SQLite connection: opened, checked and migrated once, behind a lock, with the write transaction
every table object uses (`Database.tx()`) and plain reads (`Database.rows()`).

A damaged file (SQLite's quick_check at open, or a "malformed" / "not a database" error on any statement since) sets
`damage`: from then on every write is refused with StoreDamagedError (nothing more is written into a bad file) and a
read that hits the damage raises it too, so the API answers 503 and /readyz says why, never a 500 per request."""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from sits.control_plane.store.schema import (StoreDamagedError, StoreWriteError, connect, is_damage, migrate,
                                              write_problem)

RESTORE_HINT = "restore it from a backup (docs/security.md#backup-and-restore)"


class Database:
    """`Database(path, readonly=False)`. Thread-safe: one connection behind a re-entrant lock; other processes may
    open the same file. `lock` is also held by callers that keep per-connection caches (Store's decoded data).
    `damage`: why the file is damaged (None while it is not); a writable open runs SQLite's quick_check first."""

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        self.lock = threading.RLock()
        self.damage: str | None = None
        self.conn = connect(self.path, readonly, damaged_ok=not readonly)
        self.migrated_from: int | None = None   # the schema version found; None for a damaged file
        try:
            if not readonly:
                self.damage = quick_check(self.conn)
            if self.damage is None:   # a damaged file is not migrated: nothing is written into it
                self.migrated_from = migrate(self.conn, self.path, readonly)
        except BaseException:
            self.conn.close()
            raise

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE): committed when the block ends, rolled back on an exception.
        StoreWriteError when the file cannot be written (disk full, read-only, I/O error, locked), StoreDamagedError
        when it is damaged: nothing stored."""
        with self.lock:
            if self.damage is not None:
                raise self._damaged()
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.conn
                except BaseException:
                    self._rollback()
                    raise
                self.conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                self._rollback()
                if is_damage(e):
                    raise self._damaged(e) from None
                if not isinstance(e, sqlite3.OperationalError):
                    raise
                busy = getattr(e, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                why = None if busy else write_problem(self.path)
                raise StoreWriteError(f"store {self.path} cannot be written: {e}"
                                      + (f" ({why})" if why else "")) from None

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:   # the file is gone bad: the connection drops the transaction itself
                pass

    def _damaged(self, e: sqlite3.Error | None = None) -> StoreDamagedError:
        if e is not None and self.damage is None:
            self.damage = str(e)
        return StoreDamagedError(f"store {self.path} is damaged ({self.damage}): nothing is written to it; "
                                 f"{RESTORE_HINT}")

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self.lock:
            try:
                return self.conn.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as e:
                if is_damage(e):
                    raise self._damaged(e) from None
                raise


def quick_check(conn: sqlite3.Connection) -> str | None:
    """What SQLite's quick_check finds wrong with the file (its first three lines), or None when it is sound."""
    try:
        found = [row[0] for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
    except sqlite3.DatabaseError as e:
        if is_damage(e):
            return str(e)
        raise
    return None if found == ["ok"] else " ".join("; ".join(found).split())   # one line
