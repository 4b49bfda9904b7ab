"""The load generator's schedule (Poisson arrivals, chat-like lengths; seeded) and its answer verification; against a
real engine behind the router, every request of a mixed load is answered and verified token by token."""
import json
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.demo.loadgen import OK, LoadGenerator, Tally, verify_plain, verify_stream
from sits.control_plane.demo.traffic import LengthDist, Planned, TrafficMix, plan
from tests.waiting import wait_for


def take(it, n):
    return [next(it) for _ in range(n)]


def test_schedule_is_poisson_chat_like_and_seeded():
    mix = TrafficMix(LengthDist(48, 0.8, 4, 400), LengthDist(6, 0.6, 1, 32), 0.3, 0.5)
    reqs = take(plan(50.0, mix, seed=7), 5000)
    assert take(plan(50.0, mix, seed=7), 50) == reqs[:50]
    assert take(plan(50.0, mix, seed=8), 50) != reqs[:50]
    gaps = [b.at - a.at for a, b in zip(reqs, reqs[1:])]
    mean = statistics.fmean(gaps)
    assert abs(mean - 1 / 50) < 0.002                              # rate 50/s
    assert abs(statistics.pstdev(gaps) / mean - 1) < 0.08           # exponential gaps: coefficient of variation 1
    outs = [r.max_tokens for r in reqs]
    assert min(outs) >= 1 and max(outs) <= 32 and statistics.median(outs) == 6
    prompts = [len(r.body.get("prompt") or r.body["messages"][0]["content"]) for r in reqs]
    assert min(prompts) >= 4 and max(prompts) <= 400 and 40 <= statistics.median(prompts) <= 56
    assert max(prompts) > 4 * statistics.median(prompts)           # a long tail, not a constant
    assert abs(sum(r.stream for r in reqs) / 5000 - 0.3) < 0.03
    assert abs(sum(r.route == "/v1/chat/completions" for r in reqs) / 5000 - 0.5) < 0.03
    for r in reqs[:200]:
        assert r.body["ignore_eos"] and r.body["max_tokens"] == r.max_tokens
        assert ("stream_options" in r.body) == r.stream


def test_fixed_mix_keeps_the_legacy_request():
    r = take(plan(10.0, TrafficMix.fixed(16, 4), seed=0, prompt="Once upon a time"), 3)
    assert {x.body["prompt"] for x in r} == {"Once upon a time"} and {x.max_tokens for x in r} == {4}
    assert not any(x.stream for x in r)
    with pytest.raises(ValueError):
        LengthDist(0, 1, 1, 2)
    with pytest.raises(ValueError):
        LoadGenerator("http://127.0.0.1:1", rate=0)


def sse(*events, done=True):
    lines = [f"data: {json.dumps(e)}" for e in events]
    return lines + (["data: [DONE]"] if done else [])


def chunk(n, finish=None):
    return {"choices": [{"text": "x" * n, "logprobs": {"tokens": ["x"] * n}, "finish_reason": finish}]}


@pytest.mark.parametrize("lines, outcome", [
    (sse(chunk(2), chunk(1, "length"), {"choices": [], "usage": {"completion_tokens": 3}}), OK),
    (sse(chunk(2), chunk(1, "length"), {"choices": [], "usage": {"completion_tokens": 3}}, done=False), "truncated"),
    (sse(chunk(2), chunk(0, "length"), {"choices": [], "usage": {"completion_tokens": 2}}), "short"),
    (sse(chunk(2), chunk(1, "stop"), {"choices": [], "usage": {"completion_tokens": 3}}), "short"),
    (sse(chunk(2), {"error": {"message": "interrupted"}}), "stream_error"),
])
def test_stream_verification(lines, outcome):
    p = Planned(0.0, "/v1/completions", True, {}, 3)
    assert verify_stream(p, lines)[0] == outcome


def test_plain_verification():
    p = Planned(0.0, "/v1/chat/completions", False, {}, 2)
    good = {"choices": [{"finish_reason": "length", "logprobs": {"content": [{}, {}]}}],
            "usage": {"completion_tokens": 2}}
    assert verify_plain(p, good) == (OK, 2)
    assert verify_plain(p, {**good, "usage": {"completion_tokens": 1}})[0] == "short"


