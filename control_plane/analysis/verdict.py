"""`assess(variants, policy) -> Verdict`: one look at the data of the current step, with its evidence.

Checks, in order:
  guards (FAIL at once): canary crashing, canary not ready, NaN anywhere in canary/target data, canary error rate
      above policy.max_error_rate (with >= min_error_samples requests);
  no canary or target data, or target not ready -> INCONCLUSIVE (no data is never a pass);
  per MetricCheck and series: relative delta of the quantile with order-statistic bounds (stats.py);
      FAIL when canary_lower(z_fail) > (1 + threshold) * target_upper(z_fail), PASS when the ratio's upper bound
      at z_pass (half-widths in quadrature) <= 1 + threshold, else INCONCLUSIVE with about how many more requests
      per variant would decide it;
  error rate: canary - target with an Agresti-Caffo interval, same rule.
Overall: any FAIL -> FAIL; every check PASS -> PASS; else INCONCLUSIVE. Replayed load (low-traffic mode) counts like
live load, but a PASS with replayed canary requests and fewer live ones than low_traffic's minimum (min_samples by
default) is INCONCLUSIVE unless low_traffic.allow_replay_only: replay may fail a canary, never pass it alone.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Mapping

from sits.control_plane.numbers import ABS, REL, delta, interval, limit, percent, points, rate

from .deltas import Delta, compute_deltas
from .histogram import HistogramSnapshot
from .low_traffic import live_requests_needed
from .policy import ERROR_RATE, MetricCheck, Policy
from .sequential import (AA_PREFIX, SD_FLOOR, SequenceState, blocks_to_decide, estimate, jumps, mean_window_s,
                         series_key, window_need)
from .stats import DeltaEstimate, more_samples_needed, proportion_diff, quantile_delta

if TYPE_CHECKING:   # correctness.py imports Outcome from here
    from .correctness import CorrectnessVerdict


class Outcome(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class Guard(str, Enum):
    """What failed a check at once, before any latency comparison (a Verdict's `guard`)."""
    CRASHING = "crashing"        # the canary's engine restarted or exited
    NOT_READY = "not_ready"      # the canary stopped answering its readiness probe
    NAN = "nan"                  # NaN in the canary's or the target's metrics
    ERROR_RATE = "error_rate"    # the canary's error rate above the policy's limit
    CORRECTNESS = "correctness"  # the correctness gate failed (rollout/machine.py)


@dataclass(slots=True, frozen=True)
class VariantData:
    """What one variant did in the analysed window: histograms keyed by series ("metric" or 'metric{route="/x"}'),
    window deltas (not cumulative); requests and errors (5xx) in the same window; readiness. `replayed`: how many of
    the requests were replayed by low-traffic mode (the rest are live); `streamed`: live requests that streamed."""
    histograms: Mapping[str, HistogramSnapshot] = field(default_factory=dict)
    requests: float = 0.0
    errors: float = 0.0
    ready: bool = True
    crashing: bool = False
    replayed: float = 0.0
    streamed: float = 0.0

    @property
    def live(self) -> float:
        return max(self.requests - self.replayed, 0.0)


@dataclass(slots=True, frozen=True)
class TestResult:
    """One check on one series. Latency values in seconds, deltas relative (0.1 = +10 %); error-rate values are
    fractions and deltas in fractions (0.01 = 1 point). ci_low: lower bound of the delta at z_fail (the fail test);
    ci_high: upper bound at z_pass (the pass test)."""
    check: str
    series: str
    outcome: Outcome
    reason: str
    threshold: float
    n_canary: float = 0.0
    n_target: float = 0.0
    canary: float = math.nan
    target: float = math.nan
    delta_abs: float = math.nan
    delta_rel: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    need_more: int | None = None
    vs_production: tuple[float, float] | None = None  # (delta_abs, delta_rel) when production is not the target
    low_traffic: bool = False   # too few samples to decide: skipped when another series of the check decides
    # sequential statistics (analysis/sequential.py): delta_rel, ci_low and ci_high are then the windows' mean effect
    # and the confidence sequence's bounds (error rate: points); `ship` the smaller boundary (threshold the larger)
    method: str = "fixed"
    ship: float = math.nan
    alpha: float = math.nan       # this series' share of the policy's alpha (Bonferroni)
    windows: int = 0              # paired windows used
    block: int = 1                # windows averaged per block (lag-1 autocorrelation above the limit doubles it)
    lag1: float = math.nan        # lag-1 autocorrelation of the blocks
    window_s: float = math.nan    # mean window length
    eta_s: float | None = None    # about how long until a boundary is crossed, at the current mean and spread
    jumps: int = 0                # undecided latency series: windows a factor 2 or more from the median window, when
                                  # a minority (2 to a quarter) does so: a quantile between two modes (sequential.jumps)

    def to_dict(self) -> dict:
        def finite_or_none(v):
            return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v

        d = {k: finite_or_none(getattr(self, k)) for k in self.__slots__}
        d["outcome"] = self.outcome.value
        if self.vs_production is not None:
            d["vs_production"] = [finite_or_none(x) for x in self.vs_production]
        if self.method == "fixed":   # evidence stored before sequential statistics has none of these
            for k in ("ship", "alpha", "windows", "block", "lag1", "window_s", "eta_s", "jumps"):
                d.pop(k)
        return d


@dataclass(slots=True, frozen=True)
class ReplicaOffset:
    """Production against baseline (the same kernels, at the same time): a live A/A. How far two identical engines
    differ here: its bounds are what a `ship` boundary must clear. Shown, never decided on."""
    check: str
    series: str
    delta: float          # relative for latency, points for the error rate
    ci_low: float
    ci_high: float
    windows: int

    def to_dict(self) -> dict:
        return {k: (None if isinstance(getattr(self, k), float) and math.isnan(getattr(self, k))
                    else getattr(self, k)) for k in self.__slots__}


@dataclass(slots=True, frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    compare_to: str
    results: tuple[TestResult, ...] = ()
    guard: Guard | None = None        # set when a guard decided (rollback without waiting for failure_limit)
    need_more: int | None = None      # requests per variant, for INCONCLUSIVE
    deltas: tuple[Delta, ...] = ()    # P90/P99 of every series vs baseline and production (shown, not decided)
    correctness: "CorrectnessVerdict | None" = None   # a correctness-gate check (rollout.py), with its evidence
    replica: tuple[ReplicaOffset, ...] = ()  # sequential: production vs baseline, the live A/A (shown only)

    def to_dict(self) -> dict:
        d = {"outcome": self.outcome.value, "reason": self.reason, "compare_to": self.compare_to,
             "guard": self.guard.value if self.guard else None, "need_more": self.need_more, "results": [r.to_dict() for r in self.results],
             "deltas": [d.to_dict() for d in self.deltas]}
        if self.correctness is not None:
            d["correctness"] = self.correctness.to_dict()
        if self.replica:
            d["replica"] = [o.to_dict() for o in self.replica]
        return d


def _has_nan(v: VariantData) -> bool:
    return math.isnan(v.requests) or math.isnan(v.errors) or any(h.has_nan() for h in v.histograms.values())


def _series_of(v: VariantData, metric: str) -> list[str]:
    return sorted(k for k in v.histograms if k == metric or k.startswith(metric + "{"))


def _decide(fail_est: DeltaEstimate, pass_est: DeltaEstimate, bound: float, n: float) -> tuple[Outcome, int | None]:
    if fail_est.lower > bound:
        return Outcome.FAIL, None
    if pass_est.upper <= bound:
        return Outcome.PASS, None
    # whichever boundary the estimate is heading to decides how much more data is needed
    est = fail_est if fail_est.d > bound else pass_est
    return Outcome.INCONCLUSIVE, more_samples_needed(n, est, bound)


def _samples_needed(q: float, policy: Policy) -> int:
    """Requests per variant before a q-quantile may decide: min_samples, min_tail_samples in the tail, and z^2 q / (1 -
    q) + 1 (below it the upper bound's rank q + z s passes 1: the histogram cannot bound it)."""
    z = max(policy.z_fail, policy.z_pass)
    return max(policy.min_samples, math.ceil(policy.min_tail_samples / (1.0 - q)), math.ceil(z * z * q / (1 - q)) + 1)


def _latency(check: MetricCheck, series: str, c: VariantData, t: VariantData, prod: VariantData | None,
             policy: Policy) -> TestResult:
    hc, ht = c.histograms[series], t.histograms[series]
    q, thr = check.quantile, check.max_rel_delta
    n_c, n_t = hc.total, ht.total
    need = _samples_needed(q, policy)
    base = dict(check=check.name, series=series, threshold=thr, n_canary=n_c, n_target=n_t)
    if min(n_c, n_t) < need:
        return TestResult(**base, outcome=Outcome.INCONCLUSIVE, need_more=int(math.ceil(need - min(n_c, n_t))),
                          low_traffic=True,
                          reason=f"low traffic: {min(n_c, n_t):g} requests, {need} needed for p{q * 100:g}")
    fail_est, pass_est, vc, vt = quantile_delta(hc, ht, q, policy.z_fail, policy.z_pass)
    vs_prod = None
    if prod is not None and series in prod.histograms and prod.histograms[series].total > 0:
        pv = prod.histograms[series].quantile(q)
        if pv > 0:
            vs_prod = (vc - pv, vc / pv - 1.0)
    vals = dict(canary=vc, target=vt, delta_abs=vc - vt, vs_production=vs_prod)
    if math.isnan(fail_est.d) or math.isnan(fail_est.lower) or math.isnan(pass_est.upper):
        return TestResult(**base, **vals, outcome=Outcome.INCONCLUSIVE,
                          reason="quantile cannot be bounded (observations at zero or not in finite buckets)")
    bound = math.log1p(thr)
    outcome, more = _decide(fail_est, pass_est, bound, min(n_c, n_t))
    rel, lo, hi = math.expm1(fail_est.d), math.expm1(fail_est.lower), math.expm1(pass_est.upper)
    if outcome is Outcome.FAIL:
        reason = f"p{q * 100:g} {percent(rel)} (lower bound {percent(lo)}) > {limit(REL, thr)}"
    elif outcome is Outcome.PASS:
        reason = f"p{q * 100:g} {percent(rel)} (upper bound {percent(hi)}) <= {limit(REL, thr)}"
    else:
        reason = f"p{q * 100:g} {percent(rel)}, bounds {interval(REL, lo, hi)} straddle {limit(REL, thr)}"
    return TestResult(**base, **vals, delta_rel=rel, ci_low=lo, ci_high=hi, outcome=outcome, reason=reason,
                      need_more=more)


def _error_rate(check: MetricCheck, c: VariantData, t: VariantData, prod: VariantData | None,
                policy: Policy) -> TestResult:
    thr = check.max_abs_delta
    base = dict(check=check.name, series=ERROR_RATE, threshold=thr, n_canary=c.requests, n_target=t.requests)
    n = min(c.requests, t.requests)
    if n < policy.min_error_samples:
        return TestResult(**base, outcome=Outcome.INCONCLUSIVE, need_more=int(math.ceil(policy.min_error_samples - n)),
                          low_traffic=True,
                          reason=f"low traffic: {n:g} requests, {policy.min_error_samples} needed for the error rate")
    fail_est, pass_est = proportion_diff(c.errors, c.requests, t.errors, t.requests, policy.z_fail, policy.z_pass)
    rc, rt = c.errors / c.requests, t.errors / t.requests
    vs_prod = None
    if prod is not None and prod.requests > 0:
        vs_prod = (rc - prod.errors / prod.requests, math.nan)
    outcome, more = _decide(fail_est, pass_est, thr, n)
    lo, hi = fail_est.lower, pass_est.upper
    head = f"error rate {rate(rc)} vs {rate(rt)}"
    if outcome is Outcome.FAIL:
        reason = f"{head}: {points(fail_est.d)} (lower {points(lo)}) > {limit(ABS, thr)}"
    elif outcome is Outcome.PASS:
        reason = f"{head}: upper bound {points(hi)} <= {limit(ABS, thr)}"
    else:
        reason = f"{head}: {interval(ABS, lo, hi)} straddles {limit(ABS, thr)}"
    return TestResult(**base, canary=rc, target=rt, delta_abs=fail_est.d, ci_low=lo, ci_high=hi, outcome=outcome,
                      reason=reason, need_more=more, vs_production=vs_prod)


def _fmt(check: MetricCheck, v: float) -> str:
    return delta(ABS if check.metric == ERROR_RATE else REL, v)


def _sequential(check: MetricCheck, series: str, c: VariantData, t: VariantData, prod: VariantData | None,
                policy: Policy, seq: SequenceState, alpha: float) -> TestResult:
    """One check series under sequential statistics: the confidence sequence of its paired windows (the whole
    rollout's), two boundaries. A PASS also needs min_samples requests per variant in the current step (each step is
    seen at its weight); a FAIL needs only the sequence (valid at any look)."""
    err = check.metric == ERROR_RATE
    ws = seq.windows.get(series_key(check.name, series), ())
    floor = SD_FLOOR
    if err and ws:   # windows without an error have no spread: one window's binomial spread is the floor
        p_e = (c.errors + t.errors + 1) / (c.requests + t.requests + 2)
        n_w = sum(min(w.n_canary, w.n_target) for w in ws) / len(ws)
        floor = math.sqrt(p_e * (1 - p_e) * 2 / max(n_w, 1.0))
    est = estimate([w.x for w in ws], alpha, policy.min_windows, floor)
    # log scale for latency: the mean of log ratios; the error rate in points as it is
    ship, limit = (check.ship, check.limit) if err else (math.log1p(check.ship), math.log1p(check.limit))
    back = (lambda v: v) if err else math.expm1
    if err:
        n_c, n_t = c.requests, t.requests
        vc = c.errors / c.requests if c.requests else math.nan
        vt = t.errors / t.requests if t.requests else math.nan
        vs_prod = (vc - prod.errors / prod.requests, math.nan) if prod is not None and prod.requests > 0 else None
    else:
        hc, ht = c.histograms.get(series), t.histograms.get(series)
        n_c, n_t = (hc.total if hc else 0.0), (ht.total if ht else 0.0)
        vc = hc.quantile(check.quantile) if hc and hc.total else math.nan
        vt = ht.quantile(check.quantile) if ht and ht.total else math.nan
        vs_prod = None
        if prod is not None and series in prod.histograms and prod.histograms[series].total > 0:
            pv = prod.histograms[series].quantile(check.quantile)
            if pv > 0 and not math.isnan(vc):
                vs_prod = (vc - pv, vc / pv - 1.0)
    win_s = mean_window_s(ws)
    per_window = (sum(min(w.n_canary, w.n_target) for w in ws) / len(ws) if ws else
                  window_need(None if err else check.quantile, policy.window_requests, policy.window_tail_samples))
    base = dict(check=check.name, series=series, threshold=check.limit, n_canary=n_c, n_target=n_t, canary=vc,
                target=vt, delta_abs=vc - vt, vs_production=vs_prod, method="sequential", ship=check.ship,
                alpha=alpha, windows=est.windows, block=est.block, lag1=est.lag1, window_s=win_s)
    what = "error rate" if err else f"p{check.quantile * 100:g}"
    bounds = f"ship {_fmt(check, check.ship)}, limit {_fmt(check, check.limit)}"
    if math.isnan(est.lower):
        need = int(math.ceil((policy.min_windows - est.windows) * per_window))
        eta = (policy.min_windows - est.windows) * win_s if not math.isnan(win_s) else None
        return TestResult(**base, delta_rel=back(est.mean) if est.windows else math.nan, outcome=Outcome.INCONCLUSIVE,
                          need_more=max(need, 1), low_traffic=True, eta_s=eta,
                          reason=f"{what}: {est.windows} of {policy.min_windows} windows before it may decide")
    lower, upper = seq.bounds(series_key(check.name, series), est)
    est = dataclasses.replace(est, lower=lower, upper=upper)
    rel, lo, hi = back(est.mean), back(est.lower), back(est.upper)
    vals = dict(delta_rel=rel, ci_low=lo, ci_high=hi)
    head = f"{what} {_fmt(check, rel)} over {est.windows} windows, sequence [{_fmt(check, lo)}, {_fmt(check, hi)}]"
    if est.lower > ship:
        return TestResult(**base, **vals, outcome=Outcome.FAIL, eta_s=0.0,
                          reason=f"{head}: lower bound above ship {_fmt(check, check.ship)}")
    step_need = policy.min_samples if not err else policy.min_error_samples
    if est.upper < limit:
        if min(n_c, n_t) >= step_need:
            return TestResult(**base, **vals, outcome=Outcome.PASS, eta_s=0.0,
                              reason=f"{head}: upper bound below limit {_fmt(check, check.limit)}")
        more = int(math.ceil(step_need - min(n_c, n_t)))
        return TestResult(**base, **vals, outcome=Outcome.INCONCLUSIVE, need_more=more, low_traffic=True,
                          reason=f"{head}: below limit, but {min(n_c, n_t):g} of {step_need} requests at this step")
    blocks = blocks_to_decide(est, ship, limit, alpha)
    more = None if blocks is None else max(int(math.ceil(blocks * est.block * per_window)), 1)
    eta = None if blocks is None or math.isnan(win_s) else blocks * est.block * win_s
    k = 0 if err else jumps([w.x for w in ws])
    cliff = (f"; {k} of {len(ws)} windows lie 2x or more from the typical one: the {what} may sit between two modes "
             f"of the latency (docs/control-loop.md)") if k else ""
    return TestResult(**base, **vals, outcome=Outcome.INCONCLUSIVE, need_more=more, eta_s=eta, jumps=k,
                      reason=f"{head} between the boundaries ({bounds}){cliff}")


def _replica(policy: Policy, seq: SequenceState, alpha: float) -> tuple[ReplicaOffset, ...]:
    out = []
    for key in sorted(k for k in seq.windows if k.startswith(AA_PREFIX)):
        name, _, series = key[len(AA_PREFIX):].partition("@")
        check = next((c for c in policy.checks if c.name == name), None)
        if check is None:
            continue
        est = estimate([w.x for w in seq.windows[key]], alpha, policy.min_windows)
        lower, upper = seq.bounds(key, est)
        back = (lambda v: v) if check.metric == ERROR_RATE else math.expm1
        out.append(ReplicaOffset(name, series, back(est.mean), back(lower), back(upper), est.windows))
    return tuple(out)


def _combine(check: MetricCheck, results: list[TestResult]) -> tuple[Outcome, int | None]:
    """Series too small to decide are skipped when another series of the same check has enough data."""
    if any(r.outcome is Outcome.FAIL for r in results):
        return Outcome.FAIL, None
    decided = [r for r in results if not r.low_traffic]
    if decided and all(r.outcome is Outcome.PASS for r in decided):
        return Outcome.PASS, None
    more = [r.need_more for r in (decided or results) if r.outcome is Outcome.INCONCLUSIVE and r.need_more]
    return Outcome.INCONCLUSIVE, max(more) if more else None


def assess(variants: Mapping[str, VariantData], policy: Policy, sequence: SequenceState | None = None) -> Verdict:
    """Compare the canary with policy.compare_to (baseline by default); the delta vs production is shown too.
    `variants`: the current step's data (guards, step minimums, values shown); `sequence`: the rollout's paired
    windows, which decide under policy.statistics "sequential" (None: no window yet)."""
    target_role = policy.compare_to
    c, t = variants.get("canary"), variants.get(target_role)
    prod = variants.get("production") if target_role != "production" else None

    shown = compute_deltas(variants)

    replica = (_replica(policy, sequence, policy.alpha / len(policy.checks))
               if sequence is not None and policy.statistics == "sequential" else ())

    def verdict(outcome, reason, results=(), guard=None, need_more=None):
        return Verdict(outcome, reason, target_role, tuple(results), guard, need_more, shown, replica=replica)

    if c is not None:
        if c.crashing:
            return verdict(Outcome.FAIL, "canary is crashing (restarts or exited)", guard=Guard.CRASHING)
        if not c.ready:
            return verdict(Outcome.FAIL, "canary is not ready", guard=Guard.NOT_READY)
        if _has_nan(c) or (t is not None and _has_nan(t)):
            return verdict(Outcome.FAIL, "NaN in the canary's or target's metrics", guard=Guard.NAN)
        if c.requests >= policy.min_error_samples and c.errors / c.requests > policy.max_error_rate:
            return verdict(Outcome.FAIL, f"canary error rate {rate(c.errors / c.requests)} above the limit "
                           f"{rate(policy.max_error_rate)}", guard=Guard.ERROR_RATE)
    if c is None or t is None:
        missing = "canary" if c is None else target_role
        return verdict(Outcome.INCONCLUSIVE, f"no data from {missing}")
    if not t.ready:
        return verdict(Outcome.INCONCLUSIVE, f"{target_role} is not ready")
    results: list[TestResult] = []
    failed, pending, needs = [], [], []
    sequential = policy.statistics == "sequential"
    seq = sequence or SequenceState()
    for check in policy.checks:
        if sequential:
            if check.metric == ERROR_RATE:
                keys = [ERROR_RATE]
            else:
                known = {k.partition("@")[2] for k in seq.windows if k.startswith(check.name + "@")}
                keys = sorted(known | {k for k in _series_of(c, check.metric) if k in t.histograms})
            share = policy.alpha / len(policy.checks) / max(len(keys), 1)
            rs = [_sequential(check, k, c, t, prod, policy, seq, share) for k in keys]
            if not rs:
                rs = [TestResult(check=check.name, series=check.metric, outcome=Outcome.INCONCLUSIVE,
                                 threshold=check.max_rel_delta, reason=f"no data for {check.metric}",
                                 need_more=window_need(check.quantile, policy.window_requests,
                                                       policy.window_tail_samples) * policy.min_windows,
                                 low_traffic=True, method="sequential", ship=check.ship)]
        elif check.metric == ERROR_RATE:
            rs = [_error_rate(check, c, t, prod, policy)]
        else:
            keys = [k for k in _series_of(c, check.metric) if k in t.histograms]
            if not keys:
                # nothing yet: as many requests as the quantile needs before it may decide (what replay sends)
                rs = [TestResult(check=check.name, series=check.metric, outcome=Outcome.INCONCLUSIVE,
                                 threshold=check.max_rel_delta, reason=f"no data for {check.metric}",
                                 need_more=_samples_needed(check.quantile, policy), low_traffic=True)]
            else:
                rs = [_latency(check, k, c, t, prod, policy) for k in keys]
        results.extend(rs)
        outcome, more = _combine(check, rs)
        if outcome is Outcome.FAIL:
            failed.append(next(f"{r.series} {r.reason}" for r in rs if r.outcome is Outcome.FAIL))
        elif outcome is Outcome.INCONCLUSIVE:
            if sequential:   # what each undecided check waits for, in its own words
                r = next(r for r in rs if r.outcome is Outcome.INCONCLUSIVE)
                pending.append(f"{check.name}: {r.reason}")
            else:
                pending.append(check.name)
            if more:
                needs.append(more)
    if failed:
        return verdict(Outcome.FAIL, "; ".join(failed), results)
    if not pending:
        live_needed = live_requests_needed(policy.low_traffic, policy.min_samples)
        if c.replayed > 0 and c.live < live_needed:
            # replayed load may fail a canary, never pass it alone: more replay cannot help (need_more None)
            return verdict(Outcome.INCONCLUSIVE, f"every check passed, but on replayed load: {c.live:g} live canary "
                           f"requests ({c.replayed:g} replayed), {live_needed} live needed to pass", results)
        return verdict(Outcome.PASS, "every check passed with confidence", results)
    need = max(needs) if needs else None
    if sequential:
        etas = [r.eta_s for r in results if r.outcome is Outcome.INCONCLUSIVE and r.eta_s is not None]
        tail = f"; decides in about {max(etas):.0f} s at this rate" if etas else ""
        return verdict(Outcome.INCONCLUSIVE, f"inconclusive ({'; '.join(pending)}){tail}", results, need_more=need)
    tail = f": need about {need} more request{'' if need == 1 else 's'} per variant" if need else ""
    return verdict(Outcome.INCONCLUSIVE, f"inconclusive ({', '.join(pending)}){tail}", results, need_more=need)
