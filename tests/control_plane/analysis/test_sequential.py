"""Sequential statistics (control_plane/analysis/sequential.py): the confidence sequence's closed form against the
normal-mixture martingale it comes from, its coverage under optional stopping, batch means on correlated windows, the
window bookkeeping, and decisions with two boundaries."""
import math
import random

import pytest

from sits.control_plane.analysis import (ERROR_RATE, REQUEST_LATENCY, MetricCheck, Outcome, Policy, PolicyError,
                                         VariantData, assess)
from sits.control_plane.analysis.sequential import (AA_PREFIX, SequenceState, Window, blocks_to_decide, estimate, jumps,
                                                    observe, series_key, std_margin, student_factor, tuned_r)
from tests.control_plane.helpers import lat

P90 = MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.25)
KEY = series_key(P90.name, REQUEST_LATENCY)


def _mixture(s: float, t: float, r: float) -> float:
    """Robbins' normal mixture of exp(l s - l^2 t / 2) over l ~ N(0, r), by numerical integration (no closed form)."""
    sd = math.sqrt(r)
    n, lo, hi = 4000, -12 * sd, 12 * sd
    h = (hi - lo) / n
    total = 0.0
    for i in range(n + 1):
        lam = lo + i * h
        w = 1 if i in (0, n) else (4 if i % 2 else 2)
        total += w * math.exp(lam * s - lam * lam * t / 2) * math.exp(-lam * lam / (2 * r)) / (sd * math.sqrt(2 * math.pi))
    return total * h / 3


@pytest.mark.parametrize("t,alpha", [(5, 0.05), (20, 0.05), (200, 0.01), (50, 0.2)])
def test_the_closed_form_is_where_the_mixture_martingale_reaches_one_over_alpha(t, alpha):
    r = tuned_r(alpha)
    lo, hi = 0.0, 50.0 * math.sqrt(t)
    for _ in range(80):   # the sum s at which the mixture crosses 1/alpha (Ville's inequality: P(ever) <= alpha)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _mixture(mid, t, r) < 1 / alpha else (lo, mid)
    assert std_margin(t, r, alpha) == pytest.approx(lo / t, rel=1e-4)


def test_the_sequence_covers_the_mean_at_every_look_on_independent_windows():
    """Looked at after every window, up to 150 of them: it must exclude the true mean in at most ~alpha of the runs
    (a fixed-sample interval looked at this often fails far more: shown alongside)."""
    rng = random.Random(7)
    alpha, runs, missed, naive = 0.1, 400, 0, 0
    for _ in range(runs):
        xs, miss, nmiss = [], False, False
        for i in range(150):
            xs.append(rng.gauss(0.3, 0.2))
            if i + 1 >= 8:
                e = estimate(xs, alpha, 8)
                miss = miss or not e.lower <= 0.3 <= e.upper
                m = sum(xs) / len(xs)
                sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
                nmiss = nmiss or abs(m - 0.3) > 1.645 * sd / math.sqrt(len(xs))
        missed += miss
        naive += nmiss
    assert missed / runs <= alpha
    assert naive / runs > 3 * alpha


def test_correlated_windows_are_averaged_into_blocks_and_widen_the_bounds():
    rng = random.Random(3)
    xs, v = [], 0.0
    for _ in range(64):
        v = 0.95 * v + rng.gauss(0, 0.05)     # windows that drift together
        xs.append(v + rng.gauss(0, 0.01))
    e = estimate(xs, 0.05, 6)
    assert e.block >= 2 and e.lag1 == e.lag1
    iid = estimate(sorted(xs, key=lambda _: rng.random()), 0.05, 6)
    assert e.upper - e.lower > 1.5 * (iid.upper - iid.lower)


def test_bounds_need_min_windows_and_an_early_look_is_wider():
    assert math.isnan(estimate([0.1, 0.2, 0.1], 0.05, 6).lower)
    assert student_factor(3, 0.05) > student_factor(30, 0.05) > 1.0


def test_the_time_to_decide_is_finite_and_shrinks_with_the_gap():
    xs = [0.05 + 0.1 * math.sin(i) for i in range(10)]
    e = estimate(xs, 0.05, 6)
    near = blocks_to_decide(e, math.log1p(0.04), math.log1p(0.06), 0.05)
    far = blocks_to_decide(e, math.log1p(0.02), math.log1p(0.30), 0.05)
    assert near is not None and far is not None and near > far >= 0


def _variants(n: int, scale: float = 1.0, prod_scale: float | None = None, errors=(0.0, 0.0)):
    v = {"canary": VariantData({REQUEST_LATENCY: lat(n, scale)}, float(n), errors[0]),
         "baseline": VariantData({REQUEST_LATENCY: lat(n)}, float(n), errors[1])}
    if prod_scale is not None:
        v["production"] = VariantData({REQUEST_LATENCY: lat(10 * n, prod_scale)}, 10.0 * n, 0.0)
    return v


