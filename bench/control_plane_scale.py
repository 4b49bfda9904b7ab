"""How many concurrent rollouts one control plane drives: the real Worker and Store (SQLite on disk, WAL, fsync per
commit) with simulated deployers and metrics sources that answer like real ones.

The deployer reports production, baseline and canary ready (one replica each) and records every call; the metrics
source returns, per variant, window deltas of the four engine histograms (request latency of /v1/completions, TTFT,
ITL, e2e) in the engine's 138-bucket layout, drawn from lognormal latencies at 20 requests/s per variant with 0.2 %
errors (numpy multinomial over the bucket probabilities): the same shapes and sizes the scrape and Prometheus
sources produce, so reconcile, assess and the stored evidence cost what they cost in production. Every rollout
checks at every pass (check_interval = 0.8 x the worker interval: with check_interval = interval, a pass that
starts earlier in its round than the one before skips its check), the worst case for CPU and store growth.

    .venv/bin/python bench/control_plane_scale.py                     # 100 and 1,000 rollouts, 5 s interval
    .venv/bin/python bench/control_plane_scale.py --rollouts 1000 --passes 6 --interval 5

Per pass: the wall time of the whole round (tick until every rollout's pass has finished: the shortest interval the
worker can keep), the latency of each rollout's pass (P50/P99), process CPU seconds per round (and per rollout pass:
the figure other jobs on a shared machine disturb least); and the store's growth per check, scaled to a day of
checks. The 1-minute load average is printed after each size.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from sits.control_plane.adapters.deploy import VariantStatus, normalize_weights  # noqa: E402
from sits.control_plane.adapters.metrics import MetricsWindow, NoDataError  # noqa: E402
from sits.control_plane.analysis import E2E, ITL, REQUEST_LATENCY, TTFT, HistogramSnapshot, Policy, VariantData
from sits.control_plane.analysis.promql import series_key  # noqa: E402
from sits.control_plane.service.rollouts import start_rollout  # noqa: E402
from sits.control_plane.store.db import Store  # noqa: E402
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig
from sits.wire.buckets import LATENCY_BUCKETS  # noqa: E402

BOUNDS = tuple(LATENCY_BUCKETS) + (math.inf,)
# metric -> (median seconds, sigma): a small model on a GPU
SHAPES = {series_key(REQUEST_LATENCY, {"route": "/v1/completions"}): (0.120, 0.5), TTFT: (0.030, 0.6),
          ITL: (0.004, 0.3), E2E: (0.120, 0.5)}


def _bucket_probs(median: float, sigma: float) -> np.ndarray:
    edges = np.array(LATENCY_BUCKETS)
    z = (np.log(edges) - math.log(median)) / sigma
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    p = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    return p / p.sum()


PROBS = {k: _bucket_probs(*v) for k, v in SHAPES.items()}


class SimDeployer:
    """The Deployer protocol over a dict: every variant ready at once, like a local deployer whose engines answer."""

    def __init__(self) -> None:
        self.variants: dict[str, dict[str, str]] = {}
        self.weights: dict[str, dict[str, int]] = {}
        self.calls = 0
        self._lock = threading.Lock()

    def deploy(self, spec, interrupted=None) -> None:
        with self._lock:
            self.calls += 1
            self.variants.setdefault(spec.service, {})[spec.role] = spec.kernels

    def set_weights(self, service, weights) -> None:
        with self._lock:
            self.calls += 1
            self.weights[service] = normalize_weights(weights)

    def status(self, service):
        with self._lock:
            roles = dict(self.variants.get(service, {}))
        return {r: VariantStatus(r, True, 1, 1, f"http://10.0.0.1/{service}/{r}", f"1/1 ready; kernels {k}",
                                 (f"http://10.0.0.1/{service}/{r}",)) for r, k in roles.items()}

    def promote(self, service) -> None:
        with self._lock:
            self.calls += 1
            v = self.variants.get(service, {})
            v["production"] = v.pop("canary", v.get("production", "torch"))
            v.pop("baseline", None)

    def rollback(self, service) -> None:
        with self._lock:
            self.calls += 1
            v = self.variants.get(service, {})
            v.pop("canary", None)
            v.pop("baseline", None)

    def delete(self, service, role=None) -> None:
        with self._lock:
            self.variants.pop(service, None) if role is None else self.variants.get(service, {}).pop(role, None)

    def router_url(self, service):
        return None

    def close(self) -> None:
        pass


class SimSource:
    """Window deltas of the engine histograms per variant: `rate` requests/s, lognormal latencies, 0.2 % errors."""
    name = "sim"

    def __init__(self, rate: float = 20.0, seed: int = 0) -> None:
        self.rate = rate
        self._local = threading.local()
        self._seed = seed

    def _rng(self) -> np.random.Generator:
        g = getattr(self._local, "rng", None)
        if g is None:
            g = self._local.rng = np.random.default_rng([self._seed, threading.get_ident()])
        return g

    def window(self, service, targets, start, end, metrics=(REQUEST_LATENCY,), required=()):
        missing = [r for r in required if r not in targets]
        if missing:
            raise NoDataError(f"no {missing}")
        if start is None:
            return MetricsWindow(None, end, {}, self.name, {})
        rng, n = self._rng(), max(0, int(round((end - start) * self.rate)))
        variants = {}
        for role in targets:
            hists = {}
            for key, p in PROBS.items():
                counts = np.cumsum(rng.multinomial(n, p)).astype(float)
                mean = SHAPES[key][0] * math.exp(SHAPES[key][1] ** 2 / 2)
                hists[key] = HistogramSnapshot(BOUNDS, tuple(counts), n * mean)
            variants[role] = VariantData(hists, float(n), float(rng.binomial(n, 0.002)))
        queries = {r: f"sim://{service}/{r}" for r in targets}
        return MetricsWindow(start, end, variants, self.name, queries)

    def close(self) -> None:
        pass


def run(n: int, passes: int, interval: float, workdir: str) -> dict:
    path = os.path.join(workdir, f"scale-{n}.db")
    store = Store(path)
    # latency checks only: the correctness gate replays prompts against engines, which are simulated here
    policy = Policy(steps=(5, 10, 25, 50, 100), check_interval_s=0.8 * interval, warmup_s=0.0, min_samples=50,
                    inconclusive_limit=10_000, max_duration_s=86400.0, correctness={"enabled": False})
    for i in range(n):
        start_rollout(store, f"svc{i:04d}", "triton-v1.1", "triton-v1", policy, actor="bench")
    deployer, source = SimDeployer(), SimSource()
    worker = Worker(store, deployer, source, config=WorkerConfig(interval_s=interval, lease_ttl_s=max(30, 3 * interval)))
    lat: list[float] = []
    lock = threading.Lock()
    inner = worker.reconcile_rollout

    def timed(rid, **kw):
        t = time.perf_counter()
        try:
            return inner(rid, **kw)
        finally:
            with lock:
                lat.append(time.perf_counter() - t)
    worker.reconcile_rollout = timed
    rounds, cpus = [], []
    # the first two rounds deploy (PENDING -> INITIALIZING -> PROGRESSING) and are not measured
    for i in range(passes + 2):
        if i == 2:
            lat.clear()
            checks0, size0 = _checks(store), _size(path)
        c0, t0 = time.process_time(), time.perf_counter()
        worker.run_once()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if i >= 2:
            rounds.append(wall)
            cpus.append(cpu)
        time.sleep(max(0.0, interval - wall))
    checks = _checks(store) - checks0
    grown = _size(path) - size0
    per_check = grown / checks if checks else float("nan")
    phases = {}
    for r in store.list(limit=n):
        phases[r.phase.value] = phases.get(r.phase.value, 0) + 1
    store.close()
    lat.sort()
    checks_per_day = n * 86400 / interval
    return {"rollouts": n, "passes": passes, "interval_s": interval,
            "round_p50_s": statistics.median(rounds), "round_max_s": max(rounds),
            "pass_p50_ms": 1000 * lat[len(lat) // 2], "pass_p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
            "cpu_per_round_s": statistics.median(cpus), "checks": checks, "bytes_per_check": per_check,
            "store_gb_per_day": per_check * checks_per_day / 1e9, "phases": phases}


def _checks(store: Store) -> int:
    return store._rows("SELECT COUNT(*) FROM checks")[0][0]


def _size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--workdir", default=None, help="where the store goes (default: a temp dir on /tmp's disk)")
    a = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d')} · {platform.processor() or platform.machine()} · {os.cpu_count()} CPUs "
          f"(affinity {len(os.sched_getaffinity(0))}) · python {platform.python_version()} · commit {commit}")
    with tempfile.TemporaryDirectory(prefix="sits-scale-", dir=a.workdir) as d:
        for n in a.rollouts:
            r = run(n, a.passes, a.interval, d)
            print(f"{n:5d} rollouts, {a.interval:g} s interval: round p50 {r['round_p50_s']:.2f} s "
                  f"(max {r['round_max_s']:.2f}); pass p50 {r['pass_p50_ms']:.1f} ms p99 {r['pass_p99_ms']:.1f} ms; "
                  f"CPU {r['cpu_per_round_s']:.2f} s/round ({1000 * r['cpu_per_round_s'] / n:.2f} ms/pass); "
                  f"{r['checks']} checks, "
                  f"{r['bytes_per_check'] / 1024:.1f} KiB/check -> {r['store_gb_per_day']:.1f} GB/day; "
                  f"phases {r['phases']}; load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
