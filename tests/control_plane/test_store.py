"""SQLite store: round trips, outbox, optimistic concurrency, one active rollout per service, and crash safety
(a real process killed in the middle of the save transaction, and a worker loop crashed between its steps)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sits.control_plane.analysis import REQUEST_LATENCY
from sits.control_plane.rollout import Command, Deploy, Observation, Phase, Rollout, SetWeights, reconcile
from sits.control_plane.store.queues import RolloutNotFoundError, StoreConflictError
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from tests.control_plane.helpers import latency_policy as Policy, windows as source
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

ROOT = Path(__file__).resolve().parents[2]


class Crash(BaseException):
    """A simulated kill: nothing in memory survives, only the SQLite file and the (external) deployer."""


def test_create_get_list_and_conflicts(tmp_path):
    with Store(str(tmp_path / "s.db")) as s:
        r = s.create(Rollout("r1", "chat", "v2", "v1", Policy(steps=(10, 100))))
        assert r.version == 1 and s.get("r1") == r
        with pytest.raises(StoreConflictError, match="active rollout"):
            s.create(Rollout("r2", "chat", "v3", "v1"))          # one active rollout per service
        s.create(Rollout("r3", "search", "v3", "v1"))
        assert {x.id for x in s.active()} == {"r1", "r3"} and [x.id for x in s.list(service="chat")] == ["r1"]
        with pytest.raises(RolloutNotFoundError):
            s.get("nope")
        r2, actions = reconcile(r, None, 1.0)
        saved = s.save(r2, actions)
        with pytest.raises(StoreConflictError, match="version"):
            s.save(r2, actions)                                   # stale version: someone saved first
        assert s.get("r1") == saved and saved.phase is Phase.INITIALIZING


def test_full_evidence_and_outbox_round_trip(tmp_path):
    path = str(tmp_path / "s.db")
    s = Store(path)
    r = s.create(Rollout("r1", "chat", "v2", "v1", Policy()))
    t, kinds = 0.0, []
    r, a = reconcile(r, None, t)
    r = s.save(r, a)
    t += 1
    r, a = reconcile(r, Observation(0, t, source(0, t)), t)
    r = s.save(r, a)
    while r.checks == 0:
        t += 10
        r, a = reconcile(r, Observation(r.observed_until, t, source(r.observed_until, t), source="scrape",
                                        queries={"canary": "http://127.0.0.1:1/metrics"}), t)
        r = s.save(r, a)
    s.close()
    s = Store(path)                                                # restart: everything comes back from disk
    back = s.get("r1")
    assert back == r and back.data == r.data and back.policy == Policy()
    assert s.check_summaries("r1") == [{"seq": 1, "at": t, "step": 0, "weight": 5, "outcome": "pass",
                                        "decision": "advance", "reason": "every check passed with confidence"}]
    ev = s.check("r1", 1)
    assert ev["verdict"]["outcome"] == "pass" and ev["decision"] == "advance" and ev["source"] == "scrape"
    assert ev["queries"] == {"canary": "http://127.0.0.1:1/metrics"}
    buckets = ev["variants"]["canary"]["histograms"][REQUEST_LATENCY]
    assert buckets["bounds"][-1] == "+Inf" and buckets["counts"][-1] == ev["variants"]["canary"]["requests"]
    p99 = next(x for x in ev["verdict"]["results"] if x["check"].endswith("p99"))
    assert p99["threshold"] == 0.10 and p99["ci_low"] < p99["ci_high"] and p99["n_canary"] > 0
    pending = s.pending_actions("r1")
    kinds = [a.kind for _, a in pending]
    assert kinds[:3] == ["deploy", "deploy", "notify"] and "set_weights" in kinds
    assert pending[0][1] == Deploy("baseline", "v1")
    assert any(a == SetWeights({"production": 80, "baseline": 10, "canary": 10}) for _, a in pending)
    for action_id, _ in pending:
        s.mark_action(action_id)
    assert s.pending_actions("r1") == []
    assert [e["kind"] for e in s.events("r1")][:1] == ["phase"]


CRASHER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from tests.control_plane.helpers import windows as source
    from sits.control_plane.rollout import Observation, reconcile
    from sits.control_plane.store.db import Store
    s = Store({db!r})
    r = s.get("r1")
    now = r.last_check_at + r.policy.check_interval_s
    r2, actions = reconcile(r, Observation(r.observed_until, now, source(r.observed_until, now)), now)
    assert r2.new_checks, "the crash must hit a check"
    def trace(sql):
        if sql.startswith("INSERT INTO checks"):
            os._exit(9)        # the process dies inside the transaction, after the check row was written
    s._db.conn.set_trace_callback(trace)
    s.save(r2, actions)
    os._exit(0)
""")


