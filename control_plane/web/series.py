"""Chart data of a rollout, from its stored checks: P50/P90/P99 per variant and metric over time (every series of a
metric, e.g. one per route, merged), and the canary-vs-target delta of each checked quantile with its interval.

Each check's evidence holds the step's accumulated bucket counts per variant, so a point is the quantile of the
current step's data so far (it starts afresh at each weight change). Columnar and rounded to 4 significant digits
(effects and their bounds to EFFECT_DIGITS);
more than `max_points` checks are thinned evenly (failed checks and the last one are always kept), so a one-hour
rollout's series stay far below 200 KB.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Iterable, Mapping, Sequence

from sits.control_plane.analysis import ERROR_RATE, ITL, REQUEST_LATENCY, TTFT, histogram_quantile
from sits.control_plane.rollout import ROLES
from sits.control_plane.web.common import num
from sits.control_plane.view import CheckView, ResultView, decode_check, lead
from sits.control_plane.view.names import check_label, short_name
from sits.control_plane.numbers import ABS, REL

CHART_METRICS = (REQUEST_LATENCY, TTFT, ITL)
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
# a sequential result's fields the gated columns carry beside its method: both boundaries (the limit is `threshold`),
# the windows used, the time to decide and the two-mode hint (the newest point's)
SEQUENTIAL_FIELDS = ("ship", "windows", "block", "eta_s", "jumps")


# Effects and their interval bounds are shown to 0.1 % (0.01 pt): rounded to 4 significant digits on the wire first,
# a bound of 0.159466 became 0.1595 and read "+16.0 %" on the rollout page where the worker's log said +15.9 %
EFFECT_DIGITS = 6


def thin(checks: Sequence[Mapping], max_points: int) -> list[Mapping]:
    """At most ~max_points checks, evenly spaced; failed checks and the last one always kept. `checks`: dicts with
    an "outcome" (summaries) or a "verdict" (evidence)."""
    n = len(checks)
    if n <= max_points:
        return list(checks)
    keep = {round(i * (n - 1) / (max_points - 1)) for i in range(max_points)}
    keep |= {i for i, c in enumerate(checks) if _outcome(c) == "fail"}
    keep.add(n - 1)
    return [checks[i] for i in sorted(keep)]


def _outcome(c: Mapping) -> str:
    return c["outcome"] if "outcome" in c else c["verdict"]["outcome"]


def _merged(histograms: Mapping[str, Mapping], metric: str) -> list[tuple[float, float]] | None:
    """(upper bound, cumulative count) of every series of `metric` summed (series with another bucket layout than
    the first are left out: a sum over different bounds is not a histogram)."""
    bounds, counts = None, None
    for key, h in histograms.items():
        if key != metric and not key.startswith(metric + "{"):
            continue
        b = [float(x) for x in h["bounds"]]
        c = [float(x) for x in h["counts"]]
        if bounds is None:
            bounds, counts = b, c
        elif b == bounds:
            counts = [x + y for x, y in zip(counts, c)]
    return None if bounds is None else list(zip(bounds, counts))


def _quantiles(buckets: list[tuple[float, float]] | None) -> list[float | None]:
    if not buckets or buckets[-1][1] <= 0:
        return [None] * len(QUANTILES)
    return [num(histogram_quantile(q, buckets)) for _, q in QUANTILES]


def _q_of(check_name: str) -> str:
    return "p" + check_name.partition(":p")[2].replace("_", ".")


def _deltas(view: CheckView, metric: str) -> dict[str, dict]:
    """Per quantile: the worst series' delta of this metric. Checked quantiles come with their interval, threshold
    and outcome; the others (shown, not decided) are the relative delta against the same target, without bounds."""
    out: dict[str, dict] = {}
    for r in view.results:
        if metric_matches(r.series, metric) and r.kind == REL:
            q = _q_of(r.check)
            # a checked quantile without a delta (too little data) stays empty: the table shows "–" for it too
            if q not in out or (r.delta_rel is not None and (out[q]["delta"] is None
                                                             or r.delta_rel > out[q]["delta"])):
                out[q] = {"delta": r.delta_rel, "low": r.ci_low, "high": r.ci_high, "threshold": r.threshold,
                          "outcome": r.outcome, "checked": True}
    for d in view.deltas:
        if d.quantile is None or not metric_matches(d.series, metric):
            continue
        q = f"p{d.quantile * 100:g}"
        rel = d.vs_production_rel if view.compare_to == "production" else d.vs_baseline_rel
        if rel is None or (q in out and out[q]["checked"]):
            continue
        if q not in out or out[q]["delta"] is None or rel > out[q]["delta"]:
            out[q] = {"delta": rel, "low": None, "high": None, "threshold": None, "outcome": None, "checked": False}
    return out


def gated(view: CheckView) -> dict[str, dict]:
    """Per gated check of this check's verdict (`http_request_duration_seconds:p99`, `error_rate`, ...): its lead
    result (view.headline.lead: a failing series first), with the delta, interval, threshold and outcome the checks
    table shows for it. Latency deltas are relative, the error rate's absolute (kind "abs"); under sequential
    statistics the windows' mean effect (points for the error rate), the centre of its sequence."""
    by_check: dict[str, list[ResultView]] = {}
    for r in view.results:
        by_check.setdefault(r.check, []).append(r)
    out = {}
    for name, results in by_check.items():
        r = lead(results)
        d = {"delta": r.effect, "low": r.ci_low, "high": r.ci_high, "threshold": r.threshold, "outcome": r.outcome,
             "series": r.series}
        if r.sequential:   # both boundaries, the windows used and the time to decide
            d.update(method="sequential", **{k: getattr(r, k) for k in SEQUENTIAL_FIELDS})
        out[name] = d
    return out


