"""Every PromQL of every dashboard (panels, annotations, template variables), with Grafana's variables filled in,
runs against a real Prometheus and returns finite data: engine series scraped live from three real tiny engines
(production, baseline, canary — the canary answers 20 % of requests with 500), control-plane series backfilled as
one rollout's timeline. With the service variable pointing elsewhere the same queries return nothing."""
from __future__ import annotations

import json
import math
import threading
import time

import httpx
import pytest

from sits.control_plane.adapters.deploy.local import process
from sits.dashboards import generate
from tests.dashboards.support import (CONTROL_METRICS, control_plane_timeline, exprs, finite_points, query_range,
                                      substitute)
from tests.fixtures.prometheus import PrometheusServer, backfill
from tests.tiny_engine import start_tiny_engine
from tests.waiting import wait_http_ok

NAMESPACE, SERVICE = "sits-test", "chat"
BODY = {"model": "tiny", "prompt": "hello dashboards", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    """A Prometheus holding a backfilled rollout (from t0) and scraping three live engines under load."""
    d = tmp_path_factory.mktemp("dash")
    t0 = (int(time.time()) // 60) * 60 - 3600
    backfill(control_plane_timeline(t0, NAMESPACE, SERVICE), d / "data")
    engines = {"production": start_tiny_engine(d, "production", SERVICE),
               "baseline": start_tiny_engine(d, "baseline", SERVICE),
               "canary": start_tiny_engine(d, "canary", SERVICE, "--fault-error-rate", "0.2")}
    stop, server = threading.Event(), None

    def load():
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                for _, addr in engines.values():
                    try:
                        c.post(f"http://{addr}/v1/completions", json=BODY)
                    except httpx.HTTPError:
                        pass
    loader = threading.Thread(target=load, daemon=True)
    try:
        for proc, addr in engines.values():
            wait_http_ok(f"http://{addr}/readyz", 240, proc)
        loader.start()
        # scrapes every 1 s with 1 s to answer: an engine renders ~750 histogram lines per scrape (~18 ms of CPU when
        # idle), and a 250 ms timeout on a loaded 2-core CI machine left a variant's series empty (CI at 6ee7e69)
        server = PrometheusServer.start(d, data_dir=d / "data", scrape_interval="1s", scrape_targets=[
            {"targets": [addr for _, addr in engines.values()], "labels": {"namespace": NAMESPACE}}])
        # every variant has served in the last 10 s, its latency histograms included, and the canary has answered
        # errors
        server.wait_for(f'sum by (env) (increase(http_request_duration_seconds_count{{namespace="{NAMESPACE}"}}[10s]))'
                        ' > 0', lambda r: len(r) == 3, timeout=90)
        for metric in ("sits_time_to_first_token_seconds_count", "sits_inter_token_latency_seconds_count"):
            try:
                server.wait_for(f'sum by (env) (increase({metric}{{namespace="{NAMESPACE}"}}[10s])) > 0',
                                lambda r: len(r) == 3, timeout=90)
            except TimeoutError as e:
                raise TimeoutError(f"{e}\nscrape targets: {server.targets_health()}") from e
        server.wait_for('increase(http_request_duration_seconds_count{env="canary",status="500"}[10s]) > 0',
                        lambda r: len(r) == 1, timeout=60)
        yield server, t0
    finally:
        stop.set()
        loader.join(30)
        if server is not None:
            server.stop()
        for proc, _ in engines.values():
            process.stop(proc, 10)


def _window(expr: str, t0: int, service: str):
    """(substituted expr, start, end, step): control-plane series over the backfilled rollout, the rest live."""
    values = {"datasource": "prometheus", "namespace": NAMESPACE, "service": service}
    if any(m in expr for m in CONTROL_METRICS):
        values.update(__rate_interval="1m", __interval="30s", __range="10m")
        return substitute(expr, values), t0, t0 + 600, 15
    values.update(__rate_interval="10s", __interval="1s", __range="30s")
    now = time.time()
    return substitute(expr, values), now - 5, now, 1


def test_every_dashboard_query_returns_data(prom):
    server, t0 = prom
    dashboards = {name: json.loads(text) for name, text in generate.render_all().items()}
    assert set(dashboards) == {"engine.json", "canary.json", "control-plane.json"}
    empty, checked = [], 0
    for d in dashboards.values():
        for e in exprs(d):
            q, start, end, step = _window(e.expr, t0, SERVICE)
            if finite_points(query_range(server.url, q, start, end, step)) == 0:
                empty.append(f"{e.where}: {q}")
            checked += 1
    assert not empty, "queries without data:\n" + "\n".join(empty)
    assert checked >= 60   # every panel target, annotation and variable of the three dashboards


def test_queries_select_by_service(prom):
    """The same queries for a service that does not exist return nothing: the data above is the selected service's."""
    server, t0 = prom
    leaked = []
    for text in generate.render_all().values():
        for e in exprs(json.loads(text)):
            if "$service" in e.expr and e.kind != "variable":
                q, start, end, step = _window(e.expr, t0, "no-such-service")
                if finite_points(query_range(server.url, q, start, end, step)):
                    leaked.append(f"{e.where}: {q}")
    assert not leaked, "queries ignoring $service:\n" + "\n".join(leaked)


def _panel_exprs(name: str, title: str) -> list[str]:
    d = json.loads(generate.render_all()[name])
    (panel,) = [p for p in d["panels"] if p["title"] == title]
    return [t["expr"] for t in panel["targets"]]


def _annotation_expr(name: str, annotation: str) -> str:
    d = json.loads(generate.render_all()[name])
    return next(a["expr"] for a in d["annotations"]["list"] if a["name"] == annotation)


def _series(server, expr: str, t0: int) -> list[dict]:
    q, start, end, step = _window(expr, t0, SERVICE)
    return query_range(server.url, q, start, end, step)


def test_queries_show_what_happened(prom):
    """Not just data: the rollout's transitions, verdicts and weights as backfilled, and the engines' error rates
    as served (the canary fails 20 % of its requests, the others none)."""
    server, t0 = prom
    entered = {s["metric"]["phase"]: float(s["values"][0][0])
               for s in _series(server, _annotation_expr("canary.json", "Rollout phase"), t0)}
    assert entered == {"pending": t0, "initializing": t0 + 15, "progressing": t0 + 30, "rolling_back": t0 + 450,
                       "rolled_back": t0 + 480}
    verdicts = {s["metric"]["outcome"]: float(s["values"][0][0])
                for s in _series(server, _annotation_expr("canary.json", "Check verdicts"), t0)}
    assert verdicts == {"inconclusive": t0 + 60, "pass": t0 + 120, "fail": t0 + 435}
    (weight,) = _series(server, _panel_exprs("canary.json", "Canary weight over time")[0], t0)
    assert {float(v) for _, v in weight["values"]} == {0.0, 10.0, 25.0}
    rollbacks = _series(server, _panel_exprs("control-plane.json", "Rollbacks by reason")[0], t0)
    assert {s["metric"]["reason"] for s in rollbacks} == {"check_failed"}
    errors = {}
    for expr in _panel_exprs("canary.json", "Error rate per variant"):
        (s,) = _series(server, expr, t0)
        env = next(e for e in ("production", "baseline", "canary") if f'env="{e}"' in expr)
        # a point whose rate window saw no request is 0/0 = NaN (nothing to show), not an error rate
        errors[env] = [x for x in (float(v) for _, v in s["values"]) if not math.isnan(x)]
        assert errors[env], (env, s["values"])
    assert max(errors["production"]) == max(errors["baseline"]) == 0.0
    # the canary's panel shows its errors (the fixture waited for some to be scraped) and never more than a 20 %
    # fault rate can give; its mean over the range depends on when the scrapes landed, so it is not asserted
    assert max(errors["canary"]) > 0 and all(0 <= v <= 0.6 for v in errors["canary"])
    by_env = _series(server, _panel_exprs("engine.json", "Request rate")[0], t0)
    assert {s["metric"]["env"] for s in by_env} == {"production", "baseline", "canary"}
