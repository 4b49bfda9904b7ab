"""/metrics: labelled histograms that move with traffic, engine counters, and a real Prometheus scraping them."""

import math

from sits.wire.buckets import LATENCY_BUCKETS
from tests.engine.server.harness import http, sample

ENG = {"env": "test", "service": "engine-under-test"}


def _complete(server, n, prompt="metrics probe", stream=False):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    status, _, payload = http("POST", server.url + "/v1/completions", body)
    assert status == 200, payload
    return payload


def test_histograms_have_labels_and_move(server):
    kv = server.state.runner.engine.kernel_set.version
    labels = dict(ENG, kernel_version=kv)
    before = server.metrics()
    _complete(server, 6)
    _complete(server, 4, stream=True)
    after = server.metrics()

    def delta(family, name=None, **lbl):
        return sample(after, family, name, **lbl) - sample(before, family, name, **lbl)

    for family in ("sits_time_to_first_token_seconds", "sits_e2e_request_latency_seconds",
                   "sits_queue_time_seconds"):
        assert delta(family, family + "_count", **labels) == 2, family
        assert delta(family, family + "_sum", **labels) > 0
    # one inter-token gap per token after the first
    assert delta("sits_inter_token_latency_seconds", "sits_inter_token_latency_seconds_count", **labels) == 5 + 3
    http_lbl = dict(ENG, route="/v1/completions", status="200")
    assert delta("http_request_duration_seconds", "http_request_duration_seconds_count", **http_lbl) == 2
    assert delta("sits_generation_tokens", "sits_generation_tokens_total", **labels) == 10
    assert delta("sits_prompt_tokens", "sits_prompt_tokens_total", **labels) > 0
    assert delta("sits_request_success", "sits_request_success_total", finished_reason="length", **labels) == 2
    # buckets: the shared fine layout (first bound below 1 ms), cumulative, ending at +Inf
    les = [s.labels["le"] for s in after["sits_time_to_first_token_seconds"]
           if s.name.endswith("_bucket") and s.labels.get("kernel_version") == kv]
    assert len(les) == len(LATENCY_BUCKETS) + 1 and float(les[0]) < 0.001 and les[-1] == "+Inf"
    info = after["sits_engine_info"][0]
    assert info.name == "sits_engine_info" and info.labels["kernel_version"] == kv
    assert info.labels["model"] == "tiny" and info.labels["kernel_set"] == "torch"


def test_errors_by_code_and_kv_gauges(server):
    before = server.metrics()
    assert http("POST", server.url + "/v1/completions", {"model": "nope", "prompt": "x"})[0] == 404
    assert http("POST", server.url + "/v1/completions", b"{")[0] == 400
    after = server.metrics()
    for code in ("404", "400"):
        assert sample(after, "sits_request_errors", "sits_request_errors_total", code=code) - \
            sample(before, "sits_request_errors", "sits_request_errors_total", code=code) == 1
    total = sample(after, "sits_kv_cache_total_blocks")
    assert total == server.state.runner.stats().num_total_blocks > 0
    assert 0 <= sample(after, "sits_kv_cache_free_blocks") <= total
    assert "sits_num_requests_running" in after and "sits_num_requests_waiting" in after
    assert "sits_device_memory_reserved_bytes" not in after   # on CPU there is no device allocator to report


