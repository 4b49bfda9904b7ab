"""What a worker round costs the store (bench/control_plane_scale.py): the step's accumulated data in a row of its
own, rewritten only when it changed and decoded only when another writer changed it; every due lease renewed in one
transaction; the worker's listing and its failed-action lookup without reading states or action bodies. On a file
and on ":memory:"."""
import json

import pytest

from sits.control_plane.analysis import VariantData
from sits.control_plane.rollout import Observation, Phase, Rollout, reconcile
from sits.control_plane.rollout import Notify, SetWeights
from sits.control_plane.store.db import Store
from sits.control_plane.store.queues import StoreConflictError
from sits.control_plane.store.codec import rollout_to_dict
from tests.control_plane.helpers import latency_policy as Policy, windows

POLICY = Policy(steps=(10, 50, 100), check_interval_s=30, warmup_s=0)


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    s = Store(str(tmp_path / "s.db") if request.param == "file" else ":memory:")
    yield s
    s.close()


def statements(store):
    """Every SQL statement the store's connection runs from now on."""
    seen: list[str] = []
    store._db.conn.set_trace_callback(seen.append)
    return seen


def progressing(store, rid="r1", service="chat"):
    """A rollout at its first step with one window of data accumulated (no check yet: check_interval_s 30)."""
    r = store.create(Rollout(rid, service, "triton-v1", "torch", POLICY, created_at=0.0, phase_since=0.0))
    ready = Observation(variants={"canary": VariantData(ready=True), "baseline": VariantData(ready=True)},
                        window_end=1.0)
    for now, obs in ((1.0, None), (2.0, ready), (12.0, Observation(2.0, 12.0, windows(2.0, 12.0), "scrape"))):
        r = store.save(*reconcile(r, obs, now))
    assert r.data and r.step == 0 and r.checks == 0
    return r


def data_row(store, rid="r1"):
    rows = store._db.rows("SELECT version, body FROM rollout_data WHERE rollout_id = ?", (rid,))
    return (rows[0]["version"], json.loads(rows[0]["body"])) if rows else None


def test_the_step_data_has_its_own_row_and_the_state_none(store):
    r = progressing(store)
    state = json.loads(store._db.rows("SELECT state FROM rollouts WHERE id = 'r1'")[0][0])
    assert "data" not in state
    version, body = data_row(store)
    assert version == r.version and body == rollout_to_dict(r)["data"]
    assert store.get("r1") == r and store.list()[0] == r and store.active()[0].data == r.data


def test_a_save_without_new_data_does_not_rewrite_it_and_a_load_reuses_it(store):
    r = progressing(store)
    written = data_row(store)
    seen = statements(store)
    r = store.save(*reconcile(r, Observation(), 13.0))         # no window: the same data object passes through
    assert r.version == written[0] + 1 and data_row(store) == written
    assert not [s for s in seen if "rollout_data" in s and not s.startswith("SELECT")]
    loaded = store.get("r1")
    assert loaded.data is store.get("r1").data and loaded == r   # decoded once, then reused
    # a new window: the row is rewritten at the new version and holds the sum
    r = store.save(*reconcile(loaded, Observation(12.0, 22.0, windows(12.0, 22.0), "scrape"), 22.0))
    version, body = data_row(store)
    assert version == r.version and body["canary"]["requests"] == 2000.0 and store.get("r1").data == r.data


def test_a_new_step_deletes_the_row(store):
    r = progressing(store)
    after = store.save(*reconcile(r, Observation(12.0, 40.0, windows(12.0, 40.0), "scrape"), 40.0))
    assert after.phase is Phase.PROGRESSING and after.step == 1 and after.checks == 1
    assert after.data == {} and data_row(store) is None and store.get("r1").data == {}


def test_another_connection_never_sees_or_leaves_stale_data(tmp_path):
    path = str(tmp_path / "two.db")
    with Store(path) as a, Store(path) as b:
        progressing(a)
        ra, rb = a.get("r1"), b.get("r1")
        rb = b.save(*reconcile(rb, Observation(12.0, 22.0, windows(12.0, 22.0), "scrape"), 22.0))
        assert a.get("r1").data == rb.data != ra.data          # a's remembered data is for an older version
        with pytest.raises(StoreConflictError):                 # and a cannot save over b with its stale copy
            a.save(*reconcile(ra, Observation(), 23.0))
        # a reloads, saves the same data object back: b then reads exactly that
        r = a.save(*reconcile(a.get("r1"), Observation(), 24.0))
        assert b.get("r1") == r and data_row(a)[0] == rb.version


def test_leases_of_a_round_are_one_transaction(store):
    for i in range(4):
        store.create(Rollout(f"r{i}", f"s{i}", "triton-v1", "torch"))
    assert store.leases.acquire("r1", "w2", 30.0, now=100.0)            # held by another worker
    assert store.leases.acquire("r2", "w2", 30.0, now=50.0)             # another's, expired at 80
    assert store.leases.acquire("r3", "w1", 30.0, now=90.0)             # w1's own: renewed
    seen = statements(store)
    assert store.leases.acquire_many(["r0", "r1", "r2", "r3"], "w1", 30.0, now=101.0) == {"r0", "r2", "r3"}
    assert seen.count("COMMIT") == 1
    assert [store.leases.get(f"r{i}") for i in range(4)] == [("w1", 131.0), ("w2", 130.0), ("w1", 131.0), ("w1", 131.0)]
    assert store.leases.acquire_many([], "w1", 30.0, now=101.0) == set() and seen.count("COMMIT") == 1


def test_active_ids_and_failed_actions(store):
    for i, svc in enumerate(("a", "b", "c")):
        store.create(Rollout(f"r{i}", svc, "v2", "v1", created_at=float(i)))
    store.save(*reconcile(store.get("r1"), Observation(command="abort"), 5.0))   # r1 ends: rolled back
    assert store.active_ids() == [(r.id, r.service) for r in store.active()] == [("r2", "c"), ("r0", "a")]
    r = store.get("r0")
    r = store.save(r, [SetWeights({"canary": 10, "production": 90}), Notify("step", "x"), SetWeights({})])
    (a1, _), (a2, _), (a3, _) = store.pending_actions("r0")
    store.mark_action(a3, "failed", "boom")
    store.mark_action(a2, "done")
    store.mark_action(a1, "failed", "bang")
    assert store.failed_actions("r0", r.version) == ("set_weights", "set_weights")   # saved with that version
    assert store.failed_actions("r0", r.version - 1) == () and store.failed_actions("r2", r.version) == ()
