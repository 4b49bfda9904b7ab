"""Replica noise from a rollout's windows (`sits-control rollout calibrate`): how far engines with the same kernels
differed, per check series, and the ship boundary that clears it. Reads the sequences sequential.py keeps."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .sequential import AA_PREFIX, SequenceState, estimate


@dataclass(slots=True, frozen=True)
class Calibration:
    """How far two engines with the same kernels differed on one check series, and the ship boundary that clears it."""
    check: str
    series: str
    source: str           # "canary vs baseline (A/A)" or "production vs baseline (live A/A)"
    delta: float          # relative for latency, points for the error rate
    ci_low: float
    ci_high: float
    windows: int
    suggested_ship: float | None   # None: not enough windows yet
    limit: float


def calibrate(state: SequenceState, policy, aa: bool, alpha: float | None = None) -> list[Calibration]:
    """Replica noise from a rollout's windows: its canary-vs-target sequences when canary and production ran the
    same kernels (`aa`), and its live A/A (production vs baseline) ones always. The suggested ship boundary is the
    farther bound of the offset, times 1.25, rounded up to a step of 2.5 % (0.25 pt): a change smaller than what
    identical engines differ by must never roll a canary back. Latency in relative terms (0.1 = +10 %)."""
    from .policy import ERROR_RATE

    alpha = policy.alpha / len(policy.checks) if alpha is None else alpha
    out = []
    for key, ws in sorted(state.windows.items()):
        live = key.startswith(AA_PREFIX)
        if not (live or aa):
            continue
        name, _, series = key[len(AA_PREFIX):].partition("@") if live else key.partition("@")
        check = next((c for c in policy.checks if c.name == name), None)
        if check is None:
            continue
        err = check.metric == ERROR_RATE
        est = estimate([w.x for w in ws], alpha, policy.min_windows)
        back = (lambda v: v) if err else math.expm1
        lo, hi = back(est.lower), back(est.upper)
        suggest = None
        if not math.isnan(lo):
            step = 0.0025 if err else 0.025
            suggest = math.ceil(max(abs(lo), abs(hi)) * 1.25 / step - 1e-9) * step
        out.append(Calibration(name, series, "production vs baseline (live A/A)" if live else
                               "canary vs baseline (A/A)", back(est.mean), lo, hi, est.windows, suggest, check.limit))
    return out
