"""Prometheus source against a real Prometheus: exact numbers from a backfilled TSDB, agreement with direct scrape on
the same traffic from real engines, auth, retries and the named errors."""
import crypt
import json
import random
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.metrics import MetricsQueryError, MetricsSource, MultipleSeriesError, NoDataError, Target
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig, PrometheusSource
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane.analysis import REQUEST_LATENCY, TTFT, HistogramSnapshot
from sits.control_plane.rollout import ROLES
from sits.wire.buckets import LATENCY_BUCKETS
from tests.fixtures.prometheus import PROMETHEUS_BIN, PrometheusServer, backfill, format_value
from tests.waiting import wait_for

from .conftest import SERVICE, send

COMPL = REQUEST_LATENCY + '{route="/v1/completions"}'
T0 = 1_700_000_000


def _series(lines, name, labels, snaps, ts):
    """Cumulative histogram samples `name`_bucket/_count per timestamp (snaps: cumulative snapshot per ts)."""
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for t, h in zip(ts, snaps):
        for le, c in h.buckets():
            lines.append(f'{name}_bucket{{{lab},le="{format_value(le)}"}} {format_value(c)} {t}')
        lines.append(f"{name}_count{{{lab}}} {format_value(h.count)} {t}")


def _cumulative(rng, ts, median):
    snaps, acc = [], HistogramSnapshot.empty(LATENCY_BUCKETS)
    for _ in ts:
        acc = acc.merge(HistogramSnapshot.from_values([rng.lognormvariate(0, 0.5) * median
                                                       for _ in range(rng.randint(20, 60))], LATENCY_BUCKETS))
        snaps.append(acc)
    return snaps


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    """A Prometheus over a backfilled TSDB: 3 variants, samples every 10 s from T0 to T0 + 60, 200s and 500s on
    /v1/completions, /readyz noise, TTFT; returns (prometheus, {(env, series): cumulative snapshots}, ts)."""
    rng, ts = random.Random(7), [T0 + 10 * k for k in range(7)]
    bucket_lines, count_lines, truth = [], [], {}
    for env, median in zip(ROLES, (0.05, 0.05, 0.08)):
        base = {"env": env, "service": SERVICE}
        for route, status in (("/v1/completions", "200"), ("/v1/completions", "500"), ("/readyz", "200")):
            snaps = _cumulative(rng, ts, median)
            truth[env, route, status] = snaps
            lines = []
            _series(lines, REQUEST_LATENCY, {**base, "route": route, "status": status}, snaps, ts)
            bucket_lines += [x for x in lines if "_bucket" in x]
            count_lines += [x for x in lines if "_count" in x]
        snaps = _cumulative(rng, ts, median / 2)
        truth[env, "ttft"] = snaps
        lines = []
        _series(lines, TTFT, {**base, "kernel_version": "1.0.0"}, snaps, ts)
        bucket_lines += [x for x in lines if "_bucket" in x]
    text = "\n".join([f"# TYPE {REQUEST_LATENCY}_bucket gauge"] + [x for x in bucket_lines if x.startswith(REQUEST_LATENCY)]
                     + [f"# TYPE {TTFT}_bucket gauge"] + [x for x in bucket_lines if x.startswith(TTFT)]
                     + [f"# TYPE {REQUEST_LATENCY}_count gauge"] + count_lines + ["# EOF"]) + "\n"
    d = tmp_path_factory.mktemp("backfill")
    backfill(text, d / "data")
    prom = PrometheusServer.start(d, data_dir=d / "data")
    yield prom, truth, ts
    prom.stop()


