"""Prometheus metrics of one engine server process.

Every server owns its own `CollectorRegistry` (several servers may live in one test process). Latency histograms use
`sits.wire.buckets.LATENCY_BUCKETS` (geometric, 2**(1/8) apart, from 0.49 ms to 64 s: see that module for why). Engine
counters that the engine keeps itself (tokens, preemptions, prefix-cache queries/hits) and the gauges (running/waiting
requests, KV usage) are read from `LLMEngine.stats()` (thread-safe) at scrape time, so they can never drift from the
engine's own numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from prometheus_client import (CollectorRegistry, Counter, Histogram, Info, ProcessCollector, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sits.wire import metrics as m
from sits.wire.buckets import LATENCY_BUCKETS, TOKEN_BUCKETS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # no *_created series: they double the series count and no query here reads them


@dataclass(slots=True)
class MetricLabels:
    env: str
    service: str
    kernel_version: str = "unknown"

    def __post_init__(self) -> None:
        for name in ("env", "service", "kernel_version"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"metric label {name!r} must be a non-empty string, got {value!r}")


def _thread_cpu_seconds(native_id: int) -> float | None:
    """User+system CPU seconds of one thread of this process (Linux /proc), None where unavailable."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state); utime, stime are fields 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _StatsCollector(Collector):
    """Exposes the engine's own cumulative counters and gauges, read from the engine at scrape time."""

    def __init__(self, labels: MetricLabels, get_stats: Callable[[], Any], get_threads: Callable[[], dict[str, Any]]):
        self._labels = labels
        self._get_stats = get_stats
        self._get_threads = get_threads

    def collect(self) -> Iterable[Any]:
        names = list(m.ENGINE_LABELS)
        values = [self._labels.env, self._labels.service, self._labels.kernel_version]
        stats = self._get_stats()
        if stats is not None:
            counters = [
                (m.PROMPT_TOKENS_TOTAL, "Prompt tokens processed.", stats.prompt_tokens_total),
                (m.GENERATION_TOKENS_TOTAL, "Tokens generated.", stats.generation_tokens_total),
                (m.PREEMPTIONS, "Sequences preempted (recomputed later) for lack of KV blocks.",
                 stats.num_preemptions),
                (m.PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
                 stats.prefix_cache_queries),
                (m.PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
            ]
            for name, doc, value in counters:
                family = CounterMetricFamily(name, doc, labels=names)
                family.add_metric(values, float(value))
                yield family
            gauges = [
                (m.REQUESTS_RUNNING, "Requests in the running batch.", stats.num_running),
                (m.REQUESTS_WAITING, "Requests waiting to be scheduled.", stats.num_waiting),
                (m.KV_CACHE_USAGE, "Fraction of KV-cache blocks in use (0..1).", stats.kv_cache_usage),
                (m.KV_CACHE_FREE_BLOCKS, "KV-cache blocks free.", stats.num_free_blocks),
                (m.KV_CACHE_TOTAL_BLOCKS, "KV-cache blocks in total.", stats.num_total_blocks),
            ]
            if stats.device_memory_bytes:
                gauges.append((m.DEVICE_MEMORY, "GPU memory held by the engine's CUDA caching "
                               "allocator: weights, KV cache and activations (the CUDA context not counted).",
                               stats.device_memory_bytes))
            for name, doc, value in gauges:
                family = GaugeMetricFamily(name, doc, labels=names)
                family.add_metric(values, float(value))
                yield family
        threads = self._get_threads()
        if threads:
            family = CounterMetricFamily("sits_thread_cpu_seconds", "CPU seconds used per server thread (thread "
                                         "\"engine\": the engine loop, in the engine-core process when it runs in one).",
                                         labels=names + ["thread"])
            for thread, source in sorted(threads.items()):
                seconds = source() if callable(source) else _thread_cpu_seconds(source)
                if seconds is not None:
                    family.add_metric(values + [thread], seconds)
            yield family


class EngineMetrics:
    """All metrics of one server. Thread-safe (prometheus_client metrics are)."""

    def __init__(self, labels: MetricLabels, *, model: str = "unknown", kernel_set: str = "unknown",
                 build: str = "unknown") -> None:
        self.labels = labels
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        eng = list(m.ENGINE_LABELS)
        self.http_request_duration = Histogram(
            m.REQUEST_LATENCY, "HTTP request duration, from request start to the last byte sent.",
            list(m.HTTP_LABELS), buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(m.TTFT, "Time from request arrival to its first token.",
                              eng, buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(m.ITL, "Time between consecutive output tokens.",
                             eng, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(m.E2E, "Time from request arrival to its last token.",
                             eng, buckets=LATENCY_BUCKETS, registry=r)
        # the engine API reports no scheduling timestamps: this is arrival -> start of the step that produced the
        # first token, so for prompts longer than one step's token budget it includes the earlier prefill chunks
        self.queue_time = Histogram(m.QUEUE_TIME, "Time from request arrival to the start of the "
                                    "engine step that produced its first token.",
                                    eng, buckets=LATENCY_BUCKETS, registry=r)
        self.step_time = Histogram(m.ENGINE_STEP, "Wall time of one engine scheduler step.",
                                   eng, buckets=LATENCY_BUCKETS, registry=r)
        self.request_success = Counter("sits_request_success", "Finished requests by finish reason.",
                                       eng + ["finished_reason"], registry=r)
        self.probe_requests = Counter(m.PROBE_REQUESTS, "Requests marked X-SITS-Probe: 1 (the control plane's "
                                      "correctness probes); kept out of every latency histogram and error count.",
                                      [m.ENV, m.SERVICE, m.STATUS], registry=r)
        # every inference request but probes, by origin ("replay": X-SITS-Replay: 1, the control plane's low-traffic
        # replay; "live" otherwise) and whether it streamed: replayed and live counts, the live streamed share
        self.inference_requests = Counter(m.INFERENCE_REQUESTS, "Inference requests (probes excluded) by route, "
                                          "origin (live | replay) and whether the answer streamed.",
                                          [m.ENV, m.SERVICE, m.ROUTE, m.ORIGIN, "stream"], registry=r)
        # live requests' token counts (replayed ones excluded): the workload low-traffic replay is drawn from
        self.prompt_tokens = Histogram(m.PROMPT_TOKENS, "Prompt tokens of each finished live request.",
                                       eng, buckets=TOKEN_BUCKETS, registry=r)
        self.generation_tokens = Histogram(m.GENERATION_TOKENS, "Tokens generated for each finished live "
                                           "request.", eng, buckets=TOKEN_BUCKETS, registry=r)
        self.request_errors = Counter("sits_request_errors", "Requests answered with an error, by HTTP status code.",
                                      eng + ["code"], registry=r)
        self.info = Info(m.ENGINE_INFO, "The engine build serving this endpoint.", registry=r)
        self.info.info({"kernel_version": labels.kernel_version, "kernel_set": kernel_set, "model": model,
                        "env": labels.env, "service": labels.service, "build": build})
        self._eng_values = (labels.env, labels.service, labels.kernel_version)
        self._stats_source: Callable[[], Any] = lambda: None
        self._threads: dict[str, int | Callable[[], float | None]] = {}
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, open fds
        r.register(_StatsCollector(labels, self._get_stats, lambda: dict(self._threads)))

    # --- engine stats (read at scrape) ---
    def set_stats_source(self, source: Callable[[], Any]) -> None:
        """`source()` returns an EngineStats, or None while no engine is loaded."""
        self._stats_source = source

    def _get_stats(self) -> Any:
        return self._stats_source()

    def track_thread(self, name: str, native_id: int) -> None:
        self._threads[name] = native_id

    def set_thread_cpu_source(self, name: str, source: Callable[[], float | None]) -> None:
        """CPU seconds of a thread in another process (the engine core's loop), as it last reported them."""
        self._threads[name] = source

    # --- observations ---
    def observe_http(self, route: str, status: int, seconds: float) -> None:
        self.http_request_duration.labels(self.labels.env, self.labels.service, route, str(status)).observe(seconds)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.labels(*self._eng_values).observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self.itl.labels(*self._eng_values).observe(seconds)

    def observe_e2e(self, seconds: float) -> None:
        self.e2e.labels(*self._eng_values).observe(seconds)

    def observe_queue_time(self, seconds: float) -> None:
        self.queue_time.labels(*self._eng_values).observe(seconds)

    def observe_step(self, seconds: float) -> None:
        self.step_time.labels(*self._eng_values).observe(seconds)

    def count_finished(self, reason: str) -> None:
        self.request_success.labels(*self._eng_values, reason).inc()

    def count_probe(self, status: int) -> None:
        self.probe_requests.labels(self.labels.env, self.labels.service, str(status)).inc()

    def count_inference(self, route: str, replay: bool, stream: bool) -> None:
        self.inference_requests.labels(self.labels.env, self.labels.service, route, m.ORIGIN_REPLAY if replay else m.ORIGIN_LIVE,
                                       "true" if stream else "false").inc()

    def observe_tokens(self, prompt_tokens: int, generation_tokens: int) -> None:
        self.prompt_tokens.labels(*self._eng_values).observe(prompt_tokens)
        self.generation_tokens.labels(*self._eng_values).observe(generation_tokens)

    def count_error(self, status: int) -> None:
        self.request_errors.labels(*self._eng_values, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