@pytest.mark.slow
def test_mixed_load_against_a_real_engine(tmp_path):
    with LocalDeployer(LocalConfig(workdir=str(tmp_path), cpu_threads=1)) as d:
        d.deploy(VariantSpec("lg", "production", "torch"))
        mix = TrafficMix(LengthDist(40, 0.8, 4, 200), LengthDist(4, 0.6, 1, 12), 0.5, 0.5)
        g = LoadGenerator(d.router_url("lg"), rate=15, threads=6, mix=mix, seed=3, pin_token=d.pin_token).start()
        try:
            wait_for("40 requests answered", lambda: g.finished >= 40, timeout=60, interval=0.2)
        finally:
            g.stop()
    counts = g.counts()
    assert g.sent == g.finished >= 40
    assert counts == {"production": {"answered": g.sent, "failed": 0, "ok": g.sent,
                                     "tokens": counts["production"]["tokens"]}}
    kinds = {k for (_, k, _) in g.tally.requests}
    assert kinds == {"completion", "completion+stream", "chat", "chat+stream"}
    assert counts["production"]["tokens"] >= g.sent   # every answer's tokens counted (>= 1 each)


def test_stop_sends_nothing_more_when_the_service_is_overloaded():
    """Arrivals queued behind busy senders are dropped at stop, not sent afterwards: only the requests in flight
    finish, so stopping an overloaded load ends at once and sent == finished."""
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            release.wait(30)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        g = LoadGenerator(f"http://127.0.0.1:{srv.server_port}", rate=200, threads=2, seed=1).start()
        wait_for("both senders busy and arrivals queued", lambda: g.sent == 2 and g.backlog >= 5, 30)
        stopper = threading.Thread(target=g.stop)
        stopper.start()
        wait_for("stop to be under way", lambda: g._stop.is_set(), 10)
        release.set()
        stopper.join(30)
        assert not stopper.is_alive() and g.sent == g.finished == 2
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def test_counts_come_in_role_order_whoever_answered_first():
    # the demo's summary line reads "production ... ; baseline ... ; canary ...": the canary's first answer may come
    # back before the baseline's, and the order must not depend on it
    t = Tally()
    t.requests[("canary", "chat", OK)] += 2
    t.requests[("?", "chat", "transport")] += 1
    t.requests[("baseline", "chat", OK)] += 3
    t.requests[("production", "chat", "http_503")] += 1
    t.requests[("production", "chat", OK)] += 5
    rows = t.per_variant()
    assert list(rows) == ["production", "baseline", "canary", "?"]
    assert rows["production"] == {"answered": 5, "failed": 1, "tokens": 0, OK: 5, "http_503": 1}


def test_token_latency_counts_token_events_only_per_variant_and_resets():
    from sits.control_plane.demo.loadgen import _timed
    lines = ['data: {"choices": [{"text": "a"}]}', "", 'data: {"choices":[{"text": "b"}]}',
             'data: {"choices": [], "usage": {"completion_tokens": 2}}', "data: [DONE]"]
    arrivals: list[float] = []
    assert list(_timed(iter(lines), arrivals)) == lines   # passed through unchanged
    assert len(arrivals) == 2                              # the usage-only event is no token
    g = LoadGenerator("http://127.0.0.1:9", rate=1, threads=1)
    g._record_stream("canary", 10.0, [10.5, 10.6, 10.8])       # TTFT 0.5 s, gaps 0.1 s and 0.2 s
    g._record_stream("canary", 20.0, [20.3])
    g._record_stream("baseline", 0.0, [0.25, 0.30])
    lat = g.token_latency(reset=True)
    assert list(lat) == ["baseline", "canary"] and lat["canary"]["streams"] == 2
    assert lat["canary"]["ttft_p50"] == pytest.approx(0.5) and lat["canary"]["ttft_p99"] == pytest.approx(0.5)
    assert lat["canary"]["itl_p50"] == pytest.approx(0.2) and lat["baseline"]["itl_p99"] == pytest.approx(0.05)
    assert g.token_latency() == {}
