"""Issue 26 row 15: `kill -9` of the control plane (worker, store, LocalDeployer with its engines and router, load)
and a restart: the service comes back on the same router port, so clients of the old URL get it back."""
import dataclasses
import signal
import time
import urllib.error
import urllib.request

import pytest

from sits.control_plane.router.ports import RouterPorts
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store

from tests.waiting import wait_for

from .support import FAST, engine_pids, start_control_proc



def start(store_path, workdir, svc):
    return start_control_proc(store_path, workdir, svc)


def serves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.slow
def test_a_sigkilled_control_plane_serves_on_the_same_router_port_again(tmp_path):
    svc, db = "samep", tmp_path / "s.db"
    with Store(str(db)) as s:   # awaits promotion at its end: still active whenever the kill comes
        start_rollout(s, svc, "torch", "torch", dataclasses.replace(FAST, auto_promote=False), DeploySpec(),
                      actor="test")
    first = start(db, tmp_path, svc)
    second = None
    try:
        url = wait_for("the router", lambda: next((p.read_text() for p in tmp_path.glob(f"router-{first.pid}")),
                                                  None), 240)
        wait_for("production to answer through the router", lambda: serves(url), 240)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        killed = time.monotonic()
        wait_for("the dead control plane's engines to exit", lambda: not engine_pids(svc), 30)
        assert not serves(url)                                        # down with it ...
        second = start(db, tmp_path, svc)
        wait_for("the service back on the old URL", lambda: serves(url), 240)   # ... and back on the same port
        print(f"service back on {url} {time.monotonic() - killed:.1f} s after the kill")
        again = wait_for("the restarted control plane's router URL",
                         lambda: next((p.read_text() for p in tmp_path.glob(f"router-{second.pid}")), None), 30)
        assert again == url
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(60)
    assert second.returncode == 0
    wait_for("every engine to stop", lambda: not engine_pids(svc), 30)


def test_router_ports_are_remembered_atomically_and_bad_files_ignored(tmp_path):
    f = tmp_path / "s.db.routers.json"
    ports = RouterPorts(f)
    assert ports.get("chat") == 0
    ports.remember("chat", 18123)
    assert RouterPorts(f).get("chat") == 18123 and RouterPorts(None).get("chat") == 0
    for bad in (b"[1]", b"{not json", b'{"chat": "80"}', b'{"chat": 0}', b'{"chat": true}', b"\xff"):
        f.write_bytes(bad)
        assert RouterPorts(f).get("chat") == 0
