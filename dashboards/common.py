"""Shared pieces of the SITS dashboards: the data source, template variables, panel helpers and the layout.

Every expression comes from `sits.control_plane.analysis.promql` (the analysis, these dashboards and the chart's
recording rules share that one place); here they are only filled with Grafana's template variables.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from grafanalib.core import (Annotations, Dashboard, GridPos, Stat, Target, Template, Templating, Time, TimeSeries)

from sits.control_plane.analysis import promql
from sits.wire.metrics import E2E, ENGINE_INFO_METRIC, ITL, REQUEST_LATENCY, TTFT

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 37              # panels with gridPos, fieldConfig and data-source references (Grafana >= 8.5)
RATE = "$__rate_interval"
VARIANTS = ("production", "baseline", "canary")
QUANTILES = (0.5, 0.9, 0.99)
NS = ("=~", "$namespace")

LATENCY = {REQUEST_LATENCY: "Request latency", TTFT: "Time to first token", ITL: "Inter-token latency",  # panel titles
           E2E: "End-to-end latency"}


def q_name(q: float) -> str:
    return f"P{q * 100:g}"


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, datasource=DATASOURCE, instant=instant)


def refs(targets: Iterable[tuple[str, str]]) -> list[Target]:
    """(expr, legend) pairs as targets A, B, C, ..."""
    return [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)]


def timeseries(title: str, targets: Sequence[tuple[str, str]], unit: str = "", description: str = "",
               width: int = 12) -> TimeSeries:
    return TimeSeries(title=title, dataSource=DATASOURCE, targets=refs(targets), unit=unit, description=description,
                      legendDisplayMode="table", legendCalcs=["lastNotNull", "max"], tooltipMode="multi",
                      gridPos=GridPos(h=8, w=width, x=0, y=0))


def stat(title: str, expr: str, legend: str = "", unit: str = "none", width: int = 6,
         description: str = "") -> Stat:
    return Stat(title=title, dataSource=DATASOURCE, targets=[target(expr, legend, instant=True)], format=unit,
                reduceCalc="lastNotNull", description=description, gridPos=GridPos(h=4, w=width, x=0, y=0),
                thresholds=[{"color": "green", "value": None}])


def layout(panels: Sequence) -> list:
    """Left to right on Grafana's 24-column grid, wrapping to a new row; keeps each panel's w and h."""
    x = y = row_h = 0
    for p in panels:
        w, h = p.gridPos.w, p.gridPos.h
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p.gridPos = GridPos(h=h, w=w, x=x, y=y)
        x, row_h = x + w, max(row_h, h)
    return list(panels)


def variables(service_metric: str = ENGINE_INFO_METRIC, multi_service: bool = False) -> Templating:
    """$datasource (any Prometheus), $namespace (several, or all) and $service (from `service_metric`)."""
    return Templating(list=[
        Template(name="datasource", label="Data source", type="datasource", query="prometheus", default="Prometheus"),
        Template(name="namespace", label="Namespace", dataSource=DATASOURCE, includeAll=True, multi=True,
                 allValue=".*", default="$__all", query=f"label_values({service_metric}, namespace)"),
        Template(name="service", label="Service", dataSource=DATASOURCE, includeAll=multi_service,
                 multi=multi_service, allValue=".*" if multi_service else None,
                 query=f'label_values({service_metric}{{namespace=~"$namespace"}}, service)'),
    ])


def annotations() -> Annotations:
    """Rollout phase changes and check verdicts of the selected service, from the control plane's metrics."""
    match = promql.matchers(namespace=NS, service=("=~", "$service"))
    return Annotations(list=[
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"datasource": DATASOURCE, "enable": True, "name": "Rollout phase", "iconColor": "blue",
         "expr": promql.render("phase_entered", metric="sits_rollout_phase", match=match, window="$__interval"),
         "step": "30s", "titleFormat": "{{phase}}", "textFormat": "rollout {{rollout}} entered {{phase}}",
         "tagKeys": "service,phase"},
        {"datasource": DATASOURCE, "enable": True, "name": "Check verdicts", "iconColor": "orange",
         "expr": promql.render("verdicts", by="service, outcome", match=match, window="$__interval"),
         "step": "30s", "titleFormat": "check {{outcome}}", "textFormat": "{{service}}: a check ended {{outcome}}",
         "tagKeys": "service,outcome"},
    ])


def dashboard(title: str, uid: str, description: str, panels: Sequence, templating: Templating,
              tags: Sequence[str] = ()) -> Dashboard:
    return Dashboard(title=title, uid=uid, description=description, tags=["sits", *tags], timezone="browser",
                     panels=layout(panels), templating=templating, annotations=annotations(),
                     time=Time("now-1h", "now"), refresh="10s", schemaVersion=SCHEMA_VERSION).auto_panel_ids()