def test_exact_window_increases_from_a_backfilled_prometheus(backfilled):
    prom, truth, ts = backfilled
    src = PrometheusSource(PrometheusConfig(prom.url))
    assert isinstance(src, MetricsSource)
    targets = {r: Target(r) for r in ROLES}
    w = src.window(SERVICE, targets, ts[1], ts[5], metrics=(REQUEST_LATENCY, TTFT), required=("canary", "baseline"))
    assert (w.start, w.end, w.source) == (ts[1], ts[5], "prometheus")
    for env in ROLES:
        v = w.variants[env]
        ok = truth[env, "/v1/completions", "200"]
        err = truth[env, "/v1/completions", "500"]
        want = ok[5].delta(ok[1])                      # samples sit on the range ends: no extrapolation
        got = v.histograms[COMPL]
        assert got.bounds == want.bounds and got.counts == want.counts, env   # exact; 5xx and /readyz excluded
        assert v.histograms[TTFT].counts == truth[env, "ttft"][5].delta(truth[env, "ttft"][1]).counts
        assert v.requests == (ok[5].count - ok[1].count) + (err[5].count - err[1].count)
        assert v.errors == err[5].count - err[1].count
    assert 'env="canary"' in w.queries["canary:" + REQUEST_LATENCY] and "increase(" in w.queries["canary:requests"]
    # the analysis sees the canary's slower latency through these counts
    assert w.variants["canary"].histograms[COMPL].quantile(0.9) > w.variants["baseline"].histograms[COMPL].quantile(0.9)
    with pytest.raises(NoDataError, match="canary"):
        src.window("search", targets, ts[1], ts[5], required=("canary",))
    first = src.window(SERVICE, targets, None, ts[5])                  # no start yet: nothing to count
    assert first.start is None and first.variants == {}
    src.close()


def test_multiple_series_is_a_named_error():
    rows = [{"metric": {"le": "0.1"}, "value": [T0, "1"]}, {"metric": {"le": "0.1"}, "value": [T0, "2"]}]
    with pytest.raises(MultipleSeriesError):
        PrometheusSource._group(rows, False, "q")
    with pytest.raises(MultipleSeriesError):
        PrometheusSource._scalar([{"metric": {}, "value": [T0, "1"]}] * 2, "q")


