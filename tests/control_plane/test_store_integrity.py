"""A damaged store (a truncated file) is noticed at open and on SQLite's corruption errors: writes are refused,
/readyz answers 503 with the reason, the API answers 503 `store_unavailable` (never 500), the worker says so in one
line and then stays quiet; `sits-control backup` copies a live store and refuses a damaged one."""
import logging
import os
import sqlite3

import pytest

from sits.control_plane.cli.main import main as cli_main
from sits.control_plane.rollout import Rollout
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import SCHEMA_VERSION, StoreDamagedError
from sits.control_plane.web import create_app
from sits.control_plane.worker.config import WorkerConfig
from sits.control_plane.worker.loop import Worker
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer
from tests.waiting import wait_for

ROLLOUTS = 40   # enough pages that half the file holds the header and schema but not every table


def _store_with_rollouts(path) -> None:
    with Store(str(path)) as s:
        for i in range(ROLLOUTS):
            s.create(Rollout(f"r{i}", f"svc{i}", "v2", "v1"))
    # the service is stopped (closing checkpointed the WAL): everything is in the one file now
    assert not os.path.exists(f"{path}-wal") or os.path.getsize(f"{path}-wal") == 0


def _truncated_store(tmp_path):
    path = tmp_path / "sits.db"
    _store_with_rollouts(path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    return path


def test_a_truncated_store_is_found_at_open_and_refuses_writes(tmp_path):
    with Store(str(_truncated_store(tmp_path))) as s:
        assert s.damage and "malformed" in s.damage
        with pytest.raises(StoreDamagedError, match="is damaged .*restore it from a backup"):
            s.create(Rollout("new", "fresh", "v2", "v1"))
        with pytest.raises(StoreDamagedError):
            s.list(limit=ROLLOUTS)   # a read over the missing pages


def test_damage_found_later_by_a_read_refuses_writes_from_then_on(tmp_path):
    path = tmp_path / "sits.db"
    _store_with_rollouts(path)
    with Store(str(path)) as s:
        assert s.damage is None
        with open(path, "r+b") as f:   # damaged under a running service
            f.truncate(os.path.getsize(path) // 2)
        other = sqlite3.connect(path, isolation_level=None)   # another process commits: the service's cache is stale
        other.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        other.close()
        with pytest.raises(StoreDamagedError):
            s.list(limit=ROLLOUTS)
        assert s.damage and "malformed" in s.damage
        with pytest.raises(StoreDamagedError):
            s.commands.add("r1", "abort", "otto")


def test_service_on_a_truncated_store_is_unready_and_answers_503(tmp_path):
    app = create_app({"TESTING": True, "STORE": str(_truncated_store(tmp_path)), "SECRET_KEY": "x"})
    client = app.test_client()
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert any("damaged" in p and "backup" in p for p in ready.get_json()["problems"]), ready.get_json()
    created = client.post("/api/v1/rollouts", json={"service": "fresh", "kernels": "torch"})
    assert created.status_code == 503, created.get_data(as_text=True)
    assert created.get_json()["error"]["code"] == "store_unavailable"
    for path in ("/api/v1/rollouts", "/api/v1/rollouts/r1", "/api/v1/services", "/"):
        answer = client.get(path)
        assert answer.status_code in (200, 503), (path, answer.status_code)
        if answer.status_code == 503 and path.startswith("/api/"):
            assert answer.get_json()["error"]["code"] == "store_unavailable"
    assert client.get("/healthz").status_code == 200   # the process lives: an orchestrator must not restart-loop


def test_worker_on_a_damaged_store_says_so_once(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="sits.control_plane.worker.loop")
    store = Store(str(_truncated_store(tmp_path)))
    worker = Worker(store, InMemoryDeployer(), CannedSource(), config=WorkerConfig(interval_s=0.01))
    worker.start()
    try:
        wait_for("five worker rounds on the damaged store", lambda: worker.metrics.store_errors._value.get() >= 5)
    finally:
        worker.stop()
        store.close()
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is None and "damaged" in errors[0].getMessage()
    assert worker.store_error and "damaged" in worker.store_error


def test_backup_copies_a_live_store_and_refuses_a_damaged_one(tmp_path, capsys):
    path = tmp_path / "sits.db"
    _store_with_rollouts(path)
    live = Store(str(path))   # open (WAL mode, a writer attached) while the backup runs
    live.create(Rollout("late", "late-svc", "v2", "v1"))
    out = tmp_path / "backup.db"
    assert cli_main(["backup", "--store", str(path), str(out)]) == 0
    live.close()
    with Store(str(out)) as copy:
        assert copy.damage is None and copy.count() == ROLLOUTS + 1 and copy.get("late").service == "late-svc"
    assert cli_main(["backup", "--store", str(path), str(out)]) == 2   # never over an existing file
    assert "already exists" in capsys.readouterr().err

    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    bad_out = tmp_path / "bad-backup.db"
    assert cli_main(["backup", "--store", str(path), str(bad_out)]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and "Traceback" not in err
    assert not bad_out.exists() and not os.path.exists(f"{bad_out}.partial")
    with sqlite3.connect(out) as db:   # the good backup is untouched
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
