"""Tenant and priority headers reach the engine's scheduler: priority order, and per-tenant KV limits. Orders are
completion orders (the order answers arrive in), never wall-clock comparisons; the prefix-cache scores run on an
injected clock."""

import itertools
import json
import threading

import httpx

from sits.engine import LLMEngine
from tests.engine.server.harness import http, sample
from tests.waiting import wait_for


class StepClock:
    """A monotonic clock for the engine that moves 1 ms per reading, and by `advance()`; thread-safe."""

    def __init__(self):
        self._ticks = itertools.count()
        self._offset = 0.0

    def __call__(self) -> float:
        return self._offset + next(self._ticks) * 1e-3

    def advance(self, seconds: float) -> None:
        self._offset += seconds


def _post_async(url, body, headers, done: list, name: str) -> threading.Thread:
    def run():
        status = http("POST", url + "/v1/completions", body, headers)[0]
        done.append((name, status))   # list.append is atomic: the list is the completion order

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_waiting(server, n, timeout=20):
    wait_for(f"{n} requests queued", lambda: sample(server.metrics(), "sits_num_requests_waiting") >= n, timeout,
             interval=0.02)


def _order(server, priorities):
    """With one running slot held, queue requests with `priorities` in order; release; return completion order."""
    hog = {"model": "tiny", "prompt": "hog", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    # with one running slot each queued request starts only after the one before it has finished; 24 tokens make
    # that gap (~24 engine steps) far longer than the client threads' wake-up jitter on a busy machine, so the order
    # the answers arrive in is the order they ran in (3 tokens once let two answers swap under a parallel test run)
    small = {"model": "tiny", "prompt": "queued", "max_tokens": 24, "ignore_eos": True}
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
    assert all(status == 200 for _, status in done)
    return [name for name, _ in done]


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
    status, _, _ = http("POST", s.url + "/v1/completions", {"model": "tiny", "prompt": "q", "max_tokens": 4},
                        {"X-SITS-Tenant": "quiet"})
    done.append(("quiet", status))
    for t in threads:
        t.join(60)
    order = [name for name, _ in done]
    assert sorted(st for _, st in done) == [200] * 7 and order.count("flood") == 6
    flood_done_before = order.index("quiet")
    assert flood_done_before <= 2, f"quiet tenant waited behind {flood_done_before} flood requests: {order}"


def _cached(server, prompt, priority, tenant):
    status, _, body = http("POST", server.url + "/v1/completions",
                           {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0},
                           {"X-SITS-Priority": str(priority), "X-SITS-Tenant": tenant})
    assert status == 200, body
    return json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"]


def _prefix_survivors(serve, hi_priority):
    # 10 blocks of 64 tokens; byte tokenizer: a prompt of n characters is n + 1 tokens (BOS)
    clock = StepClock()
    # in-process: the test advances the clock the engine reads
    s = serve(num_kv_blocks=10, max_num_seqs=4, engine_process="off",
              engine_factory=lambda cfg: LLMEngine(cfg, clock=clock))
    clock.advance(2.0)   # eviction scores scale with time since start: two seconds in, priority outweighs recency
    hi, lo = "H" * 196, "L" * 196  # 197 tokens: 3 full (cacheable) blocks + 5 tokens
    assert _cached(s, hi, hi_priority, "gold") == 0
    assert _cached(s, lo, 0, "bronze") == 0  # more recent than hi
    assert _cached(s, hi, hi_priority, "gold") == 192 and _cached(s, lo, 0, "bronze") == 192  # both cached
    # 385 + 1 tokens = 7 blocks: the 4 never-cached free blocks + 3 evicted cached ones
    _cached(s, "P" * 384, 0, "pressure")
    # measuring re-admits a prompt, which itself needs a block: measure the low-priority one first, so that its
    # own allocation can only evict the pressure tenant's blocks, never hi's
    lo_cached = _cached(s, lo, 0, "bronze")
    return _cached(s, hi, hi_priority, "gold"), lo_cached


def test_high_priority_prefix_survives_cache_pressure(serve):
    assert _prefix_survivors(serve, hi_priority=3) == (192, 0)


def test_without_priority_the_older_prefix_is_evicted(serve):
    # control: same traffic at equal priority evicts by recency, so the older (hi) prefix goes
    hi_cached, lo_cached = _prefix_survivors(serve, hi_priority=0)
    assert hi_cached == 0 and lo_cached == 192
