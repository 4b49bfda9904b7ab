"""`histogram_quantile` with exactly the semantics of Prometheus 2.42 (promql/quantile.go, `bucketQuantile`).

Linear interpolation inside the bucket holding rank q * total; a natural lower bound of 0 for the lowest bucket when
its upper bound is > 0 (else that upper bound is returned); a rank in the +Inf bucket returns the second-highest upper
bound. Buckets are sorted, equal upper bounds are summed, and decreasing cumulative counts are raised to the running
maximum (Prometheus' "envelope" fix for non-monotonic data). Special cases, in this order: q NaN -> NaN, q < 0 -> -Inf,
q > 1 -> +Inf, no buckets or highest bound not +Inf -> NaN, fewer than 2 buckets -> NaN, zero observations -> NaN.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from operator import le
from typing import Iterable, Sequence

NAN = float("nan")
INF = float("inf")


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """q-quantile of `buckets`, a sequence of (upper_bound, cumulative_count) pairs (any order) ending at +Inf."""
    q = float(q)
    if math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    pairs = sorted(((float(le), float(c)) for le, c in buckets), key=lambda p: p[0])
    if not pairs or pairs[-1][0] != INF:
        return NAN
    bounds: list[float] = []
    counts: list[float] = []
    for le, c in pairs:  # coalesce equal upper bounds
        if bounds and bounds[-1] == le:
            counts[-1] += c
        else:
            bounds.append(le)
            counts.append(c)
    if len(bounds) < 2:
        return NAN
    return quantile_sorted(q, bounds, counts)


def quantile_sorted(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """The same, for 0 <= q <= 1 and strictly ascending `bounds` (>= 2, last +Inf): skips sorting and coalescing."""
    counts = monotonic(counts)
    return _quantile_monotonic(q, bounds, counts, _no_nan(counts))


def monotonic(counts: Sequence[float]) -> Sequence[float]:
    """Prometheus' ensureMonotonic: decreasing cumulative counts are raised to the running maximum."""
    if all(map(le, counts, counts[1:])):  # the common case, at C speed
        return counts
    counts = list(counts)
    running = counts[0]
    for i in range(1, len(counts)):
        if counts[i] > running:
            running = counts[i]
        elif counts[i] < running:
            counts[i] = running
    return counts


def quantiles_sorted(qs: Sequence[float], bounds: Sequence[float], counts: Sequence[float]) -> list[float]:
    """Several quantiles (each 0 <= q <= 1) of one sorted layout, making the counts monotonic once."""
    counts = monotonic(counts)
    no_nan = _no_nan(counts)
    return [_quantile_monotonic(q, bounds, counts, no_nan) for q in qs]


def _no_nan(counts: Sequence[float]) -> bool:
    total = sum(counts)
    return total == total  # an inf - inf NaN only sends us down the literal search, which is also right


def _quantile_monotonic(q: float, bounds: Sequence[float], counts: Sequence[float], no_nan: bool) -> float:
    observations = counts[-1]
    if observations == 0:
        return NAN
    rank = q * observations
    b = bisect_left(counts, rank, 0, len(counts) - 1) if no_nan else _search(counts, rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * _div(rank, count)


def _search(counts: list[float], rank: float) -> int:
    """Go's sort.Search(len(counts)-1, counts[i] >= rank), replayed literally: NaN counts break bisect's order."""
    lo, hi = 0, len(counts) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if not counts[mid] >= rank:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _div(a: float, b: float) -> float:
    """IEEE-754 division as Go does it (x/0 -> +-Inf, 0/0 -> NaN) instead of Python's ZeroDivisionError."""
    if b != 0:
        return a / b
    if a == 0 or math.isnan(a):
        return NAN
    return math.copysign(INF, a) * math.copysign(1.0, b)
