"""`backup(store_path, out_path)`: a consistent copy of a live store through SQLite's online backup API (safe while
the service and worker write to it; WAL included), checked with quick_check before it is given its name. The way
back is a file copy with the service stopped (docs/security.md#backup-and-restore)."""
from __future__ import annotations

import os
import sqlite3

from sits.control_plane.store.database import quick_check
from sits.control_plane.store.schema import StoreDamagedError, StoreError, connect, is_damage


def backup(store_path: str, out_path: str) -> int:
    """Copy the store at `store_path` to `out_path` (which must not exist); returns the number of rollouts copied.
    StoreDamagedError when the store (or so the copy) is damaged: a damaged file is never passed off as a backup."""
    if os.path.lexists(out_path):
        raise StoreError(f"backup {out_path} already exists; give a new file name")
    partial = f"{out_path}.partial"
    src = connect(store_path, readonly=True)
    try:
        dst = sqlite3.connect(partial, isolation_level=None)
        try:
            src.backup(dst)
            damage = quick_check(dst)
            if damage is not None:
                raise StoreDamagedError(f"store {store_path} is damaged ({damage}); no backup was written: restore "
                                        "it from an earlier backup")
            rollouts = dst.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]
        finally:
            dst.close()
        os.replace(partial, out_path)
        return rollouts
    except sqlite3.DatabaseError as e:
        if is_damage(e):
            raise StoreDamagedError(f"store {store_path} is damaged ({e}); no backup was written: restore it from "
                                    "an earlier backup") from None
        raise StoreError(f"backup of {store_path} to {out_path} failed: {e}") from None
    finally:
        src.close()
        if os.path.lexists(partial):
            os.unlink(partial)