def test_killed_inside_the_save_transaction(tmp_path):
    db = str(tmp_path / "s.db")
    s = Store(db)
    r = s.create(Rollout("r1", "chat", "v2", "v1", Policy()))
    r, a = reconcile(r, None, 0.0)
    r = s.save(r, a)
    r, a = reconcile(r, Observation(0, 1, source(0, 1)), 1.0)
    r = s.save(r, a)
    r, a = reconcile(r, Observation(1, 21, source(1, 21)), 21.0)      # step data, no check yet
    r = s.save(r, a)
    s.close()
    code = CRASHER.format(root=str(ROOT), db=db)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    s = Store(db)
    after = s.get("r1")
    assert after == r and after.checks == 0 and s.checks("r1") == []          # all or nothing
    # the restarted worker redoes the same check with the same seq
    now = after.last_check_at + after.policy.check_interval_s
    r2, a = reconcile(after, Observation(after.observed_until, now, source(after.observed_until, now)), now)
    s.save(r2, a)
    assert [c["seq"] for c in s.checks("r1")] == [1]


@pytest.mark.parametrize("scale,final", [(1.0, Phase.SUCCEEDED), (1.5, Phase.ROLLED_BACK)])
def test_worker_crashes_lose_and_repeat_no_check(tmp_path, scale, final):
    """The real worker, killed (a BaseException from Worker.step_hook) before its save, after it, and while acting;
    every pass is a fresh worker and store on the file, as after a process restart."""
    crashes = ["executed:", "saved", "reconciled"]
    db = str(tmp_path / "w.db")
    with Store(db) as s:
        s.create(Rollout("r1", "chat", "v2", "v1", Policy()))
    deployer, source = InMemoryDeployer(), CannedSource(scale={"chat": scale})
    now, crashed = 0.0, set()

    def crash_at(step, where):
        if step.startswith(where):
            raise Crash(where)
    for i in range(200):
        now += 10
        with Store(db) as s:
            w = Worker(s, deployer, source, clock=lambda: now, owner="worker-0")
            if i % 2 == 1:   # every other pass crashes, at each point in turn
                w.step_hook = lambda step, where=crashes[(i // 2) % 3]: crash_at(step, where)
            try:
                w.reconcile_rollout("r1")
            except Crash as e:
                crashed.add(e.args[0])
            if not s.get("r1").active and not s.pending_actions("r1"):
                break
    with Store(db) as s:
        r, checks = s.get("r1"), s.checks("r1")
        assert r.phase is final and crashed == set(crashes)
        seqs = [c["seq"] for c in checks]
        assert seqs == list(range(1, r.checks + 1)) and len(seqs) >= 2       # contiguous: none lost or repeated
        assert s.pending_actions("r1") == []
        # every window was counted exactly once: step data in the checks never exceeds what the source produced
        for c in checks:   # (a check whose step's windows were all warm-up has no data at all)
            n = c["variants"]["canary"]["requests"]
            span = 0.0 if c["window_start"] is None else c["window_end"] - c["window_start"]
            assert n == pytest.approx(span * source.rate)
        kinds = [a["kind"] for a in s.actions("r1")]
        assert kinds.count("deploy") == 2 and kinds.count("promote" if scale == 1.0 else "rollback") == 1


def test_commands_persist(tmp_path):
    with Store(str(tmp_path / "c.db")) as s:
        r = s.create(Rollout("r1", "chat", "v2", "v1", Policy()))
        r = s.save(*reconcile(r, None, 0.0))
        r = s.save(*reconcile(r, Observation(0, 1, source(0, 1)), 1.0))
        r = s.save(*reconcile(r, Observation(1, 2, command=Command.PAUSE, command_by="alice"), 2.0))
        assert s.get("r1").phase is Phase.PAUSED and s.get("r1").paused_from is Phase.PROGRESSING
        assert any("paused by alice" in e["message"] for e in s.events("r1"))
