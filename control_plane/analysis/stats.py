"""Confidence bounds from bucket counts.

Quantiles: distribution-free order-statistic bounds. The sample q-quantile of n observations sits at a rank whose
fraction has standard deviation s = sqrt(q (1 - q) / n) (binomial); the quantiles at q - z*s and q + z*s of the
histogram (Prometheus' interpolation) bound the true q-quantile at one-sided level ~Phi(-z) each (Woodruff's interval).
Canary vs target, with d = log(canary / target):
    fail  when  canary_lower(z_fail) > (1 + threshold) * target_upper(z_fail)
    pass  when  d + hypot(canary's upper half-width, target's lower half-width) at z_pass <= log(1 + threshold)
A false fail needs one of two one-sided bounds to be wrong (probability <= 2 Phi(-z_fail) per look whatever the shape
of the distribution; a quantile sitting in a gap between two modes just gets wide bounds). The pass (early success)
combines the half-widths in quadrature, as for independent samples: it comes ~2x sooner, and a wrong pass must also
survive the later steps, each on fresh data.

Error rates: difference of two proportions with the Agresti-Caffo adjustment (one success and one failure added to each
arm), so zero-error windows still get a non-zero width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .histogram import HistogramSnapshot

NAN = float("nan")
INF = float("inf")


@dataclass(slots=True, frozen=True)
class QuantileBounds:
    q: float
    n: float            # observations (the +Inf bucket)
    value: float        # histogram_quantile(q): exactly what Prometheus shows
    lower: float        # one-sided lower bound at the given z (0 if q - z*s < 0)
    upper: float        # one-sided upper bound (+Inf if q + z*s > 1: the histogram cannot bound it)


def quantile_bounds(h: HistogramSnapshot, q: float, zs: tuple[float, ...]) -> list[QuantileBounds]:
    """The q-quantile with its one-sided bounds at each z in `zs` (one monotonicity pass for all of them)."""
    n = h.total
    if not n > 0:
        value = h.quantile(q)
        return [QuantileBounds(q, n, value, NAN, NAN) for _ in zs]
    sd = math.sqrt(q * (1.0 - q) / n)
    probs = [q]
    for z in zs:
        probs += [max(q - z * sd, 0.0), min(q + z * sd, 1.0)]
    values = h.quantiles(probs)
    out = []
    for i, z in enumerate(zs):
        lower = values[1 + 2 * i] if q - z * sd >= 0 else 0.0
        upper = values[2 + 2 * i] if q + z * sd < 1 else INF
        out.append(QuantileBounds(q, n, values[0], lower, upper))
    return out


@dataclass(slots=True, frozen=True)
class DeltaEstimate:
    """Canary vs target: `d` the point estimate, (lower, upper) its bounds; for latency these are log ratios
    (relative delta = exp(x) - 1), for error rates differences of fractions."""
    d: float
    lower: float
    upper: float
    width: float        # combined one-sided half-width used to extrapolate "how many more requests"


def _log(x: float) -> float:
    if x > 0:
        return math.log(x)
    return -INF if x == 0 else NAN


def quantile_delta(canary: HistogramSnapshot, target: HistogramSnapshot, q: float, z_low: float,
                   z_high: float) -> tuple[DeltaEstimate, DeltaEstimate, float, float]:
    """Log-ratio of the q-quantiles with bounds for the fail test (z_low: lower bound of the ratio) and for the pass
    test (z_high: upper bound of the ratio). Returns (fail_estimate, pass_estimate, canary_value, target_value)."""
    cb, tb = quantile_bounds(canary, q, (z_low, z_high)), quantile_bounds(target, q, (z_low, z_high))
    vc, vt = cb[0].value, tb[0].value
    d = _log(vc) - _log(vt) if vc > 0 and vt > 0 else NAN
    (cf, cp), (tf, tp) = cb, tb
    # fail: the two one-sided bounds themselves (a false fail needs one of them to be wrong, whatever the shape)
    lower = _log(cf.lower) - _log(tf.upper)
    fail = DeltaEstimate(d, lower, _log(cf.upper) - _log(tf.lower), d - lower)
    # pass: the two one-sided half-widths combine in quadrature (independent samples): early success comes ~2x
    # sooner; a wrong pass must also survive every later step, on fresh data
    w = math.hypot(_log(cp.upper) - _log(vc), _log(vt) - _log(tp.lower))
    return fail, DeltaEstimate(d, d - w, d + w, w), vc, vt


def proportion_diff(errors_c: float, n_c: float, errors_t: float, n_t: float, z_low: float,
                    z_high: float) -> tuple[DeltaEstimate, DeltaEstimate]:
    """Error-rate difference canary - target (fractions) with Agresti-Caffo bounds. As for quantiles, the fail bound
    adds the arms' half-widths (z * sqrt(2) * se) and the pass bound combines them in quadrature (z * se)."""
    if not (n_c > 0 and n_t > 0):
        nan = DeltaEstimate(NAN, NAN, NAN, NAN)
        return nan, nan
    d = errors_c / n_c - errors_t / n_t
    ac, at = (errors_c + 1) / (n_c + 2), (errors_t + 1) / (n_t + 2)
    se = math.sqrt(ac * (1 - ac) / (n_c + 2) + at * (1 - at) / (n_t + 2))
    wf, wp = z_low * math.sqrt(2) * se, z_high * se
    return DeltaEstimate(d, d - wf, d + wf, wf), DeltaEstimate(d, d - wp, d + wp, wp)


def more_samples_needed(n: float, est: DeltaEstimate, bound: float) -> int | None:
    """About how many more requests per variant until `bound` leaves the interval (widths shrink like 1/sqrt(n))."""
    if not (n > 0 and est.width > 0) or math.isnan(est.d) or math.isinf(est.width):
        return None
    gap = abs(bound - est.d)
    if gap == 0:
        return None  # sitting on the threshold: no amount of data decides it
    needed = n * (est.width / gap) ** 2
    return max(int(math.ceil(needed - n)), 1)
