"""Control plane: rollouts by phase, checks by outcome, rollbacks by reason, reconcile latency, rollout durations."""
from sits.control_plane.analysis import promql
from sits.dashboards.common import NS, QUANTILES, RATE, dashboard, q_name, stat, timeseries, variables

MATCH = promql.matchers(namespace=NS, service=("=~", "$service"))
NS_ONLY = promql.matchers(namespace=NS)   # the duration histograms are not split by service

panels = [
    stat("Active rollouts", promql.render("gauge_by", agg="sum", metric="sits_rollout_phase", by="namespace",
                                          match=promql.matchers(namespace=NS, service=("=~", "$service"),
                                                                phase=("=~", "pending|initializing|progressing|"
                                                                             "paused|promoting|rolling_back"))),
         "{{namespace}}"),
    stat("Rollbacks in range", promql.render("increase_by", metric="sits_rollbacks_total", by="namespace",
                                             match=MATCH, window="$__range"), "{{namespace}}"),
    stat("Inconclusive checks in range",
         promql.render("increase_by", metric="sits_rollout_checks_total", by="namespace",
                       match=promql.matchers(namespace=NS, service=("=~", "$service"), outcome="inconclusive"),
                       window="$__range"), "{{namespace}}"),
    stat("Reconcile P99", promql.render("quantile_by", q=0.99, metric="sits_reconcile_duration_seconds",
                                        by="namespace", match=NS_ONLY, window=RATE), "{{namespace}}", unit="s"),
    timeseries("Rollouts by phase", [(promql.render("gauge_by", agg="sum", metric="sits_rollout_phase", by="phase",
                                                    match=MATCH), "{{phase}}")]),
    timeseries("Canary weight per rollout", [
        (promql.render("gauge_by", agg="max", metric="sits_canary_weight_percent", by="service, rollout",
                       match=MATCH), "{{service}} {{rollout}}")], unit="percent"),
    timeseries("Checks by outcome", [(promql.render("increase_by", metric="sits_rollout_checks_total",
                                                    by="service, outcome", match=MATCH, window=RATE),
                                      "{{service}} {{outcome}}")]),
    timeseries("Rollbacks by reason", [(promql.render("increase_by", metric="sits_rollbacks_total",
                                                      by="service, reason", match=MATCH, window=RATE),
                                        "{{service}} {{reason}}")]),
    timeseries("Reconcile latency", [
        (promql.render("quantile_by", q=q, metric="sits_reconcile_duration_seconds", by="namespace",
                       match=NS_ONLY, window=RATE), f"{q_name(q)} {{{{namespace}}}}") for q in QUANTILES], unit="s"),
    timeseries("Rollout duration by outcome (over the range)", [
        (promql.render("quantile_by", q=q, metric="sits_rollout_duration_seconds", by="outcome", match=NS_ONLY,
                       window="$__range"), f"{q_name(q)} {{{{outcome}}}}") for q in (0.5, 0.9)], unit="s"),
]

dashboard = dashboard(
    "SITS / Control plane", "sits-control-plane",
    "The control plane's own metrics: rollouts by phase, canary weights, checks by outcome, rollbacks by reason, "
    "reconcile latency and rollout durations.",
    panels, variables("sits_rollout_phase", multi_service=True), tags=["control-plane"])
