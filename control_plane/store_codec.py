"""The store's JSON codec: rollouts (state), variants' data and checks' evidence to and from JSON-safe dicts.
Non-finite floats become Prometheus' strings ("NaN", "+Inf", "-Inf"). Pure."""
from __future__ import annotations

import math
from typing import Any, Mapping

from control_plane.analysis import HistogramSnapshot, Policy, VariantData
from control_plane.rollout_types import Check, Phase, Rollout


def clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become Prometheus' strings ("NaN", "+Inf", "-Inf"); enums their values."""
    t = type(x)   # exact types first: evidence is ~10^4 plain numbers per check, and ABC isinstance() is slow
    if t is float:
        return x if x - x == 0 else ("NaN" if x != x else ("+Inf" if x > 0 else "-Inf"))
    if t is int or t is str or t is bool or x is None:
        return x
    if t is list or t is tuple:
        return [clean(v) for v in x]
    if t is dict or isinstance(x, Mapping):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, float):
        return clean(float(x))
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def variant_to_dict(v: VariantData) -> dict:
    return {"histograms": {k: h.to_dict() for k, h in v.histograms.items()}, "requests": v.requests,
            "errors": v.errors, "ready": v.ready, "crashing": v.crashing}


def variant_from_dict(d: Mapping) -> VariantData:
    return VariantData({k: HistogramSnapshot.from_dict(h) for k, h in d["histograms"].items()}, float(d["requests"]),
                       float(d["errors"]), bool(d["ready"]), bool(d["crashing"]))


_STATE_FIELDS = ("reason", "created_at", "phase_since", "started_at", "paused_total_s", "awaiting_promotion", "step",
                 "weight", "warmup_until", "last_check_at", "checks", "step_checks", "consecutive_failures",
                 "consecutive_inconclusive", "data_since", "observed_until", "excluded_requests", "source",
                 "correctness_step", "correctness_at")


def rollout_to_dict(r: Rollout) -> dict:
    d = {"id": r.id, "service": r.service, "canary_kernels": r.canary_kernels,
         "production_kernels": r.production_kernels, "policy": r.policy.to_dict(), "phase": r.phase.value,
         "paused_from": r.paused_from.value if r.paused_from else None, "queries": dict(r.queries),
         "data": {role: variant_to_dict(v) for role, v in r.data.items()}}
    d.update({k: getattr(r, k) for k in _STATE_FIELDS})
    return clean(d)


def rollout_from_dict(d: Mapping, version: int = 0) -> Rollout:
    kw = {k: d[k] for k in _STATE_FIELDS if k in d}
    for k in ("created_at", "phase_since", "paused_total_s", "warmup_until", "last_check_at", "excluded_requests"):
        kw[k] = float(kw[k])
    for k in ("started_at", "data_since", "observed_until", "correctness_at"):
        kw[k] = _f(kw.get(k))
    return Rollout(id=d["id"], service=d["service"], canary_kernels=d["canary_kernels"],
                   production_kernels=d["production_kernels"], policy=Policy.from_dict(d["policy"]),
                   phase=Phase(d["phase"]), paused_from=Phase(d["paused_from"]) if d.get("paused_from") else None,
                   queries=dict(d.get("queries", {})),
                   data={role: variant_from_dict(v) for role, v in d.get("data", {}).items()}, version=version, **kw)


def check_to_dict(rollout_id: str, c: Check) -> dict:
    """The evidence of one check: raw bucket counts per variant, the queries, estimates, bounds, verdict, decision."""
    return clean({"rollout_id": rollout_id, "seq": c.seq, "at": c.at, "step": c.step, "weight": c.weight,
                  "window_start": c.window_start, "window_end": c.window_end, "source": c.source,
                  "queries": dict(c.queries), "decision": c.decision.value, "verdict": c.verdict.to_dict(),
                  "variants": {role: variant_to_dict(v) for role, v in c.data.items()}})
