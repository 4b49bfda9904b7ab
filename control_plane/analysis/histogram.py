"""Snapshots of one Prometheus histogram (cumulative `_bucket{le}` counts, `_sum`, `_count`), window deltas, merging."""
from __future__ import annotations

import math
from bisect import bisect_left
from operator import add
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .quantile import histogram_quantile, quantile_sorted, quantiles_sorted

INF = float("inf")


class HistogramError(ValueError):
    """Malformed histogram data (bucket layout, lengths), or two snapshots whose layouts differ."""


@dataclass(slots=True, frozen=True)
class HistogramSnapshot:
    """bounds: ascending upper bounds ending at +Inf; counts: cumulative count per bound (same length).

    A snapshot is either cumulative (as scraped) or a window delta (`newer.delta(older)`); both have this shape.
    """
    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0
    count: float | None = None  # the `_count` series; defaults to the +Inf bucket

    def __post_init__(self) -> None:
        bounds = _layout(tuple(map(float, self.bounds)))
        counts = tuple(map(float, self.counts))
        if len(counts) != len(bounds):
            raise HistogramError(f"{len(bounds)} bounds but {len(counts)} counts")
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "sum", float(self.sum))
        object.__setattr__(self, "count", counts[-1] if self.count is None else float(self.count))

    @classmethod
    def _trusted(cls, bounds: tuple[float, ...], counts: tuple[float, ...], sum: float,
                 count: float) -> "HistogramSnapshot":
        """Build from an already validated layout (merge/delta hot path: skips __post_init__)."""
        snap = object.__new__(cls)
        for name, v in (("bounds", bounds), ("counts", counts), ("sum", sum), ("count", count)):
            object.__setattr__(snap, name, v)
        return snap

    @classmethod
    def from_buckets(cls, buckets: Iterable[tuple[float, float]], sum: float = 0.0,
                     count: float | None = None) -> "HistogramSnapshot":
        """From (le, cumulative_count) pairs in any order; duplicate `le` (e.g. two replicas) are summed."""
        merged: dict[float, float] = {}
        for le, c in buckets:
            le = float(le)
            merged[le] = merged.get(le, 0.0) + float(c)
        bounds = tuple(sorted(merged))
        return cls(bounds, tuple(merged[b] for b in bounds), sum, count)

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> "HistogramSnapshot":
        bounds = tuple(float(b) for b in bounds)
        if not bounds or bounds[-1] != INF:
            bounds = bounds + (INF,)
        return cls(bounds, (0.0,) * len(bounds), 0.0, 0.0)

    @classmethod
    def from_values(cls, values: Iterable[float], bounds: Sequence[float]) -> "HistogramSnapshot":
        """Observe `values` into buckets with these finite upper bounds (+Inf added), as a Prometheus client does."""
        snap = cls.empty(bounds)
        per = [0] * len(snap.bounds)
        total = 0.0
        for v in values:
            per[bisect_left(snap.bounds, v)] += 1  # bucket le >= v
            total += v
        cum, acc = [], 0
        for c in per:
            acc += c
            cum.append(float(acc))
        return cls(snap.bounds, tuple(cum), total, float(acc))

    @property
    def total(self) -> float:
        """Observations in the +Inf bucket (the sample size the analysis uses)."""
        return self.counts[-1]

    def buckets(self) -> list[tuple[float, float]]:
        """(upper_bound, cumulative_count) pairs, the input of `histogram_quantile`."""
        return list(zip(self.bounds, self.counts))

    def per_bucket(self) -> tuple[float, ...]:
        """Non-cumulative counts per bucket."""
        return tuple(c - p for c, p in zip(self.counts, (0.0,) + self.counts[:-1]))

    def quantile(self, q: float) -> float:
        """histogram_quantile(q, self.buckets()), without re-sorting the already ordered layout."""
        if len(self.bounds) >= 2 and 0.0 <= q <= 1.0:
            return quantile_sorted(q, self.bounds, self.counts)
        return histogram_quantile(q, self.buckets())

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """quantile(q) for each q in `qs`, sharing the monotonicity pass."""
        if len(self.bounds) >= 2 and qs and min(qs) >= 0.0 and max(qs) <= 1.0:
            return quantiles_sorted(qs, self.bounds, self.counts)
        return [self.quantile(q) for q in qs]

    def _check_layout(self, other: "HistogramSnapshot") -> None:
        if other.bounds is not self.bounds and other.bounds != self.bounds:
            raise HistogramError(f"bucket layouts differ ({len(self.bounds)} vs {len(other.bounds)} bounds, or "
                                 "different upper bounds)")

    def delta(self, older: "HistogramSnapshot") -> "HistogramSnapshot":
        """The window between `older` and this snapshot. Each series (every bucket, sum, count) is a counter: if
        it went down, the target restarted and its current value is the increase since the reset - what
        Prometheus' rate()/increase() does between two samples."""
        self._check_layout(older)

        def inc(new: float, old: float) -> float:
            return new - old if new >= old else new

        return HistogramSnapshot._trusted(self.bounds, tuple(map(inc, self.counts, older.counts)),
                                          inc(self.sum, older.sum), inc(self.count, older.count))

    def merge(self, other: "HistogramSnapshot") -> "HistogramSnapshot":
        """Sum of two snapshots with the same layout (replicas of one variant, or consecutive windows)."""
        self._check_layout(other)
        return HistogramSnapshot._trusted(self.bounds, tuple(map(add, self.counts, other.counts)),
                                          self.sum + other.sum, self.count + other.count)

    def scaled(self, factor: float) -> "HistogramSnapshot":
        return HistogramSnapshot(self.bounds, tuple(c * factor for c in self.counts), self.sum * factor,
                                 self.count * factor)

    def has_nan(self) -> bool:
        total = sum(self.counts) + self.sum + self.count
        return total != total and (any(math.isnan(c) for c in self.counts) or math.isnan(self.sum)
                                   or math.isnan(self.count))

    def to_dict(self) -> dict:
        # x - x == 0 only for finite x: the common case skips _num
        return {"bounds": [b if b - b == 0 else _num(b) for b in self.bounds],
                "counts": [c if c - c == 0 else _num(c) for c in self.counts],
                "sum": _num(self.sum), "count": _num(self.count)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "HistogramSnapshot":
        # the checks of __post_init__, without its second float() pass over every count (stored states and evidence
        # are decoded on every load)
        bounds = _layout(tuple(map(float, d["bounds"])))
        counts = tuple(map(float, d["counts"]))
        if len(counts) != len(bounds):
            raise HistogramError(f"{len(bounds)} bounds but {len(counts)} counts")
        return cls._trusted(bounds, counts, _unnum(d["sum"]), _unnum(d["count"]))


_LAYOUTS: dict[tuple[float, ...], tuple[float, ...]] = {}


def _layout(bounds: tuple[float, ...]) -> tuple[float, ...]:
    """Validate a bucket layout once and share one tuple per layout (so equal layouts compare by identity)."""
    known = _LAYOUTS.get(bounds)
    if known is not None:
        return known
    if not bounds or bounds[-1] != INF:
        raise HistogramError("bucket upper bounds must end at +Inf")
    if any(math.isnan(b) for b in bounds) or any(b >= c for b, c in zip(bounds, bounds[1:])):
        raise HistogramError("bucket upper bounds must be strictly ascending")
    if len(_LAYOUTS) < 256:
        _LAYOUTS[bounds] = bounds
    return bounds


def increase(samples: Sequence[HistogramSnapshot]) -> HistogramSnapshot | None:
    """What Prometheus' increase() sees over successive cumulative samples of one target (without its
    extrapolation to the range edges): the sum of the pairwise deltas, each series restarting at a counter reset."""
    out = None
    for older, newer in zip(samples, samples[1:]):
        d = newer.delta(older)
        out = d if out is None else out.merge(d)
    return out


def merge_all(snapshots: Iterable[HistogramSnapshot]) -> HistogramSnapshot | None:
    out = None
    for s in snapshots:
        out = s if out is None else out.merge(s)
    return out


def _num(x: float) -> float | str:
    """JSON-safe float: +Inf/-Inf/NaN as Prometheus' strings."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return x


def _unnum(x) -> float:
    return float(x)
