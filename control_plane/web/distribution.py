"""A check's latency distributions for the detail page (Kayenta's per-metric histograms): canary against its
comparison target on the engines' own bucket bounds, from the bucket counts the check's evidence holds."""
from __future__ import annotations

import math
from typing import Mapping

from sits.control_plane.view.names import metric_of, short_name

MAX_BINS = 48


def distributions(ev: Mapping, max_bins: int = MAX_BINS) -> dict:
    """Per latency series of the check at `ev` (its stored evidence): each bin's lower and upper bound in seconds
    (shared by both variants; the +Inf bucket's upper bound is None) and the share of each variant's requests in it,
    trimmed to the bins either variant used and merged pairwise down to at most `max_bins`; with the P90/P99 the
    check computed for each. Series whose two layouts differ are left out (no shared axis)."""
    target = ev.get("verdict", {}).get("compare_to") or "baseline"
    variants = ev.get("variants", {})
    canary_h = (variants.get("canary") or {}).get("histograms", {})
    target_h = (variants.get(target) or {}).get("histograms", {})
    quantiles: dict[str, dict] = {}
    for d in ev.get("verdict", {}).get("deltas", []):
        if d.get("quantile") is not None:
            quantiles.setdefault(d["series"], {})[f"p{round(d['quantile'] * 100)}"] = {
                "canary": d.get("canary"), "target": d.get(target)}
    out = []
    for series in sorted(canary_h):
        c, t = canary_h[series], target_h.get(series)
        if t is None or [float(b) for b in c["bounds"]] != [float(b) for b in t["bounds"]]:
            continue
        bounds = [float(b) for b in c["bounds"]]
        cc, tc = _per_bucket(c["counts"]), _per_bucket(t["counts"])
        nc, nt = sum(cc), sum(tc)
        used = [i for i in range(len(bounds)) if cc[i] > 0 or tc[i] > 0]
        if not used or nc <= 0 or nt <= 0:
            continue
        lo, hi = used[0], used[-1]
        bins = [(bounds[i - 1] if i else 0.0, bounds[i], cc[i], tc[i]) for i in range(lo, hi + 1)]
        while len(bins) > max_bins:   # merge neighbours: the bounds stay the engines' own
            bins = [(bins[i][0], bins[min(i + 1, len(bins) - 1)][1],
                     bins[i][2] + (bins[i + 1][2] if i + 1 < len(bins) else 0.0),
                     bins[i][3] + (bins[i + 1][3] if i + 1 < len(bins) else 0.0)) for i in range(0, len(bins), 2)]
        metric = metric_of(series)
        out.append({"series": series, "metric": metric, "label": short_name(metric),
                    "lower": [b[0] for b in bins], "upper": [None if math.isinf(b[1]) else b[1] for b in bins],
                    "canary": [b[2] / nc for b in bins], "target": [b[3] / nt for b in bins],
                    "n_canary": nc, "n_target": nt, "quantiles": quantiles.get(series, {})})
    return {"seq": ev.get("seq"), "compare_to": target, "window_start": ev.get("window_start"),
            "window_end": ev.get("window_end"), "series": out}


def _per_bucket(cumulative) -> list[float]:
    prev, out = 0.0, []
    for x in cumulative:
        x = float(x)
        out.append(max(0.0, x - prev))
        prev = max(prev, x)
    return out
