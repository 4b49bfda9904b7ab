"""Tenant and priority headers reach the engine's scheduler: priority order, and per-tenant KV limits."""

import threading
import time

import httpx

from tests.engine.server.harness import http, sample


def _post_async(url, body, headers, done: list, name: str) -> threading.Thread:
    def run():
        status = http("POST", url + "/v1/completions", body, headers)[0]
        done.append((name, status, time.monotonic()))

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_waiting(server, n, timeout=20):
    deadline = time.monotonic() + timeout
    while sample(server.metrics(), "sits_num_requests_waiting") < n:
        assert time.monotonic() < deadline, f"fewer than {n} requests queued"
        time.sleep(0.02)


def _order(server, priorities):
    """With one running slot held, queue requests with `priorities` in order; release; return completion order."""
    hog = {"model": "tiny", "prompt": "hog", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    small = {"model": "tiny", "prompt": "queued", "max_tokens": 3, "ignore_eos": True}
    done: list = []
    with httpx.Client(timeout=60) as c, c.stream("POST", server.url + "/v1/completions", json=hog) as stream:
        lines = stream.iter_lines()
        next(lines)
        threads = []
        for i, p in enumerate(priorities):
            threads.append(_post_async(server.url, small, {"X-SITS-Priority": str(p), "X-SITS-Tenant": f"t{i}"},
                                       done, f"p{p}#{i}"))
            _wait_waiting(server, i + 1)  # arrival order is fixed before the next one is sent
    for t in threads:
        t.join(30)
    assert all(status == 200 for _, status, _ in done)
    return [name for name, _, _ in sorted(done, key=lambda d: d[2])]


def test_priority_header_orders_the_queue(serve):
    s = serve(max_num_seqs=1)
    assert _order(s, [0, 3, 1]) == ["p3#1", "p1#2", "p0#0"]
    assert _order(s, [0, 0, 0]) == ["p0#0", "p0#1", "p0#2"]  # FCFS within a priority


def test_one_tenant_cannot_starve_another(serve):
    # 2 blocks (128 tokens) per tenant: the flooding tenant runs one request at a time, the other still gets in
    s = serve(max_num_seqs=16, max_blocks_per_tenant=2)
    flood = {"model": "tiny", "prompt": "f" * 60, "max_tokens": 60, "ignore_eos": True}
    done: list = []
    threads = [_post_async(s.url, flood, {"X-SITS-Tenant": "flood"}, done, "flood") for _ in range(6)]
    _wait_waiting(s, 5)
    t0 = time.monotonic()
    status, _, _ = http("POST", s.url + "/v1/completions", {"model": "tiny", "prompt": "q", "max_tokens": 4},
                        {"X-SITS-Tenant": "quiet"})
    quiet_done = time.monotonic()
    assert status == 200
    flood_done_before = sum(1 for _, _, t in done if t < quiet_done)
    for t in threads:
        t.join(60)
    assert [st for _, st, _ in done] == [200] * 6
    assert flood_done_before <= 2, f"quiet tenant waited behind {flood_done_before} flood requests"
    assert quiet_done - t0 < max(t for _, _, t in done) - t0
