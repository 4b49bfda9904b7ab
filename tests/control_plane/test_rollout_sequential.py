"""The rollout state machine under sequential statistics (the default): noisy seeded windows through reconcile(), a
frozen clock. Decisions are final, an undecided look only waits, one sequence spans the steps, and max_duration_s
does what the policy says."""
import random

import pytest

from sits.control_plane.analysis import REQUEST_LATENCY, HistogramSnapshot, MetricCheck, Policy, VariantData
from sits.control_plane.analysis.sequential import series_key
from sits.control_plane.rollout import Observation, Phase, Rollout, reconcile
from sits.control_plane.rollout.builder import Builder
from sits.control_plane.store.codec import rollout_from_dict, rollout_to_dict
from tests.control_plane.helpers import BOUNDS

P90 = MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.25)
KEY = series_key(P90.name, REQUEST_LATENCY)


def policy(**kw) -> Policy:
    base = dict(steps=(25, 50, 100), checks=(P90,), check_interval_s=10.0, warmup_s=0.0, min_samples=100,
                window_s=10.0, min_windows=6, correctness={"enabled": False})
    return Policy(**{**base, **kw})


class Driver:
    """Every tick: 10 s of traffic, ~200 requests per arm with lognormal latency, the canary's scaled."""

    def __init__(self, p: Policy, scale: float, seed: int = 1):
        self.rng, self.scale, self.t = random.Random(seed), scale, 0.0
        self.r, _ = reconcile(Rollout("r1", "chat", "v2", "v1", p), None, 0.0)
        self.tick(ready_only=True)
        assert self.r.phase is Phase.PROGRESSING

    def _arm(self, scale: float) -> VariantData:
        vals = [0.05 * scale * self.rng.lognormvariate(0, 0.4) for _ in range(200)]
        return VariantData({REQUEST_LATENCY: HistogramSnapshot.from_values(vals, BOUNDS)}, 200.0, 0.0)

    def tick(self, *, ready_only=False) -> Phase:
        self.t += 10.0
        if ready_only:
            obs = {"canary": VariantData(), "baseline": VariantData()}
        else:
            obs = {"canary": self._arm(self.scale), "baseline": self._arm(1.0)}
        self.r, self.actions = reconcile(self.r, Observation(self.t - 10.0, self.t, obs, source="scrape"), self.t)
        return self.r.phase

    def run(self, ticks: int) -> list:
        checks = []
        for _ in range(ticks):
            self.tick()
            checks += self.r.new_checks
            if self.r.phase is not Phase.PROGRESSING:
                break
        return checks


def test_an_equal_canary_waits_for_min_windows_then_walks_the_steps_and_is_promoted():
    d = Driver(policy(), 1.0)
    checks = d.run(60)
    assert d.r.phase is Phase.PROMOTING
    first = checks[0].verdict
    assert first.outcome.value == "inconclusive" and "windows before it may decide" in first.reason
    assert [c.decision.value for c in checks if c.decision.value != "hold"] == ["advance", "promote"]
    # one sequence over the steps: the second step kept the first step's windows
    assert len(d.r.sequence.windows[KEY]) >= 6 and checks[-1].verdict.results[0].windows >= 7


def test_a_slow_canary_is_rolled_back_by_its_first_failed_check():
    d = Driver(policy(failure_limit=5), 1.6)
    checks = d.run(30)
    assert d.r.phase is Phase.ROLLING_BACK
    assert [c.verdict.outcome.value for c in checks][-1] == "fail"
    assert sum(c.verdict.outcome.value == "fail" for c in checks) == 1       # final: no failure count
    assert "lower bound above ship +12.5 %" in d.r.reason and d.r.reason.startswith(f"check {checks[-1].seq}:")


@pytest.mark.parametrize("then,phase", [("rollback", Phase.ROLLING_BACK), ("pause", Phase.PAUSED),
                                        ("hold", Phase.PROGRESSING)])
def test_undecided_looks_only_wait_and_max_duration_does_what_the_policy_says(then, phase):
    """A canary in the gap between the boundaries (+18 %: ship +12.5 %, limit +25 %) with too little time to
    decide: no inconclusive_limit applies, the deadline does."""
    d = Driver(policy(max_duration_s=75.0, on_max_duration=then, inconclusive_limit=2, on_inconclusive="rollback"),
               1.18, seed=5)
    checks = d.run(9)
    assert d.r.phase is phase, d.r.reason
    assert all(c.verdict.outcome.value == "inconclusive" for c in checks)
    if then == "hold":
        assert d.r.deadline_hit and d.r.checks == len(checks)      # still checking past the deadline
    else:
        assert d.r.reason.startswith("max duration 75 s reached undecided (inconclusive (")


def test_a_weight_change_drops_the_open_window_and_keeps_the_closed_ones():
    d = Driver(policy(window_s=25.0), 1.0)
    for _ in range(4):
        d.tick()
    closed, opened = d.r.sequence.windows.get(KEY, ()), d.r.sequence.pending
    assert closed and opened
    b = Builder(d.r, d.t + 1)
    b.start_step(1, "test")
    r, _ = b.done()
    assert r.sequence.windows == d.r.sequence.windows and not r.sequence.pending


def test_the_sequence_survives_the_store_codec():
    d = Driver(policy(), 1.0)
    for _ in range(5):
        d.tick()
    back = rollout_from_dict(rollout_to_dict(d.r))
    assert back.sequence == d.r.sequence and back.sequence.windows[KEY]
