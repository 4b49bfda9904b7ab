"""`POST /api/v1/judge` with scrape URLs of a real engine: the first call records the starting scrape (INCONCLUSIVE),
the next counts exactly the requests served in between, per variant."""
import pytest

from sits.control_plane.web import create_app
from tests.engine.server.harness import BASE, RunningServer, http

from .conftest import auth


@pytest.fixture(scope="module")
def engine():
    s = RunningServer(BASE).wait_ready()
    yield s
    s.stop()


def test_scrape_urls_window_between_calls(store, users, engine):
    t = [1000.0]
    client = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "k",
                         "CLOCK": lambda: t[0]}).test_client()

    def judge(service=None, window="5m"):
        body = {"canary": {"scrape_urls": [engine.url]}, "baseline": {"scrape_urls": [engine.url + "/"]},
                "window": window}
        if service:
            body["service"] = service
        r = client.post("/api/v1/judge", json=body, headers=auth("operator"))
        assert r.status_code == 200, r.get_json()
        return r.get_json()

    first = judge()
    assert first["verdict"] == "inconclusive" and "first scrape" in first["reason"] and first["variants"] == {}
    assert judge(service=BASE.service)["verdict"] == "inconclusive"   # another key: its own first scrape
    for _ in range(4):
        assert http("POST", engine.url + "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1})[0] == 200
    t[0] = 1060.0
    out = judge()
    assert out["window"]["start"] == 1000.0 and out["window"]["end"] == 1060.0
    assert {role: v["requests"] for role, v in out["variants"].items()} == {"canary": 4, "baseline": 4}
    assert out["verdict"] == "inconclusive" and out["need_more"] > 0   # 4 requests decide nothing
    assert judge(service=BASE.service)["variants"]["canary"]["requests"] == 4
    t[0] = 1060.0 + 301   # every remembered scrape is older than the window: a new starting point
    assert "first scrape" in judge()["reason"]