def metric_matches(series: str, metric: str) -> bool:
    return series == metric or series.startswith(metric + "{")


def point(ev: Mapping, metrics: Sequence[str] = CHART_METRICS) -> dict:
    """One check's chart values: per metric, P50/P90/P99 of each variant and the deltas per quantile."""
    variants = ev.get("variants", {})
    view = decode_check(ev)
    # decided_by: the gated checks that made the check's outcome (the charts ring them at the deciding check)
    out = {"t": view.at, "seq": view.seq, "weight": view.weight, "outcome": view.outcome,
           "decision": view.decision, "decided_by": sorted(view.deciding), "metrics": {}, "checks": gated(view)}
    for metric in metrics:
        qs = {role: _quantiles(_merged(variants.get(role, {}).get("histograms", {}), metric)) for role in ROLES}
        deltas = _deltas(view, metric)
        if deltas or any(x is not None for v in qs.values() for x in v):
            out["metrics"][metric] = {"q": qs, "d": deltas}
    return out


class PointCache:
    """Checks never change once stored: each one's point is computed once per (store, rollout, seq)."""

    def __init__(self, size: int = 50000) -> None:
        self._d: OrderedDict[tuple, dict] = OrderedDict()
        self._size, self._lock = size, threading.Lock()

    def points(self, store, rollout_id: str, seqs: Sequence[int]) -> list[dict]:
        out = []
        for seq in seqs:
            key = (store.path, rollout_id, seq)
            with self._lock:
                p = self._d.get(key)
            if p is None:
                p = point(store.check(rollout_id, seq))
                with self._lock:
                    self._d[key] = p
                    while len(self._d) > self._size:
                        self._d.popitem(last=False)
            out.append(p)
        return out


def series_of(store, rollout_id: str, compare_to: str, since_seq: int = 0, max_points: int = 300,
              cache: PointCache | None = None) -> dict:
    """The rollout's chart data after `since_seq`: which checks from the (small) summaries, values from the cache."""
    summaries = store.check_summaries(rollout_id, since_seq=since_seq, limit=10 ** 7)
    shown = thin(summaries, max_points)
    pts = (cache or PointCache(0)).points(store, rollout_id, [c["seq"] for c in shown])
    out = assemble(pts, compare_to)
    out.update(checks=len(summaries), last_seq=summaries[-1]["seq"] if summaries else None)
    return out


