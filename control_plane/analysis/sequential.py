"""Anytime-valid comparisons of canary and target over paired time windows (Policy.statistics = "sequential").

The sample unit is a paired window, not a request or a token: canary and target are measured over the same span, and
one window of one check's series gives one number,
    latency:     x = log(canary q-quantile / target q-quantile), each from that window's histogram delta;
    error rate:  x = canary error rate - target error rate.
Tokens of one engine step and requests of one time window move together, so treating each of them as independent
claims intervals far narrower than the data supports; windows are (nearly) independent of each other, and where
they are not (lag-1 autocorrelation of the x above LAG1_LIMIT), adjacent windows are averaged into blocks of 2, 4, ...
(batch means) until they are. A window closes once both arms have enough observations for its quantile
(`Policy.window_requests`, and `Policy.window_tail_samples` beyond the quantile), so a P99 window is longer than a P90
one.

The effect is the mean of x; its bounds are an asymptotic confidence sequence (Waudby-Smith, Arbour, Sinha, Kennedy
and Ramdas, "Time-uniform central limit theory and asymptotic confidence sequences", Ann. Statist. 2024, Theorem
2.2): with n blocks, mean m and standard deviation s,
    m +- s * sqrt( 2 (n r + 1) / (n^2 r) * log( sqrt(n r + 1) / alpha ) ),     r = rho^2 tuned for n = T_OPT,
a two-sided (1 - alpha) sequence: the probability that it EVER excludes the true mean, however often the worker looks
and whenever it stops, is at most alpha (asymptotically; `bench/sequential_sim.py` measures it on correlated data).
Why this one: it needs no bound on the data (log ratios are unbounded), no distributional assumption beyond a finite
variance, one closed form per look (no library: `confseq`'s boundaries agree, tests/control_plane/analysis), and it
shrinks like sqrt(log n / n), so a gap between two boundaries is always crossed in bounded time.

Decisions with two boundaries per check, `ship` < `limit` (log scale for latency, points for errors), and alpha split
evenly over the policy's checks and each check's series (Bonferroni):
    FAIL  when lower > ship        P(FAIL | effect <= ship) <= alpha, at any stopping time;
    PASS  when upper < limit       P(PASS | effect >= limit) <= alpha;
once the sequence is narrower than limit - ship one of the two must hold: the time to decide is bounded.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .histogram import HistogramSnapshot

T_OPT = 20          # the number of blocks the sequence is tightest at (its width there is ~ that of a fixed test)
LAG1_LIMIT = 0.3    # lag-1 autocorrelation of the window values above this: windows are averaged in pairs
MIN_BLOCKS = 4      # batch means never go below this many blocks
R_MAX = 0.8         # the long-run variance factor (1 + r) / (1 - r) stops at r = 0.8 (x9): beyond, blocks grow
SD_FLOOR = 1e-3     # log-ratio units: two bit-identical windows still round differently in real histograms


@dataclass(slots=True, frozen=True)
class Window:
    """One closed paired window of one check series: its value x and how many observations each arm had."""
    x: float
    n_canary: float
    n_target: float
    start: float
    end: float

    def to_dict(self) -> dict:
        return {"x": self.x, "n_canary": self.n_canary, "n_target": self.n_target, "start": self.start,
                "end": self.end}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Window":
        return cls(float(d["x"]), float(d["n_canary"]), float(d["n_target"]), float(d["start"]), float(d["end"]))


@dataclass(slots=True, frozen=True)
class Pending:
    """The open window of one check series: latency histograms, or (error rate) request and error counts."""
    start: float
    canary: HistogramSnapshot | None = None
    target: HistogramSnapshot | None = None
    requests_canary: float = 0.0
    errors_canary: float = 0.0
    requests_target: float = 0.0
    errors_target: float = 0.0

    def to_dict(self) -> dict:
        d = {"start": self.start, "requests": [self.requests_canary, self.requests_target],
             "errors": [self.errors_canary, self.errors_target]}
        if self.canary is not None and self.target is not None:
            d["canary"], d["target"] = self.canary.to_dict(), self.target.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Pending":
        hc, ht = d.get("canary"), d.get("target")
        return cls(float(d["start"]), HistogramSnapshot.from_dict(hc) if hc else None,
                   HistogramSnapshot.from_dict(ht) if ht else None, float(d["requests"][0]), float(d["errors"][0]),
                   float(d["requests"][1]), float(d["errors"][1]))


@dataclass(slots=True, frozen=True)
class SequenceState:
    """Every check series' closed windows and open window, for the whole rollout (steps do not reset it: one
    sequence, so its guarantee holds across steps). Keys: `series_key(check_name, series)`; live A/A keys (production
    against baseline, when both run the same kernels) start with AA_PREFIX. `running`: per key the intersection of
    the sequence's bounds after every window so far (log scale; points for the error rate): a confidence sequence
    stays one when intersected over time, so bounds never widen again and a boundary once cleared stays cleared."""
    windows: Mapping[str, tuple[Window, ...]] = field(default_factory=dict)
    pending: Mapping[str, Pending] = field(default_factory=dict)
    running: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"windows": {k: [w.to_dict() for w in ws] for k, ws in self.windows.items()},
                "pending": {k: p.to_dict() for k, p in self.pending.items()},
                "running": {k: list(b) for k, b in self.running.items()}}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "SequenceState":
        if not d:
            return cls()
        return cls({k: tuple(Window.from_dict(w) for w in ws) for k, ws in d.get("windows", {}).items()},
                   {k: Pending.from_dict(p) for k, p in d.get("pending", {}).items()},
                   {k: (float(b[0]), float(b[1])) for k, b in d.get("running", {}).items()})

    def without_pending(self) -> "SequenceState":
        """After a weight change or a pause: the open windows straddle it and are dropped; closed ones stay."""
        return SequenceState(self.windows, {}, self.running) if self.pending else self

    def bounds(self, key: str, est: "Bounds") -> tuple[float, float]:
        """The estimate's bounds intersected with the running ones (NaN while the estimate has none)."""
        if math.isnan(est.lower):
            return est.lower, est.upper
        lo, hi = self.running.get(key, (-math.inf, math.inf))
        return max(est.lower, lo), min(est.upper, hi)


