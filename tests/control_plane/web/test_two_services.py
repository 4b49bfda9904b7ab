"""Two control-plane services (app + worker each) on one store: the rollout's lease lets one drive it; the API of
both shows who; when the holder dies without releasing, the other takes over after the lease expires."""
from __future__ import annotations

from sits.control_plane.web import create_app
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

from .conftest import auth


def test_only_one_of_two_services_drives_a_rollout_and_the_other_takes_over(tmp_path, users):
    path = str(tmp_path / "shared.db")
    cluster = InMemoryDeployer()   # what both processes deploy to (a cluster)
    now = {"t": 100.0}
    services = []
    for name in ("a", "b"):
        store = Store(path)
        worker = Worker(store, cluster, CannedSource(), config=WorkerConfig(interval_s=5, lease_ttl_s=30),
                        clock=lambda: now["t"], owner=name)
        services.append((worker, create_app({"TESTING": True, "STORE": store, "SITS_USERS": users,
                                             "WORKER": worker}).test_client()))
    (wa, ca), (wb, cb) = services
    r = ca.post("/api/v1/rollouts", json={"service": "chat", "kernels": "triton-v1.1",
                                          "production_kernels": "triton-v1"}, headers=auth("operator"))
    rid = r.get_json()["id"]
    wa.run_once()
    assert cb.get(f"/api/v1/rollouts/{rid}", headers=auth("viewer")).get_json()["lease"]["owner"] == "a"
    version = wa.store.get(rid).version
    for _ in range(3):   # b passes while a's lease is valid: nothing changes
        now["t"] += 5
        wb.run_once()
        assert wb.store.get(rid).version == version
    # a is killed (no release); b takes over once the lease has expired
    now["t"] += 31
    wb.run_once()
    wb.run_once()
    d = ca.get(f"/api/v1/rollouts/{rid}", headers=auth("viewer")).get_json()
    assert d["lease"]["owner"] == "b" and wb.store.get(rid).version > version
    assert d["phase"] in (Phase.INITIALIZING.value, Phase.PROGRESSING.value)
    for w, _ in services:
        w.store.close()
