"""A service with no active rollout keeps serving across a control-plane restart (local deployer): SIGTERM takes its
production engine and router down with the control plane, and the restarted one deploys production again, as the
last rollout left it (a promoted canary's kernel set), behind a router on the same port."""
import dataclasses
import signal

import pytest

from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store

from tests.waiting import wait_for

from .support import FAST, engine_pids, start_control_proc
from .test_router_restart import serves


def _kernels(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return argv[argv.index("--kernels") + 1]


def _router(tmp_path, proc) -> str:
    return wait_for("the router of the idle service", lambda: next(
        (p.read_text() for p in tmp_path.glob(f"router-{proc.pid}")), None), 240, proc=proc)


@pytest.mark.slow
def test_an_idle_service_gets_production_and_its_router_back_after_a_restart(tmp_path):
    svc, db = "idle", tmp_path / "s.db"
    with Store(str(db)) as s:   # what a control plane leaves behind once torch-slow-attn was promoted
        r = start_rollout(s, svc, "torch-slow-attn", "torch", FAST, DeploySpec(), actor="test")
        s.save(dataclasses.replace(s.get(r.id), phase=Phase.SUCCEEDED))
        s.services.set_router(svc, "http://127.0.0.1:9")
        assert s.active_ids() == []
    first = start_control_proc(db, tmp_path, svc, "--rate", "1")
    second = None
    try:
        url = _router(tmp_path, first)
        wait_for("production to answer through the router", lambda: serves(url), 240, proc=first)
        assert [_kernels(p) for p in engine_pids(svc, "production", under=tmp_path.parent)] == ["torch-slow-attn"]
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
        wait_for("the stopped control plane's engines to exit", lambda: not engine_pids(svc, under=tmp_path.parent), 30)
        assert not serves(url)
        second = start_control_proc(db, tmp_path, svc, "--rate", "1")
        assert _router(tmp_path, second) == url
        wait_for("the idle service back on its old URL", lambda: serves(url), 240, proc=second)
        assert [_kernels(p) for p in engine_pids(svc, "production", under=tmp_path.parent)] == ["torch-slow-attn"]
        with Store(str(db)) as s:
            assert s.services.routers()[svc] == url and s.active_ids() == []   # no rollout was started for it
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(60)
    wait_for("every engine to stop", lambda: not engine_pids(svc, under=tmp_path.parent), 30)
