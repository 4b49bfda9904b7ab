"""KernelRollout <-> rollout, as data: what a resource's spec asks for (`RolloutRequest`) and the `status` a rollout
(and its last check) shows on it, with standard conditions (Progressing, Completed, Degraded) whose
lastTransitionTime moves only when their status does. No I/O."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from sits.control_plane.rollout import Phase, Rollout

DEFAULT_PRODUCTION_KERNELS = "torch"


@dataclass(slots=True, frozen=True)
class RolloutRequest:
    """A KernelRollout's spec in the service layer's terms (start_rollout validates it)."""
    service: Any
    kernels: Any
    production_kernels: Any
    policy: Any
    spec: Mapping[str, Any] = field(default_factory=dict)
    paused: bool = False

    @classmethod
    def from_object(cls, obj: Mapping) -> "RolloutRequest":
        s = obj.get("spec") or {}
        spec = {"model": s.get("model") or "tiny", "canary_args": s.get("args") or []}
        spec.update({k: s[k] for k in ("replicas", "gpus") if s.get(k) is not None})
        if s.get("image"):
            spec["canary_image"] = s["image"]
        return cls(s.get("service"), s.get("kernels"), s.get("productionKernels") or DEFAULT_PRODUCTION_KERNELS,
                   s.get("policy"), spec, bool(s.get("paused", False)))


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _pct(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):   # the store's JSON keeps infinities as "+Inf" / "-Inf"
        return x
    return "-" if math.isnan(x) else f"{x * 100:+.1f} %"


def last_check(ev: Mapping | None) -> dict | None:
    """The check that says most: a failed test, else the largest delta; a correctness check says how many prompts
    matched. `ev`: a check's evidence as the store keeps it."""
    if not ev:
        return None
    verdict = ev["verdict"]
    out = {"seq": ev["seq"], "verdict": verdict["outcome"], "decision": str(ev["decision"]), "time": rfc3339(ev["at"])}
    if verdict.get("correctness"):
        cv = verdict["correctness"]
        cf = cv.get("conformance") or {}
        if cf.get("outcome") == "fail" and cf.get("failures"):   # op-level conformance: the op and its error
            f = cf["failures"][0]
            got = f.get("exception") or f"error {f['error']:.3g} > allowed {f['allowed']:.3g}"
            return {**out, "metric": f"conformance:{f['op']}", "delta": got[:200], "interval": f["case"][:200]}
        frac = cv.get("identical_fraction")
        return {**out, "metric": "correctness", "delta": "-" if frac is None else f"{frac:.0%} identical",
                "interval": f"{cv.get('diverged', 0)} of {cv.get('prompts', 0)} prompts diverged"}
    results = [r for r in verdict.get("results", []) if not r.get("low_traffic")] or verdict.get("results", [])
    if not results:
        return {**out, "metric": verdict.get("guard") or "-", "delta": "-", "interval": verdict.get("reason", "")[:200]}

    def weight(r: Mapping) -> tuple:
        d = r.get("delta_rel")
        return (r["outcome"] == "fail", isinstance(d, (int, float)) and not math.isnan(d), d if isinstance(
            d, (int, float)) and not math.isnan(d) else 0.0)
    r = max(results, key=weight)
    err = r["check"] == "error_rate"
    f = (lambda x: "-" if x is None else f"{float(x) * 100:+.2f} pt") if err else _pct
    main = {**out, "metric": r["check"], "delta": f(r.get("delta_rel") if not err else r.get("delta_abs")),
            "interval": f"[{f(r.get('ci_low'))}, {f(r.get('ci_high'))}]"}
    if r.get("method") == "sequential":   # the confidence sequence, both boundaries, the windows, the time to decide
        if err:
            main["delta"] = f(r.get("delta_rel"))
        eta = r.get("eta_s")
        main.update(boundaries=f"{f(r.get('ship'))} / {f(r.get('threshold'))}", windows=int(r.get("windows") or 0),
                    decidesIn="-" if r["outcome"] != "inconclusive" or eta is None else f"~{eta:.0f} s")
    return main


_COMPLETED_REASON = {Phase.SUCCEEDED: "Succeeded", Phase.ROLLED_BACK: "RolledBack", Phase.FAILED: "Failed"}


def conditions(previous: list | None, wanted: list[tuple[str, str, str, str]], generation: int, now: float) -> list:
    """`wanted`: (type, status, reason, message) each; lastTransitionTime kept from `previous` when the status of
    that type did not change."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for type_, status, reason, message in wanted:
        old = before.get(type_) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        c = {"type": type_, "status": status, "reason": reason, "lastTransitionTime": since or rfc3339(now),
             "observedGeneration": generation}
        out.append({**c, "message": message[:1024]} if message else c)   # the API server stores "" as null
    return out


def _without_empty(d: dict) -> dict:
    """The API server's client sends "" as null, which the schema's string fields refuse: leave them out."""
    return {k: (_without_empty(v) if isinstance(v, dict) else v) for k, v in d.items() if v != ""}


def rollout_status(r: Rollout, check: Mapping | None, generation: int, previous: Mapping | None,
                   now: float) -> dict:
    """The status of a resource whose rollout is `r` (`check`: its last check's evidence, or None)."""
    prev = previous or {}
    msg = r.reason or r.phase.value
    if r.phase.terminal:
        degraded = r.phase is not Phase.SUCCEEDED
        wanted = [("Progressing", "False", _COMPLETED_REASON[r.phase], msg),
                  ("Completed", "True", _COMPLETED_REASON[r.phase], msg),
                  ("Degraded", "True" if degraded else "False", _COMPLETED_REASON[r.phase] if degraded else "AsExpected",
                   msg if degraded else "")]
    else:
        reason = "".join(w.capitalize() for w in r.phase.value.split("_"))
        wanted = [("Progressing", "True", reason, msg), ("Completed", "False", reason, ""),
                  ("Degraded", "False", "AsExpected", "")]
    status = {"phase": r.phase.value, "weight": r.weight, "step": r.step, "reason": r.reason, "rolloutId": r.id,
              "observedGeneration": generation, "checks": r.checks,
              "conditions": conditions(prev.get("conditions"), wanted, generation, now)}
    lc = last_check(check)
    if lc is not None:
        status["lastCheck"] = lc
    elif prev.get("lastCheck") and prev.get("rolloutId") == r.id:
        status["lastCheck"] = prev["lastCheck"]
    return _without_empty(status)


def refused_status(message: str, reason: str, generation: int, previous: Mapping | None, now: float) -> dict:
    """The status of a resource the control plane refused (invalid spec, the service busy with another rollout):
    Degraded, with the refusal as its message. A rollout the resource had before keeps its fields."""
    prev = dict(previous or {})
    prev.pop("conditions", None)
    wanted = [("Progressing", "False", reason, message), ("Completed", "False", reason, ""),
              ("Degraded", "True", reason, message)]
    return _without_empty({**prev, "reason": message, "observedGeneration": generation,
                           "conditions": conditions((previous or {}).get("conditions"), wanted, generation, now)})
