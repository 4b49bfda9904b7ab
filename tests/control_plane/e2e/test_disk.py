"""Disk trouble under the store: its filesystem (a small tmpfs mounted for the test) full, before and during a
rollout. (Read-only is not tested: Linux refuses to remount a filesystem read-only while the store holds its files
open for writing, and SQLite reports EROFS through the same StoreWriteError path.) The worker
says so in one clear log line and keeps `store_error` (for /readyz), takes no deployer action it could not record,
and carries on where it was once the disk is writable again. The deployer is the in-memory one, so every call it
gets is known."""
import logging
import os
import subprocess

import pytest

from control_plane.app import create_app
from control_plane.rollout import Phase
from control_plane.service import start_rollout
from control_plane.store import Store, StoreWriteError
from control_plane.web.users import Users, token_sha256
from control_plane.worker import Worker

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer
from .support import FAST


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path):
    """Write to `path` until the filesystem is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_full_disk_stops_the_worker_cleanly_and_it_recovers(small_disk, caplog):
    t = [0.0]
    store = Store(str(small_disk / "s.db"))
    deployer = InMemoryDeployer()
    r = start_rollout(store, "chat", "torch", "torch", FAST, now=0.0, rollout_id="r1")
    w = Worker(store, deployer, CannedSource(), clock=lambda: t[0])
    users = Users.from_dict({"users": [{"name": "otto", "role": "operator", "token_sha256": token_sha256("t" * 24)}]})
    client = create_app({"TESTING": True, "STORE": store, "WORKER": w, "SITS_USERS": users,
                         "SECRET_KEY": "x"}).test_client()
    bearer = {"Authorization": "Bearer " + "t" * 24}

    def store_problems():
        return [p for p in client.get("/readyz").get_json()["problems"] if p.startswith("store:")]

    def passes(n):
        for _ in range(n):
            t[0] += 2
            w.run_once(30)

    fill(small_disk / "filler")
    caplog.set_level(logging.ERROR, "control_plane.worker")
    passes(3)
    assert store.get(r.id).phase is Phase.PENDING and deployer.calls == []      # decided nothing, did nothing
    assert "cannot be written" in (w.store_error or "") and "full" in w.store_error
    lines = [rec.getMessage() for rec in caplog.records if "cannot be written" in rec.getMessage()]
    assert len(lines) == 3 and "this pass stopped without acting" in lines[0] and not caplog.records[0].exc_info
    with pytest.raises(StoreWriteError):   # a command from the CLI/API is refused the same way, nothing queued
        store.add_command(r.id, "pause", "alice")
    assert store.pending_commands(r.id) == []
    assert client.get("/readyz").status_code == 503 and "cannot be written" in store_problems()[0]
    resp = client.post("/api/v1/rollouts", json={"service": "other", "kernels": "torch"}, headers=bearer)
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "store_unavailable"
    assert store.count() == 1                                                   # and nothing was created

    (small_disk / "filler").unlink()                                             # space returns
    passes(1)
    assert w.store_error is None and store.get(r.id).phase is Phase.INITIALIZING and store_problems() == []
    assert sorted(c[2] for c in deployer.calls if c[0] == "deploy") == ["baseline", "canary", "production"]
    passes(1)
    assert store.get(r.id).phase is Phase.PROGRESSING
    fill(small_disk / "filler")                                                  # full again, mid-rollout
    calls, version = len(deployer.calls), store.get(r.id).version
    caplog.clear()
    passes(3)
    assert store.get(r.id).version == version and len(deployer.calls) == calls  # reads work, nothing changes
    assert any("this pass stopped without acting" in rec.getMessage() for rec in caplog.records)
    (small_disk / "filler").unlink()
    passes(3)
    got = store.get(r.id)
    assert w.store_error is None and got.version > version and got.checks >= 1
    assert all(a["status"] == "done" for a in store.actions(r.id))
    store.close()