def build_series(checks: Iterable[Mapping], compare_to: str, max_points: int = 300,
                 metrics: Sequence[str] = CHART_METRICS) -> dict:
    """series_of for check evidence already in hand."""
    checks = list(checks)
    out = assemble([point(c, metrics) for c in thin(checks, max_points)], compare_to, metrics)
    out.update(checks=len(checks), last_seq=checks[-1]["seq"] if checks else None)
    return out


def assemble(pts: Sequence[dict], compare_to: str, metrics: Sequence[str] = CHART_METRICS) -> dict:
    """Points -> columns: every array has one entry per point (None where a point lacks the value)."""
    n = len(pts)
    out = {"compare_to": compare_to, "points": n, "t": [p["t"] for p in pts], "seq": [p["seq"] for p in pts],
           "weight": [p["weight"] for p in pts], "outcome": [p["outcome"] for p in pts],
           "decision": [p.get("decision") for p in pts], "decided_by": [p.get("decided_by", []) for p in pts],
           "metrics": {}, "gated": _gated_columns(pts)}
    for metric in metrics:
        if not any(metric in p["metrics"] for p in pts):
            continue
        qs = {role: {name: [None] * n for name, _ in QUANTILES} for role in ROLES}
        deltas: dict[str, dict] = {}
        for i, p in enumerate(pts):
            m = p["metrics"].get(metric)
            if m is None:
                continue
            for role in ROLES:
                for (name, _), x in zip(QUANTILES, m["q"][role]):
                    qs[role][name][i] = x
            for q, d in m["d"].items():
                col = deltas.setdefault(q, {"delta": [None] * n, "low": [None] * n, "high": [None] * n,
                                            "outcome": [None] * n, "checked": False, "threshold": None})
                col["checked"] = col["checked"] or d["checked"]
                if d["threshold"] is not None:
                    col["threshold"] = d["threshold"]
                for k in ("delta", "low", "high"):
                    col[k][i] = num(d[k], EFFECT_DIGITS)
                col["outcome"][i] = d["outcome"]
        out["metrics"][metric] = {"label": short_name(metric), "quantiles": qs,
                                  "deltas": dict(sorted(deltas.items(), key=lambda kv: -_qf(kv[0])))}
    return out


def _gated_columns(pts: Sequence[dict]) -> dict[str, dict]:
    """Per gated check: delta, low, high, outcome columns (one entry per point), its threshold, label and kind."""
    n = len(pts)
    out: dict[str, dict] = {}
    for i, p in enumerate(pts):
        for name, d in p.get("checks", {}).items():
            metric, _, q = name.partition(":p")
            col = out.setdefault(name, {"label": check_label(name), "metric": metric,
                                        "quantile": "p" + q.replace("_", ".") if q else None,
                                        "kind": ABS if name == ERROR_RATE else REL, "threshold": d["threshold"],
                                        "delta": [None] * n, "low": [None] * n, "high": [None] * n,
                                        "outcome": [None] * n})
            col["threshold"] = d["threshold"]
            # the newest point's method, boundary and windows (a rollout's checks share one policy)
            for k in ("method", *SEQUENTIAL_FIELDS):
                if k in d:
                    col[k] = num(d[k]) if k in ("ship", "eta_s") else d[k]
                elif d.get("method") is None:
                    col.pop(k, None)
            for k in ("delta", "low", "high"):
                col[k][i] = num(d[k], EFFECT_DIGITS)
            col["outcome"][i] = d["outcome"]
    return out


def _qf(q: str) -> float:
    try:
        return float(q[1:])
    except ValueError:
        return math.nan
