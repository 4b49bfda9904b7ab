"""Dashboard test helpers: the structure Grafana needs, every PromQL a dashboard holds, Grafana's variable
substitution, and a control-plane rollout timeline as OpenMetrics for backfilling."""
from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass

from sits.control_plane.rollout import Phase

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = {"__rate_interval", "__interval", "__range", "__all"}
PANEL_TYPES = {"timeseries", "stat"}


class SchemaError(AssertionError):
    pass


def check_schema(d: dict) -> None:
    """What Grafana needs to import and render a dashboard: uid, title, schemaVersion, templating, and panels on the
    24-column grid (no overlaps) with unique ids, each target an expr with a refId and a Prometheus data source."""
    def need(cond, msg):
        if not cond:
            raise SchemaError(f"{d.get('uid')}: {msg}")
    need(isinstance(d.get("uid"), str) and 0 < len(d["uid"]) <= 40, "uid must be 1..40 characters")
    need(isinstance(d.get("title"), str) and d["title"], "no title")
    need(isinstance(d.get("schemaVersion"), int) and d["schemaVersion"] >= 33, "schemaVersion < 33 (datasource refs)")
    variables = {v["name"]: v for v in d.get("templating", {}).get("list", [])}
    need({"datasource", "namespace", "service"} <= set(variables), f"template variables {sorted(variables)}")
    need(variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus",
         "$datasource must be a Prometheus data-source variable")
    for name in ("namespace", "service"):
        need(variables[name]["datasource"] == DATASOURCE and variables[name]["query"], f"${name} has no query")
    panels = d.get("panels")
    need(isinstance(panels, list) and panels, "no panels")
    ids, cells = set(), set()
    for p in panels:
        need(p.get("type") in PANEL_TYPES, f"panel type {p.get('type')!r}")
        need(isinstance(p.get("id"), int) and p["id"] not in ids, f"panel {p.get('title')!r}: id missing or reused")
        ids.add(p["id"])
        need(p.get("title"), "panel without title")
        g = p.get("gridPos") or {}
        need(all(isinstance(g.get(k), int) for k in "xywh") and g["w"] > 0 and g["h"] > 0 and g["x"] >= 0
             and g["x"] + g["w"] <= 24, f"panel {p['title']!r}: gridPos {g}")
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        need(not (mine & cells), f"panel {p['title']!r} overlaps another")
        cells |= mine
        need(p.get("datasource") == DATASOURCE, f"panel {p['title']!r}: datasource {p.get('datasource')}")
        steps = p.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
        need(isinstance(steps, list), f"panel {p['title']!r}: thresholds.steps must be a list, got {steps!r}")
        refs = [t.get("refId") for t in p.get("targets", [])]
        need(refs and len(set(refs)) == len(refs) and all(refs), f"panel {p['title']!r}: targets/refIds {refs}")
        for t in p["targets"]:
            need(isinstance(t.get("expr"), str) and t["expr"], f"panel {p['title']!r}: target without expr")
            need(t.get("datasource") == DATASOURCE, f"panel {p['title']!r}: target datasource {t.get('datasource')}")
    for e in exprs(d):
        unknown = set(re.findall(r"\$(\w+)", e.expr)) - set(variables) - BUILTINS
        need(not unknown, f"{e.where} uses undefined variables {unknown}")


@dataclass(frozen=True)
class Expr:
    where: str
    expr: str
    kind: str    # "panel" | "annotation" | "variable"


