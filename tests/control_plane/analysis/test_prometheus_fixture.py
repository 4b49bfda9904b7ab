"""The shared Prometheus fixture: backfilled data answers exact queries; a scraped target shows up; no orphan."""
import http.server
import threading
import time

from tests.fixtures.prometheus import PrometheusServer, backfill, value


def test_backfill_then_query_exact(prometheus_factory, tmp_path):
    t0 = int(time.time()) - 3600
    text = "# TYPE demo_total counter\n" + "".join(
        f'demo_total{{env="canary"}} {10 * i} {t0 + 15 * i}\n' for i in range(9)) + "# EOF\n"
    backfill(text, tmp_path / "data")
    prom = prometheus_factory(data_dir=tmp_path / "data")
    got = prom.query('demo_total{env="canary"}', time=t0 + 15 * 8)
    assert [value(s) for s in got] == [80.0]
    # rate over 2 minutes: 80 increase over 120 s of samples
    assert abs(value(prom.query('rate(demo_total[2m])', time=t0 + 120)[0]) - 80 / 120) < 1e-9
    assert value(prom.query("1/0")[0]) == float("inf")


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"# TYPE fixture_up gauge\nfixture_up 42\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_scrape_and_clean_stop(tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with PrometheusServer.start(tmp_path, scrape_targets=[f"127.0.0.1:{httpd.server_port}"]) as prom:
            got = prom.wait_for("fixture_up", lambda r: len(r) == 1, timeout=20)
            assert value(got[0]) == 42.0 and got[0]["metric"]["job"] == "target0"
            proc = prom.proc
        assert proc.poll() is not None  # stopped on context exit, no orphan
    finally:
        httpd.shutdown()
