"""Deterministic latency data shared by the control-plane tests (no randomness: exact lognormal quantiles)."""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

from sits.control_plane.analysis import REQUEST_LATENCY, HistogramSnapshot, Policy, VariantData

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
