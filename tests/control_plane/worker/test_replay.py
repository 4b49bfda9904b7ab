"""Low-traffic replay (control_plane/worker/replay.py, workload.py): the budgets and the rate under an injected clock,
the sender thread stopping at once on a queued pause/abort, the Replayer started/fed/stopped by the rollout's
state, and requests drawn from the live workload."""
import random
import threading

import pytest

from sits.control_plane.adapters.inference.replay import ReplayAnswer
from sits.control_plane.analysis import (GENERATION_TOKENS, PROMPT_TOKENS, REQUEST_LATENCY, HistogramSnapshot,
                                    LowTrafficPolicy, Outcome, Policy, VariantData, Verdict)
from sits.control_plane.analysis import TestResult as Result
from sits.control_plane.rollout import Check, Decision, Phase, Rollout
from sits.control_plane.worker.replay import ReplayPlan, Replayer, RolloutReplay, requests_wanted
from sits.control_plane.worker.workload import Workload, prompt


def _plan(**kw) -> ReplayPlan:
    return ReplayPlan(LowTrafficPolicy(enabled=True, **{"max_rps": 2.0, **kw}))


def _drain(plan: ReplayPlan, now: float) -> int:
    """Send (and finish at once) all that is owed, the clock following the pace; returns how many went."""
    n = 0
    while (wait := plan.take(now)) is not None:
        if wait > 0:
            now += wait
            continue
        n += 1
        plan.finished(now)
    return n


def test_rate_spaces_requests_by_one_over_max_rps():
    plan = _plan(max_rps=2.0)
    plan.demand(5, step=0, as_of=0.0)
    assert plan.take(10.0) == 0.0
    plan.finished(10.0)
    assert plan.take(10.0) == pytest.approx(0.5)     # next one at 10.5
    assert plan.take(10.4) == pytest.approx(0.1)
    assert plan.take(10.5) == 0.0
    plan.finished(10.5)
    # a quiet spell does not bank credit: after a pause the pace is still one per 0.5 s
    assert plan.take(100.0) == 0.0
    plan.finished(100.0)
    assert plan.take(100.0) == pytest.approx(0.5)


def test_concurrency_caps_requests_in_flight():
    plan = _plan(max_rps=1000.0, concurrency=3)
    plan.demand(10, step=0, as_of=0.0)
    sent = [plan.take(t / 1000) for t in range(1, 6)]
    assert sent[:3] == [0.0, 0.0, 0.0] and sent[3] is None and plan.in_flight == 3
    plan.finished(0.01)
    assert plan.take(0.02) == 0.0


def test_step_and_rollout_budgets():
    plan = _plan(max_rps=1000.0, max_requests_per_step=40, max_requests_per_rollout=100)
    assert plan.demand(500, step=0, as_of=0.0) == 40           # capped by the step's budget
    assert _drain(plan, 1.0) == 40
    assert plan.demand(500, step=0, as_of=1.0) == 0             # the step's budget is spent
    assert plan.take(2.0) is None
    assert plan.demand(500, step=1, as_of=2.0) == 40           # a new step: its own budget
    assert _drain(plan, 3.0) == 40
    assert plan.demand(500, step=2, as_of=3.0) == 20           # the rollout's budget leaves 20
    assert _drain(plan, 4.0) == 20
    assert plan.sent_total == 100 and plan.left() == 0
    # budgets resume from what a restarted worker measured
    again = _plan(max_rps=1000.0, max_requests_per_step=40, max_requests_per_rollout=100)
    again = ReplayPlan(again.policy, sent_total=90, step=2, sent_step=35)
    assert again.demand(500, step=2, as_of=0.0) == 5


def test_demand_counts_what_the_check_did_not_see_yet():
    plan = _plan(max_rps=1000.0)
    plan.demand(10, step=0, as_of=0.0)
    for t in (1.0, 2.0, 3.0):                   # three finish at 1, 2, 3
        assert plan.take(t) == 0.0
        plan.finished(t)
    assert plan.take(3.5) == 0.0                # one in flight
    # a check whose window ended at 1.5 saw one of them; 2, 3 and the one in flight are still to come
    assert plan.demand(10, step=0, as_of=1.5) == 7
    assert plan.demand(2, step=0, as_of=1.5) == 0