def test_windows_close_when_both_arms_have_enough_and_the_span_is_long_enough():
    p = Policy(checks=(P90,), window_requests=50, window_tail_samples=2, window_s=10.0)
    s = observe(SequenceState(), _variants(30), p, 0.0, 5.0)
    assert KEY not in s.windows and s.pending[KEY].canary.total == 30
    s = observe(s, _variants(30), p, 5.0, 9.0)        # 60 each, but only 9 s long
    assert KEY not in s.windows
    s = observe(s, _variants(30, 1.2), p, 9.0, 12.0)
    (w,) = s.windows[KEY]
    assert (w.start, w.end, w.n_canary) == (0.0, 12.0, 90.0) and 0 < w.x < math.log(1.2)
    assert KEY not in s.pending
    assert s.without_pending() is s
    assert SequenceState.from_dict(s.to_dict()) == s


def test_production_against_baseline_is_a_live_a_a():
    p = Policy(checks=(P90,), window_s=0.0)
    s = observe(SequenceState(), _variants(400, 1.0, prod_scale=1.1), p, 0.0, 10.0)
    (w,) = s.windows[AA_PREFIX + KEY]
    assert w.x == pytest.approx(math.log(1.1), abs=0.03)


def _sequence(xs, n=400) -> SequenceState:
    return SequenceState({KEY: tuple(Window(x, n, n, 10.0 * i, 10.0 * (i + 1)) for i, x in enumerate(xs))})


def test_two_boundaries_fail_above_ship_and_pass_below_limit():
    p = Policy(checks=(P90,), min_samples=100, min_windows=6)
    data = _variants(400)
    slow = assess(data, p, _sequence([math.log(1.4) + 0.01 * (-1) ** i for i in range(8)]))
    assert slow.outcome is Outcome.FAIL and "lower bound above ship +12.5 %" in slow.reason
    r = slow.results[0]
    assert r.method == "sequential" and r.ship == 0.125 and r.threshold == 0.25 and r.windows == 8
    assert r.ci_low > 0.125 and r.delta_rel == pytest.approx(0.4, abs=0.01)
    same = assess(data, p, _sequence([0.01 * (-1) ** i for i in range(8)]))
    assert same.outcome is Outcome.PASS and "upper bound below limit +25.0 %" in same.results[0].reason
    early = assess(data, p, _sequence([0.0] * 3))
    assert early.outcome is Outcome.INCONCLUSIVE and "3 of 6 windows" in early.reason
    between = assess(data, p, _sequence([math.log(1.18) + 0.06 * (-1) ** i for i in range(8)]))
    r = between.results[0]
    assert between.outcome is Outcome.INCONCLUSIVE and r.eta_s > 0 and r.need_more > 0
    assert "between the boundaries (ship +12.5 %, limit +25.0 %)" in between.reason
    d = r.to_dict()
    assert {"ship", "windows", "block", "lag1", "eta_s", "alpha"} <= set(d) and d["method"] == "sequential"


def test_an_undecided_latency_check_says_when_a_few_windows_jump_between_two_modes():
    # triton-v1.8's GPU canary (bench/tail_cliff.py): ITL P99 log ratios; 3 of 26 windows a factor 2 or more from the
    # median one (the fourth outlier, -0.65, lies a factor 1.99 below it)
    p99 = [1.54, 0.08, -0.02, 1.08, 0.05, 0.01, -0.32, -0.26, -0.65, 0.08, 0.18, -0.12, 0.15, 1.42, -0.04, -0.03,
           0.01, -0.07, 0.03, 0.15, 0.06, -0.06, -0.07, 0.08, 0.20, 0.12]
    assert jumps(p99) == 3 and jumps([0.3, -0.3, 0.2] * 8) == 0 and jumps([5.0, 0.0]) == 0
    p = Policy(checks=(MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.5),), min_samples=100,
               min_windows=8)
    key = series_key(p.checks[0].name, REQUEST_LATENCY)
    seq = SequenceState({key: tuple(Window(x, 6000, 6000, 6.0 * i, 6.0 * (i + 1)) for i, x in enumerate(p99))})
    v = assess(_variants(400), p, seq)
    assert v.outcome is Outcome.INCONCLUSIVE
    assert "; 3 of 26 windows lie 2x or more from the typical one: the p99 may sit between two modes" in v.reason
    # the same count as evidence, for the UI's verdict table ("3 of 26 windows jump 2x: two modes?")
    from sits.control_plane.view.check import decode_result
    assert v.results[0].jumps == 3 and decode_result(v.results[0].to_dict()).jumps == 3
    # a check whose windows all scatter widely, or that has decided, says nothing of the kind
    wide = SequenceState({key: tuple(Window(x, 6000, 6000, 6.0 * i, 6.0 * (i + 1))
                                     for i, x in enumerate([0.9, -0.9] * 6))})
    assert "two modes" not in assess(_variants(400), p, wide).reason
    calm = SequenceState({key: tuple(Window(0.01 * (-1) ** i, 6000, 6000, 6.0 * i, 6.0 * (i + 1)) for i in range(26))})
    assert "two modes" not in assess(_variants(400), p, calm).reason


