"""The store's one SQLite connection: opened and migrated once, behind a lock, with the write transaction every table
object uses (`Database.tx()`) and plain reads (`Database.rows()`)."""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from sits.control_plane.store.schema import StoreWriteError, connect, migrate, write_problem


class Database:
    """`Database(path, readonly=False)`. Thread-safe: one connection behind a re-entrant lock; other processes may
    open the same file. `lock` is also held by callers that keep per-connection caches (Store's decoded data)."""

    def __init__(self, path: str, *, readonly: bool = False) -> None:
        self.path = str(path)
        self.readonly = readonly
        self.lock = threading.RLock()
        self.conn = connect(self.path, readonly)
        try:
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
        StoreWriteError when the file cannot be written (disk full, read-only, I/O error, locked): nothing stored."""
        with self.lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self.conn
                except BaseException:
                    self._rollback()
                    raise
                self.conn.execute("COMMIT")
            except sqlite3.OperationalError as e:
                self._rollback()
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

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self.conn.execute(sql, args).fetchall()