def exprs(d: dict) -> list[Expr]:
    out = [Expr(f"{d['uid']} panel {p['title']!r} {t['refId']}", t["expr"], "panel")
           for p in d["panels"] for t in p["targets"]]
    out += [Expr(f"{d['uid']} annotation {a['name']!r}", a["expr"], "annotation")
            for a in d["annotations"]["list"] if a.get("expr")]
    for v in d["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v.get("query") or "")
        if m:   # Grafana's label_values(selector, label) asks for the label's values among the matching series
            out.append(Expr(f"{d['uid']} variable ${v['name']}", f"count by ({m.group(2)}) ({m.group(1)})",
                            "variable"))
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's interpolation for Prometheus: $var and ${var} (regex-escaped values are not needed here)."""
    def one(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no test value for ${name} in {expr}")
        return values[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    data = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/api/v1/query_range", data=data), timeout=30) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        raise AssertionError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]["result"]


def finite_points(result: list[dict]) -> int:
    return sum(1 for s in result for _, v in s["values"] if math.isfinite(float(v)))


CONTROL_METRICS = ("sits_rollout_phase", "sits_canary_weight_percent", "sits_rollout_checks_total",
                   "sits_rollbacks_total", "sits_reconcile_duration_seconds", "sits_rollout_duration_seconds")


def control_plane_timeline(t0: int, namespace: str, service: str = "chat", step: int = 15, n: int = 41) -> str:
    """One rollout of `service` as the control plane's /metrics would show it, scraped every `step` s from t0:
    pending -> initializing -> progressing (weight 10 %, then 25 %) -> rolling_back -> rolled_back; a check every
    4 samples (the first inconclusive, the last failing), one rollback, a reconcile pass per sample."""
    base = f'namespace="{namespace}",service="{service}"'
    ts = [t0 + step * i for i in range(n)]

    def phase_at(i):
        return (Phase.PENDING if i < 1 else Phase.INITIALIZING if i < 2 else Phase.PROGRESSING if i < 30
                else Phase.ROLLING_BACK if i < 32 else Phase.ROLLED_BACK)

    checks = {4: "inconclusive", 29: "fail", **{i: "pass" for i in (8, 12, 16, 20, 24)}}
    lines = ["# TYPE sits_rollout_phase gauge"]
    for ph in Phase:
        lines += [f'sits_rollout_phase{{{base},rollout="r1",phase="{ph.value}"}} {int(phase_at(i) is ph)} {t}'
                  for i, t in enumerate(ts)]
    lines.append("# TYPE sits_canary_weight_percent gauge")
    lines += [f'sits_canary_weight_percent{{{base},rollout="r1"}} {0 if i < 2 or i >= 30 else 10 if i < 15 else 25} '
              f'{t}' for i, t in enumerate(ts)]
    lines.append("# TYPE sits_rollout_checks counter")
    for outcome in ("pass", "fail", "inconclusive"):
        lines += [f'sits_rollout_checks_total{{{base},outcome="{outcome}"}} '
                  f'{sum(1 for j, o in checks.items() if j <= i and o == outcome)} {t}' for i, t in enumerate(ts)]
    lines.append("# TYPE sits_rollbacks counter")
    lines += [f'sits_rollbacks_total{{{base},reason="check_failed"}} {int(i >= 30)} {t}' for i, t in enumerate(ts)]
    lines += _histogram("sits_reconcile_duration_seconds", f'namespace="{namespace}"', (0.005, 0.01, 0.05, 0.1),
                        ts, lambda i: [(0.004, 3 * i), (0.02, i), (0.08, i // 4)])
    lines += _histogram("sits_rollout_duration_seconds", f'namespace="{namespace}",outcome="rolled_back"',
                        (60, 300, 900, 3600), ts, lambda i: [(480.0, int(i >= 32))])
    return "\n".join(lines) + "\n# EOF\n"


def _histogram(name, labels, bounds, ts, observed) -> list[str]:
    """observed(i) -> [(value, cumulative count)]: cumulative bucket counts per sample."""
    out = [f"# TYPE {name} histogram"]
    for i, t in enumerate(ts):
        obs = observed(i)
        for le in (*bounds, math.inf):
            le_s = "+Inf" if math.isinf(le) else repr(float(le))
            out.append(f'{name}_bucket{{{labels},le="{le_s}"}} {sum(c for v, c in obs if v <= le)} {t}')
        out.append(f"{name}_count{{{labels}}} {sum(c for _, c in obs)} {t}")
        out.append(f"{name}_sum{{{labels}}} {sum(v * c for v, c in obs)} {t}")
    return out
