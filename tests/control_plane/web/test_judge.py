"""`POST /api/v1/judge` against a real Prometheus holding backfilled canary/baseline histograms, with the request and
response shapes Argo Rollouts (Web metric provider) and Flagger (webhook) use: a slow canary FAILs, an equal one
PASSes, too little data is INCONCLUSIVE; plus auth, bad input and a Prometheus that is down."""
import json
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from sits.control_plane.analysis import REQUEST_LATENCY
from sits.control_plane.web import create_app
from sits.control_plane.web.users import token_sha256
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig
from tests.control_plane.helpers import lat
from tests.control_plane.test_otel_spans import memory_tracing
from tests.fixtures.prometheus import PrometheusServer, backfill, format_value

from .accounts import TOKENS
from .conftest import auth

T0 = 1_700_000_000
T_END = T0 + 300
STEPS = 20
# service -> (requests per variant over the 5 minutes, canary latency scale)
CASES = {"equal": (20000, 1.0), "slow": (20000, 1.5), "sparse": (30, 1.0)}
EXPECT = {"equal": "pass", "slow": "fail", "sparse": "inconclusive"}


def _lines(service: str, env: str, n: int, scale: float) -> list[str]:
    """Cumulative buckets growing linearly from 0 at T0 to the whole histogram at T_END, one sample per 15 s."""
    h = lat(n, scale)
    lab = f'service="{service}",env="{env}",route="/v1/completions",status="200"'
    out = []
    for k in range(STEPS + 1):
        t, f = T0 + k * 300 // STEPS, k / STEPS
        for le, c in h.buckets():
            out.append(f'{REQUEST_LATENCY}_bucket{{{lab},le="{format_value(le)}"}} {format_value(c * f)} {t}')
        out.append(f"{REQUEST_LATENCY}_count{{{lab}}} {format_value(h.count * f)} {t}")
    return out


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    lines = []
    for service, (n, scale) in CASES.items():
        lines += _lines(service, "baseline", n, 1.0) + _lines(service, "canary", n, scale)
    text = "\n".join([f"# TYPE {REQUEST_LATENCY}_bucket gauge"] + [x for x in lines if "_bucket" in x]
                     + [f"# TYPE {REQUEST_LATENCY}_count gauge"] + [x for x in lines if "_count" in x] + ["# EOF"])
    d = tmp_path_factory.mktemp("judge")
    backfill(text + "\n", d / "data")
    server = PrometheusServer.start(d, data_dir=d / "data")
    yield server
    server.stop()


@pytest.fixture
def client(store, users, prom):
    return create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "k",
                       "CLOCK": lambda: T_END, "JUDGE_PROMETHEUS": PrometheusConfig(prom.url)}).test_client()


def selector(service: str, env: str) -> str:
    return f'{{service="{service}",env="{env}"}}'


@pytest.mark.parametrize("service", list(CASES))
def test_argo_rollouts_web_provider(client, service):
    # what the AnalysisTemplate in docs/judge.md sends: method POST, body (a JSON string), these headers
    body = json.dumps({"canary": {"selector": selector(service, "canary")},
                       "baseline": {"selector": selector(service, "baseline")}, "window": "5m"})
    r = client.post("/api/v1/judge", data=body, headers={**auth("viewer"), "Content-Type": "application/json"})
    assert r.status_code == 200   # Argo: any other status is an Error measurement, not a verdict
    out = r.get_json()
    result = out["verdict"]   # jsonPath "{$.verdict}"
    assert result == EXPECT[service], out["reason"]
    # successCondition result == "pass"; failureCondition result == "fail"; neither: Argo's Inconclusive
    assert (result == "pass", result == "fail") == (out["pass"], out["fail"])
    assert out["inconclusive"] == (service == "sparse")
    n = CASES[service][0]
    assert out["variants"]["canary"]["requests"] == pytest.approx(n, rel=0.01)
    assert out["window"] == {"start": T_END - 300, "end": T_END, "seconds": 300.0}
    assert 'service="%s",env="canary"' % service in out["queries"]["canary:requests"]
    p99 = next(t for t in out["evidence"]["results"] if t["check"].endswith(":p99"))
    if service == "slow":
        assert p99["outcome"] == "fail" and p99["ci_low"] > 0.10 and 0.4 < p99["delta_rel"] < 0.6
    elif service == "equal":
        assert p99["outcome"] == "pass" and abs(p99["delta_rel"]) < 0.01 and p99["ci_high"] <= 0.10
        # sequential statistics: the 5 minutes cut into paired sub-windows, each queried on its own
        assert p99["method"] == "sequential" and p99["windows"] >= 6 and p99["ship"] == pytest.approx(0.05)
    else:
        assert ("low traffic" in p99["reason"] or "windows before it may decide" in p99["reason"]) and out["need_more"] > 0


