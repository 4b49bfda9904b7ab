"""The store's JSON codec: rollouts (state), variants' data and checks' evidence to and from JSON-safe dicts.
Non-finite floats become Prometheus' strings ("NaN", "+Inf", "-Inf"). Pure, apart from two bounded caches of
immutable values (decoded policies, encoded policies), because every save and load of a rollout repeats them.

The store keeps a rollout's state (`state_to_dict`) and the step's accumulated data (`data_to_dict`) in separate
rows, so a save whose data did not change does not re-encode it; `rollout_to_dict` is both in one dict."""
from __future__ import annotations

from typing import Any, Mapping

from sits.control_plane.analysis import HistogramSnapshot, Policy, VariantData
from sits.control_plane.analysis.prompts import stored_prompt_set
from sits.control_plane.analysis.sequential import SequenceState
from sits.control_plane.rollout import Check, Phase, Rollout


def nonfinite_to_strings(x: Any) -> Any:
    """JSON-safe for the store: non-finite floats become Prometheus' strings ("NaN", "+Inf", "-Inf"); enums their
    values (web/common.py `nonfinite_to_null` is the API's direction: None)."""
    t = type(x)   # exact types first: evidence is ~10^4 plain numbers per check, and ABC isinstance() is slow
    if t is float:
        return x if x - x == 0 else ("NaN" if x != x else ("+Inf" if x > 0 else "-Inf"))
    if t is int or t is str or t is bool or x is None:
        return x
    if t is list or t is tuple:
        return [nonfinite_to_strings(v) for v in x]
    if t is dict or isinstance(x, Mapping):
        return {str(k): nonfinite_to_strings(v) for k, v in x.items()}
    if isinstance(x, float):
        return nonfinite_to_strings(float(x))
    if isinstance(x, (list, tuple)):
        return [nonfinite_to_strings(v) for v in x]
    return x


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def variant_to_dict(v: VariantData, memo: dict[int, dict] | None = None) -> dict:
    """JSON-safe as it is (HistogramSnapshot.to_dict already is: no nonfinite_to_strings() pass over ~10^3 numbers per variant).
    `memo`: id(snapshot) -> its dict, shared by the encodings of one save (a check's evidence and the step's data
    hold the same snapshots); the caller keeps the snapshots alive while it is used."""
    if memo is None:
        hists = {str(k): h.to_dict() for k, h in v.histograms.items()}
    else:
        hists = {}
        for k, h in v.histograms.items():
            d = memo.get(id(h))
            if d is None:
                d = memo[id(h)] = h.to_dict()
            hists[str(k)] = d
    d = {"histograms": hists, "requests": nonfinite_to_strings(v.requests), "errors": nonfinite_to_strings(v.errors), "ready": nonfinite_to_strings(v.ready),
         "crashing": nonfinite_to_strings(v.crashing)}
    if v.replayed or v.streamed:   # low-traffic mode's counts; absent (0) in data stored before it
        d.update(replayed=nonfinite_to_strings(v.replayed), streamed=nonfinite_to_strings(v.streamed))
    return d


def data_to_dict(data: Mapping[str, VariantData], memo: dict[int, dict] | None = None) -> dict:
    return {str(role): variant_to_dict(v, memo) for role, v in data.items()}


def data_from_dict(d: Mapping) -> dict[str, VariantData]:
    return {role: variant_from_dict(v) for role, v in d.items()}


def variant_from_dict(d: Mapping) -> VariantData:
    return VariantData({k: HistogramSnapshot.from_dict(h) for k, h in d["histograms"].items()}, float(d["requests"]),
                       float(d["errors"]), bool(d["ready"]), bool(d["crashing"]), float(d.get("replayed", 0.0)),
                       float(d.get("streamed", 0.0)))


_STATE_FIELDS = ("reason", "created_at", "phase_since", "started_at", "paused_total_s", "awaiting_promotion", "step",
                 "weight", "warmup_until", "last_check_at", "checks", "step_checks", "consecutive_failures",
                 "consecutive_inconclusive", "data_since", "observed_until", "excluded_requests", "source",
                 "correctness_step", "correctness_at", "replayed_requests", "not_ready_since", "deadline_hit",
                 "retry_of")


_CACHE_SIZE = 256
_POLICY_DICTS: dict[int, tuple[Policy, dict]] = {}   # id(policy) -> (policy, its encoded dict); the policy kept alive
_POLICIES: dict[str, Policy] = {}                    # repr(policy dict) -> Policy


