"""Every PromQL expression SITS runs or shows, as templates that fail on a missing key.

The analysis needs bucket COUNTS per variant (not a single quantile) to bound its estimates, so the Prometheus metrics
source asks for each window's increase of every bucket; the quantile expressions are what dashboards and the evidence
view show next to the analysis' own numbers (same data, same interpolation: histogram_quantile here is Prometheus').
Labels: env = the variant's role (production | baseline | canary), service = the rollout's service.
Error responses (5xx) are excluded from latency and counted as errors.

    render("bucket_increase", metric="http_request_duration_seconds", service="chat", env="canary",
           extra="", window="30s")
"""
from __future__ import annotations

import re
import string
from typing import Mapping

LATENCY_FILTER = {"http_request_duration_seconds": ',status!~"5.."'}

TEMPLATES: dict[str, str] = {
    # per-window bucket counts of one variant, summed over replicas (what the analysis consumes)
    "bucket_increase": 'sum by (le) (increase({metric}_bucket{{service="{service}",env="{env}"{extra}}}[{window}]))',
    # the same, split per route (request-latency checks run per route)
    "bucket_increase_by_route": 'sum by (le, route) (increase({metric}_bucket{{service="{service}",env="{env}"'
                                '{extra}}}[{window}]))',
    "count_increase": 'sum(increase({metric}_count{{service="{service}",env="{env}"{extra}}}[{window}]))',
    "requests": 'sum(increase(http_request_duration_seconds_count{{service="{service}",env="{env}"}}[{window}]))',
    "errors": 'sum(increase(http_request_duration_seconds_count{{service="{service}",env="{env}",status=~"5.."}}'
              '[{window}]))',
    # what a dashboard shows: the windowed quantile per variant, and the canary-vs-target relative delta
    "quantile": 'histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{service="{service}",env="{env}"{extra}}}'
                '[{window}])))',
    "quantile_delta": '(histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{service="{service}",env="canary"'
                      '{extra}}}[{window}]))) / histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{service='
                      '"{service}",env="{target}"{extra}}}[{window}])))) - 1',
    "error_rate": 'sum(rate(http_request_duration_seconds_count{{service="{service}",env="{env}",status=~"5.."}}'
                  '[{window}])) / sum(rate(http_request_duration_seconds_count{{service="{service}",env="{env}"}}'
                  '[{window}]))',
}


class TemplateError(KeyError):
    """Unknown template, missing key, or a value that would break the expression."""


_SAFE_VALUE = re.compile(r'^[^"\\\n{}]*$')


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
    for k, v in values.items():
        if k != "extra" and not _SAFE_VALUE.match(str(v)):
            raise TemplateError(f"value for {k!r} may not contain quotes, backslashes, braces or newlines: {v!r}")
    return TEMPLATES[name].format(**values)


def route_filter(route: str) -> str:
    """The `extra` matcher selecting one route (plus the latency filter), e.g. for a per-route series."""
    if not _SAFE_VALUE.match(route):
        raise TemplateError(f"route may not contain quotes, backslashes, braces or newlines: {route!r}")
    return f',route="{route}"' + LATENCY_FILTER["http_request_duration_seconds"]


def series_key(metric: str, labels: Mapping[str, str] | None = None) -> str:
    """The key a histogram has in VariantData.histograms: 'metric' or 'metric{route="/v1/completions"}'."""
    if not labels:
        return metric
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