def test_requests_wanted():
    inc = Result("m:p99", "m", Outcome.INCONCLUSIVE, "few", 0.5, need_more=400)
    fail = Result("m:p90", "m", Outcome.FAIL, "slow", 0.25)
    assert requests_wanted(Verdict(Outcome.INCONCLUSIVE, "", "baseline", (inc,), need_more=400)) == 400
    # a failed check being confirmed: its inconclusive metrics still get their data
    assert requests_wanted(Verdict(Outcome.FAIL, "", "baseline", (fail, inc))) == 400
    assert requests_wanted(Verdict(Outcome.FAIL, "", "baseline", (fail, inc), guard="crashing")) is None
    assert requests_wanted(Verdict(Outcome.PASS, "", "baseline", ())) is None
    assert requests_wanted(Verdict(Outcome.INCONCLUSIVE, "replay only", "baseline", ())) is None


class FakeSender:
    """Records every request; `gate` (when set) holds each answer until released."""

    def __init__(self, gate: threading.Event | None = None):
        self.sent: list[tuple[str, str, int, bool, int]] = []
        self.lock = threading.Lock()
        self.gate = gate
        self.arrived = threading.Semaphore(0)

    def model(self, url, timeout):
        return "tiny"

    def send(self, url, route, model, text, max_tokens, stream, timeout):
        with self.lock:
            self.sent.append((url, route, max_tokens, stream, len(text)))
        self.arrived.release()
        if self.gate is not None:
            self.gate.wait(10)
        return ReplayAnswer(True, prompt_tokens=len(text), prompt_chars=len(text))


class Clock:
    """A clock that moves 10 ms per reading: the sender thread's pacing always lets the next pair go (max_rps 1000),
    and nothing depends on real time passing."""

    def __init__(self):
        self.t = 1000.0
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.t += 0.01
            return self.t


def _replay(sender, clock, halted=lambda: False, **lt):
    policy = LowTrafficPolicy(enabled=True, **{"max_rps": 1000.0, **lt})
    return RolloutReplay("r1", "svc", policy, {"canary": "http://c", "baseline": "http://b"}, "tiny",
                         ["hello world"], sender, clock=clock, halted=halted, seed=1)


def _wait_for(sender, n):
    for _ in range(n):
        assert sender.arrived.acquire(timeout=10), f"only {len(sender.sent)} requests arrived"


def test_sender_sends_pairs_to_canary_and_baseline_only():
    sender = FakeSender()
    rep = _replay(sender, Clock()).start()
    try:
        rep.demand(5, step=0, as_of=None)
        _wait_for(sender, 10)
    finally:
        rep.stop("test")
        rep.join(5)
    urls = [s[0] for s in sender.sent]
    assert sorted(urls) == ["http://b"] * 5 + ["http://c"] * 5
    assert rep.stats.sent == 5 and rep.plan.sent_total == 5


def test_a_queued_pause_or_abort_stops_the_sender_before_its_next_request():
    gate = threading.Event()
    sender = FakeSender(gate)
    halt = threading.Event()
    rep = _replay(sender, Clock(), halted=halt.is_set, concurrency=1).start()
    try:
        rep.demand(50, step=0, as_of=None)
        _wait_for(sender, 2)                 # the first pair is in flight, held by the gate
        halt.set()                           # a pause is queued meanwhile
        gate.set()                           # the pair in flight finishes
        rep.join(5)
        assert not rep.running and "pause or abort" in rep.stats.stopped
    finally:
        rep.stop("test")
        gate.set()
    assert len(sender.sent) == 2 and rep.stats.sent == 1     # not one request after the halt
    assert rep.plan.sent_total == 1 and rep.plan.in_flight == 0


