"""Rollouts under sequential statistics (Policy.statistics "sequential", the default) for the browser and present
tests of the sequence's evidence (issue 38, issue 40's last bullet): built in a store by the real worker, state
machine and analysis (in-memory deployer, seeded noisy lognormal latencies, frozen clock).

- chat: a 1.6x slower canary, rolled back once a sequence's lower bound crossed its ship boundary;
- rank: a ~1.17x canary between the boundaries of P90 (ship +10 %, limit +25 %): progressing, inconclusive, with an
  expected time to decide; production runs next to the baseline, so the evidence has a live A/A (replica offset);
- embed: an equal canary, promoted;
- fixed: the same slow canary under statistics "fixed" (older rollouts' evidence): today's columns;
- tail: an equal canary whose latency has two modes, the slow one holding about 1 % of the requests: its P99 stays
  undecided and says that a few windows jump between the modes (TwoModeSource).
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.metrics import MetricsWindow
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, HistogramSnapshot, MetricCheck, Policy, VariantData
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.wire.buckets import LATENCY_BUCKETS

from tests.control_plane.worker.support import InMemoryDeployer

KEY = REQUEST_LATENCY + '{route="/v1/completions"}'
CHECKS = (MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.5),
          MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.25, ship_rel_delta=0.1),
          MetricCheck(ERROR_RATE, max_abs_delta=0.01))
POLICY = Policy(steps=(20, 50, 100), check_interval_s=10, warmup_s=5, checks=CHECKS, min_samples=50, window_s=10,
                min_windows=6, correctness={"enabled": False})
FIXED = Policy(**{**{k: getattr(POLICY, k) for k in ("steps", "check_interval_s", "warmup_s", "checks",
                                                      "min_samples")}, "statistics": "fixed",
                  "correctness": {"enabled": False}})
T0 = float(int(time.time()) - 600)


class NoisySource:
    """A MetricsSource: `rate` requests/s per variant in [start, end], lognormal latencies drawn afresh per window
    (seeded), the canary's scaled by `scale[service]`, production 3 % slower than the baseline (two identical
    engines are not identical), one error per ~500 requests on every variant."""
    name = "noisy"

    def __init__(self, rate: float = 20.0, scale: dict | None = None, seed: int = 7) -> None:
        self.rate, self.scale, self.seed = rate, scale or {}, seed

    def window(self, service, targets, start, end, metrics=(REQUEST_LATENCY,), required=()):
        if start is None:
            return MetricsWindow(None, end, {}, self.name, {})
        n = int(round((end - start) * self.rate))
        variants = {}
        for role in sorted(targets):
            # one stream per (window, role): the same draws whatever order the deployer lists the variants in
            rng = random.Random(f"{self.seed}/{service}/{role}/{end - T0:.0f}")
            s = {"canary": self.scale.get(service, 1.0), "production": 1.03}.get(role, 1.0)
            vals = self.latencies(rng, service, role, end, n, s)
            h = HistogramSnapshot.from_values(vals, LATENCY_BUCKETS) if n else HistogramSnapshot.empty(LATENCY_BUCKETS)
            errors = float(sum(rng.random() < 0.002 for _ in range(n)))
            variants[role] = VariantData({KEY: h}, float(n), errors)
        return MetricsWindow(start, end, variants, self.name, {r: f"noisy://{service}/{r}" for r in targets})

    def latencies(self, rng: random.Random, service: str, role: str, end: float, n: int, scale: float) -> list[float]:
        """One variant's n request latencies in the window ending at `end` (seconds)."""
        return [0.05 * scale * math.exp(0.4 * rng.gauss(0, 1)) for _ in range(n)]

    def close(self) -> None:
        pass