AA_PREFIX = "aa:"


def series_key(check: str, series: str) -> str:
    return f"{check}@{series}"


@dataclass(slots=True, frozen=True)
class Bounds:
    """The sequence at one look: the mean effect with its anytime-valid bounds (NaN below min_windows blocks), how
    many windows and blocks it used, the blocks' lag-1 autocorrelation and standard deviation."""
    mean: float
    lower: float
    upper: float
    windows: int
    block: int
    lag1: float
    sd: float

    @property
    def blocks(self) -> int:
        return self.windows // self.block


def std_margin(n: float, r: float, alpha: float) -> float:
    """Half-width of the unit-variance normal-mixture sequence after n samples (mixture variance r = rho^2)."""
    return math.sqrt(2.0 * (n * r + 1.0) / (n * n * r) * math.log(math.sqrt(n * r + 1.0) / alpha))


def tuned_r(alpha: float, t_opt: float = T_OPT) -> float:
    """rho^2 that makes the sequence tightest at t_opt samples (the paper's closed-form approximation)."""
    a = -2.0 * math.log(alpha)
    return (a + math.log(a + 1.0)) / t_opt


def margin(n: int, sd: float, alpha: float) -> float:
    return sd * std_margin(n, tuned_r(alpha), alpha) if n > 0 else math.inf


