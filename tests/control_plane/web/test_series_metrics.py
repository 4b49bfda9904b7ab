"""Chart series from stored checks (checked against histogram_quantile on the raw buckets), their size for a
one-hour rollout, and /metrics, /healthz, /readyz."""
from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from sits.control_plane.analysis import REQUEST_LATENCY, Policy, histogram_quantile
from sits.control_plane.web import create_app
from sits.control_plane.rollout import Phase
from sits.control_plane.web.series import thin
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

from .conftest import auth, drive, new_rollout


def _buckets(ev, role):
    """Every request-latency series of the variant merged, by hand (not through the code under test)."""
    merged: dict[float, float] = {}
    for key, h in ev["variants"][role]["histograms"].items():
        if key.split("{")[0] == REQUEST_LATENCY:
            for b, c in zip(h["bounds"], h["counts"]):
                b = float(b)
                merged[b] = merged.get(b, 0.0) + float(c)
    return sorted(merged.items())


def test_series_match_histogram_quantile_on_the_stored_buckets(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 10, scale=1.3)
    checks = store.checks(ro.id)
    s = client.get(f"/api/v1/rollouts/{ro.id}/series", headers=auth("viewer")).get_json()
    assert s["seq"] == [c["seq"] for c in checks] and s["t"] == [c["at"] for c in checks]
    m = s["metrics"][REQUEST_LATENCY]
    for i, ev in enumerate(checks):
        for role in ("production", "baseline", "canary"):
            b = _buckets(ev, role)
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                want = histogram_quantile(q, b)
                assert abs(m["quantiles"][role][name][i] - want) <= 1e-3 * want, (i, role, name)
    assert m["quantiles"]["canary"]["p99"][-1] > m["quantiles"]["baseline"]["p99"][-1]   # the canary is slower
    d99 = m["deltas"]["p99"]
    assert d99["checked"] is True and d99["threshold"] == 0.10
    bounded = [(lo, d, hi) for lo, d, hi in zip(d99["low"], d99["delta"], d99["high"]) if lo is not None]
    assert bounded and all(lo <= d <= hi for lo, d, hi in bounded)
    assert set(d99["outcome"]) <= {"pass", "fail", "inconclusive", None}
    later = client.get(f"/api/v1/rollouts/{ro.id}/series?since_seq={checks[-2]['seq']}", headers=auth("viewer"))
    assert later.get_json()["seq"] == [checks[-1]["seq"]]


def test_thinning_keeps_failures_and_the_last_check():
    checks = [{"seq": i, "verdict": {"outcome": "fail" if i == 7 else "pass"}} for i in range(1000)]
    kept = thin(checks, 100)
    seqs = [c["seq"] for c in kept]
    assert len(kept) <= 101 and 7 in seqs and seqs[-1] == 999 and seqs[0] == 0 and seqs == sorted(seqs)
    assert thin(checks[:50], 100) == checks[:50]


def test_one_hour_rollout_detail_data_is_under_200_kb(client, store):
    """A check every 10 s for an hour (360 checks): series, detail and the compact checks stay small."""
    ro = new_rollout(store, policy=Policy(correctness={"enabled": False}, steps=(10, 50, 100), check_interval_s=10, warmup_s=0, max_duration_s=7200,
                                          min_samples=10 ** 9, inconclusive_limit=100_000, on_inconclusive="pause"))
    drive(store, ro.id, 363, dt=10.0)
    assert store.get(ro.id).checks >= 355
    series = client.get(f"/api/v1/rollouts/{ro.id}/series", headers=auth("viewer")).data
    detail = client.get(f"/api/v1/rollouts/{ro.id}", headers=auth("viewer")).data
    body = json.loads(series)
    assert body["checks"] >= 355 and body["points"] <= 301
    assert len(series) + len(detail) < 200_000, (len(series), len(detail))


def _metrics(client) -> dict:
    text = client.get("/metrics").get_data(as_text=True)
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_are_computed_from_the_store(client, store):
    bad = new_rollout(store, "chat")
    drive(store, bad.id, 30, scale=2.0)
    assert store.get(bad.id).phase is Phase.ROLLED_BACK
    live = new_rollout(store, "embed", now=500.0)
    drive(store, live.id, 6, t0=500.0)
    m = _metrics(client)
    assert m[("sits_rollout_phase", (("phase", "rolled_back"), ("rollout", bad.id), ("service", "chat")))] == 1
    assert m[("sits_rollout_phase", (("phase", "progressing"), ("rollout", bad.id), ("service", "chat")))] == 0
    r = store.get(live.id)
    assert m[("sits_rollout_phase", (("phase", r.phase.value), ("rollout", live.id), ("service", "embed")))] == 1
    assert m[("sits_canary_weight_percent", (("rollout", live.id), ("service", "embed")))] == r.weight
    outcomes = {}
    for c in store.check_summaries(bad.id):
        outcomes[c["outcome"]] = outcomes.get(c["outcome"], 0) + 1
    for outcome, n in outcomes.items():
        assert m[("sits_rollout_checks_total", (("outcome", outcome), ("service", "chat")))] == n
    assert m[("sits_rollbacks_total", (("reason", "checks_failed"), ("service", "chat")))] == 1
    assert m[("sits_rollout_duration_seconds_count", (("outcome", "rolled_back"),))] == 1


def test_rollback_reason_aborted(client, store):
    ro = new_rollout(store)
    t = drive(store, ro.id, 3)
    client.post(f"/api/v1/rollouts/{ro.id}/abort", headers=auth("operator"))
    drive(store, ro.id, 3, t0=t)
    assert _metrics(client)[("sits_rollbacks_total", (("reason", "aborted"), ("service", "chat")))] == 1


def test_health_readiness_and_the_worker_histogram(store, users):
    t = [0.0]
    worker = Worker(store, InMemoryDeployer(), CannedSource(), config=WorkerConfig(interval_s=0.05, lease_ttl_s=1),
                    clock=lambda: t[0])
    app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "WORKER": worker})
    c = app.test_client()
    assert c.get("/healthz").status_code == 200
    r = c.get("/readyz")
    assert r.status_code == 503 and "worker" in r.get_json()["problems"][0]   # not started
    ro = new_rollout(store)
    worker.run_once()
    worker.start()
    try:
        assert c.get("/readyz").status_code == 200
    finally:
        worker.stop()
    assert c.get("/readyz").status_code == 503
    m = _metrics(c)
    assert m[("sits_reconcile_duration_seconds_count", ())] >= 1
    assert store.get(ro.id).phase is not Phase.PENDING   # the loop drove it


def test_effects_and_bounds_keep_the_digits_the_page_shows(store):
    # a bound of +15.9466 % (a GPU canary's ITL P90) rounded to 4 significant digits on the wire read "+16.0 %" on the
    # rollout page while the worker's log said +15.9 %: the series carry effects and bounds to 6
    from sits.control_plane.web.series import build_series
    ro = new_rollout(store)
    drive(store, ro.id, 10, scale=1.3)
    checks = store.checks(ro.id)
    checks = [c for c in checks if any(r.get("ci_high") is not None for r in c["verdict"]["results"])]
    result = next(r for r in checks[-1]["verdict"]["results"] if r.get("ci_high") is not None)
    result["ci_low"], result["ci_high"] = 0.016882939789049367, 0.15946640318512253
    gated = build_series(checks, "baseline")["gated"][result["check"]]
    assert f"{gated['high'][-1] * 100:.1f}" == "15.9" and f"{gated['low'][-1] * 100:.1f}" == "1.7"
    assert abs(gated["high"][-1] - 0.15946640318512253) < 1e-6
