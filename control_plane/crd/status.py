"""KernelRollout <-> rollout, as data: what a resource's spec asks for (`RolloutRequest`) and the `status` a rollout
(and its last check) shows on it, with standard conditions (Progressing, Completed, Degraded) whose
lastTransitionTime moves only when their status does. No I/O."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from sits.control_plane.rollout import Phase, Rollout
from sits.control_plane import numbers
from sits.control_plane.view import decode_check, headline_of

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
        if s.get("tensorParallelSize") is not None:
            spec["tensor_parallel_size"] = s["tensorParallelSize"]
        if s.get("image"):
            spec["canary_image"] = s["image"]
        return cls(s.get("service"), s.get("kernels"), s.get("productionKernels") or DEFAULT_PRODUCTION_KERNELS,
                   s.get("policy"), spec, bool(s.get("paused", False)))


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def last_check(ev: Mapping | None) -> dict | None:
    """The check's headline (view.headline_of: the result that made its outcome) in words; a correctness check says
    how many prompts matched, or which op failed its conformance. `ev`: a check's evidence as the store keeps it."""
    if not ev:
        return None
    view = decode_check(ev)
    out = {"seq": view.seq, "verdict": view.outcome, "decision": view.decision, "time": rfc3339(view.at)}
    cv = view.correctness
    if cv is not None:
        cf = cv.conformance
        if cf is not None and cf.outcome == "fail" and cf.failures:   # op-level conformance: the op and its error
            f = cf.failures[0]
            return {**out, "metric": f"conformance:{f.op}", "delta": f.problem[:200], "interval": f.case[:200]}
        return {**out, "metric": "correctness", "delta": f"{numbers.number(cv.identical_fraction, '.0%')} identical"
                if cv.identical_fraction is not None else "-",
                "interval": f"{cv.diverged} of {cv.prompts} prompts diverged"}
    h = headline_of(view)
    if h.check is None:
        return {**out, "metric": view.guard or "-", "delta": "-", "interval": view.reason[:200]}
    main = {**out, "metric": h.check, "delta": numbers.delta(h.kind, h.delta),
            "interval": numbers.interval(h.kind, h.ci_low, h.ci_high)}
    if h.sequential:   # the confidence sequence, both boundaries, the windows, the time to decide
        main.update(boundaries=f"{numbers.delta(h.kind, h.ship)} / {numbers.delta(h.kind, h.threshold)}",
                    windows=h.windows or 0,
                    decidesIn=numbers.eta(h.eta_s) if h.result == "inconclusive" else "-")
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
