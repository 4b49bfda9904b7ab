"""Evaluation harness for the canary analysis: the real Policy + reconcile() on simulated traffic, simulated clock.

Latencies (lognormal, and a bimodal long-tail mix) are observed through the engine's real bucket layout
(sits.wire.buckets.LATENCY_BUCKETS): a window of n ~ Poisson(rate * dt) requests per variant lands in the buckets as a
Multinomial(n, P(bucket)), which is exactly what n independent observations produce. Every `tick` seconds the worker's
observation (window deltas, readiness) goes through `reconcile`; the request rate per variant is held constant.

    .venv/bin/python bench/canary_eval.py            # full run (a few minutes on 2 cores)
    .venv/bin/python bench/canary_eval.py --quick    # fewer rollouts, for a smoke test
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import platform
import sys
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sits.control_plane.analysis import HistogramSnapshot, Policy, VariantData, histogram_quantile  # noqa: E402
from sits.control_plane.rollout import Observation, Phase, Rollout, reconcile  # noqa: E402
from sits.wire.buckets import LATENCY_BUCKETS  # noqa: E402
from sits.wire.metrics import REQUEST_LATENCY  # noqa: E402

BOUNDS = tuple(LATENCY_BUCKETS) + (math.inf,)
KEY = REQUEST_LATENCY
_erf = np.frompyfunc(math.erf, 1, 1)


def _lognorm_cdf(x: np.ndarray, median: float, sigma: float) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    z = (np.log(np.maximum(x, 1e-300)) - math.log(median)) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + np.asarray(_erf(z), dtype=float))


@dataclass(frozen=True)
class Dist:
    """A latency distribution by its CDF; `scale` multiplies every latency, `tail_only` only those above its P95."""
    name: str
    parts: tuple[tuple[float, float, float], ...]   # (weight, median, sigma) lognormal components
    scale: float = 1.0
    tail_only: bool = False

    def base_cdf(self, x) -> np.ndarray:
        return sum(w * _lognorm_cdf(x, m, s) for w, m, s in self.parts)

    def cdf(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if not self.tail_only:
            return self.base_cdf(x / self.scale)
        p95 = self.quantile95()
        return np.where(x <= p95, self.base_cdf(x), self.base_cdf(np.maximum(p95, x / self.scale)))

    def quantile95(self) -> float:
        lo, hi = 1e-6, 1e4
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if float(self.base_cdf(mid)) < 0.95 else (lo, mid)
        return hi

    @functools.cache
    def bucket_probs(self) -> np.ndarray:
        cum = np.append(self.cdf(np.array(LATENCY_BUCKETS)), 1.0)
        p = np.diff(np.concatenate([[0.0], cum]))
        return np.clip(p, 0.0, None) / np.clip(p, 0.0, None).sum()

    def with_scale(self, r: float, tail_only: bool = False) -> "Dist":
        return Dist(self.name, self.parts, 1.0 + r, tail_only)


LOGNORMAL = Dist("lognormal", ((1.0, 0.050, 0.5),))
LONGTAIL = Dist("long-tail", ((0.97, 0.050, 0.4), (0.03, 0.400, 0.5)))  # 3 % slow requests (long generations)
BIMODAL = Dist("bimodal", ((0.9, 0.040, 0.3), (0.1, 0.300, 0.6)))      # adversarial: P90 falls in the gap


def _window(rng, probs: np.ndarray, rate: float, dt: float, err_p: float) -> VariantData:
    n = int(rng.poisson(rate * dt))
    counts = np.cumsum(rng.multinomial(n, probs)).astype(float)
    h = HistogramSnapshot(BOUNDS, tuple(counts.tolist()), 0.0, float(n))
    return VariantData({KEY: h}, float(n), float(rng.binomial(n, err_p)))


@dataclass
class RunResult:
    outcome: str          # rolled_back | promoted | paused | timeout
    t_decision: float     # seconds from the canary's first traffic to the outcome
    requests: float       # canary requests observed until the outcome
    checks: int


def simulate(rng, policy: Policy, base: Dist, canary: Dist, rate: float, *, tick: float = 10.0,
             horizon: float = 3600.0, err_p: float = 0.005) -> RunResult:
    pb, pc = base.bucket_probs(), canary.bucket_probs()
    # latency only: simulated traffic has no answers to check (the correctness gate: bench/correctness_gate.py)
    r = Rollout("sim", "sim", "new", "old", dataclasses.replace(policy, correctness={"enabled": False}))
    r, _ = reconcile(r, None, 0.0)
    ready = {"baseline": VariantData(), "canary": VariantData()}
    r, _ = reconcile(r, Observation(0.0, 1.0, ready), 1.0)
    t0, t, requests = r.started_at, 1.0, 0.0
    while t - t0 < horizon:
        t += tick
        obs = {"baseline": _window(rng, pb, rate, tick, err_p), "canary": _window(rng, pc, rate, tick, err_p)}
        requests += obs["canary"].requests
        r, _ = reconcile(r, Observation(t - tick, t, obs, source="sim"), t)
        if r.phase in (Phase.ROLLING_BACK, Phase.PROMOTING, Phase.PAUSED):
            return RunResult({Phase.ROLLING_BACK: "rolled_back", Phase.PROMOTING: "promoted",
                              Phase.PAUSED: "paused"}[r.phase], t - t0, requests, r.checks)
    return RunResult("timeout", t - t0, requests, r.checks)


def batch(seed: int, n: int, policy: Policy, base: Dist, canary: Dist, rate: float, **kw) -> list[RunResult]:
    rng = np.random.default_rng(seed)
    return [simulate(rng, policy, base, canary, rate, **kw) for _ in range(n)]


def frac(results, outcome: str, within: float | None = None) -> float:
    hits = [x for x in results if x.outcome == outcome and (within is None or x.t_decision <= within)]
    return len(hits) / max(len(results), 1)


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    p = k / n
    return (p + z * z / (2 * n) + z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)


def common_rule(seed: int, n_rollouts: int, dist: Dist, rate: float, threshold: float = 0.10,
                checks: int = 10, window: float = 60.0) -> tuple[float, float]:
    """Fail a check when the windowed P99 delta > threshold; roll back after one failed check."""
    rng = np.random.default_rng(seed)
    p = dist.bucket_probs()
    fails = np.zeros((n_rollouts, checks), dtype=bool)
    for i in range(n_rollouts):
        for j in range(checks):
            qs = []
            for _ in range(2):
                n = rng.poisson(rate * window)
                cum = np.cumsum(rng.multinomial(n, p)).astype(float)
                qs.append(histogram_quantile(0.99, zip(BOUNDS, cum)))
            fails[i, j] = qs[1] / qs[0] - 1.0 > threshold
    return float(fails.mean()), float(fails.any(axis=1).mean())


def analysis_inputs(n_rollouts: int) -> tuple[list, list]:
    """n active rollouts, each one observation away from a check with ~2,400 requests of step data per variant,
    production included (the canary 10 % slower), and those observations: what `analysis_cost` times."""
    rng = np.random.default_rng(7)
    p = LOGNORMAL.bucket_probs()
    rollouts, observations = [], []
    for i in range(n_rollouts):
        r = Rollout(f"r{i}", f"svc{i}", "new", "old", Policy(correctness={"enabled": False}))
        r, _ = reconcile(r, None, 0.0)
        ready = {role: VariantData() for role in ("production", "baseline", "canary")}
        r, _ = reconcile(r, Observation(0.0, 1.0, ready), 1.0)            # step 1 at t=1, warm-up until 11
        for start, now in ((11.0, 21.0), (21.0, 30.0)):                   # step data, no check yet (due at 31)
            r, _ = reconcile(r, Observation(start, now, {k: _window(rng, p, 80.0, 10.0, 0.005) for k in ready}), now)
        rollouts.append(r)
        observations.append(Observation(30.0, 41.0, {k: _window(rng, p, 80.0, 11.0, 0.005) for k in ready}))
    return rollouts, observations


def analysis_cost(n_rollouts: int = 100, repeats: int = 20) -> tuple[float, float]:
    """(best wall, median CPU) time in ms of one reconcile pass over `analysis_inputs(n_rollouts)`."""
    rollouts, observations = analysis_inputs(n_rollouts)
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = [reconcile(r, o, 41.0) for r, o in zip(rollouts, observations)]
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
        assert all(x[0].new_checks for x in out), "every rollout must have run a check"
    return float(np.min(wall)), float(np.median(cpu))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rollouts (smoke test)")
    ap.add_argument("--aa", type=int, default=1000, help="A/A rollouts per rate and distribution")
    ap.add_argument("--ab", type=int, default=300, help="A/B rollouts per case")
    args = ap.parse_args(argv)
    n_aa, n_ab = (100, 40) if args.quick else (args.aa, args.ab)
    policy = Policy()
    rows: list[tuple[str, str, str]] = []
    t_start = time.time()

    def emit(name: str, figure: str, target: str = "") -> None:
        rows.append((name, figure, target))
        print(f"{name}: {figure} {target} [{time.time() - t_start:.0f} s]", flush=True)

    print(f"# canary_eval: policy z_fail={policy.z_fail} z_pass={policy.z_pass} failure_limit={policy.failure_limit} "
          f"interval={policy.check_interval_s:g}s warmup={policy.warmup_s:g}s min_samples={policy.min_samples}; "
          f"{n_aa} A/A and {n_ab} A/B rollouts per case", flush=True)

    for dist in (LOGNORMAL, LONGTAIL, BIMODAL):
        for rate in (20.0, 100.0):
            res = batch(11 + int(rate), n_aa, policy, dist, dist, rate)
            k = sum(x.outcome == "rolled_back" for x in res)
            promoted = [x for x in res if x.outcome == "promoted"]
            med = np.median([x.t_decision for x in promoted]) if promoted else float("nan")
            emit(f"A/A {dist.name} {rate:g} req/s: false rollback", f"{k}/{n_aa} = {k / n_aa:.2%} "
                 f"(95% upper {wilson_upper(k, n_aa):.2%})", "<= 1 %")
            emit(f"A/A {dist.name} {rate:g} req/s: promoted / paused", f"{frac(res, 'promoted'):.1%} / "
                 f"{frac(res, 'paused'):.1%}, median {med:.0f} s to promote")
        for rate in (20.0, 100.0):
            per_check, per_rollout = common_rule(5 + int(rate), n_aa, dist, rate)
            emit(f"common rule (1-min P99 > +10 %, 1 strike) {dist.name} {rate:g} req/s",
                 f"{per_check:.1%} of good checks fail; {per_rollout:.0%} of good rollouts (10 checks) rolled back",
                 "(reference)")

    for r_, rate, within in ((0.50, 20.0, 90.0), (0.20, 100.0, 240.0)):
        res = batch(21 + int(rate), n_ab, policy, LOGNORMAL, LOGNORMAL.with_scale(r_), rate)
        ok = frac(res, "rolled_back", within)
        rb = [x for x in res if x.outcome == "rolled_back"]
        emit(f"A/B +{r_:.0%} at {rate:g} req/s: rolled back within {within:g} s", f"{ok:.1%} "
             f"(median {np.median([x.t_decision for x in rb]):.0f} s, p95 "
             f"{np.percentile([x.t_decision for x in rb], 95):.0f} s)", ">= 95 %")
        if r_ == 0.20:
            emit("A/B +20% at 100 req/s: canary requests to rollback", f"median "
                 f"{np.median([x.requests for x in rb]):.0f}, p95 {np.percentile([x.requests for x in rb], 95):.0f}",
                 "fixed test: ~18,000")
            p99_only = Policy(checks=(policy.checks[0], policy.checks[2]))
            res99 = batch(31, n_ab, p99_only, LOGNORMAL, LOGNORMAL.with_scale(r_), rate)
            rb99 = [x for x in res99 if x.outcome == "rolled_back"]
            emit("  same, P99-only policy: requests to rollback",
                 f"median {np.median([x.requests for x in rb99]):.0f}, p95 "
                 f"{np.percentile([x.requests for x in rb99], 95):.0f}; rolled back {frac(res99, 'rolled_back'):.1%}",
                 "fixed test: ~18,000")

    n_pc = max(n_ab // 2, 20)
    for rate in (20.0, 100.0):
        cells = []
        for r_ in (0.05, 0.10, 0.20, 0.50):
            res = batch(41 + int(100 * r_) + int(rate), n_pc, policy, LOGNORMAL, LOGNORMAL.with_scale(r_), rate,
                        horizon=1800.0)
            rb = [x.t_decision for x in res if x.outcome == "rolled_back"]
            cells.append(f"+{r_:.0%}: {frac(res, 'rolled_back'):.0%}"
                         + (f" ({np.median(rb):.0f} s)" if rb else "")
                         + (f" [promoted {frac(res, 'promoted'):.0%}]" if frac(res, "promoted") else ""))
        emit(f"power (rolled back within 30 min) {rate:g} req/s", ", ".join(cells))
    for rate in (20.0, 100.0):
        res = batch(51 + int(rate), n_pc, policy, LOGNORMAL, LOGNORMAL.with_scale(0.5, tail_only=True), rate,
                    horizon=1800.0)
        rb = [x.t_decision for x in res if x.outcome == "rolled_back"]
        emit(f"tail-only +50 % (slowest 5 %) {rate:g} req/s", f"rolled back {frac(res, 'rolled_back'):.0%}"
             + (f", median {np.median(rb):.0f} s" if rb else "") + f"; promoted {frac(res, 'promoted'):.0%}")
    # stress for the sequential rule: the adversarial A/A never pauses, so every step keeps looking for 30 minutes
    never_pause = Policy(inconclusive_limit=10_000)
    n_st = max(n_aa // 4, 20)
    res = batch(61, n_st, never_pause, BIMODAL, BIMODAL, 20.0, horizon=1800.0)
    k = sum(x.outcome == "rolled_back" for x in res)
    emit("A/A bimodal 20 req/s, never pausing, 60 looks per step", f"false rollback {k}/{n_st} = {k / n_st:.1%}, "
         f"mean {np.mean([x.checks for x in res]):.0f} looks", "(stress)")

    wall, cpu = analysis_cost()
    emit("one analysis pass over 100 active rollouts", f"{cpu:.1f} ms CPU (best wall {wall:.1f} ms, "
         f"load average {os.getloadavg()[0]:.1f})", "< 50 ms")
    print(f"\n# {time.strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'host'} ({os.cpu_count()} CPUs, "
          f"{platform.python_implementation()} {platform.python_version()}), {time.time() - t_start:.0f} s total")
    w = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b}  {c}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