def test_agrees_with_direct_scrape_on_the_same_traffic(engines, prometheus_factory):
    prom = prometheus_factory(scrape_targets=[u.removeprefix("http://") for u in engines.values()],
                              scrape_interval="300ms")
    prom.wait_for("up", lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r), timeout=30)
    send(engines["baseline"], 4)
    while 500 not in send(engines["canary"], 10):
        pass   # every series (the canary's 500s too) exists before the window: increase() cannot see the first
        #        increment of a series born inside it
    targets = {r: Target(r, (u,)) for r, u in engines.items()}
    scrape, promsrc = ScrapeSource(), PrometheusSource(PrometheusConfig(prom.url))

    def scraped_by_prometheus(after: float, requests: dict) -> None:
        """Wait for a successful scrape of both engines after `after` that saw these request counts (scrapes can
        time out on a busy machine; the window must hold the quiet counters at both ends)."""
        def ok(r):
            got = {x["metric"]["env"]: float(x["value"][1]) for x in r}
            return got == requests
        # timestamp() of a plain selector: of `up == 1` this Prometheus (2.42) returns the evaluation time, which
        # made this wait pass on a scrape from before `after`
        prom.wait_for(f'sum by (env) (http_request_duration_seconds_count{{route="/v1/completions"}} '
                      f'and on (instance) (timestamp(up) > {after:.3f}) and on (instance) (up == 1))', ok,
                      timeout=30, interval=0.1)

    def counts():
        """The engines' request counts once they stop moving: an engine observes a request's duration after its
        response went out, so a count read right after the last answer can still grow."""
        last = {}

        def settled():
            now = {r: scrape.scrape(u, SERVICE, [REQUEST_LATENCY]).requests for r, u in engines.items()}
            same, last["counts"] = now == last.get("counts"), now
            return now if same else None
        return wait_for("the engines' request counts to settle", settled, timeout=30, interval=0.3)

    def samples_since(t: float) -> float:
        """The fewest samples Prometheus holds since `t` of any series of the request counts (0 before a scrape)."""
        span = f"{max(1, round((time.time() - t) * 1000))}ms"
        got = prom.query(f'count_over_time(http_request_duration_seconds_count{{route="/v1/completions"}}[{span}])')
        return min((float(x["value"][1]) for x in got), default=0.0) \
            if {x["metric"]["env"] for x in got} == {"baseline", "canary"} else 0.0

    before = counts()
    t0 = time.time()
    scrape.window(SERVICE, targets, None, t0)
    scraped_by_prometheus(t0, before)
    send(engines["baseline"], 60)
    send(engines["canary"], 60)
    # a window holding more scrapes bounds increase()'s extrapolation tighter (tol, below): wait for 8 of each series
    wait_for("8 scrapes of every series since the window began", lambda: samples_since(t0) >= 8, timeout=30,
             interval=0.2)
    final = counts()
    assert final == {r: before[r] + 60 for r in before}, (before, final)
    after = time.time()
    scraped_by_prometheus(after, final)
    t1 = time.time()
    a = scrape.window(SERVICE, targets, t0, t1)
    b = promsrc.window(SERVICE, targets, t0, t1, required=("canary", "baseline"))
    # increase() scales the first-to-last sample delta (here exactly the window's count: the counters are quiet at
    # both ends) by (sampled span + extrapolation) / sampled span, extrapolating each end by at most 1.1 average
    # sample intervals: with n samples in the window that is at most 1 + 2.2 / (n - 1). n comes from Prometheus
    # itself: under load scrapes come late or fail, and the window holds fewer than (t1 - t0) / 300 ms of them.
    span = f"{max(1, round((t1 - t0) * 1000))}ms"
    samples = prom.query(f'count_over_time(http_request_duration_seconds_count{{route="/v1/completions"}}[{span}])',
                         time=t1)
    n = min(float(x["value"][1]) for x in samples)
    assert {x["metric"]["env"] for x in samples} == {"baseline", "canary"} and n >= 2, samples
    tol = 2.2 / (n - 1)
    for role in ("baseline", "canary"):
        x, y = a.variants[role], b.variants[role]
        assert x.requests == 60 and x.requests <= y.requests <= x.requests * (1 + tol), role
        assert y.errors == pytest.approx(x.errors, rel=tol, abs=1e-9)
        hx, hy = x.histograms[COMPL], y.histograms[COMPL]
        assert hx.total > 0 and hy.total == pytest.approx(hx.total, rel=tol)
        # increase() extrapolates each bucket's series by its own factor in [1, 1 + tol] (a series that started the
        # window at 0 is extrapolated less: Prometheus stops at the counter's zero), so each cumulative fraction
        # moves by at most tol: Prometheus's q-quantile lies between the scraped (q -/+ tol)-quantiles, give or take
        # the bucket precision (one bucket is 9 % wide)
        for q in (0.5, 0.9, 0.99):
            lo = hx.quantile(q - tol) if q - tol > 0 else 0.0
            hi = hx.quantile(q + tol) if q + tol < 1 else float("inf")
            assert lo / 1.0905 <= hy.quantile(q) <= hi * 1.0905, (role, q, lo, hy.quantile(q), hi, tol)
    scrape.close()
    promsrc.close()


class _Recorder(BaseHTTPRequestHandler):
    script: list = []
    seen: list = []

    def do_POST(self):
        self.seen.append((self.headers.get("Authorization"), urllib.parse.parse_qs(
            self.rfile.read(int(self.headers["Content-Length"])).decode())))
        code = self.script.pop(0) if self.script else 503
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_bearer_token_retries_and_timeouts():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        _Recorder.script[:] = [503, 429, 200]
        src = PrometheusSource(PrometheusConfig(url, bearer_token="s3cret", retries=3, backoff_s=0.05))
        assert src.query("up", at=T0) == []
        assert len(_Recorder.seen) == 3 and all(a == "Bearer s3cret" for a, _ in _Recorder.seen)
        assert _Recorder.seen[-1][1] == {"query": ["up"], "time": [f"{T0:.3f}"]}
        _Recorder.script[:] = []
        slept = []
        with pytest.raises(MetricsQueryError, match="3 attempts failed; last: HTTP 503"):
            PrometheusSource(PrometheusConfig(url, retries=2, backoff_s=0.1, max_backoff_s=0.15),
                             sleep=slept.append).query("up")
        assert slept == [0.1, 0.15]                                    # doubled after each failure, capped
    finally:
        srv.shutdown()
        srv.server_close()
    with pytest.raises(MetricsQueryError, match="attempts failed"):
        PrometheusSource(PrometheusConfig("http://127.0.0.1:9", retries=1, backoff_s=0.01, timeout_s=0.5)).query("up")
    with pytest.raises(ValueError, match="not both"):
        PrometheusConfig("http://x", bearer_token="a", basic_auth=("u", "p"))
    with pytest.raises(ValueError, match="given twice"):
        PrometheusConfig("http://u:p@x", bearer_token="a")
    with pytest.raises(MetricsQueryError) as e:   # a transport error's text quotes the URL: no password in it
        PrometheusSource(PrometheusConfig("http://u:hunter2@127.0.0.1:9", retries=0, timeout_s=0.5)).query("up")
    assert "hunter2" not in str(e.value)


