"""Low-traffic mode through the real worker, state machine and store (in-memory deployer, canned thin traffic,
frozen clock moved per pass, a recording sender instead of HTTP): an inconclusive check starts replay to canary and
baseline only, the budgets hold, the control plane's /metrics counts it, a queued pause stops it before its next
request, and the rollout page's data carry replayed vs live counts."""
import threading

import pytest

from sits.control_plane.adapters.inference.replay import ReplayAnswer
from sits.control_plane.analysis import LowTrafficPolicy, VariantData
from sits.control_plane.rollout import Command, Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.web import create_app
from sits.control_plane.worker.loop import Worker

from tests.control_plane.helpers import latency_policy
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "sits.db"))
    yield s
    s.close()


class RecordingSender:
    def __init__(self):
        self.sent = []
        self.lock = threading.Lock()
        self.arrived = threading.Semaphore(0)

    def model(self, url, timeout):
        return "tiny"

    def send(self, url, route, model, text, max_tokens, stream, timeout):
        with self.lock:
            self.sent.append(url)
        self.arrived.release()
        return ReplayAnswer(True, len(text), len(text))

    def wait(self, n, t):
        """Until n requests arrived, moving the frozen clock `t` on 10 ms whenever the sender waits (its pace)."""
        got = 0
        for _ in range(2000):
            if got == n:
                return
            if self.arrived.acquire(timeout=0.05):
                got += 1
            else:
                t[0] += 0.01
        raise AssertionError(f"{len(self.sent)} requests arrived, {n} expected")


class ThinSource(CannedSource):
    """Canned windows at 1 req/s per variant, half of which the engines report as replayed (what the budgets and
    the page read: measured counts)."""

    def window(self, *a, **kw):
        w = super().window(*a, **kw)
        w.variants.update({role: VariantData(v.histograms, v.requests, v.errors, replayed=v.requests // 2)
                           for role, v in w.variants.items() if role in ("canary", "baseline")})
        return w


def _setup(store, source=CannedSource, **lt):
    policy = latency_policy(steps=(50, 100), check_interval_s=2, warmup_s=0, min_samples=100,
                            low_traffic=LowTrafficPolicy(enabled=True, max_rps=1000.0, **lt))
    ro = start_rollout(store, "chat", "triton-v1.1", "triton-v1", policy, now=0.0, actor="tester")
    t = [0.0]
    sender = RecordingSender()
    w = Worker(store, InMemoryDeployer(), source(rate=1.0), clock=lambda: t[0], owner="w", replay_sender=sender)
    return ro, t, sender, w


def _passes(w, t, n, dt=2.0):
    for _ in range(n):
        t[0] += dt
        w.run_once()


def test_inconclusive_checks_start_replay_to_canary_and_baseline_and_pause_stops_it(store):
    ro, t, sender, w = _setup(store, max_requests_per_step=6)
    try:
        _passes(w, t, 4)
        assert store.get(ro.id).phase is Phase.PROGRESSING and store.get(ro.id).checks >= 1
        rep = w.replay.get(ro.id)
        assert rep is not None and rep.running
        sender.wait(12, t)   # canary and baseline: 6 pairs, the step's budget
        assert sorted(set(sender.sent)) == ["mem://chat/baseline", "mem://chat/canary"]
        assert sender.sent.count("mem://chat/canary") == sender.sent.count("mem://chat/baseline") == 6
        assert rep.plan.sent_step == 6 and rep.plan.left() == 0          # the step's budget is spent
        metrics = {s.labels["variant"]: s.value for m in w.metrics.replayed.collect() for s in m.samples
                   if s.name.endswith("_total")}
        assert metrics == {"canary": 6.0, "baseline": 6.0}
        store.commands.add(ro.id, Command.PAUSE, "otto")                  # the operator pauses
        assert w.halt_pending(ro.id)
        _passes(w, t, 1)
        assert store.get(ro.id).phase is Phase.PAUSED and not rep.running and w.replay.get(ro.id) is None
    finally:
        w.stop()


def test_a_queued_abort_stops_the_sender_between_passes(store):
    ro, t, sender, w = _setup(store)
    try:
        _passes(w, t, 4)
        rep = w.replay.get(ro.id)
        assert rep is not None
        sent = len(sender.sent)
        store.commands.add(ro.id, Command.ABORT, "otto")   # queued; no pass has run since
        t[0] += 5.0                                        # the sender's clock moves: it could send more now
        rep.join(5)
        assert not rep.running and "pause or abort" in rep.stats.stopped
        assert len(sender.sent) <= sent + 2                # at most the pair already taken finishes
    finally:
        w.stop()


def test_rollout_page_data_show_replayed_and_live(store):
    ro, t, sender, w = _setup(store, ThinSource)   # the engines' counts of what was replayed
    try:
        _passes(w, t, 6)
    finally:
        w.stop()
    r = store.get(ro.id)
    assert r.replayed_requests > 0 and 0 < r.data["canary"].replayed < r.data["canary"].requests
    app = create_app({"TESTING": True, "STORE": store, "SECRET_KEY": "x"})
    d = app.test_client().get(f"/api/v1/rollouts/{ro.id}").get_json()
    lt = d["low_traffic"]
    assert lt["enabled"] and lt["replayed_rollout"] == r.replayed_requests
    assert lt["replayed_step"] == r.data["canary"].replayed and lt["live_step"] == r.data["canary"].live
    assert d["variants"]["canary"]["replayed"] == r.data["canary"].replayed
    assert d["last_verdict"]["variants"]["canary"]["replayed"] > 0
    html = app.test_client().get(f"/rollouts/{ro.id}").get_data(as_text=True)
    assert 'id="low-traffic"' in html
