"""Direct scrape: the parser on real prometheus_client expositions, counter resets, and windows over real engines."""
import time

import pytest

from sits.control_plane.adapters.metrics import MetricsQueryError, MetricsSource, NoDataError, Target
from sits.control_plane.adapters.metrics.scrape import ScrapeSource, diff, parse_exposition
from sits.control_plane.analysis import REQUEST_LATENCY, TTFT, HistogramSnapshot
from sits.engine.server.metrics import EngineMetrics, MetricLabels
from sits.wire.buckets import LATENCY_BUCKETS

from .conftest import SERVICE, send

COMPL = REQUEST_LATENCY + '{route="/v1/completions"}'
CHAT = REQUEST_LATENCY + '{route="/v1/chat/completions"}'


def exposition(n_ok=5, n_err=2, service="chat", ttft=(0.02, 0.03, 0.5)) -> tuple[str, list[float]]:
    m = EngineMetrics(MetricLabels("canary", service, "1.0.0"))
    ok = [0.004 * (i + 1) for i in range(n_ok)]
    for v in ok:
        m.observe_http("/v1/completions", 200, v)
    for _ in range(n_err):
        m.observe_http("/v1/completions", 500, 2.0)
    for _ in range(3):
        m.observe_http("/readyz", 200, 0.0005)
    for _ in range(4):
        m.observe_http("/v1/chat/completions", 200, 0.05)
    for status in (400, 408, 413, 499):   # client errors (a slow or bad client): neither timed nor requests
        m.observe_http("/v1/completions", status, 60.0)
    m.observe_http("/v1/completions", 429, 0.001)   # the server refused the work: an error
    for v in ttft:
        m.observe_ttft(v)
    return m.render().decode(), ok


def test_parse_real_client_exposition():
    text, ok = exposition()
    c = parse_exposition(text, "chat", [REQUEST_LATENCY, TTFT])
    assert set(c.histograms) == {COMPL, CHAT, TTFT}
    # 5xx and 429 are counted as errors, not timed; client errors and health checks are neither
    assert c.requests == 5 + 2 + 1 + 4 and c.errors == 2 + 1
    assert c.histograms[COMPL] == HistogramSnapshot.from_values(ok, LATENCY_BUCKETS)
    assert c.histograms[CHAT].total == 4 and c.histograms[TTFT].total == 3
    assert c.histograms[TTFT].quantile(0.5) == HistogramSnapshot.from_values([0.02, 0.03, 0.5],
                                                                             LATENCY_BUCKETS).quantile(0.5)
    other = parse_exposition(text, "search", [REQUEST_LATENCY])
    assert other.histograms == {} and other.requests == 0
    with pytest.raises(MetricsQueryError, match="unparsable"):
        parse_exposition("http_request_duration_seconds_bucket{route=\"/v1/completions\",le=\"0.1\" 3\n", "chat",
                         [REQUEST_LATENCY])


def test_diff_is_the_window_and_handles_a_counter_reset():
    old = parse_exposition(exposition(n_ok=5, n_err=2)[0], "chat", [REQUEST_LATENCY])
    new = parse_exposition(exposition(n_ok=9, n_err=3)[0], "chat", [REQUEST_LATENCY])
    d = diff(new, old)
    assert d.requests == 5 and d.errors == 1 and d.histograms[COMPL].total == 4
    assert d.histograms[CHAT].total == 0
    restarted = parse_exposition(exposition(n_ok=1, n_err=0)[0], "chat", [REQUEST_LATENCY])
    r = diff(restarted, new)   # the process restarted: what it counted since is the increase
    assert r.requests == 1 + 4 + 1 and r.errors == 1 and r.histograms[COMPL].total == 1   # (+ one 429)


def test_windows_over_real_engines(engines):
    src = ScrapeSource()
    assert isinstance(src, MetricsSource)
    targets = {role: Target(role, (url,)) for role, url in engines.items()}
    t0 = time.time()
    w0 = src.window(SERVICE, targets, None, t0)
    assert w0.start is None and w0.variants == {}                      # first scrape: nothing to diff against
    codes_b = send(engines["baseline"], 30)
    codes_c = send(engines["canary"], 40)
    t1 = time.time()
    w1 = src.window(SERVICE, targets, t0, t1)
    assert (w1.start, w1.end, w1.source) == (t0, t1, "scrape")
    b, c = w1.variants["baseline"], w1.variants["canary"]
    errors_c = codes_c.count(500)
    assert codes_b == [200] * 30 and errors_c + codes_c.count(200) == 40 and 0 < errors_c < 40
    assert (b.requests, b.errors, b.histograms[COMPL].total) == (30, 0, 30)
    assert (c.requests, c.errors, c.histograms[COMPL].total) == (40, errors_c, 40 - errors_c)
    assert "GET " + engines["canary"] + "/metrics" == w1.queries["canary"]
    # a caller that did not count w1 (it crashed) asks again from t0: one window spans both batches
    send(engines["baseline"], 5)
    t2 = time.time()
    w2 = src.window(SERVICE, targets, t0, t2)
    assert w2.start == t0 and w2.variants["baseline"].requests == 35
    w3 = src.window(SERVICE, targets, t2, time.time())
    assert w3.start == t2 and w3.variants["baseline"].requests == 0
    with pytest.raises(NoDataError, match="production"):
        src.window(SERVICE, targets, t2, time.time(), required=("canary", "production"))
    with pytest.raises(MetricsQueryError, match="canary"):
        src.window(SERVICE, {**targets, "canary": Target("canary", ("http://127.0.0.1:9",))}, t2, time.time())
    src.close()
