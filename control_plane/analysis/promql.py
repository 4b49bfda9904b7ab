"""Every PromQL expression SITS runs or shows, as templates that fail on a missing key.

The analysis needs bucket COUNTS per variant (not a single quantile) to bound its estimates, so the Prometheus metrics
source asks for each window's increase of every bucket; the quantile expressions are what dashboards and the evidence
view show next to the analysis' own numbers (same data, same interpolation: histogram_quantile here is Prometheus').
Labels: env = the variant's role (production | baseline | canary), service = the rollout's service.
Only answered requests are timed: server errors (5xx, and 429: the server refused the work) are counted as errors,
client errors (every other 4xx: 400, 408, 413, 499, ...) are kept in their own `status` series but neither timed nor
counted as requests of the error rate, so no client can move a verdict by sending bad or slow requests
(docs/security.md). The Grafana dashboards (dashboards/) and the Helm chart's recording rules and alerts
(dashboards/rules.py) are rendered from these templates too.

    render("bucket_increase", metric="http_request_duration_seconds", service="chat", env="canary",
           extra="", window="30s")
"""
from __future__ import annotations

import re
import string
from typing import Mapping

from sits.wire.metrics import REQUEST_LATENCY

# status classes of http_request_duration_seconds (label `status`), as PromQL regexes and as one Python predicate
SERVER_ERROR = "5..|429"            # counted as errors
COUNTED = "[1235]..|429"            # the requests of the error rate: everything but client errors
TIMED = "[123].."                   # the judged latency: answered requests only
LATENCY_FILTER = {REQUEST_LATENCY: f',status=~"{TIMED}"'}
_REQUESTS = REQUEST_LATENCY + "_count"   # every answered request, by status


def status_class(status: str) -> str:
    """'timed' (1xx-3xx), 'error' (5xx, 429) or 'client' (any other 4xx, or no status): the regexes above in Python."""
    if status == "429" or status.startswith("5"):
        return "error"
    if status[:1] in ("1", "2", "3"):
        return "timed"
    return "client"


TEMPLATES: dict[str, str] = {
    # per-window bucket counts of one variant, summed over replicas (what the analysis consumes)
    "bucket_increase": 'sum by (le) (increase({metric}_bucket{{service="{service}",env="{env}"{extra}}}[{window}]))',
    # the same, split per route (request-latency checks run per route)
    "bucket_increase_by_route": 'sum by (le, route) (increase({metric}_bucket{{service="{service}",env="{env}"'
                                '{extra}}}[{window}]))',
    "count_increase": 'sum(increase({metric}_count{{service="{service}",env="{env}"{extra}}}[{window}]))',
    # the same three over any matcher list (`match`, built by matchers()/selector(): the judge's label selectors)
    "bucket_increase_match": 'sum by (le) (increase({metric}_bucket{{{match}}}[{window}]))',
    "bucket_increase_by_route_match": 'sum by (le, route) (increase({metric}_bucket{{{match}}}[{window}]))',
    "count_increase_match": 'sum(increase({metric}_count{{{match}}}[{window}]))',
    # a counter's window increase (sits_inference_requests_total by origin/stream: replayed and live streamed requests)
    "counter_increase_match": 'sum(increase({metric}_total{{{match}}}[{window}]))',
    "requests": 'sum(increase(' + _REQUESTS + '{{service="{service}",env="{env}",status=~"' + COUNTED
                + '"}}[{window}]))',
    "errors": 'sum(increase(' + _REQUESTS + '{{service="{service}",env="{env}",status=~"' + SERVER_ERROR
              + '"}}[{window}]))',
    # what a dashboard shows: the windowed quantile per variant, and the canary-vs-target relative delta
    "quantile": 'histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{service="{service}",env="{env}"{extra}}}'
                '[{window}])))',
    "quantile_delta": '(histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{service="{service}",env="canary"'
                      '{extra}}}[{window}]))) / histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{service='
                      '"{service}",env="{target}"{extra}}}[{window}])))) - 1',
    # (a variant that never answered 5xx has no 5xx series: its rate is 0, not "no data")
    "error_rate": '(sum(rate(' + _REQUESTS + '{{service="{service}",env="{env}",status=~"' + SERVER_ERROR
                  + '"{extra}}}[{window}])) or vector(0)) / sum(rate(' + _REQUESTS
                  + '{{service="{service}",env="{env}",status=~"' + COUNTED + '"{extra}}}[{window}]))',
    # dashboards and the Helm chart's recording rules: the same forms split by variant. `match` is a whole matcher
    # list built by matchers() (validated there), `by` the grouping labels (validated as label names)
    "quantile_by": 'histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{match}}}[{window}])))',
    "rate_by": 'sum by ({by}) (rate({metric}{{{match}}}[{window}]))',
    "increase_by": 'sum by ({by}) (increase({metric}{{{match}}}[{window}]))',
    "ratio_by": 'sum by ({by}) (rate({numerator}{{{match}}}[{window}])) / sum by ({by}) (rate({denominator}'
                '{{{match}}}[{window}]))',
    "error_ratio_by": '(sum by ({by}) (rate(' + _REQUESTS + '{{{match},status=~"' + SERVER_ERROR
                      + '"}}[{window}])) or 0 * sum by ({by}) (rate(' + _REQUESTS + '{{{match},status=~"' + COUNTED
                      + '"}}[{window}]))) / sum by ({by}) (rate(' + _REQUESTS + '{{{match},status=~"' + COUNTED
                      + '"}}[{window}]))',
    "gauge_by": '{agg} by ({by}) ({metric}{{{match}}})',
    # control plane: phase transitions (a phase that is current now but was not one interval ago), rollbacks,
    # and services whose checks were all inconclusive over a window
    "verdicts": 'sum by ({by}) (increase(sits_rollout_checks_total{{{match}}}[{window}])) > 0',
    "rolled_back": 'sum by ({by}) (increase(sits_rollbacks_total{{{match}}}[{window}])) > 0',
    "target_down": 'absent(up{{{match}}} == 1)',
    "phase_entered": '({metric}{{{match}}} == 1) unless ({metric}{{{match}}} offset {window} == 1)',
    "inconclusive_only": 'sum by ({by}) (increase(sits_rollout_checks_total{{{match},outcome="inconclusive"}}'
                         '[{window}])) > 0 unless sum by ({by}) (increase(sits_rollout_checks_total{{{match},'
                         'outcome=~"pass|fail"}}[{window}])) > 0',
}


