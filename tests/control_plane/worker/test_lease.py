"""Worker leases: two workers on one store never both drive a rollout; when the holder stops renewing, the other
takes over after the lease expires. First with an injected clock (deterministic), then with two real Worker loops
(threads) on one file store, the holder hung in a deploy."""
import threading

from tests.control_plane.helpers import latency_policy as Policy   # in-memory deployer: no engines, no gate
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig

from tests.waiting import wait_for

from .support import CannedSource, InMemoryDeployer

POLICY = Policy(steps=(50, 100), check_interval_s=10, warmup_s=0)


class Recording:
    """One worker's view of a shared deployer: every call is recorded under this worker's name; `gate` (an Event)
    holds this worker's deploy() calls until set."""

    def __init__(self, inner, name, log, gate=None):
        self.inner, self.name, self.log, self.gate = inner, name, log, gate

    def __getattr__(self, attr):
        fn = getattr(self.inner, attr)

        def call(*a, **kw):
            if attr == "deploy" and self.gate is not None:
                self.gate.wait(60)
            if attr not in ("status", "router_url"):   # reads
                self.log.append((self.name, attr))
            return fn(*a, **kw)
        return call


def test_only_the_lease_holder_drives_and_the_other_takes_over_after_expiry(tmp_path):
    db, t, log = str(tmp_path / "l.db"), [0.0], []
    deployer = InMemoryDeployer()
    cfg = WorkerConfig(interval_s=5, lease_ttl_s=30)
    with Store(db) as s1, Store(db) as s2:                     # two processes' connections to one file
        start_rollout(s1, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w1 = Worker(s1, Recording(deployer, "w1", log), CannedSource(), config=cfg, clock=lambda: t[0], owner="w1")
        w2 = Worker(s2, Recording(deployer, "w2", log), CannedSource(), config=cfg, clock=lambda: t[0], owner="w2")
        versions = []
        for _ in range(3):                                     # both try every pass; only w1 (first) gets through
            t[0] += 5
            versions.append(w1.reconcile_rollout("r1").version)
            assert w2.reconcile_rollout("r1").version == versions[-1]      # skipped: nothing saved by w2
        assert s1.leases.get("r1") == ("w1", t[0] + 30) and w1.holds("r1") and not w2.holds("r1")
        assert versions == sorted(set(versions)) and {who for who, _ in log} == {"w1"}
        # w1 stops renewing (hung or dead): w2 is refused until the lease expires, then drives to the end
        renewed = t[0]
        t[0] = renewed + 29.9
        assert w2.reconcile_rollout("r1").version == versions[-1]
        t[0] = renewed + 30.0
        phases = []
        while s2.get("r1").active:
            phases.append(w2.reconcile_rollout("r1").phase)
            t[0] += 5
            assert len(phases) < 50
        assert phases[-1] is Phase.SUCCEEDED and s2.leases.get("r1") is not None and s2.leases.get("r1")[0] == "w2"
        before = len(log)
        t[0] += 5
        assert w1.reconcile_rollout("r1").phase is Phase.SUCCEEDED and len(log) == before   # w1 came back: refused
        # the holder gives the lease up once the rollout is over and its outbox empty
        w2.reconcile_rollout("r1")
        assert s2.leases.get("r1") is None
        assert [c["seq"] for c in s2.checks("r1")] == list(range(1, s2.get("r1").checks + 1))
        assert [who for who, what in log if what == "promote"] == ["w2"]


def test_a_stopped_worker_hands_its_leases_over_at_once(tmp_path):
    db, t, deployer = str(tmp_path / "h.db"), [0.0], InMemoryDeployer()
    with Store(db) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w1 = Worker(s, deployer, CannedSource(), clock=lambda: t[0], owner="w1")
        w1.run_once()
        assert s.leases.get("r1")[0] == "w1"
        w1.stop()
        assert s.leases.get("r1") is None
        w2 = Worker(s, deployer, CannedSource(), clock=lambda: t[0], owner="w2")
        t[0] += 1                                              # long before w1's lease would have expired
        assert w2.reconcile_rollout("r1").phase is Phase.PROGRESSING and s.leases.get("r1")[0] == "w2"


def test_two_real_workers_on_one_file_store(tmp_path):
    """Both loops run; w1 takes the rollout and hangs in its deploy (its loop renews the lease of the running pass,
    but for max_pass_s only); w2 waits out the lease and finishes the rollout; w1's late pass then finds the lease
    gone and stops without acting again."""
    db, log, gate = str(tmp_path / "two.db"), [], threading.Event()
    deployer = InMemoryDeployer()
    fast = Policy(steps=(50, 100), check_interval_s=0.1, warmup_s=0.0)
    cfg = WorkerConfig(interval_s=0.02, lease_ttl_s=0.5, action_retries=0, join_timeout_s=10, max_pass_s=0.5)
    with Store(db) as s0:
        start_rollout(s0, "chat", "triton-v1", "torch", fast, rollout_id="r1")
    s1, s2 = Store(db), Store(db)
    w1 = Worker(s1, Recording(deployer, "w1", log, gate), CannedSource(rate=20000), config=cfg, owner="w1")
    w2 = Worker(s2, Recording(deployer, "w2", log), CannedSource(rate=20000), config=cfg, owner="w2")
    try:
        w1.start()
        # w1 holds it, stuck in its first deploy
        wait_for("w1 to hold the lease", lambda: s1.leases.get("r1") is not None, 30)
        w2.start()
        wait_for("w2 to finish the rollout",
                 lambda: s2.get("r1").phase is Phase.SUCCEEDED and not s2.pending_actions("r1"), 30)
        assert {who for who, _ in log} == {"w2"}               # w1 never got a call through
        gate.set()                                             # w1's hung deploy returns ...
        wait_for("w1's passes to end", lambda: not any(t.is_alive() for t in w1._threads.values()), 30)
    finally:
        gate.set()
        w1.stop()
        w2.stop()
    # ... and w1 did nothing more: one deploy of each variant by it at most (the hung call itself), no weights,
    # no promote; the outbox and the checks are as one worker would have left them
    assert [what for who, what in log if who == "w1"] in ([], ["deploy"], ["deploy", "deploy"])
    assert [who for who, what in log if what in ("promote", "set_weights")] == ["w2"] * len(
        [1 for _, what in log if what in ("promote", "set_weights")])
    assert all(a["status"] == "done" for a in s2.actions("r1"))
    assert [c["seq"] for c in s2.checks("r1")] == list(range(1, s2.get("r1").checks + 1))
    s1.close()
    s2.close()


def test_tick_renews_the_due_leases_at_once_and_skips_the_others(tmp_path):
    """A round takes every due rollout's lease in one transaction and starts passes only for those it holds."""
    db, t, log = str(tmp_path / "t.db"), [100.0], []
    with Store(db) as s:
        for svc in ("a", "b", "c"):
            start_rollout(s, svc, "triton-v1", "torch", POLICY, now=0.0, rollout_id=f"r-{svc}")
        assert s.leases.acquire("r-b", "w2", 30.0, now=100.0)
        w1 = Worker(s, Recording(InMemoryDeployer(), "w1", log), CannedSource(), clock=lambda: t[0], owner="w1")
        seen: list[str] = []
        s._db.conn.set_trace_callback(seen.append)
        started = w1.tick()
        for th in started:
            th.join(30)
        s._db.conn.set_trace_callback(None)
        assert sorted(th.name for th in started) == ["sits-rollout-a", "sits-rollout-c"]
        tx = seen[:seen.index("COMMIT")]                              # the round's first transaction: every lease
        assert sum(q.startswith("SELECT owner, expires_at FROM leases") for q in tx) == 3
        assert sum(q.startswith("INSERT OR REPLACE INTO leases") for q in tx) == 2
        assert s.leases.get("r-b") == ("w2", 130.0) and s.leases.get("r-a")[0] == s.leases.get("r-c")[0] == "w1"
        assert s.get("r-b").version == 1 and s.get("r-a").version == s.get("r-c").version == 2


def test_actions_reuse_a_lease_renewed_moments_ago_and_renew_an_older_one(tmp_path):
    """Before each action the lease is renewed, unless this worker renewed it less than lease_ttl_s / 10 ago (then
    it holds it for 0.9 lease_ttl_s at least and the store is not written)."""
    t, log = [100.0], []

    class SlowDeploys(InMemoryDeployer):
        def deploy(self, spec, interrupted=None):                                # each deploy takes 2 s of the injected clock
            t[0] += 2
            super().deploy(spec)

    with Store(str(tmp_path / "f.db")) as s:
        w = Worker(s, Recording(InMemoryDeployer(), "w", log), CannedSource(), clock=lambda: t[0], owner="w",
                   config=WorkerConfig(interval_s=5, lease_ttl_s=30))
        seen: list[str] = []
        s._db.conn.set_trace_callback(seen.append)
        start_rollout(s, "a", "triton-v1", "torch", POLICY, now=0.0, rollout_id="ra")
        w.reconcile_rollout("ra")                              # deploys baseline, canary (+ production), notifies
        writes = [q for q in seen if q.startswith(("INSERT OR REPLACE INTO leases", "UPDATE leases"))]
        assert [what for _, what in log].count("deploy") == 3 and len(writes) == 1 and s.leases.get("ra") == ("w", 130.0)
        slow = Worker(s, SlowDeploys(), CannedSource(), clock=lambda: t[0], owner="w2",
                      config=WorkerConfig(interval_s=5, lease_ttl_s=30))
        start_rollout(s, "b", "triton-v1", "torch", POLICY, now=0.0, rollout_id="rb")
        seen.clear()
        slow.reconcile_rollout("rb")                           # its actions take 6 s of the clock
        writes = [q for q in seen if q.startswith(("INSERT OR REPLACE INTO leases", "UPDATE leases"))]
        # renewed again once 3 s had passed (which parallel deploy sees that first depends on the threads)
        assert len(writes) >= 2 and s.leases.get("rb")[0] == "w2" and s.leases.get("rb")[1] >= t[0] + 27
