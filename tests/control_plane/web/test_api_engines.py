"""GET /api/v1/rollouts/<id>/engines: each variant's engines as the worker last listed them through the deployer's
replicas(), kept once the rollout ended; a deployer that fails to list them never fails the worker's pass."""
from __future__ import annotations

from sits.control_plane.rollout import Phase

from tests.control_plane.worker.support import InMemoryDeployer

from .conftest import auth, drive, new_rollout


def engines(client, rid):
    r = client.get(f"/api/v1/rollouts/{rid}/engines", headers=auth("viewer"))
    assert r.status_code == 200
    return r.get_json()


def test_the_worker_lists_each_variants_engines_and_the_last_sight_stays(client, store):
    ro = new_rollout(store, "chat", now=0.0)
    assert engines(client, ro.id) == {"engines": [], "observed_at": None}   # no pass yet
    deployer = InMemoryDeployer()
    t = drive(store, ro.id, 4, deployer=deployer)
    seen = engines(client, ro.id)
    assert [(e["role"], e["name"], e["ready"], e["state"]) for e in seen["engines"]] == [
        ("production", "production-0", True, "running"), ("baseline", "baseline-0", True, "running"),
        ("canary", "canary-0", True, "running")]
    assert seen["engines"][2]["last_log_line"] == '127.0.0.1 - "GET /readyz HTTP/1.1" 200'
    assert seen["observed_at"] == t
    deployer.crash("chat", "canary")   # the crash guard rolls it back; the list shows why
    t = drive(store, ro.id, 1, t0=t, deployer=deployer)
    canary = engines(client, ro.id)["engines"][2]
    assert canary["ready"] is False and canary["state"] == "exited 1"
    drive(store, ro.id, 3, t0=t, deployer=deployer)
    assert store.get(ro.id).phase is Phase.ROLLED_BACK and deployer.status("chat").keys() == {"production"}
    assert engines(client, ro.id)["engines"][2]["state"] == "exited 1"   # what was seen last, after the rollback


class NoList(InMemoryDeployer):
    def replicas(self, service):
        raise RuntimeError("pods/log forbidden")


def test_a_deployer_that_cannot_list_engines_never_fails_the_pass(client, store, caplog):
    ro = new_rollout(store, "chat", now=0.0)
    drive(store, ro.id, 4, deployer=NoList())
    assert store.get(ro.id).phase is Phase.PROGRESSING
    assert engines(client, ro.id) == {"engines": [], "observed_at": None}
    assert "engines not listed: RuntimeError: pods/log forbidden" in caplog.text


def test_engines_of_an_unknown_rollout_are_404(client):
    r = client.get("/api/v1/rollouts/nope/engines", headers=auth("viewer"))
    assert r.status_code == 404 and r.get_json()["error"]["code"] == "not_found"