def _policy_dict(p: Policy) -> dict:
    """nonfinite_to_strings(p.to_dict()), shared: only for encoders whose result goes straight to json.dumps (never mutated)."""
    hit = _POLICY_DICTS.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    d = nonfinite_to_strings(p.to_dict())
    if len(_POLICY_DICTS) >= _CACHE_SIZE:
        _POLICY_DICTS.clear()
    _POLICY_DICTS[id(p)] = (p, d)
    return d


def _policy(d: Mapping) -> Policy:
    """Policy.from_dict, once per distinct stored policy (a Policy is frozen: one instance serves every load)."""
    key = repr(d)
    p = _POLICIES.get(key)
    if p is None:
        c = d.get("correctness")   # stored before prompt sets were names: a path becomes a name, never read
        p = Policy.from_dict({**d, "correctness": {**c, "prompt_set": stored_prompt_set(c.get("prompt_set"))}}
                             if isinstance(c, Mapping) and "prompt_set" in c else d)
        if len(_POLICIES) >= _CACHE_SIZE:
            _POLICIES.clear()
        _POLICIES[key] = p
    return p


def state_to_dict(r: Rollout) -> dict:
    """The rollout without its step data (stored in a row of its own, see data_to_dict). For json.dumps only: the
    policy's dict inside is shared with other encodings of the same policy."""
    d = nonfinite_to_strings({"id": r.id, "service": r.service, "canary_kernels": r.canary_kernels,
               "production_kernels": r.production_kernels, "policy": None, "phase": r.phase.value,
               "paused_from": r.paused_from.value if r.paused_from else None, "queries": dict(r.queries),
               **{k: getattr(r, k) for k in _STATE_FIELDS}})
    d["policy"] = _policy_dict(r.policy)
    if r.sequence.windows or r.sequence.pending:
        d["sequence"] = nonfinite_to_strings(r.sequence.to_dict())
    return d


def rollout_to_dict(r: Rollout) -> dict:
    d = {"id": r.id, "service": r.service, "canary_kernels": r.canary_kernels,
         "production_kernels": r.production_kernels, "policy": nonfinite_to_strings(r.policy.to_dict()), "phase": r.phase.value,
         "paused_from": r.paused_from.value if r.paused_from else None, "queries": nonfinite_to_strings(dict(r.queries)),
         "data": data_to_dict(r.data), "sequence": nonfinite_to_strings(r.sequence.to_dict())}
    d.update(nonfinite_to_strings({k: getattr(r, k) for k in _STATE_FIELDS}))
    return d


def rollout_from_dict(d: Mapping, version: int = 0, data: Mapping[str, VariantData] | None = None) -> Rollout:
    """`data`: the step's data when it was stored apart from the state (else the state's own "data", if any)."""
    kw = {k: d[k] for k in _STATE_FIELDS if k in d}
    for k in ("created_at", "phase_since", "paused_total_s", "warmup_until", "last_check_at", "excluded_requests"):
        kw[k] = float(kw[k])
    kw["replayed_requests"] = float(kw.get("replayed_requests", 0.0))   # absent in states stored before it
    for k in ("started_at", "data_since", "observed_until", "correctness_at", "not_ready_since"):
        kw[k] = _f(kw.get(k))
    if data is None:
        data = data_from_dict(d.get("data", {}))
    return Rollout(id=d["id"], service=d["service"], canary_kernels=d["canary_kernels"],
                   production_kernels=d["production_kernels"], policy=_policy(d["policy"]),
                   phase=Phase(d["phase"]), paused_from=Phase(d["paused_from"]) if d.get("paused_from") else None,
                   queries=dict(d.get("queries", {})), sequence=SequenceState.from_dict(d.get("sequence")),
                   data=data, version=version, **kw)


def check_to_dict(rollout_id: str, c: Check, memo: dict[int, dict] | None = None) -> dict:
    """The evidence of one check: raw bucket counts per variant, the queries, estimates, bounds, verdict, decision.
    `memo`: as in variant_to_dict."""
    d = nonfinite_to_strings({"rollout_id": rollout_id, "seq": c.seq, "at": c.at, "step": c.step, "weight": c.weight,
               "window_start": c.window_start, "window_end": c.window_end, "source": c.source,
               "queries": dict(c.queries), "decision": c.decision.value, "verdict": c.verdict.to_dict()})
    d["variants"] = data_to_dict(c.data, memo)
    return d
