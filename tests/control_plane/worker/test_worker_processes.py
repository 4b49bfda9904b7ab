"""`sits-control worker` as real processes with the local deployer and real tiny engines: a SIGTERM during a deploy
stops it promptly (cancelled starts, nothing left running, the store still resumable), and two workers on one store
never both deploy (the issue's reproductions: 10 -> 30 engines after SIGTERM; two routers with production and
baseline each)."""
import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from tests.control_plane.deploy.test_local_limits import _engines
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]
POLICY = {"steps": [50], "check_interval_s": 1, "warmup_s": 0, "min_samples": 1000000}   # never decides: stays up


def _start(db: str, service: str, policy: Path, replicas: int = 1) -> str:
    p = subprocess.run([sys.executable, "-m", "sits.control_plane.cli", "rollout", "start", "--service", service,
                        "--kernels", "torch", "--policy", str(policy), "--replicas", str(replicas), "--store", db],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()[1]


def _worker(db: str, workdir: Path, *extra: str) -> subprocess.Popen:
    workdir.mkdir()
    return process.spawn([sys.executable, "-m", "sits.control_plane.cli", "worker", "--store", db, "--interval", "0.2",
                          "--workdir", str(workdir), "--cpu-threads", "1", *extra],
                         log_path=workdir.parent / f"{workdir.name}.log", cwd=str(REPO))


def _stop(p: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 60) -> int:
    p.send_signal(sig)
    try:
        return p.wait(timeout)
    finally:
        if p.poll() is None:
            process.stop(p, 5)


@pytest.fixture
def policy(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_deploy_stops_the_worker_promptly(tmp_path, policy, sig):
    db = str(tmp_path / "s.db")
    rid = _start(db, "sigstop", policy, replicas=2)
    w = _worker(db, tmp_path / "w", "--max-replicas", "6")
    try:
        # the first engines have been spawned: the worker is inside deploy(), waiting for them to load
        assert process.wait_until(lambda: list((tmp_path / "w").glob("sigstop-*.log")), 60), \
            (tmp_path / "w.log").read_text()
        rc = _stop(w, sig)
    finally:
        if w.poll() is None:
            process.stop(w, 5)
    log = (tmp_path / "w.log").read_text()
    assert rc == 0, log
    assert "Traceback" not in log
    spawned = list((tmp_path / "w").glob("sigstop-*.log"))
    assert len(spawned) <= 2, [p.name for p in spawned]   # one batch (2 cores) at most, not every replica
    assert process.wait_until(lambda: not _engines("sigstop"), 15)
    with Store(db) as store:
        r = store.get(rid)
        assert not r.phase.terminal and r.phase is not Phase.ROLLING_BACK, r.phase
        statuses = [a["status"] for a in store.actions(rid)]
        assert "failed" not in statuses, store.actions(rid)   # cancelled, not failed: the next worker resumes


def test_two_workers_on_one_store_deploy_once(tmp_path, policy):
    db = str(tmp_path / "s.db")
    rid = _start(db, "twoworkers", policy)
    a = _worker(db, tmp_path / "a")
    b = _worker(db, tmp_path / "b")
    try:
        def progressing():
            with Store(db, readonly=True) as s:
                return s.get(rid).phase is Phase.PROGRESSING
        assert process.wait_until(progressing, 240), (tmp_path / "a.log").read_text()[-2000:]
        logs = {n: sorted(p.name.split("-")[1] for p in (tmp_path / n).glob("twoworkers-*.log")) for n in "ab"}
        # one worker started production, baseline and canary; the other started nothing
        assert sorted(logs.values(), key=len) == [[], ["baseline", "canary", "production"]], logs
        assert len(_engines("twoworkers")) == 3
        with Store(db, readonly=True) as s:
            owner, expires = s.leases.get(rid)

        def renewed_five_times():   # the owner renews its lease every pass (0.2 s): both workers made passes
            with Store(db, readonly=True) as s:
                held = s.leases.get(rid)
            assert held[0] == owner, f"the lease moved from {owner} to {held[0]}"
            return held[1] >= expires + 1.0
        wait_for("five more passes of the lease's owner", renewed_five_times, 60)
        assert {n: len(list((tmp_path / n).glob("twoworkers-*.log"))) for n in "ab"} == \
            {n: len(v) for n, v in logs.items()}
    finally:
        for w in (a, b):
            if w.poll() is None:
                _stop(w)
    assert process.wait_until(lambda: not _engines("twoworkers"), 15)


_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


@pytest.mark.skipif(sys.platform != "linux" or _TGKILL is None, reason="tgkill(2) is Linux's")
def test_a_signal_taken_by_another_thread_stops_the_worker(tmp_path):
    """The kernel may hand a process's SIGTERM to any of its threads; CPython runs the handler on the main thread only
    when that thread runs bytecode. Sent here to the worker's loop thread (tgkill), it must still stop the worker: a
    main thread blocked in one Event.wait() never woke (seen once in CI: a worker deployed on for a minute)."""
    db = str(tmp_path / "s.db")
    Store(db).close()
    w = _worker(db, tmp_path / "w")
    try:
        def threads() -> list[int]:
            return [int(t.name) for t in Path(f"/proc/{w.pid}/task").iterdir() if int(t.name) != w.pid]
        assert process.wait_until(lambda: "Ctrl-C to stop" in (tmp_path / "w.log").read_text() and threads(), 60), \
            (tmp_path / "w.log").read_text()
        # to every thread but the main one (a short-lived one may exit first and lose it): one is enough
        libc = ctypes.CDLL(None, use_errno=True)
        sent = [libc.syscall(_TGKILL, w.pid, tid, signal.SIGTERM) == 0 for tid in threads()]
        assert any(sent), os.strerror(ctypes.get_errno())
        assert w.wait(20) == 0, (tmp_path / "w.log").read_text()
    finally:
        if w.poll() is None:
            process.stop(w, 5)
    assert "Traceback" not in (tmp_path / "w.log").read_text()