def _lag1(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 3:
        return math.nan
    m = sum(xs) / n
    den = sum((x - m) ** 2 for x in xs)
    if den <= 0:
        return 0.0
    return sum((xs[i] - m) * (xs[i + 1] - m) for i in range(n - 1)) / den


def _blocks(xs: Sequence[float], b: int) -> list[float]:
    return [sum(xs[i:i + b]) / b for i in range(0, len(xs) - b + 1, b)]


def estimate(xs: Sequence[float], alpha: float, min_windows: int, sd_floor: float = SD_FLOOR) -> Bounds:
    """The sequence's bounds after the windows `xs` (in order). Blocks double while their lag-1 autocorrelation is
    above LAG1_LIMIT and at least MIN_BLOCKS would remain; the bounds are NaN until min_windows windows."""
    n = len(xs)
    if n == 0:
        return Bounds(math.nan, math.nan, math.nan, 0, 1, math.nan, math.nan)
    b, blocks = 1, list(xs)
    lag = _lag1(blocks)
    while lag > LAG1_LIMIT and n // (2 * b) >= MIN_BLOCKS:
        b *= 2
        blocks = _blocks(xs, b)
        lag = _lag1(blocks)
    k = len(blocks)
    mean = sum(blocks) / k   # complete blocks only: the last few windows join once their block is full
    if n < min_windows or k < 2:
        return Bounds(sum(xs) / n, math.nan, math.nan, n, b, lag, math.nan)
    sd = math.sqrt(sum((x - mean) ** 2 for x in blocks) / (k - 1))
    # the spread of a mean of correlated blocks: an AR(1) long-run variance from the lag-1 autocorrelation (bias
    # corrected by 1/k; none taken below zero), and a Student-t factor for the few blocks of an early look
    r = min(max((0.0 if math.isnan(lag) else lag) + 1.0 / k, 0.0), R_MAX)
    sd = max(sd * math.sqrt((1 + r) / (1 - r)) * student_factor(k - 1, alpha), sd_floor)
    w = margin(k, sd, alpha)
    return Bounds(mean, mean - w, mean + w, n, b, lag, sd)


def student_factor(df: int, alpha: float) -> float:
    """t(df) quantile over the normal one at 1 - alpha/2 (Cornish-Fisher expansion in 1/df): how much wider an
    interval must be when its deviation is estimated from df + 1 values."""
    z = _normal_quantile(1 - alpha / 2)
    if df < 1:
        return math.inf
    t = (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
         + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))
    return t / z


def _normal_quantile(p: float) -> float:
    lo, hi = -40.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2)) < p else (lo, mid)
    return (lo + hi) / 2


JUMP = math.log(2.0)   # a latency window whose value lies a factor 2 or more from the median window's


def jumps(xs: Sequence[float]) -> int:
    """How many windows lie a factor 2 or more from the median window (log ratios), when they are a few among many
    calm ones (2 to a quarter of the windows; else 0): what a quantile between two modes of the latency looks like,
    each window's quantile landing in one mode or the other (bench/tail_cliff.py) and the sequence narrowing
    slowly. Windows that all scatter widely are noise, not two modes."""
    if len(xs) < 3:
        return 0
    median = statistics.median(xs)
    k = sum(abs(x - median) >= JUMP for x in xs)
    return k if 2 <= k <= len(xs) // 4 else 0


def blocks_to_decide(est: Bounds, ship: float, limit: float, alpha: float) -> int | None:
    """About how many more blocks until one boundary is crossed, if the mean and deviation stay as they are: the
    sequence's half-width must fall below the larger of (mean - ship) and (limit - mean); both positive whenever the
    mean lies between them, and one of them is at least (limit - ship) / 2. None without an estimate yet."""
    if math.isnan(est.sd) or est.sd <= 0:
        return None
    gap = max(est.mean - ship, limit - est.mean)
    k = est.blocks
    if margin(k, est.sd, alpha) < gap:
        return 0
    lo, hi = k, max(2 * k, 2)
    while margin(hi, est.sd, alpha) >= gap:
        lo, hi = hi, hi * 2
        if hi > 10 ** 9:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if margin(mid, est.sd, alpha) < gap else (mid, hi)
    return hi - k


# -- windows -----------------------------------------------------------------------------------------------------

def window_need(q: float | None, window_requests: int, window_tail: int) -> int:
    """Observations per arm before a window of a q-quantile (None: error rate) closes."""
    if q is None:
        return window_requests
    return max(window_requests, math.ceil(window_tail / (1.0 - q) - 1e-9))


def close_latency(p: Pending, q: float) -> float:
    """x of a latency window: log(canary q / target q); NaN when either quantile is not positive and finite."""
    vc, vt = p.canary.quantile(q), p.target.quantile(q)
    if not (vc > 0 and vt > 0) or math.isinf(vc) or math.isinf(vt):
        return math.nan
    return math.log(vc / vt)