def test_real_prometheus_scrapes_and_computes_quantiles(server, prometheus_factory):
    host_port = server.url.removeprefix("http://")
    prom = prometheus_factory(scrape_targets=[host_port], scrape_interval="250ms")
    for i in range(8):
        _complete(server, 4, prompt=f"prometheus {i}")
    prom.wait_for('up{job="target0"}', lambda r: len(r) == 1 and r[0]["value"][1] == "1", timeout=30)
    for metric in ("sits_time_to_first_token_seconds", "sits_inter_token_latency_seconds",
                   "sits_e2e_request_latency_seconds", "http_request_duration_seconds"):
        q = f'histogram_quantile(0.9, sum by (le, kernel_version) ({metric}_bucket{{env="test"}}))' \
            if metric.startswith("sits") else \
            f'histogram_quantile(0.9, sum by (le) ({metric}_bucket{{route="/v1/completions",status="200"}}))'
        result = prom.wait_for(q, lambda r: len(r) == 1 and not math.isnan(float(r[0]["value"][1])), timeout=15)
        v = float(result[0]["value"][1])
        assert 0 < v < 64, (metric, v)
    # the quantile moves as requests are served: rate() over new traffic is defined
    for i in range(4):
        _complete(server, 2, prompt=f"again {i}")
    prom.wait_for('sum(increase(sits_e2e_request_latency_seconds_count[10s])) > 0', lambda r: len(r) == 1,
                  timeout=15)


def test_replayed_requests_are_counted_apart_and_stay_out_of_the_live_token_counts(server):
    """X-SITS-Replay: 1 (low-traffic mode): timed like live requests (same latency histogram), counted by origin and
    stream in sits_inference_requests_total, and left out of the live token-count histograms replay is drawn from."""
    kv = server.state.runner.engine.kernel_set.version
    labels = dict(ENG, kernel_version=kv)
    before = server.metrics()
    _complete(server, 5, prompt="x" * 40)                        # live, plain
    _complete(server, 3, prompt="y" * 10, stream=True)           # live, streamed
    body = {"model": "tiny", "prompt": "replayed", "max_tokens": 7, "temperature": 0, "ignore_eos": True}
    for stream in (False, True):
        status, _, payload = http("POST", server.url + "/v1/completions", {**body, "stream": stream},
                                  {"X-SITS-Replay": "1"})
        assert status == 200, payload
    after = server.metrics()

    def delta(family, name=None, **lbl):
        return sample(after, family, name, **lbl) - sample(before, family, name, **lbl)

    route = dict(ENG, route="/v1/completions")
    assert delta("http_request_duration_seconds", "http_request_duration_seconds_count", **route) == 4
    counter = ("sits_inference_requests", "sits_inference_requests_total")
    assert delta(*counter, origin="live", stream="false", **route) == 1
    assert delta(*counter, origin="live", stream="true", **route) == 1
    assert delta(*counter, origin="replay", stream="false", **route) == 1
    assert delta(*counter, origin="replay", stream="true", **route) == 1
    # token counts: the two live requests only (byte-level tokenizer: 40 and 10 prompt tokens, +1 for BOS or not)
    assert delta("sits_request_generation_tokens", "sits_request_generation_tokens_count", **labels) == 2
    assert delta("sits_request_generation_tokens", "sits_request_generation_tokens_sum", **labels) == 5 + 3
    prompt_sum = delta("sits_request_prompt_tokens", "sits_request_prompt_tokens_sum", **labels)
    assert 50 <= prompt_sum <= 52, prompt_sum
    # the 5-token answer lands in the le=5 bucket, not le=4
    assert delta("sits_request_generation_tokens", "sits_request_generation_tokens_bucket", le="5.0", **labels) == 2
    assert delta("sits_request_generation_tokens", "sits_request_generation_tokens_bucket", le="4.0", **labels) == 1


def test_device_memory_gauge_is_exported_when_the_engine_holds_gpu_memory():
    """The collector turns EngineStats.device_memory_bytes (a CUDA engine's allocator hold) into a gauge."""
    from prometheus_client import CollectorRegistry, generate_latest

    from sits.engine.server.metrics import MetricLabels, _StatsCollector
    from sits.engine.outputs import EngineStats

    stats = EngineStats(1, 0, 90, 100, 0.1, 0, 0, 0, 5, 7, device_memory_bytes=1_500_000_000)
    reg = CollectorRegistry()
    reg.register(_StatsCollector(MetricLabels("canary", "chat", "triton-v1"), lambda: stats, dict))
    text = generate_latest(reg).decode()
    assert ('sits_device_memory_reserved_bytes{env="canary",kernel_version="triton-v1",service="chat"} 1.5e+09'
            in text)
