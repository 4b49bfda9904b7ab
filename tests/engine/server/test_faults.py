"""Fault injection changes latency and error rate measurably (and is off by default)."""

import json
import time

import pytest

from sits.engine.server.main import ServerConfig, build_parser
from tests.engine.server.harness import http, sample

REQ = {"model": "tiny", "prompt": "fault", "max_tokens": 6, "ignore_eos": True, "stream": True}


def _means(server, n=4):
    before = server.metrics()
    t0 = time.perf_counter()
    for _ in range(n):
        assert http("POST", server.url + "/v1/completions", REQ)[0] == 200
    wall = (time.perf_counter() - t0) / n
    after = server.metrics()

    def mean(family):
        d_sum = sample(after, family, family + "_sum") - sample(before, family, family + "_sum")
        d_cnt = sample(after, family, family + "_count") - sample(before, family, family + "_count")
        return d_sum / d_cnt

    return mean("sits_time_to_first_token_seconds"), mean("sits_inter_token_latency_seconds"), wall


def test_flags_are_off_by_default():
    args = vars(build_parser().parse_args([]))
    assert (args["fault_latency_ms"], args["fault_token_latency_ms"], args["fault_error_rate"]) == (0, 0, 0)
    with pytest.raises(ValueError):
        ServerConfig(fault_error_rate=1.5)
    with pytest.raises(ValueError):
        ServerConfig(fault_latency_ms=-1)


def test_injected_latency_shows_in_ttft_and_itl(server, serve):
    ttft0, itl0, wall0 = _means(server)
    slow = serve(fault_latency_ms=300, fault_token_latency_ms=50)
    ttft1, itl1, wall1 = _means(slow)
    assert ttft1 >= 0.300 and ttft1 - ttft0 >= 0.2, (ttft0, ttft1)
    assert itl1 >= 0.050 and itl1 - itl0 >= 0.03, (itl0, itl1)
    # end to end, each request waits at least the injected 300 ms and 5 x 50 ms (a difference to wall0 would be at
    # the mercy of the machine's load: CI once measured the fault-free server at 263 ms per request)
    assert wall1 >= 0.300 + 5 * 0.050, (wall0, wall1)


def test_injected_error_rate(serve):
    s = serve(fault_error_rate=0.3)
    statuses = []
    for i in range(60):
        status, _, body = http("POST", s.url + "/v1/completions", {**REQ, "stream": False, "max_tokens": 1})
        statuses.append(status)
        if status == 500:
            err = json.loads(body)["error"]
            assert err["type"] == "server_error" and err["code"] == "injected_fault"
    n500 = statuses.count(500)
    assert set(statuses) == {200, 500} and 8 <= n500 <= 30, statuses  # Binomial(60, 0.3): mean 18, sd 3.5
    m = s.metrics()
    assert sample(m, "sits_request_errors", "sits_request_errors_total", code="500") == n500
    assert sample(m, "http_request_duration_seconds", "http_request_duration_seconds_count",
                  route="/v1/completions", status="500") == n500