def test_a_pass_needs_the_step_minimum_a_fail_does_not():
    p = Policy(checks=(P90,), min_samples=1000, min_windows=6)
    thin = _variants(400)
    assert assess(thin, p, _sequence([0.0] * 8)).outcome is Outcome.INCONCLUSIVE
    assert assess(thin, p, _sequence([math.log(2.0)] * 8)).outcome is Outcome.FAIL


def test_the_error_rate_uses_windows_of_points():
    p = Policy(checks=(MetricCheck(ERROR_RATE, max_abs_delta=0.02),), min_windows=6, min_error_samples=100)
    key = series_key(ERROR_RATE, ERROR_RATE)
    bad = SequenceState({key: tuple(Window(0.05 + 0.005 * (-1) ** i, 400, 400, i, i + 1) for i in range(8))})
    v = assess(_variants(400, errors=(20.0, 0.0)), p, bad)
    assert v.outcome is Outcome.FAIL and "error rate +5.00 pt" in v.reason
    ok = SequenceState({key: tuple(Window(0.0, 400, 400, i, i + 1) for i in range(8))})
    assert assess(_variants(400), p, ok).outcome is Outcome.PASS


@pytest.mark.parametrize("field,value,msg", [
    ("statistics", "bayes", "must be 'sequential' or 'fixed'"), ("on_max_duration", "promote", "'hold'"),
    ("alpha", 0.9, "from 0.0001 to 0.5"), ("min_windows", 1, "integer from 2"), ("window_s", -1, "seconds")])
def test_bad_sequential_fields_are_policy_errors(field, value, msg):
    with pytest.raises(PolicyError, match=msg):
        Policy.from_dict({field: value})


def test_ship_must_be_below_the_limit():
    with pytest.raises(PolicyError, match="ship_rel_delta"):
        Policy.from_dict({"checks": [{"metric": REQUEST_LATENCY, "quantile": 0.9, "max_rel_delta": 0.1,
                                      "ship_rel_delta": 0.1}]})
    c = Policy.from_dict({"checks": [{"metric": ERROR_RATE, "max_abs_delta": 0.02, "ship_abs_delta": 0.005}]}).checks[0]
    assert (c.ship, c.limit) == (0.005, 0.02)
    assert P90.ship == 0.125
    assert Policy.from_dict(Policy(checks=(c,)).to_dict()) == Policy(checks=(c,))


def test_calibration_suggests_a_ship_boundary_that_clears_the_replica_offset():
    from sits.control_plane.analysis.calibration import calibrate
    p = Policy(checks=(P90,), min_windows=6)
    offset = [math.log(1.06) + 0.02 * (-1) ** i for i in range(20)]
    state = SequenceState({KEY: tuple(Window(x, 200, 200, i, i + 1) for i, x in enumerate(offset)),
                           AA_PREFIX + KEY: tuple(Window(0.0, 200, 2000, i, i + 1) for i in range(3))})
    aa = calibrate(state, p, aa=True)
    (seq, live) = sorted(aa, key=lambda c: c.source)
    assert seq.source.startswith("canary vs baseline") and seq.delta == pytest.approx(0.06, abs=0.002)
    assert seq.suggested_ship >= max(abs(seq.ci_low), abs(seq.ci_high)) and seq.suggested_ship < P90.limit
    assert round(seq.suggested_ship / 0.025, 6) == int(round(seq.suggested_ship / 0.025))
    assert live.suggested_ship is None and live.windows == 3        # too few windows yet
    assert [c.source for c in calibrate(state, p, aa=False)] == ["production vs baseline (live A/A)"]


def test_bounds_never_widen_again_a_cleared_boundary_stays_cleared():
    """The running intersection: after a quiet stretch the sequence passed; a noisy window widens a fresh estimate,
    but the intersection of every look's bounds is still a valid sequence and keeps the pass."""
    p = Policy(checks=(P90,), min_samples=100, min_windows=6, window_s=0.0, window_requests=1, window_tail_samples=1)
    s, t = SequenceState(), 0.0
    for i in range(12):
        s = observe(s, _variants(400, 1.0 + 0.01 * (-1) ** i), p, t, t + 10)
        t += 10
    quiet = s.running[KEY]
    assert assess(_variants(400), p, s).outcome is Outcome.PASS
    s = observe(s, _variants(400, 1.6), p, t, t + 10)          # one wild window: the fresh estimate widens
    fresh = estimate([w.x for w in s.windows[KEY]], p.alpha, p.min_windows)
    assert fresh.upper - fresh.lower > quiet[1] - quiet[0]
    assert s.running[KEY][1] <= quiet[1] and assess(_variants(400), p, s).outcome is Outcome.PASS
    assert SequenceState.from_dict(s.to_dict()) == s
