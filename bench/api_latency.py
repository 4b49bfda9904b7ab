"""API latency of the control plane with a big store: 1,000 rollouts (100 services x 10) and 100,000 checks with real
evidence, served by waitress over HTTP on loopback (the same app `sits-control serve` runs).

    python bench/api_latency.py [--rollouts 1000] [--checks-per-rollout 100] [--requests 200]

Each check's evidence comes from the real state machine: `reconcile` is driven once with canned lognormal windows
(production, baseline, canary; request latency per route, TTFT, inter-token) and the checks it records are stored
for every rollout. Prints p50/p99 per route and the bytes the detail page loads (HTML + detail + series + compact
checks shown + events; static assets are cached by the browser and listed apart). `--keep FILE` keeps the store
(~4 GB at the defaults) for a faster second run.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import waitress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sits.control_plane.analysis import ITL, REQUEST_LATENCY, TTFT, HistogramSnapshot, Policy, VariantData  # noqa: E402
from sits.control_plane.web import create_app  # noqa: E402
from sits.control_plane.rollout import Observation, Phase, Rollout, reconcile  # noqa: E402
from sits.control_plane.adapters.deploy.spec import DeploySpec  # noqa: E402
from sits.control_plane.store.db import Store  # noqa: E402
from sits.control_plane.web.users import Users, token_sha256  # noqa: E402
from sits.wire.buckets import LATENCY_BUCKETS  # noqa: E402

TOKEN = "bench-token"
KEYS = {REQUEST_LATENCY + '{route="/v1/completions"}': 0.05, REQUEST_LATENCY + '{route="/v1/chat/completions"}': 0.08,
        TTFT: 0.02, ITL: 0.004}


def _hist(n: int, median: float, sigma: float = 0.4) -> HistogramSnapshot:
    z = statistics.NormalDist()
    return HistogramSnapshot.from_values([median * math.exp(sigma * z.inv_cdf((i + 0.5) / n)) for i in range(n)],
                                         LATENCY_BUCKETS)


def template_checks(n_checks: int) -> tuple[Rollout, tuple]:
    """Drive reconcile until it has recorded n_checks checks; returns the final state and its checks."""
    policy = Policy(steps=(5, 10, 25, 50, 100), check_interval_s=10, warmup_s=0, min_samples=10 ** 9, correctness={"enabled": False},
                    inconclusive_limit=100_000, max_duration_s=30 * 86400)   # the policy bounds
    r = Rollout("template", "svc", "triton-v1.1", "triton-v1", policy, created_at=0.0, phase_since=0.0)
    checks, t, windows = [], 0.0, {}
    for role, scale in (("production", 1.0), ("baseline", 1.0), ("canary", 1.05)):
        windows[role] = VariantData({k: _hist(60, m * scale) for k, m in KEYS.items()}, 60.0, 0.0)
    while len(checks) < n_checks:
        t += 5.0
        obs = Observation(t - 5.0 if r.observed_until is not None else None, t, windows, "bench", {"canary": "q"})
        r, _ = reconcile(r, obs, t)
        checks.extend(r.new_checks)
    return r, tuple(checks[:n_checks])


def populate(store: Store, n_rollouts: int, n_checks: int) -> list[str]:
    final, checks = template_checks(n_checks)
    ids, per_service = [], 10
    t0 = time.time() - n_rollouts * 3600
    for i in range(n_rollouts):
        svc, k = f"svc-{i // per_service:03d}", i % per_service
        rid = f"{svc}-{k:02d}"
        created = t0 + i * 3600
        phase = Phase.PROGRESSING if k == per_service - 1 else (Phase.SUCCEEDED if k % 2 else Phase.ROLLED_BACK)
        r = store.create_rollout(Rollout(rid, svc, "triton-v1.1", "triton-v1", final.policy, created_at=created,
                                         phase_since=created), DeploySpec())
        store.save(replace(final, id=rid, service=svc, phase=phase, created_at=created, version=r.version,
                           new_checks=checks, new_events=()))
        ids.append(rid)
    return ids


def measure(client: httpx.Client, path: str, n: int) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(n):
        t = time.perf_counter()
        r = client.get(path)
        times.append(time.perf_counter() - t)
        r.raise_for_status()
        size = len(r.content)
    times.sort()
    return times[len(times) // 2] * 1000, times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)] * 1000, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--checks-per-rollout", type=int, default=100)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--keep", default=None, help="store file to keep (and reuse when it exists) instead of a temp one")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sits-bench-") as d:
        path = Path(a.keep or Path(d) / "bench.db")
        reuse = path.exists()
        store = Store(str(path))
        t = time.perf_counter()
        ids = [r.id for r in reversed(store.list_summaries(limit=10 ** 6))] if reuse else \
            populate(store, a.rollouts, a.checks_per_rollout)
        n_checks = sum(store.get(i).checks for i in ids[:1]) * len(ids)
        size_mb = path.stat().st_size / 2 ** 20
        print(f"store: {len(ids)} rollouts, {n_checks} checks, {size_mb:.0f} MiB (populated in "
              f"{time.perf_counter() - t:.0f} s)")
        users = Users.from_dict({"users": [{"name": "bench", "role": "admin", "token_sha256": token_sha256(TOKEN)}]})
        app = create_app({"STORE": store, "SITS_USERS": users, "SECRET_KEY": "bench"})
        server = waitress.create_server(app, host="127.0.0.1", port=0, threads=4)
        th = threading.Thread(target=server.run, daemon=True)
        th.start()
        base = f"http://127.0.0.1:{server.effective_port}"
        active, done = ids[-1], ids[-2]
        routes = [("list (50 newest)", "/api/v1/rollouts"), ("list ?service= (10)", "/api/v1/rollouts?service=svc-050"),
                  ("list ?phase=progressing (50)", "/api/v1/rollouts?phase=progressing"),
                  ("detail", f"/api/v1/rollouts/{active}"), ("series", f"/api/v1/rollouts/{active}/series"),
                  ("checks ?view=compact", f"/api/v1/rollouts/{active}/checks?view=compact"),
                  ("checks ?view=compact&last=10", f"/api/v1/rollouts/{active}/checks?view=compact&last=10"),
                  ("events", f"/api/v1/rollouts/{active}/events"), ("detail page (HTML)", f"/rollouts/{active}"),
                  ("detail of a finished one", f"/api/v1/rollouts/{done}"), ("metrics", "/metrics")]
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False) as c:
            for _, path in routes:   # warm: first-touch of the page cache, headline cache
                c.get(path)
            print(f"{'route':32} {'p50 ms':>8} {'p99 ms':>8} {'bytes':>9}   ({a.requests} requests each, 1 client)")
            sizes = {}
            for name, path in routes:
                p50, p99, size = measure(c, path, a.requests if name != "metrics" else max(20, a.requests // 10))
                sizes[name] = size
                print(f"{name:32} {p50:8.1f} {p99:8.1f} {size:9d}")
            page = sum(sizes[k] for k in ("detail page (HTML)", "series", "checks ?view=compact&last=10", "events"))
            static = sum(len(c.get(f"/static/{f}").content) for f in (
                "app.css", "js/common.js", "js/charts.js", "js/detail.js", "vendor/uplot/uPlot.iife.min.js",
                "vendor/uplot/uPlot.min.css"))
            print(f"detail page first load: {page} bytes of data (HTML with the detail embedded + series + the newest "
                  f"10 compact checks + events) for {a.checks_per_rollout} checks; static assets {static} bytes "
                  "(cached)")
        server.close()
        store.close()


if __name__ == "__main__":
    main()