def _rollout(phase=Phase.PROGRESSING, verdict=None, enabled=True, step=0):
    p = Policy(low_traffic=LowTrafficPolicy(enabled=enabled, max_rps=1000.0))
    checks = ()
    if verdict is not None:
        checks = (Check(1, 10.0, step, 50, 0.0, 9.0, "scrape", {}, {}, verdict, Decision.HOLD),)
    return Rollout("r1", "svc", "slow", "torch", policy=p, phase=phase, step=step, new_checks=checks)


def test_replayer_follows_the_rollout():
    sender = FakeSender()
    asked = []
    rp = Replayer(sender, clock=Clock(), load_prompts=lambda ps: ["p"], halted=lambda rid: False,
                  counted=lambda service, variant: asked.append(variant))

    def urls():
        asked.append("endpoints")
        return {"canary": "http://c", "baseline": "http://b", "production": "http://p"}

    inconclusive = Verdict(Outcome.INCONCLUSIVE, "", "baseline", need_more=3)
    try:
        assert rp.after_pass(_rollout(verdict=inconclusive, enabled=False), urls) is None
        assert rp.after_pass(_rollout(), urls) is None           # no check in this pass: nothing starts
        rep = rp.after_pass(_rollout(verdict=inconclusive), urls)
        assert rep is not None and rep.running
        _wait_for(sender, 6)
        assert "http://p" not in {s[0] for s in sender.sent}   # never production
        assert asked.count("endpoints") == 1 and asked.count("canary") == 3 and asked.count("baseline") == 3
        assert rp.after_pass(_rollout(verdict=inconclusive), urls) is rep   # fed, not restarted
        assert asked.count("endpoints") == 1
        rp.after_pass(_rollout(phase=Phase.PAUSED), urls)       # paused: stopped at once
        assert not rep.running and rp.get("r1") is None
    finally:
        rp.close()


def _hist(values, bounds):
    return HistogramSnapshot.from_values(values, bounds)


def test_workload_is_drawn_from_the_live_token_histograms_and_stream_share():
    bounds = [1, 2, 4, 8, 16, 32, 64, 128]
    live = VariantData({PROMPT_TOKENS: _hist([40] * 90 + [100] * 10, bounds),
                        GENERATION_TOKENS: _hist([3] * 100, bounds),
                        REQUEST_LATENCY + '{route="/v1/chat/completions"}': _hist([0.1] * 30, [0.5]),
                        REQUEST_LATENCY + '{route="/v1/completions"}': _hist([0.1] * 70, [0.5])},
                       requests=100, replayed=0, streamed=25)
    w = Workload.from_data({"baseline": live})
    assert w.known and w.stream_share == 0.25
    assert dict(w.routes) == pytest.approx({"/v1/chat/completions": 0.3, "/v1/completions": 0.7})
    rng = random.Random(7)
    draws = [w.sample(rng) for _ in range(4000)]
    prompts = [d.prompt_tokens for d in draws]
    assert all(33 <= p <= 64 or 65 <= p <= 128 for p in prompts)
    assert sum(p > 64 for p in prompts) / len(prompts) == pytest.approx(0.10, abs=0.02)
    assert all(3 <= d.max_tokens <= 4 for d in draws)          # the (2, 4] bucket
    assert sum(d.stream for d in draws) / len(draws) == pytest.approx(0.25, abs=0.03)
    assert sum(d.route == "/v1/completions" for d in draws) / len(draws) == pytest.approx(0.7, abs=0.03)


def test_workload_without_live_data_and_prompt_length():
    w = Workload.from_data({"canary": VariantData()})
    assert not w.known and w.routes == (("/v1/completions", 1.0),)
    d = w.sample(random.Random(1), default_max_tokens=9)
    assert d.max_tokens == 9 and d.prompt_tokens == 0 and not d.stream
    rng = random.Random(3)
    assert prompt(["abc", "defgh"], 0, 1.0, rng) in ("abc", "defgh")
    assert len(prompt(["abc", "defgh"], 50, 1.0, rng)) == 50
    assert len(prompt(["abc", "defgh"], 50, 4.0, rng)) == 200     # 4 characters per token (a BPE model)
