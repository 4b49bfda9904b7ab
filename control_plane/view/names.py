"""Metric and check names in words, one map for every renderer: 'http_request_duration_seconds:p99' is "p99 request
latency" in a list, "request latency p99 /v1/completions" in a table, "P99" on the demo's one line."""
from __future__ import annotations

from sits.control_plane.analysis import ERROR_RATE
from sits.wire.metrics import E2E, ITL, REQUEST_LATENCY, TTFT

SHORT_NAMES = {REQUEST_LATENCY: "request latency", TTFT: "TTFT", ITL: "inter-token latency", E2E: "e2e latency",
               ERROR_RATE: "error rate"}
# the demo's one line per check: request latency goes unnamed ("P99"), the others abbreviated ("ITL P99")
TERSE_NAMES = {REQUEST_LATENCY: "", ITL: "ITL", TTFT: "TTFT"}


def metric_of(series: str) -> str:
    """'http_request_duration_seconds{route="/x"}' -> 'http_request_duration_seconds'."""
    return series.split("{", 1)[0]


def route_of(series: str) -> str:
    """The series' route label, "" when it has none."""
    return series.split('route="', 1)[1].split('"', 1)[0] if 'route="' in series else ""


def quantile_of(check: str) -> str:
    """'metric:p99_9' -> '99.9'; "" for a check without a quantile (the error rate)."""
    return check.partition(":p")[2].replace("_", ".")


def short_name(metric: str) -> str:
    return SHORT_NAMES.get(metric, metric)


def check_label(check: str) -> str:
    """'http_request_duration_seconds:p99' -> 'p99 request latency'; 'error_rate' -> 'error rate'."""
    metric = check.partition(":p")[0]
    q = quantile_of(check)
    return f"p{q} {short_name(metric)}" if q else short_name(metric)


def series_label(check: str, series: str) -> str:
    """'request latency p99 /v1/completions' for check 'http_request_duration_seconds:p99' on that route's series."""
    metric = check.partition(":p")[0]
    if metric == ERROR_RATE:
        return short_name(ERROR_RATE)
    return f"{short_name(metric)} p{quantile_of(check)} {route_of(series)}".strip()


def terse_label(check: str) -> str:
    """'http_request_duration_seconds:p99' -> 'P99', 'sits_inter_token_latency_seconds:p99_9' -> 'ITL P99.9'."""
    metric = check.partition(":p")[0]
    return f"{TERSE_NAMES.get(metric, metric)} P{quantile_of(check)}".lstrip()