class TwoModeSource(NoisySource):
    """As NoisySource, but each window of each variant puts ~0.4 % of its requests in a 5x slower mode, and about one
    window in eight (per variant, seeded) 3 %: that window's P99 lands in the slow mode (prefill-carrying steps, as
    the GPU demo's inter-token latency: bench/tail_cliff.py)."""
    SLOW_WINDOWS, SLOW_SHARE = 0.12, 0.03

    def __init__(self, t0: float, seed: int) -> None:
        super().__init__(seed=seed)
        self.t0 = t0   # the draws depend on the time since the rollout's start, not on where the scenario puts it

    def latencies(self, rng: random.Random, service: str, role: str, end: float, n: int, scale: float) -> list[float]:
        rng = random.Random(f"modes/{self.seed}/{service}/{role}/{end - self.t0:.0f}")
        share = self.SLOW_SHARE if rng.random() < self.SLOW_WINDOWS else 0.004
        return [0.05 * scale * math.exp(0.3 * rng.gauss(0, 1)) * (5.0 if rng.random() < share else 1.0)
                for _ in range(n)]


@dataclass
class Scenario:
    store: Store
    slow: str
    undecided: str
    promoted: str
    fixed: str
    tail: str
    clock: float


def _drive(store, rid, deployer, source, t, passes, dt=5.0, until=None) -> float:
    now = [t]
    w = Worker(store, deployer, source, clock=lambda: now[0], owner="test-worker")
    for _ in range(passes):
        now[0] += dt
        w.reconcile_rollout(rid)
        if until is not None and until(store.get(rid)):
            break
    return now[0]


def build(path: str) -> Scenario:
    store = Store(path)
    deployer = InMemoryDeployer()
    t = T0

    def start(service, policy=POLICY, at=0.0):
        return start_rollout(store, service, "triton-v1.1", "triton-v1", policy, DeploySpec(), now=at,
                             actor="otto").id

    # production deployed first (as the demo does): its windows against the baseline's are the live A/A
    for svc in ("chat", "rank", "embed", "fixed", "tail"):
        deployer.deploy(VariantSpec(service=svc, role="production", kernels="triton-v1"))
    ended = lambda r: not r.active   # noqa: E731
    slow = start("chat", at=t)
    t = _drive(store, slow, deployer, NoisySource(scale={"chat": 1.6}, seed=1), t, 200, until=ended)
    promoted = start("embed", at=t + 10)
    t = _drive(store, promoted, deployer, NoisySource(seed=2), t + 10, 400, until=ended)
    fixed = start("fixed", FIXED, at=t + 10)
    t = _drive(store, fixed, deployer, NoisySource(scale={"fixed": 1.6}, seed=3), t + 10, 200, until=ended)
    undecided = start("rank", at=t + 10)
    t = _drive(store, undecided, deployer, NoisySource(scale={"rank": 1.17}, seed=4), t + 10, 24)
    tail = start("tail", at=t + 10)
    t = _drive(store, tail, deployer, TwoModeSource(t + 10, seed=1), t + 10, 24)
    for rid, phase in ((slow, Phase.ROLLED_BACK), (promoted, Phase.SUCCEEDED), (fixed, Phase.ROLLED_BACK),
                       (undecided, Phase.PROGRESSING), (tail, Phase.PROGRESSING)):
        got = store.get(rid)
        assert got.phase is phase, (rid, got.phase, got.reason)
    last = store.check(undecided, store.get(undecided).checks)["verdict"]
    p90 = next(r for r in last["results"] if r["check"] == CHECKS[1].name)
    assert p90["outcome"] == "inconclusive" and p90["eta_s"], p90   # between its boundaries, an expected time
    assert last["replica"], last
    tail_last = store.check(tail, store.get(tail).checks)["verdict"]
    p99 = next(r for r in tail_last["results"] if r["check"] == CHECKS[0].name)
    assert p99["outcome"] == "inconclusive" and p99["jumps"] >= 2, p99   # a few windows in the slow mode
    return Scenario(store, slow, undecided, promoted, fixed, tail, t)
