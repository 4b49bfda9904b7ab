"""Disk trouble under the store, before and during a rollout: its filesystem full (a small tmpfs mounted for the
test), and read-only (a small ext4 on a loop device that the kernel remounts read-only on an error, as
errors=remount-ro does on a failing disk: the one way a filesystem becomes read-only under files held open for
writing; `mount -o remount,ro` refuses while the store holds its files open). The worker says so in one clear log
line and keeps `store_error` (for /readyz), takes no deployer action it could not record, and carries on where it
was once the disk is writable again. The deployer is the in-memory one, so every call it gets is known."""
import logging
import os
import shutil
import subprocess

import pytest

from sits.control_plane.web import create_app
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import StoreWriteError
from sits.control_plane.web.users import Users, token_sha256
from sits.control_plane.worker.loop import Worker

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
    caplog.set_level(logging.ERROR, "sits.control_plane.worker")
    passes(3)
    assert store.get(r.id).phase is Phase.PENDING and deployer.calls == []      # decided nothing, did nothing
    assert "cannot be written" in (w.store_error or "") and "full" in w.store_error
    lines = [rec.getMessage() for rec in caplog.records if "cannot be written" in rec.getMessage()]
    # one line when it starts, then quiet (the counter and /readyz keep saying it)
    assert len(lines) == 1 and "passes stop without acting" in lines[0] and not caplog.records[0].exc_info
    assert w.metrics.store_errors._value.get() == 3
    with pytest.raises(StoreWriteError):   # a command from the CLI/API is refused the same way, nothing queued
        store.commands.add(r.id, "pause", "alice")
    assert store.commands.pending(r.id) == []
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
    assert any("passes stop without acting" in rec.getMessage() for rec in caplog.records)
    (small_disk / "filler").unlink()
    passes(3)
    got = store.get(r.id)
    assert w.store_error is None and got.version > version and got.checks >= 1
    assert all(a["status"] == "done" for a in store.actions(r.id))
    store.close()


@pytest.fixture
def ext4_disk(tmp_path):
    """A 16 MiB ext4 on a loop device, mounted errors=remount-ro; yields (mount point, remount) where remount()
    unmounts, checks (e2fsck, as an operator would after an error) and mounts it read-write again."""
    tools = all(shutil.which(t) for t in ("mkfs.ext4", "losetup", "e2fsck"))
    if os.geteuid() != 0 or not tools:
        pytest.skip("needs root, mkfs.ext4, losetup and e2fsck for a loop-mounted ext4")
    img, mnt = tmp_path / "disk.img", tmp_path / "ext4"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True)
    attach = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True)
    if attach.returncode != 0:
        pytest.skip(f"no loop device: {attach.stderr.strip()}")
    dev = attach.stdout.strip()

    def mount():
        subprocess.run(["mount", "-o", "errors=remount-ro", dev, str(mnt)], check=True, capture_output=True)

    def remount():
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
        subprocess.run(["e2fsck", "-fy", dev], capture_output=True)   # exit 1: errors fixed
        mount()
    try:
        mount()
        trigger = f"/sys/fs/ext4/{os.path.basename(dev)}/trigger_fs_error"
        if not os.path.exists(trigger):
            pytest.skip("this kernel has no ext4 trigger_fs_error")
        yield mnt, trigger, remount
    finally:   # lazily if a failed test left the store open; the loop device then goes with its last user
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def test_read_only_disk_stops_the_worker_cleanly_and_it_recovers(ext4_disk, caplog):
    """The kernel turns the store's filesystem read-only mid-rollout: readyz fails naming the cause, reads are
    still served, nothing is deployed or recorded. ext4 clears a read-only-after-error state only by an unmount
    (after e2fsck), which waits until no process holds the store's files: the control plane is stopped, the disk
    fixed and mounted read-write, and a new control plane on the same file continues the rollout where it was."""
    mnt, trigger, remount = ext4_disk
    t, deployer, path = [0.0], InMemoryDeployer(), str(mnt / "s.db")
    users = Users.from_dict({"users": [{"name": "otto", "role": "operator", "token_sha256": token_sha256("t" * 24)}]})
    bearer = {"Authorization": "Bearer " + "t" * 24}

    def control_plane():
        store = Store(path)
        w = Worker(store, deployer, CannedSource(), clock=lambda: t[0])
        client = create_app({"TESTING": True, "STORE": store, "WORKER": w, "SITS_USERS": users,
                             "SECRET_KEY": "x"}).test_client()
        return store, w, client

    def passes(w, n):
        for _ in range(n):
            t[0] += 2
            w.run_once(30)

    store, w, client = control_plane()
    r = start_rollout(store, "chat", "torch", "torch", FAST, now=0.0, rollout_id="r1")
    passes(w, 2)
    assert store.get(r.id).phase is Phase.PROGRESSING
    with open(trigger, "w") as f:                                                 # the disk fails: read-only
        f.write("sits test\n")
    calls, version = len(deployer.calls), store.get(r.id).version
    caplog.set_level(logging.ERROR, "sits.control_plane.worker")
    passes(w, 3)
    assert store.get(r.id).version == version and len(deployer.calls) == calls  # reads work, nothing changes
    assert "cannot be written" in (w.store_error or "") and "Read-only file system" in w.store_error
    lines = [rec.getMessage() for rec in caplog.records if "cannot be written" in rec.getMessage()]
    assert len(lines) == 1 and "Read-only file system" in lines[0] and "without acting" in lines[0]
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert any(p.startswith("store:") and "Read-only file system" in p for p in ready.get_json()["problems"])
    with pytest.raises(StoreWriteError, match="Read-only file system"):   # a command is refused, nothing queued
        store.commands.add(r.id, "pause", "alice")
    resp = client.post("/api/v1/rollouts", json={"service": "other", "kernels": "torch"}, headers=bearer)
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "store_unavailable"
    got = client.get(f"/api/v1/rollouts/{r.id}", headers=bearer)
    assert got.status_code == 200 and got.get_json()["phase"] == "progressing"

    w.stop()                                                     # its leases cannot be released: they expire
    store.close()
    remount()                                                                     # fixed, read-write again
    store, w, client = control_plane()
    t[0] += w.config.lease_ttl_s
    passes(w, 4)
    got = store.get(r.id)
    assert w.store_error is None and got.version > version and got.checks >= 1
    assert [p for p in client.get("/readyz").get_json()["problems"] if p.startswith("store:")] == []
    assert [c["seq"] for c in store.checks(r.id)] == list(range(1, got.checks + 1))
    assert all(a["status"] == "done" for a in store.actions(r.id))
    store.close()
