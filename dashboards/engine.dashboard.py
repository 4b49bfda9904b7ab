"""Engine: every variant (env, kernel_version) of one service: traffic, latency percentiles, the scheduler's state."""
from sits.control_plane.analysis import promql
from sits.dashboards.common import (LATENCY, NS, QUANTILES, RATE, dashboard, q_name, timeseries, variables)
from sits.wire import metrics as m
from sits.wire.metrics import QUEUE_TIME, REQUEST_LATENCY

VARIANT = "env, kernel_version"   # the engine's own histograms carry the kernel version; HTTP ones only env


def _match(metric: str = "") -> str:
    return promql.matchers(metric, namespace=NS, service="$service")


def _latency(metric: str, title: str):
    by = "env" if metric == REQUEST_LATENCY else VARIANT
    legend = "{{env}}" if by == "env" else "{{env}} {{kernel_version}}"
    return timeseries(f"{title} P50 / P90 / P99", [
        (promql.render("quantile_by", q=q, metric=metric, by=by, match=_match(metric), window=RATE),
         f"{q_name(q)} {legend}") for q in QUANTILES], unit="s")


def _per_variant(title: str, template: str, unit: str, **values):
    return timeseries(title, [(promql.render(template, by=VARIANT, match=_match(), **values),
                               "{{env}} {{kernel_version}}")], unit=unit)


panels = [
    timeseries("Request rate", [(promql.render("rate_by", metric=REQUEST_LATENCY + "_count", by="env",
                                               match=_match(), window=RATE), "{{env}}")], unit="reqps"),
    timeseries("Error ratio (5xx)", [(promql.render("error_ratio_by", by="env", match=_match(), window=RATE),
                                      "{{env}}")], unit="percentunit"),
    *[_latency(metric, title) for metric, title in LATENCY.items()],
    _latency(QUEUE_TIME, "Queue time"),
    timeseries("Requests running / waiting", [
        (promql.render("gauge_by", agg="sum", metric=m.REQUESTS_RUNNING, by=VARIANT, match=_match()),
         "running {{env}} {{kernel_version}}"),
        (promql.render("gauge_by", agg="sum", metric=m.REQUESTS_WAITING, by=VARIANT, match=_match()),
         "waiting {{env}} {{kernel_version}}")]),
    _per_variant("KV-cache usage (busiest replica)", "gauge_by", "percentunit", agg="max",
                 metric=m.KV_CACHE_USAGE),
    timeseries("Tokens / s", [
        (promql.render("rate_by", metric=m.GENERATION_TOKENS_TOTAL + "_total", by=VARIANT, match=_match(), window=RATE),
         "generated {{env}} {{kernel_version}}"),
        (promql.render("rate_by", metric=m.PROMPT_TOKENS_TOTAL + "_total", by=VARIANT, match=_match(), window=RATE),
         "prompt {{env}} {{kernel_version}}")], unit="short"),
    _per_variant("Prefix-cache hit rate (prompt tokens)", "ratio_by", "percentunit",
                 numerator=m.PREFIX_CACHE_HITS + "_total", denominator=m.PREFIX_CACHE_QUERIES + "_total",
                 window=RATE),
    _per_variant("Preemptions", "increase_by", "short", metric=m.PREEMPTIONS + "_total", window=RATE),
]

dashboard = dashboard(
    "SITS / Engine", "sits-engine",
    "Every variant of one service: request rate, errors, latency percentiles (request, TTFT, inter-token, e2e, "
    "queue), running/waiting requests, KV-cache usage, tokens/s, prefix-cache hits and preemptions.",
    panels, variables(), tags=["engine"])
