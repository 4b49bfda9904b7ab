"""Canary: production, baseline and canary side by side, the P90/P99 deltas the analysis judges, the canary's weight."""
from sits.control_plane.analysis import promql
from sits.dashboards.common import LATENCY, NS, RATE, VARIANTS, dashboard, q_name, stat, timeseries, variables
from sits.wire.metrics import REQUEST_LATENCY

DELTA_QUANTILES = (0.9, 0.99)
NAMESPACE = ',namespace=~"$namespace"'


def _extra(metric: str) -> str:
    return NAMESPACE + promql.LATENCY_FILTER.get(metric, "")


def _side_by_side(metric: str, title: str):
    return timeseries(f"{title}: P90 / P99 per variant", [
        (promql.render("quantile", q=q, metric=metric, service="$service", env=env, extra=_extra(metric),
                       window=RATE), f"{q_name(q)} {env}")
        for q in DELTA_QUANTILES for env in VARIANTS], unit="s")


def _deltas(metric: str, title: str):
    return timeseries(f"{title}: canary delta", [
        (promql.render("quantile_delta", q=q, metric=metric, service="$service", target=target,
                       extra=_extra(metric), window=RATE), f"{q_name(q)} vs {target}")
        for q in DELTA_QUANTILES for target in ("baseline", "production")], unit="percentunit",
        description="(canary / target) - 1 of the windowed quantile: the same PromQL as the analysis' evidence "
                    "view (control_plane/analysis/promql.py); the verdict itself also bounds it by confidence.")


_weight = promql.render("gauge_by", agg="max", metric="sits_canary_weight_percent", by="service",
                        match=promql.matchers(namespace=NS, service="$service"))

panels = [
    stat("Canary weight", _weight, "{{service}}", unit="percent"),
    *[stat(f"Request latency {q_name(q)} vs baseline",
           promql.render("quantile_delta", q=q, metric=REQUEST_LATENCY, service="$service", target="baseline",
                         extra=_extra(REQUEST_LATENCY), window=RATE), unit="percentunit") for q in DELTA_QUANTILES],
    stat("Error rate (canary)", promql.render("error_rate", service="$service", env="canary", extra=NAMESPACE,
                                              window=RATE), unit="percentunit"),
    timeseries("Canary weight over time", [(_weight, "{{service}}")], unit="percent", width=24),
]
for metric in list(LATENCY)[:3]:   # request latency, TTFT, inter-token latency: what the policy checks
    panels += [_side_by_side(metric, LATENCY[metric]), _deltas(metric, LATENCY[metric])]
panels += [
    timeseries("Error rate per variant", [
        (promql.render("error_rate", service="$service", env=env, extra=NAMESPACE, window=RATE), env)
        for env in VARIANTS],
        unit="percentunit"),
    timeseries("Requests / s per variant", [
        (promql.render("rate_by", metric=REQUEST_LATENCY + "_count", by="env",
                       match=promql.matchers(namespace=NS, service="$service"), window=RATE), "{{env}}")],
        unit="reqps"),
]

dashboard = dashboard(
    "SITS / Canary", "sits-canary",
    "A rollout of one service: production, baseline and canary P90/P99 side by side, the canary's relative deltas "
    "against baseline and production, its traffic weight, and rollout phase / check verdict annotations.",
    panels, variables(), tags=["canary"])