def close_errors(p: Pending) -> float:
    return p.errors_canary / p.requests_canary - p.errors_target / p.requests_target


def add_latency(p: Pending | None, hc: HistogramSnapshot, ht: HistogramSnapshot, start: float) -> Pending:
    if p is None or p.canary is None or p.target is None:
        return Pending(start, hc, ht)
    return Pending(p.start, p.canary.merge(hc), p.target.merge(ht))


def add_errors(p: Pending | None, req_c: float, err_c: float, req_t: float, err_t: float, start: float) -> Pending:
    if p is None:
        return Pending(start, requests_canary=req_c, errors_canary=err_c, requests_target=req_t, errors_target=err_t)
    return Pending(p.start, requests_canary=p.requests_canary + req_c, errors_canary=p.errors_canary + err_c,
                   requests_target=p.requests_target + req_t, errors_target=p.errors_target + err_t)


def mean_window_s(ws: Iterable[Window]) -> float:
    ws = list(ws)
    if not ws:
        return math.nan
    return max((ws[-1].end - ws[0].start) / len(ws), 1e-9)


def observe(state: SequenceState, variants: Mapping, policy, start: float, end: float) -> SequenceState:
    """Add one observation window ([start, end], VariantData per role) to every check series' open window, closing
    those that have enough on both arms. Canary against policy.compare_to; and, when the policy asks for it
    (`replica_aa`), production against baseline as a live A/A (shown, never decided on)."""
    from .policy import ERROR_RATE   # policy.py is a leaf; imported here to keep this module's top light

    pairs = [("", variants.get("canary"), variants.get(policy.compare_to))]
    if policy.compare_to == "baseline" and variants.get("production") is not None:
        pairs.append((AA_PREFIX, variants.get("production"), variants.get("baseline")))
    windows, pending = dict(state.windows), dict(state.pending)
    for prefix, c, t in pairs:
        if c is None or t is None:
            continue
        for check in policy.checks:
            if check.metric == ERROR_RATE:
                key = prefix + series_key(check.name, ERROR_RATE)
                p = add_errors(pending.get(key), c.requests, c.errors, t.requests, t.errors, start)
                need = window_need(None, policy.window_requests, policy.window_tail_samples)
                if min(p.requests_canary, p.requests_target) >= need and end - p.start >= policy.window_s - 1e-9:
                    windows[key] = (*windows.get(key, ()), Window(close_errors(p), p.requests_canary,
                                                                  p.requests_target, p.start, end))
                    pending.pop(key, None)
                else:
                    pending[key] = p
                continue
            need = window_need(check.quantile, policy.window_requests, policy.window_tail_samples)
            for series in sorted(k for k in c.histograms if k == check.metric or k.startswith(check.metric + "{")):
                if series not in t.histograms:
                    continue
                key = prefix + series_key(check.name, series)
                p = add_latency(pending.get(key), c.histograms[series], t.histograms[series], start)
                if min(p.canary.total, p.target.total) < need or end - p.start < policy.window_s - 1e-9:
                    pending[key] = p
                    continue
                pending.pop(key, None)
                x = close_latency(p, check.quantile)
                if not math.isnan(x):
                    windows[key] = (*windows.get(key, ()), Window(x, p.canary.total, p.target.total, p.start, end))
    running = dict(state.running)
    for key, ws in windows.items():
        if ws is state.windows.get(key):
            continue   # no new window for this key
        name = key[len(AA_PREFIX):] if key.startswith(AA_PREFIX) else key
        check = name.partition("@")[0]
        n_series = sum(1 for k in windows if k.startswith(check + "@")) or 1
        est = estimate([w.x for w in ws], policy.alpha / len(policy.checks) / n_series, policy.min_windows)
        if not math.isnan(est.lower):
            lo, hi = running.get(key, (-math.inf, math.inf))
            running[key] = (max(lo, est.lower), min(hi, est.upper))
    return SequenceState(windows, pending, running)

