"""Chart data of a rollout, from its stored checks: P50/P90/P99 per variant and metric over time (every series of a
metric, e.g. one per route, merged), and the canary-vs-target delta of each checked quantile with its interval.

Each check's evidence holds the step's accumulated bucket counts per variant, so a point is the quantile of the
current step's data so far (it starts afresh at each weight change). Columnar and rounded to 4 significant digits;
more than `max_points` checks are thinned evenly (failed checks and the last one are always kept), so a one-hour
rollout's series stay far below 200 KB.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from control_plane.analysis import ITL, REQUEST_LATENCY, TTFT, HistogramError, HistogramSnapshot, histogram_quantile
from control_plane.web.common import num
from control_plane.web.present import SHORT

CHART_METRICS = (REQUEST_LATENCY, TTFT, ITL)
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
ROLES = ("production", "baseline", "canary")


def thin(checks: Sequence[Mapping], max_points: int) -> list[Mapping]:
    n = len(checks)
    if n <= max_points:
        return list(checks)
    keep = {round(i * (n - 1) / (max_points - 1)) for i in range(max_points)}
    keep |= {i for i, c in enumerate(checks) if c["verdict"]["outcome"] == "fail"}
    keep.add(n - 1)
    return [checks[i] for i in sorted(keep)]


def _merged(histograms: Mapping[str, Mapping], metric: str) -> HistogramSnapshot | None:
    out = None
    for key, h in histograms.items():
        if key != metric and not key.startswith(metric + "{"):
            continue
        snap = HistogramSnapshot.from_dict(h)
        try:
            out = snap if out is None else out.merge(snap)
        except HistogramError:   # a series with another bucket layout: charted by the others
            continue
    return out


def _quantiles(snap: HistogramSnapshot | None) -> list[float | None]:
    if snap is None or snap.total <= 0:
        return [None] * len(QUANTILES)
    buckets = snap.buckets()
    return [num(histogram_quantile(q, buckets)) for _, q in QUANTILES]


def _q_of(check_name: str) -> str:
    return "p" + check_name.partition(":p")[2].replace("_", ".")


def _deltas(ev: Mapping, metric: str) -> dict[str, dict]:
    """Per quantile: the worst series' delta of this metric. Checked quantiles come with their interval, threshold
    and outcome; the others (shown, not decided) are the relative delta against the same target, without bounds."""
    v = ev["verdict"]
    out: dict[str, dict] = {}
    for r in v.get("results", []):
        if metric_matches(r["series"], metric) and r.get("delta_rel") is not None:
            q = _q_of(r["check"])
            if q not in out or r["delta_rel"] > out[q]["delta"]:
                out[q] = {"delta": r["delta_rel"], "low": r.get("ci_low"), "high": r.get("ci_high"),
                          "threshold": r["threshold"], "outcome": r["outcome"], "checked": True}
    target = v.get("compare_to") or "baseline"
    for d in v.get("deltas", []):
        if d.get("quantile") is None or not metric_matches(d["series"], metric):
            continue
        q = f"p{d['quantile'] * 100:g}"
        rel = d.get(f"vs_{target}_rel")
        if rel is None or (q in out and out[q]["checked"]):
            continue
        if q not in out or rel > out[q]["delta"]:
            out[q] = {"delta": rel, "low": None, "high": None, "threshold": None, "outcome": None, "checked": False}
    return out


def metric_matches(series: str, metric: str) -> bool:
    return series == metric or series.startswith(metric + "{")


def build_series(checks: Iterable[Mapping], compare_to: str, max_points: int = 300,
                 metrics: Sequence[str] = CHART_METRICS) -> dict:
    checks = list(checks)
    shown = thin(checks, max_points)
    out = {"compare_to": compare_to, "points": len(shown), "checks": len(checks),
           "last_seq": checks[-1]["seq"] if checks else None,
           "t": [c["at"] for c in shown], "seq": [c["seq"] for c in shown], "weight": [c["weight"] for c in shown],
           "outcome": [c["verdict"]["outcome"] for c in shown], "metrics": {}}
    for metric in metrics:
        qs = {role: {name: [] for name, _ in QUANTILES} for role in ROLES}
        deltas: dict[str, dict[str, list]] = {}
        thresholds: dict[str, float | None] = {}
        for i, ev in enumerate(shown):
            variants = ev.get("variants", {})
            for role in ROLES:
                vals = _quantiles(_merged(variants.get(role, {}).get("histograms", {}), metric))
                for (name, _), x in zip(QUANTILES, vals):
                    qs[role][name].append(x)
            for q, d in _deltas(ev, metric).items():
                col = deltas.setdefault(q, {"delta": [None] * i, "low": [None] * i, "high": [None] * i,
                                            "outcome": [None] * i, "checked": d["checked"]})
                col["checked"] = col["checked"] or d["checked"]
                for k in ("delta", "low", "high", "outcome"):
                    col[k].append(num(d[k]) if k != "outcome" else d[k])
                if d["threshold"] is not None:
                    thresholds[q] = d["threshold"]
            for col in deltas.values():   # pad quantiles missing at this check
                for k in ("delta", "low", "high", "outcome"):
                    if len(col[k]) < i + 1:
                        col[k].append(None)
        for q, col in deltas.items():
            col["threshold"] = thresholds.get(q)
        has_data = any(x is not None for role in qs.values() for col in role.values() for x in col)
        if has_data or deltas:
            out["metrics"][metric] = {"label": SHORT.get(metric, metric), "quantiles": qs,
                                      "deltas": dict(sorted(deltas.items(), key=lambda kv: -_qf(kv[0])))}
    return out


def _qf(q: str) -> float:
    try:
        return float(q[1:])
    except ValueError:
        return math.nan
