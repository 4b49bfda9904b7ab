"""Do the product's decisions keep their promises on correlated latency? A CPU simulation through the real Policy and
reconcile() (control_plane/rollout/machine.py), simulated clock, both statistics methods side by side.

Latency of one request on one engine, as GPU serving produces it (bench/README in BENCHMARKS.md "Sequential
statistics" for the figures behind the defaults):
    base ~ lognormal(median, sigma)                      the request's own work
    x exp(step noise)    shared by the requests of one engine step (a batch of --batch requests)
    x exp(engine drift)  AR(1) per engine, --drift-sd stationary, --drift-tau s correlation time: windows of one
                         engine move together for tens of seconds, and canary and baseline do not share it
    x exp(common drift)  AR(1) shared by every engine (load, host): cancels in a paired window
    x exp(offset)        persistent per-engine offset, N(0, --offset-sd) per engine and run (start order, placement)
    x (1 + effect)       canary only
Each engine's requests land in the engine's real buckets (sits/wire/buckets.py LATENCY_BUCKETS); the worker observes window
deltas every --poll s and the policy checks every check_interval_s. The true effect a run's sequence should cover is
log(1 + effect) + offset_canary - offset_baseline (every factor is a scale: the quantiles move by exactly that).

    .venv/bin/python bench/sequential_sim.py                 # 1,000 runs per case and method (~15 min on 2 cores)
    .venv/bin/python bench/sequential_sim.py --runs 100      # a quick look
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sits.control_plane.analysis import HistogramSnapshot, MetricCheck, Policy, VariantData  # noqa: E402
from sits.control_plane.analysis.sequential import AA_PREFIX, estimate  # noqa: E402
from sits.control_plane.rollout import Observation, Phase, Rollout, reconcile  # noqa: E402
from sits.wire.buckets import LATENCY_BUCKETS  # noqa: E402

BOUNDS = tuple(LATENCY_BUCKETS) + (math.inf,)
EDGES = np.array(LATENCY_BUCKETS)
KEY = "sits_inter_token_latency_seconds"
EFFECTS = (0.0, 0.10, 0.28, 0.50)
LIMIT = 0.25


@dataclass(frozen=True)
class Noise:
    median: float = 0.012       # an inter-token time on a loaded GPU
    sigma: float = 0.35
    batch: int = 8              # requests per engine step sharing its noise
    step_sd: float = 0.15
    drift_sd: float = 0.05      # per engine, stationary
    drift_tau: float = 20.0     # seconds
    common_sd: float = 0.10
    common_tau: float = 60.0
    offset_sd: float = 0.02     # persistent per engine
    rate: float = 20.0          # observations per second per engine


def policy(method: str, **kw) -> Policy:
    """A GPU-demo-like policy: one checked step at 50 %, a P90 gate at +25 % and a P99 one at +50 %."""
    checks = (MetricCheck(KEY, quantile=0.90, max_rel_delta=LIMIT), MetricCheck(KEY, quantile=0.99, max_rel_delta=0.50))
    return Policy(steps=(50, 100), check_interval_s=5.0, warmup_s=5.0, checks=checks, min_samples=100,
                  min_tail_samples=2, failure_limit=2, inconclusive_limit=24, on_inconclusive="rollback",
                  max_duration_s=900.0, statistics=method, correctness={"enabled": False}, **kw)


class Engine:
    def __init__(self, rng, noise: Noise, scale: float):
        self.rng, self.n, self.scale = rng, noise, scale
        self.offset = rng.normal(0.0, noise.offset_sd)
        self.drift = rng.normal(0.0, noise.drift_sd)

    def window(self, dt: float, common: float) -> VariantData:
        n_, rng = self.n, self.rng
        a = math.exp(-dt / n_.drift_tau)
        self.drift = a * self.drift + math.sqrt(1 - a * a) * n_.drift_sd * rng.normal()
        k = int(rng.poisson(n_.rate * dt))
        lat = n_.median * np.exp(n_.sigma * rng.standard_normal(k))
        steps = np.repeat(np.exp(n_.step_sd * rng.standard_normal(k // n_.batch + 1)), n_.batch)[:k]
        lat *= steps * math.exp(self.drift + common + self.offset) * self.scale
        counts = np.cumsum(np.bincount(np.searchsorted(EDGES, lat), minlength=len(BOUNDS))).astype(float)
        h = HistogramSnapshot._trusted(BOUNDS, tuple(counts.tolist()), float(lat.sum()), float(k))
        return VariantData({KEY: h}, float(k), 0.0)


@dataclass
class Run:
    outcome: str            # rolled_back | promoted | timeout
    t: float                # seconds from first traffic to the decision
    missed: bool            # the P90 sequence excluded the true effect at some look (sequential only)
    truth: float            # the true relative P90 effect of this run (effect and both offsets)


def simulate(rng, method: str, effect: float, noise: Noise, poll: float = 1.0, **kw) -> Run:
    p = policy(method, **kw)
    r = Rollout("sim", "sim", "new", "old", p)
    r, _ = reconcile(r, None, 0.0)
    r, _ = reconcile(r, Observation(0.0, 1.0, {"baseline": VariantData(), "canary": VariantData()}), 1.0)
    base, canary = Engine(rng, noise, 1.0), Engine(rng, noise, 1.0 + effect)
    truth = math.log1p(effect) + canary.offset - base.offset
    a = math.exp(-poll / noise.common_tau)
    common, t, t0, missed = rng.normal(0.0, noise.common_sd), 1.0, r.started_at, False
    key = f"{KEY}:p90@{KEY}"
    alpha = p.alpha / len(p.checks)
    while t - t0 < p.max_duration_s + 5:
        common = a * common + math.sqrt(1 - a * a) * noise.common_sd * rng.normal()
        obs = {"baseline": base.window(poll, common), "canary": canary.window(poll, common)}
        r, _ = reconcile(r, Observation(t, t + poll, obs, source="sim"), t + poll)
        t += poll
        if method == "sequential" and r.new_checks and not missed:
            est = estimate([w.x for w in r.sequence.windows.get(key, ())], alpha, p.min_windows)
            missed = not math.isnan(est.lower) and not est.lower <= truth <= est.upper
        if r.phase in (Phase.ROLLING_BACK, Phase.PROMOTING, Phase.PAUSED):
            out = {Phase.ROLLING_BACK: "rolled_back", Phase.PROMOTING: "promoted", Phase.PAUSED: "paused"}[r.phase]
            if r.phase is Phase.ROLLING_BACK and "max duration" in r.reason:
                out = "timeout"
            return Run(out, t - t0, missed, math.expm1(truth))
    return Run("timeout", t - t0, missed, math.expm1(truth))


def clopper_pearson_upper(k: int, n: int, conf: float = 0.95) -> float:
    """One-sided upper bound of a binomial proportion (exact): the p with P(X <= k | n, p) = 1 - conf."""
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        cdf = sum(math.comb(n, i) * mid ** i * (1 - mid) ** (n - i) for i in range(k + 1))
        lo, hi = (mid, hi) if cdf > 1 - conf else (lo, mid)
    return hi


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000, help="runs per case and method")
    ap.add_argument("--methods", default="sequential,fixed")
    ap.add_argument("--effects", default=",".join(str(e) for e in EFFECTS))
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--policy", action="append", default=[], metavar="FIELD=VALUE",
                    help="a policy field for the sequential runs, e.g. window_s=10 (numbers)")
    for f in dataclasses.fields(Noise):
        ap.add_argument("--" + f.name.replace("_", "-"), type=float, default=f.default)
    args = ap.parse_args(argv)
    noise = Noise(**{f.name: (int if f.type == "int" else float)(getattr(args, f.name)) for f in dataclasses.fields(Noise)})
    print(f"# sequential_sim {time.strftime('%Y-%m-%d')} python {platform.python_version()}; {args.runs} runs per "
          f"case; limit +{LIMIT:.0%} (ship +{LIMIT / 2:.1%}) on P90, +50 % on P99; {noise}", flush=True)
    rows = []
    t_start = time.time()
    for method in args.methods.split(","):
        for effect in (float(e) for e in args.effects.split(",")):
            rng = np.random.default_rng([args.seed, int(effect * 1000), method == "fixed"])
            kw = {} if method == "fixed" else {k: (float(v) if "." in v else int(v))
                                               for k, v in (a.split("=", 1) for a in args.policy)}
            runs = [simulate(rng, method, effect, noise, **kw) for _ in range(args.runs)]
            n = len(runs)
            k_rb = sum(r.outcome == "rolled_back" for r in runs)
            k_pr = sum(r.outcome == "promoted" for r in runs)
            k_to = n - k_rb - k_pr
            times = sorted(r.t for r in runs if r.outcome != "timeout")
            med = times[len(times) // 2] if times else math.nan
            p90 = times[min(int(len(times) * 0.9), len(times) - 1)] if times else math.nan
            miss = sum(r.missed for r in runs) / n if method == "sequential" else math.nan
            # the guarantees are about the engines' true effect, offsets included: rollbacks among the runs whose
            # truth is a shippable change, promotions among those whose truth is at or over the limit
            small = [r for r in runs if r.truth <= LIMIT / 2]
            large = [r for r in runs if r.truth >= LIMIT]
            k_bad_rb = sum(r.outcome == "rolled_back" for r in small)
            k_bad_pr = sum(r.outcome == "promoted" for r in large)
            wrong = (f"rollback when truth<=ship {k_bad_rb}/{len(small)} (CP95 {clopper_pearson_upper(k_bad_rb, len(small)):.1%})"
                     if small else "") + (f" promote when truth>=limit {k_bad_pr}/{len(large)} "
                                         f"(CP95 {clopper_pearson_upper(k_bad_pr, len(large)):.1%})" if large else "")
            row = (method, effect, k_rb / n, clopper_pearson_upper(k_rb, n), k_pr / n, k_to / n, miss, med, p90, wrong)
            rows.append(row)
            print(f"{method:>10} {effect:+5.0%}: rollback {k_rb / n:6.1%} (CP95 upper {row[3]:6.1%}), promote "
                  f"{k_pr / n:6.1%}, undecided {k_to / n:5.1%}, sequence missed the truth {miss:6.1%}, decided in "
                  f"{med:5.0f} s median, {p90:5.0f} s P90; {wrong}  [{time.time() - t_start:.0f} s]", flush=True)
    print("\n| method | effect | rollback | CP95 upper | promote | undecided at 900 s | sequence ever missed | "
          "median s | P90 s | wrong decisions by the run's true effect |\n|---|---|---|---|---|---|---|---|---|---|")
    for m, e, rb, up, pr, to, miss, med, p90, wrong in rows:
        ms = "-" if math.isnan(miss) else f"{miss:.1%}"
        print(f"| {m} | {e:+.0%} | {rb:.1%} | {up:.1%} | {pr:.1%} | {to:.1%} | {ms} | {med:.0f} | {p90:.0f} | {wrong} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