class _Stuck(BaseHTTPRequestHandler):
    """A Prometheus that refuses the production variant's latency query at once (401) and never answers any other
    (a SIGSTOPped one, as far as a client can tell) until `release` is set."""
    arrived: list = []
    release = threading.Event()

    def do_POST(self):
        query = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        self.arrived.append(query)
        if 'env="production"' in query and "_bucket" in query:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.release.wait(10)

    def log_message(self, *a):
        pass


def test_a_failed_window_leaves_no_queries_queued_behind_it():
    # 3 roles x 6 queries on a pool of 8: the window's first query fails at once while 7 others hang; the 10 not yet
    # started must never run (a stopped Prometheus would otherwise pile every pass's leftovers in front of the next
    # pass's queries). One worker thread may take a ninth between the failure and the cancel.
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stuck)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    src = PrometheusSource(PrometheusConfig(f"http://127.0.0.1:{srv.server_port}", retries=0, timeout_s=5.0))
    try:
        targets = {role: Target(role, ("http://127.0.0.1:9",), True) for role in ROLES}
        with pytest.raises(MetricsQueryError, match="HTTP 401"):
            src.window(SERVICE, targets, T0 - 60, T0)
        _Stuck.release.set()                   # the hung queries end (connection closed) ...
        src._pool.shutdown(wait=True)          # ... and whatever is still queued runs now
        assert len(_Stuck.arrived) <= 9, len(_Stuck.arrived)
    finally:
        _Stuck.release.set()
        srv.shutdown()
        srv.server_close()
        src.close()


def test_basic_auth_against_a_real_prometheus(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  sits: '{crypt.crypt('pw', crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))}'\n")
    (tmp_path / "prom.yml").write_text("global: {scrape_interval: 1s}\n")
    port = process.free_port()
    proc = subprocess.Popen([PROMETHEUS_BIN, f"--config.file={tmp_path / 'prom.yml'}", f"--web.config.file={web}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        good = PrometheusSource(PrometheusConfig(url, basic_auth=("sits", "pw"), retries=40, backoff_s=0.05))
        assert good.query("vector(1)")[0]["value"][1] == "1"          # retried until Prometheus listened
        with pytest.raises(MetricsQueryError, match="HTTP 401"):
            PrometheusSource(PrometheusConfig(url, basic_auth=("sits", "wrong"))).query("vector(1)")
        with pytest.raises(MetricsQueryError, match="bad_data"):
            good.query("sum(")
        # credentials inside the URL authenticate, and are never kept in (or printed from) the URL
        in_url = PrometheusConfig(f"http://sits:pw@127.0.0.1:{port}", retries=0)
        assert in_url.url == url and in_url.basic_auth == ("sits", "pw") and "pw" not in repr(in_url)
        assert PrometheusSource(in_url).query("vector(1)")[0]["value"][1] == "1"
        with pytest.raises(MetricsQueryError) as e:
            PrometheusSource(PrometheusConfig(f"http://sits:wrong-pw@127.0.0.1:{port}", retries=0)).query("up")
        assert "wrong-pw" not in str(e.value) and "HTTP 401" in str(e.value)
    finally:
        proc.terminate()
        proc.wait(10)
