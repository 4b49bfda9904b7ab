"""Deterministic latency data shared by the control-plane tests (no randomness: exact lognormal quantiles)."""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

from sits.control_plane.analysis import REQUEST_LATENCY, HistogramSnapshot, MetricCheck, Policy, VariantData, assess
from sits.control_plane.analysis.sequential import AA_PREFIX, SequenceState, Window, series_key
from sits.control_plane.rollout import Check, Decision
from sits.control_plane.store.codec import check_to_dict

BOUNDS = tuple(0.001 * 1.05 ** k for k in range(200))   # 5 % buckets, 1 ms .. 17 s
_Z = NormalDist()


def lat(n: int, scale: float = 1.0, *, tail_scale: float = 1.0, median: float = 0.05, sigma: float = 0.5,
        bounds: Sequence[float] = BOUNDS) -> HistogramSnapshot:
    """n latencies at the exact lognormal quantiles (i + 0.5) / n, times `scale`; the slowest 5 % optionally
    multiplied by `tail_scale`."""
    vals = []
    for i in range(n):
        p = (i + 0.5) / n
        v = median * math.exp(sigma * _Z.inv_cdf(p)) * scale
        vals.append(v * tail_scale if p > 0.95 else v)
    return HistogramSnapshot.from_values(vals, bounds)


def windows(start: float, end: float, scale: float = 1.0, rate: float = 100.0) -> dict[str, VariantData]:
    """Canary and baseline over [start, end] at `rate` requests/s each (0.5 % errors), the canary's latency scaled."""
    n = max(int(round((end - start) * rate)), 0)
    if n == 0:
        return {"canary": VariantData(), "baseline": VariantData()}
    return {"canary": VariantData({REQUEST_LATENCY: lat(n, scale)}, float(n), n * 0.005),
            "baseline": VariantData({REQUEST_LATENCY: lat(n)}, float(n), n * 0.005)}


def latency_policy(**kw) -> Policy:
    """A Policy without the correctness gate (on by default; it needs engines to replay prompts): for tests of the
    latency analysis driven by canned windows. The gate's own tests: test_rollout_correctness.py and the worker's.
    Statistics "fixed" unless asked: canned windows repeat one histogram, which the sequential method (its own
    tests: test_rollout_sequential.py) sees as a spread of zero."""
    return Policy(correctness={"enabled": False}, **{"statistics": "fixed", **kw})


def sequential_check(scale: float = 1.18, windows: int = 8):
    """A check stored as the worker stores it (check_to_dict) under sequential statistics: one P90 check (limit +25 %,
    ship +12.5 %) on /v1/completions with a canary `scale` times slower, `windows` paired windows of it around
    log(scale) and as many A/A windows (production against baseline). Returns (verdict, the stored dict)."""
    route = REQUEST_LATENCY + '{route="/v1/completions"}'
    policy = Policy(checks=(MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.25),), min_samples=100)
    data = {role: VariantData({route: lat(2000, scale if role == "canary" else 1.0)}, 2000.0, 0.0)
            for role in ("canary", "baseline", "production")}
    key = series_key(policy.checks[0].name, route)
    ws = tuple(Window(math.log(scale) + 0.08 * (-1) ** i, 200, 200, 10.0 * i, 10.0 * i + 10) for i in range(windows))
    aa = tuple(Window(0.01 * (-1) ** i, 200, 2000, 10.0 * i, 10.0 * i + 10) for i in range(windows))
    verdict = assess(data, policy, SequenceState({key: ws, AA_PREFIX + key: aa}))
    return verdict, check_to_dict("r1", Check(4, 100.0, 0, 50, 20.0, 100.0, "scrape", {}, data, verdict,
                                              Decision.HOLD))
