"""Issue 26 row 14: the judge's `scrape_urls` fetch exactly `<base>/metrics`: no other path (`#`, `?`, paths and
credentials refused with 422), no redirects, no body echoed, one error for refused ports and every other failure."""
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sits.control_plane.errors import ValidationError
from sits.control_plane.service.judge import SCRAPE_FAILED, parse_request
from sits.control_plane.web import create_app

from .conftest import auth


def body(url: str) -> dict:
    return {"canary": {"scrape_urls": [url]}, "baseline": {"scrape_urls": [url]}, "window": "5m"}


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/other", "http://127.0.0.1:1/#", "http://127.0.0.1:1#/x",
                                 "http://127.0.0.1:1/x#", "http://127.0.0.1:1/?x=1", "http://127.0.0.1:1?",
                                 "http://u:p@127.0.0.1:1", "http://@127.0.0.1:1", "http://127.0.0.1:99999",
                                 "http://127.0.0.1:1\\@evil", "http://127.0.0.1:1/metrics/x", "ftp://127.0.0.1:1",
                                 "http://", "http://127.0.0.1:1/\x00"])
def test_anything_but_a_base_url_is_refused(url):
    with pytest.raises(ValidationError) as e:
        parse_request(body(url))
    assert e.value.field == "canary.scrape_urls"


def test_base_urls_are_normalised():
    for url in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/metrics"):
        assert parse_request(body(url)).canary.scrape_urls == ("http://127.0.0.1:8000",)


class Handler(BaseHTTPRequestHandler):
    hits: list = []
    redirect_to = ""

    def do_GET(self):
        type(self).hits.append((self.server.server_port, self.path))
        if self.server.server_port == self.server.redirecting_port:
            self.send_response(302)
            self.send_header("Location", type(self).redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = b"SECRET-BODY of an internal page"
        self.send_response(404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def servers():
    out = []
    for _ in range(2):
        s = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=s.serve_forever, daemon=True).start()
        out.append(s)
    for s in out:
        s.redirecting_port = out[0].server_port
    Handler.hits = []
    Handler.redirect_to = f"http://127.0.0.1:{out[1].server_port}/metrics"
    yield out
    for s in out:
        s.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_redirects_no_body_echo_and_one_error_for_every_failure(store, users, servers):
    client = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "k"}).test_client()
    redirecting, other = (f"http://127.0.0.1:{s.server_port}" for s in servers)
    answers = {}
    for name, url in (("redirect", redirecting), ("404", other), ("refused", f"http://127.0.0.1:{closed_port()}")):
        r = client.post("/api/v1/judge", json=body(url), headers=auth("operator"))
        assert r.status_code == 502, r.get_json()
        answers[name] = r.get_json()["error"]["message"]
        assert "SECRET-BODY" not in r.get_data(as_text=True)
    assert {port for port, _ in Handler.hits} == {servers[0].server_port, servers[1].server_port}
    assert [p for port, p in Handler.hits if port == servers[1].server_port] == ["/metrics"] * 2   # its own calls only
    assert all(path == "/metrics" for _, path in Handler.hits)
    assert len(set(answers.values())) == 1 and SCRAPE_FAILED in answers["refused"], answers


@pytest.mark.parametrize("status", [200, 500])
def test_a_prometheus_url_that_answers_something_else_is_not_echoed(client, status):
    class Internal(BaseHTTPRequestHandler):
        def do_POST(self):
            data = b"SECRET-BODY of an internal page, not a Prometheus"
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Internal)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = client.post("/api/v1/judge", json={"canary": {"selector": 'service="x",env="canary"'},
                                               "baseline": {"selector": 'service="x",env="baseline"'},
                                               "window": "5m", "prometheus_url": f"http://127.0.0.1:{srv.server_port}"},
                        headers=auth("operator"))
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.status_code == 502 and r.get_json()["error"]["code"] == "metrics_unavailable"
    assert "SECRET" not in r.get_data(as_text=True)
