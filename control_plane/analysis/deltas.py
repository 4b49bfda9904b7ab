"""Shown, not decided: P90/P99 of every series each variant reported, and the canary's deltas against the baseline
and production (absolute and relative), plus the error-rate differences. The decision lives in verdict.py."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from .low_traffic import WORKLOAD_METRICS
from .policy import ERROR_RATE

NAN = math.nan
QUANTILES = (0.9, 0.99)


@dataclass(slots=True, frozen=True)
class Delta:
    """One series at one quantile (quantile None: the error rate, values as fractions). NaN where a variant has no
    data; relative deltas are canary / other - 1."""
    series: str
    quantile: float | None
    canary: float
    baseline: float
    production: float
    vs_baseline_abs: float
    vs_baseline_rel: float
    vs_production_abs: float
    vs_production_rel: float

    def to_dict(self) -> dict:
        return {k: (None if isinstance(getattr(self, k), float) and math.isnan(getattr(self, k))
                    else getattr(self, k)) for k in self.__slots__}


def _rel(a: float, b: float) -> float:
    return a / b - 1.0 if b > 0 and not math.isnan(a) else NAN


def _delta(series: str, q: float | None, c: float, b: float, p: float) -> Delta:
    return Delta(series, q, c, b, p, c - b, _rel(c, b), c - p, _rel(c, p))


def compute_deltas(variants: Mapping, quantiles: tuple[float, ...] = QUANTILES) -> tuple[Delta, ...]:
    """`variants`: role -> VariantData. One Delta per (canary series, quantile), then the error rate."""
    canary = variants.get("canary")
    if canary is None:
        return ()
    others = {role: variants.get(role) for role in ("baseline", "production")}
    values: dict[str, dict[str, list[float]]] = {}
    for role, v in (("canary", canary), *others.items()):
        if v is None:
            continue
        for key in canary.histograms:
            if key.startswith(WORKLOAD_METRICS):   # token counts (low-traffic mode's workload), not latencies
                continue
            h = v.histograms.get(key)
            if h is not None and h.total > 0:
                values.setdefault(key, {})[role] = h.quantiles(quantiles)
    out = []
    for key in sorted(values):
        per = values[key]
        if "canary" not in per:
            continue
        for i, q in enumerate(quantiles):
            out.append(_delta(key, q, per["canary"][i], per.get("baseline", [NAN] * len(quantiles))[i],
                              per.get("production", [NAN] * len(quantiles))[i]))
    rate = {role: (v.errors / v.requests if v is not None and v.requests > 0 else NAN)
            for role, v in (("canary", canary), *others.items())}
    if not math.isnan(rate["canary"]):
        out.append(Delta(ERROR_RATE, None, rate["canary"], rate["baseline"], rate["production"],
                         rate["canary"] - rate["baseline"], NAN, rate["canary"] - rate["production"], NAN))
    return tuple(out)