class TemplateError(KeyError):
    """Unknown template, missing key, or a value that would break the expression."""


_SAFE_VALUE = re.compile(r'^[^"\\\n{}]*$')
_LABELS = re.compile(r'^[a-zA-Z_][a-zA-Z0-9_]*(, ?[a-zA-Z_][a-zA-Z0-9_]*)*$')
_RAW = {"extra", "match"}   # built by matchers()/route_filter(), or LATENCY_FILTER


def keys(name: str) -> set[str]:
    if name not in TEMPLATES:
        raise TemplateError(f"unknown PromQL template {name!r}; known: {', '.join(sorted(TEMPLATES))}")
    return {f for _, f, _, _ in string.Formatter().parse(TEMPLATES[name]) if f}


def render(name: str, **values: object) -> str:
    """Fill template `name`; raises TemplateError on a missing or unknown key or an unsafe label value."""
    needed = keys(name)
    if "extra" in needed and "extra" not in values:
        values["extra"] = LATENCY_FILTER.get(str(values.get("metric", "")), "")
    missing, unknown = needed - set(values), set(values) - needed
    if missing:
        raise TemplateError(f"PromQL template {name!r} needs {', '.join(sorted(missing))}")
    if unknown:
        raise TemplateError(f"PromQL template {name!r} takes no {', '.join(sorted(unknown))}")
    if "agg" in values and values["agg"] not in ("sum", "max", "min", "avg", "count"):
        raise TemplateError(f"'agg' must be sum, max, min, avg or count: {values['agg']!r}")
    if "by" in values and not _LABELS.match(str(values["by"])):
        raise TemplateError(f"'by' must be a comma-separated list of label names: {values['by']!r}")
    for k, v in values.items():
        if k not in _RAW and not _SAFE_VALUE.match(str(v)):
            raise TemplateError(f"value for {k!r} may not contain quotes, backslashes, braces or newlines: {v!r}")
    return TEMPLATES[name].format(**values)


def matchers(metric: str = "", **labels: str | tuple[str, str]) -> str:
    """A matcher list for `match`: labels as values (`=`) or (op, value) pairs, e.g. namespace=("=~", "$ns"),
    plus the latency filter of `metric` (5xx excluded from request latency)."""
    out = []
    for k, v in labels.items():
        op, val = v if isinstance(v, tuple) else ("=", v)
        if op not in ("=", "!=", "=~", "!~"):
            raise TemplateError(f"matcher operator for {k!r} must be =, !=, =~ or !~, got {op!r}")
        if not _LABELS.match(k) or not _SAFE_VALUE.match(str(val)):
            raise TemplateError(f"unsafe matcher {k}{op}{val!r}")
        out.append(f'{k}{op}"{val}"')
    return (",".join(out) + LATENCY_FILTER.get(metric, "")).lstrip(",")


_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"\\\n{}]*)"\s*(,|$)')
MAX_SELECTOR = 1000


def selector(text: str) -> str:
    """A user's label selector (`{service="chat",env="canary"}`, braces optional) as a validated `match` list.
    Values may not contain quotes, backslashes, braces or newlines; at least one matcher must select a non-empty
    value (Prometheus refuses selectors that match everything)."""
    if not isinstance(text, str) or len(text) > MAX_SELECTOR:
        raise TemplateError(f"a label selector is a string of at most {MAX_SELECTOR} characters")
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out, pos = [], 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if m is None:
            raise TemplateError(f'bad label selector {text[:200]!r}: expected name="value" matchers separated by '
                                f'commas (operators =, !=, =~, !~) at character {pos}')
        out.append((m[1], m[2], m[3]))
        pos = m.end()
        if m[4] == "," and pos >= len(body):
            raise TemplateError(f"bad label selector {text[:200]!r}: trailing comma")
    if not any(op in ("=", "=~") and val for _, op, val in out):
        raise TemplateError(f"label selector {text[:200]!r} needs a matcher with a non-empty value, "
                            'e.g. service="chat"')
    return ",".join(f'{k}{op}"{v}"' for k, op, v in out)


def route_filter(route: str) -> str:
    """The `extra` matcher selecting one route (plus the latency filter), e.g. for a per-route series."""
    if not _SAFE_VALUE.match(route):
        raise TemplateError(f"route may not contain quotes, backslashes, braces or newlines: {route!r}")
    return f',route="{route}"' + LATENCY_FILTER[REQUEST_LATENCY]


def series_key(metric: str, labels: Mapping[str, str] | None = None) -> str:
    """The key a histogram has in VariantData.histograms: 'metric' or 'metric{route="/v1/completions"}'."""
    if not labels:
        return metric
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
