"""The store's other tables, each on a file and on ":memory:" (which behaves the same): a rollout created with its
spec in one transaction, listing with filters and pages, the command queue, worker leases (injected clock) and the
webhook delivery journal."""
import pytest

from sits.control_plane.analysis import Policy
from sits.control_plane.rollout import Command, Event, EventKind, Phase, Rollout, reconcile
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.queues import RolloutNotFoundError, StoreConflictError
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import StoreError


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    s = Store(str(tmp_path / "s.db") if request.param == "file" else ":memory:")
    yield s
    s.close()


def test_a_rollout_and_its_spec_are_one_transaction(store):
    spec = DeploySpec(replicas=3, canary_args=("--seed", "7"), env={"A": "b"}, canary_image="reg/sits:2")
    created = Event(1.0, EventKind.CREATED, "created by alice", Phase.PENDING, "alice")
    r = store.create_rollout(Rollout("r1", "chat", "triton-v1", "torch", new_events=(created,)), spec)
    assert r.version == 1 and r.new_events == () and store.spec("r1") == spec
    assert [(e["kind"], e["actor"], e["message"]) for e in store.events("r1")] == [("created", "alice",
                                                                                   "created by alice")]
    # the second rollout of the service is refused whole: neither its row nor its spec is written
    with pytest.raises(StoreConflictError, match="active rollout") as e:
        store.create_rollout(Rollout("r2", "chat", "triton-v1.1", "torch"), DeploySpec(replicas=5))
    # in the operator's words, naming the active rollout; never the database's ("UNIQUE constraint failed")
    assert str(e.value) == ("service 'chat' already has an active rollout, r1 (pending): one rollout per service at "
                            "a time; abort it or wait until it ends")
    assert store.count() == 1 and store.spec("r2") == DeploySpec()
    assert store._db.rows("SELECT COUNT(*) FROM rollout_specs")[0][0] == 1
    with pytest.raises(StoreConflictError, match="^a rollout with id 'r1' already exists$"):   # nor its spec
        store.create_rollout(Rollout("r1", "other", "torch", "torch"), DeploySpec(replicas=9))
    assert store.spec("r1") == spec


def test_list_filters_pages_and_counts(store):
    for i, svc in enumerate(("a", "b", "c", "d")):
        store.create(Rollout(f"r{i}", svc, "v2", "v1", created_at=float(i)))
    r = store.get("r1")
    store.save(*reconcile(r, None, 10.0))                     # r1 -> initializing
    assert [x.id for x in store.list()] == ["r3", "r2", "r1", "r0"]      # newest first
    assert [x.id for x in store.list(limit=2, offset=1)] == ["r2", "r1"]
    assert [x.id for x in store.list(phase=Phase.INITIALIZING)] == ["r1"]
    assert [x.id for x in store.list(phase="pending", service="c")] == ["r2"]
    assert store.count() == 4 and store.count(phase="pending") == 3 and store.count(active=False) == 0
    assert store.count(service="a", phase=Phase.INITIALIZING) == 0


def test_command_queue(store):
    store.create(Rollout("r1", "chat", "v2", "v1"))
    assert store.commands.next("r1") is None and store.commands.pending("r1") == []
    a = store.commands.add("r1", Command.PAUSE, "alice")
    b = store.commands.add("r1", "resume", "bob")
    assert store.commands.add("r1", "pause", "carol", reuse_pending=True) == a      # already queued: the same one
    assert store.commands.add("r1", "pause", "dave") not in (a, b)                  # without reuse: a second one
    assert store.commands.next("r1") == (a, Command.PAUSE, "alice")
    store.commands.consume(a)
    assert store.commands.next("r1") == (b, Command.RESUME, "bob")
    assert [(c["command"], c["actor"]) for c in store.commands.pending("r1")] == [("resume", "bob"),
                                                                                  ("pause", "dave")]
    assert store.commands.add("r1", "pause", "erin", reuse_pending=True) != a       # a was consumed
    with pytest.raises(RolloutNotFoundError, match="no rollout 'nope'"):
        store.commands.add("nope", "abort", "x")
    with pytest.raises(StoreError, match="unknown command"):
        store.commands.add("r1", "explode", "x")


def test_leases_with_an_injected_clock(store):
    assert store.leases.get("r1") is None
    assert store.leases.acquire("r1", "w1", 30.0, now=100.0) and store.leases.get("r1") == ("w1", 130.0)
    assert not store.leases.acquire("r1", "w2", 30.0, now=129.9)          # held: the other waits
    assert store.leases.acquire("r1", "w1", 30.0, now=120.0) and store.leases.get("r1") == ("w1", 150.0)   # renewed
    assert not store.leases.acquire("r1", "w2", 30.0, now=149.0)
    assert store.leases.acquire("r1", "w2", 30.0, now=150.0) and store.leases.get("r1") == ("w2", 180.0)   # expired
    assert not store.leases.acquire("r1", "w1", 30.0, now=151.0)          # the old holder lost it
    store.leases.release("r1", "w1")                                      # not its lease: nothing happens
    assert store.leases.get("r1") == ("w2", 180.0)
    store.leases.release("r1", "w2")
    assert store.leases.get("r1") is None and store.leases.acquire("r1", "w1", 30.0, now=151.0)
    assert store.leases.acquire("r2", "w2", 5.0, now=151.0)              # one lease per rollout


def test_delivery_journal(store):
    body = {"event": "step", "at": 1.0, "key": "r1:4", "rollout_id": "r1"}
    assert store.deliveries.record("hookA", "r1:4", "r1", body, limit=2) is True
    assert store.deliveries.record("hookA", "r1:4", "r1", body, limit=2) is None         # a replay: nothing queued
    assert store.deliveries.record("hookB", "r1:4", "r1", body, limit=2) is True         # another webhook
    assert store.deliveries.record("hookA", "r1:5", "r1", dict(body, key="r1:5"), limit=2) is True
    assert store.deliveries.record("hookA", "r1:6", "r1", dict(body, key="r1:6"), limit=2) is False   # full
    assert store.deliveries.pending("hookA") == 2
    first, got = store.deliveries.next("hookA")
    assert got == body
    store.deliveries.finish(first, "sent", 3, None)
    assert store.deliveries.pending("hookA") == 1 and store.deliveries.next("hookA")[1]["key"] == "r1:5"
    log = store.deliveries.of_rollout("r1")
    assert [(d["webhook"], d["key"], d["status"], d["attempts"]) for d in log] == [
        ("hookA", "r1:4", "sent", 3), ("hookB", "r1:4", "pending", 0), ("hookA", "r1:5", "pending", 0)]
    assert store.deliveries.of_rollout("r2") == []


def test_two_stores_on_one_file_see_each_other(tmp_path):
    path = str(tmp_path / "shared.db")
    with Store(path) as a, Store(path) as b:
        a.create_rollout(Rollout("r1", "chat", "v2", "v1", Policy(steps=(50,))), DeploySpec(replicas=2))
        assert b.get("r1").policy.steps == (50,) and b.spec("r1").replicas == 2
        assert a.leases.acquire("r1", "w1", 30.0, now=0.0) and not b.leases.acquire("r1", "w2", 30.0, now=1.0)
        b.commands.add("r1", "abort", "bob")
        assert a.commands.next("r1")[1:] == (Command.ABORT, "bob")