@pytest.mark.parametrize("service", list(CASES))
def test_flagger_webhook(client, prom, service):
    # Flagger's documented payload; metadata values are strings; it sends no headers, so the token rides there
    payload = {"name": "podinfo", "namespace": "test", "phase": "Progressing", "checksum": "6d7b9c",
               "metadata": {"canary_selector": selector(service, "canary"),
                            "baseline_selector": selector(service, "baseline"), "window": "300s",
                            "policy": json.dumps({"checks": [{"metric": REQUEST_LATENCY, "quantile": 0.99,
                                                              "max_rel_delta": 0.1}]}),
                            "prometheus_url": prom.url, "token": TOKENS["operator"]}}
    r = client.post("/api/v1/judge", json=payload)
    out = r.get_json()
    assert r.status_code == (200 if EXPECT[service] == "pass" else 412), out
    assert out["verdict"] == EXPECT[service] and out["reason"]
    assert (out["name"], out["namespace"], out["phase"]) == ("podinfo", "test", "Progressing")
    assert "evidence" not in out and TOKENS["operator"] not in r.get_data(as_text=True)


def test_auth(client, prom):
    body = {"canary": {"selector": selector("equal", "canary")},
            "baseline": {"selector": selector("equal", "baseline")}, "window": "5m"}
    assert client.post("/api/v1/judge", json=body).status_code == 401
    assert client.post("/api/v1/judge", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/api/v1/judge", json=body, headers=auth("viewer")).status_code == 200
    # naming a host for the service to contact needs the operator role
    r = client.post("/api/v1/judge", json={**body, "prometheus_url": prom.url}, headers=auth("viewer"))
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "forbidden"
    assert client.post("/api/v1/judge", json={**body, "prometheus_url": prom.url},
                       headers=auth("operator")).status_code == 200
    flagger = {"name": "podinfo", "namespace": "test", "phase": "Progressing",
               "metadata": {"canary_selector": selector("equal", "canary"),
                            "baseline_selector": selector("equal", "baseline"), "window": "5m", "token": "nope"}}
    assert client.post("/api/v1/judge", json=flagger).status_code == 401


GOOD = {"canary": {"selector": 'service="equal",env="canary"'},
        "baseline": {"selector": 'service="equal",env="baseline"'}, "window": "5m"}


@pytest.mark.parametrize("change,field", [
    ({"window": "5 minutes"}, "window"), ({"window": "2s"}, "window"), ({"window": None}, "window"),
    ({"canary": {"selector": 'service="a\\"}'}}, "canary.selector"),
    ({"canary": {"selector": 'env!="x"'}}, "canary.selector"),
    ({"canary": {"selector": "x" * 2000}}, "canary.selector"),
    ({"canary": {"selector": 'a="b"', "scrape_urls": ["http://x"]}}, "canary"),
    ({"canary": {"scrape_urls": ["http://127.0.0.1:1"]}}, "baseline"),
    ({"baseline": {"scrape_urls": ["file:///etc/passwd"]}, "canary": {"scrape_urls": ["http://a"]}},
     "baseline.scrape_urls"),
    ({"policy": {"compare_to": "production"}}, "policy.compare_to"),
    ({"policy": {"checks": []}}, "policy.checks"), ({"prometheus_url": "ftp://x"}, "prometheus_url"),
    ({"extra": 1}, "extra")])
def test_bad_input_is_a_422_naming_the_field(client, change, field):
    body = {**GOOD, **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = client.post("/api/v1/judge", json=body, headers=auth("operator"))
    assert r.status_code == 422, r.get_json()
    assert r.get_json()["error"]["field"] == field


@pytest.mark.parametrize("metadata,field", [
    ({"baseline_selector": 'service="x"', "window": "5m"}, "metadata.canary_selector"),
    ({"canary_selector": 'service="x"', "baseline_selector": 'service="y"', "window": "5m", "policy": "{not json"},
     "metadata.policy"),
    ({"canary_selector": 'service="x"', "baseline_selector": 'service="y"', "window": "5m", "replicas": 3},
     "metadata")])
def test_bad_flagger_metadata(client, metadata, field):
    r = client.post("/api/v1/judge", json={"name": "p", "namespace": "t", "phase": "Progressing",
                                           "metadata": metadata}, headers=auth("viewer"))
    assert r.status_code == 422 and r.get_json()["error"]["field"] == field


def test_not_json_and_prometheus_down(client):
    r = client.post("/api/v1/judge", data="{", headers={**auth("viewer"), "Content-Type": "application/json"})
    assert r.status_code == 422 and r.get_json()["error"]["code"] == "invalid"
    r = client.post("/api/v1/judge", json={**GOOD, "prometheus_url": "http://127.0.0.1:9"}, headers=auth("operator"))
    assert r.status_code == 502 and r.get_json()["error"]["code"] == "metrics_unavailable"


def test_unknown_selector_is_inconclusive_not_a_pass(client):
    body = {**GOOD, "canary": {"selector": 'service="nosuch",env="canary"'}}
    out = client.post("/api/v1/judge", json=body, headers=auth("viewer")).get_json()
    assert out["verdict"] == "inconclusive" and "no data" in out["reason"] and not out["pass"]


def test_a_judgement_is_a_span_under_its_request(store, prom):
    tracing, exporter = memory_tracing()
    client = create_app({"TESTING": True, "STORE": store, "CLOCK": lambda: T_END, "TRACING": tracing,
                         "JUDGE_PROMETHEUS": PrometheusConfig(prom.url)}).test_client()
    body = {"canary": {"selector": selector("slow", "canary")}, "baseline": {"selector": selector("slow", "baseline")},
            "window": "5m"}
    assert client.post("/api/v1/judge", json=body).get_json()["verdict"] == "fail"
    judged, request = exporter.get_finished_spans()
    assert request.name == "POST /api/v1/judge" and request.attributes["http.response.status_code"] == 200
    assert judged.name == "sits.judge" and judged.parent.span_id == request.context.span_id
    assert judged.attributes["sits.verdict"] == "fail" and judged.attributes["sits.judge.source"] == "prometheus"


def test_serve_without_worker_judges_with_the_prometheus_its_flags_name(tmp_path, prom):
    auth_file = tmp_path / "users.json"
    auth_file.write_text(json.dumps({"users": [{"name": "argo", "role": "viewer",
                                                "token_sha256": token_sha256(TOKENS["viewer"])}]}))
    proc = subprocess.Popen([sys.executable, "-m", "sits.control_plane.cli", "serve", "--port", "0", "--no-worker",
                             "--auth-file", str(auth_file), "--store", str(tmp_path / "s.db"),
                             "--metrics", "prometheus", "--prometheus-url", prom.url],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = re.search(r"(http://127\.0\.0\.1:\d+)/", proc.stdout.readline()).group(1)
        r = httpx.post(url + "/api/v1/judge", json=GOOD, headers=auth("viewer"), timeout=30)
        out = r.json()
        # the backfilled data lies in 2023: at the real now the window holds none, asked of that Prometheus
        assert r.status_code == 200 and out["verdict"] == "inconclusive" and "no data" in out["reason"], out
        assert out["source"] == "prometheus" and 'service="equal",env="canary"' in out["reason"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.mark.parametrize("data", [b"[" * 30000, b"{not json", b'{"metadata": ' * 5000])
def test_judge_authenticates_before_it_reads_a_bad_body(app, caplog, data):
    """Issue 26 row 10: the judge parsed before auth, so an anonymous `[` x 30000 was a 500 with a traceback; now
    anonymous callers get 401 whatever the body, authenticated ones a 422 that says what is wrong."""
    c = app.test_client()
    r = c.post("/api/v1/judge", data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 401 and r.get_json()["error"]["code"] == "unauthorized"
    r = c.post("/api/v1/judge", data=data, headers={**auth("viewer"), "Content-Type": "application/json"})
    assert r.status_code == 422 and r.get_json()["error"]["code"] == "invalid"
    assert "JSON" in r.get_json()["error"]["message"] or "deeper" in r.get_json()["error"]["message"]
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
