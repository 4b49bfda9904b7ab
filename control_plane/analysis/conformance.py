"""Op-level conformance, judged: part of the correctness gate, before traffic and at every gate run.

Each engine measures at warm-up every op of its kernel set that is not the reference set's (`torch`) on fresh random
inputs at the served model's shapes, on its own device, and serves the report at GET /conformance
(engine/execution/conformance.py). Per case the report has the kernel's largest error against the fp64 reference
(`error`), the reference's own error in the serving precision (`reference_error`) and the largest reference value
(`scale`).

The gate judges the ops the canary's set changes relative to production's: an op is changed when the canary's
engine and the baseline's (which runs production's set) name different implementations for it; without the
baseline's report, every measured op is judged, and so it is when the two engines serve under other conditions
(dtype, shapes, weights' quantization, KV page format: a rollout that changes an engine flag such as
`--kv-cache-dtype fp8` runs the same implementations on other data). A case passes when

    error <= k * reference_error + atol[dtype] * max(1, scale)

the kernel tests' criterion (tests/kernels/helpers.py, assert_close_to_fp64) with k and atol from the policy. A kernel
that raised on a served shape, or returned NaN/inf, fails. Any failing case fails the gate, naming op, shape, error and
what was allowed. Random inputs: it judges a kernel on random-weight llama3-8b exactly as on a trained model.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from .gate_policy import ConformancePolicy
from .verdict import Outcome

_MAX_SHOWN = 8   # failing cases kept in the evidence (the count says how many there were)


@dataclass(slots=True, frozen=True)
class CaseResult:
    op: str
    case: str
    error: float | None         # None: the kernel raised (see `exception`)
    allowed: float
    reference_error: float
    exception: str = ""

    @property
    def passed(self) -> bool:
        return self.error is not None and math.isfinite(self.error) and self.error <= self.allowed

    def to_dict(self) -> dict:
        return {**asdict(self), "error": _clean(self.error)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "CaseResult":
        return cls(d["op"], d["case"], math.inf if d.get("error") is None and not d.get("exception")
                   else d.get("error"), d["allowed"], d.get("reference_error", 0.0), d.get("exception", ""))

    def describe(self) -> str:
        got = self.exception if self.error is None else f"error {self.error:.3g} > allowed {self.allowed:.3g}"
        return f"{self.op} at {self.case}: {got}"


@dataclass(slots=True, frozen=True)
class ConformanceVerdict:
    outcome: Outcome
    reason: str
    kernel_set: str = ""
    reference: str = ""
    device: str = ""
    dtype: str = ""
    judged_ops: tuple[str, ...] = ()       # changed relative to production's set (and measured)
    unchanged_ops: tuple[str, ...] = ()    # the same implementation as production's: not judged
    cases: int = 0
    failures: tuple[CaseResult, ...] = ()  # at most _MAX_SHOWN
    failed_cases: int = 0
    worst: CaseResult | None = None        # the case closest to (or furthest past) its bound
    seconds: float = math.nan              # the engine's measurement time
    seed: int | None = None
    k: float = math.nan

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "reason": self.reason, "kernel_set": self.kernel_set,
                "reference": self.reference, "device": self.device, "dtype": self.dtype,
                "judged_ops": list(self.judged_ops), "unchanged_ops": list(self.unchanged_ops), "cases": self.cases,
                "failures": [f.to_dict() for f in self.failures], "failed_cases": self.failed_cases,
                "worst": self.worst.to_dict() if self.worst else None, "seconds": _clean(self.seconds),
                "seed": self.seed, "k": _clean(self.k)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "ConformanceVerdict":
        return cls(Outcome(d["outcome"]), d.get("reason", ""), d.get("kernel_set", ""), d.get("reference", ""),
                   d.get("device", ""), d.get("dtype", ""), tuple(d.get("judged_ops", ())),
                   tuple(d.get("unchanged_ops", ())), d.get("cases", 0),
                   tuple(CaseResult.from_dict(f) for f in d.get("failures", ())), d.get("failed_cases", 0),
                   CaseResult.from_dict(d["worst"]) if d.get("worst") else None,
                   math.nan if d.get("seconds") is None else d["seconds"], d.get("seed"),
                   math.nan if d.get("k") is None else d["k"])


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _conditions(report: Mapping[str, Any]) -> list[str]:
    """What an engine serves under, part by part: its dtype and its shapes' description (engine/execution/
    conformance.py Shapes.describe: heads, sizes, page, batch, context, weights' quantization, KV page format)."""
    return [f"dtype {report.get('dtype', '')}", *(p.strip() for p in str(report.get("shapes", "")).split(", "))]


def served_differently(canary: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    """'' when both engines serve under the same conditions, else what differs ("+fp8 KV pages" for a part only the
    canary's engine has, "-int8 weights" for one only the baseline's has): an engine flag changed by the rollout
    (--kv-cache-dtype, --quantization, --max-num-seqs, ...) runs the same implementations on other data."""
    mine, theirs = _conditions(canary), _conditions(baseline)
    return "; ".join([f"+{p}" for p in mine if p not in theirs] + [f"-{p}" for p in theirs if p not in mine])


def _changed_ops(canary: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> tuple[list[str], list[str], str]:
    """(judged, unchanged, why every measured op is judged or '')."""
    measured = [str(op) for op in canary.get("measured_ops", ())]
    if not baseline or not isinstance(baseline.get("ops"), Mapping):
        return measured, [], ""
    if differs := served_differently(canary, baseline):
        return measured, [], f"the canary's engine serves under other conditions than production's ({differs})"
    mine, theirs = canary.get("ops") or {}, baseline["ops"]
    changed = [op for op in measured if mine.get(op) != theirs.get(op)]
    return changed, [op for op in measured if op not in changed], ""


def judge(canary: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None,
          policy: ConformancePolicy) -> ConformanceVerdict:
    """The verdict on the canary engine's report (None: the engine did not measure -> INCONCLUSIVE, with why).
    `baseline`: the baseline engine's report (production's set), to tell which ops the canary changes."""
    if canary is None:
        return ConformanceVerdict(Outcome.INCONCLUSIVE, "the canary's engine reported no op-level conformance "
                                  "(started with --no-conformance, or an engine without GET /conformance)")
    dtype = str(canary.get("dtype", ""))
    atol = policy.atol_for(dtype)
    judged, unchanged, conditions = _changed_ops(canary, baseline)
    base = dict(kernel_set=str(canary.get("kernel_set", "")), reference=str(canary.get("reference", "")),
                device=str(canary.get("device", "")), dtype=dtype, judged_ops=tuple(judged),
                unchanged_ops=tuple(unchanged), seconds=float(canary.get("seconds") or 0.0), seed=canary.get("seed"),
                k=float(policy.k))
    results = []
    for c in canary.get("cases", ()):
        if c.get("op") not in judged:
            continue
        ref_err = c.get("reference_error")
        if ref_err is None:   # the reference itself could not run this case: the engine's bug, not the kernel's
            return ConformanceVerdict(Outcome.INCONCLUSIVE, f"the reference could not run {c.get('op')} at "
                                      f"{c.get('case')}: {c.get('exception', '')}", **base)
        allowed = policy.k * float(ref_err) + atol * max(1.0, float(c.get("scale") or 0.0))
        err = c.get("error")
        results.append(CaseResult(str(c["op"]), str(c["case"]), math.inf if err is None and not c.get("exception")
                                  else err, allowed, float(ref_err), str(c.get("exception", ""))))
    if not judged:
        why = ("every op of the canary's set is the reference's own" if not canary.get("measured_ops") else
               f"the canary's set changes no op relative to production's ({', '.join(unchanged)} as production)")
        return ConformanceVerdict(Outcome.PASS, f"nothing to judge: {why}", **base)
    failures = [r for r in results if not r.passed]

    def margin(r: CaseResult) -> float:
        return math.inf if r.error is None or not math.isfinite(r.error) else r.error / r.allowed if r.allowed else 0
    worst = max(results, key=margin, default=None)
    if failures:
        ops = sorted({f.op for f in failures}, key=judged.index)
        return ConformanceVerdict(
            Outcome.FAIL, f"op-level conformance: {len(failures)} of {len(results)} cases out of tolerance in "
            f"{', '.join(ops)} (k={policy.k:g}, atol={atol:g}); first: {failures[0].describe()}"
            + (f"; every measured op judged: {conditions}" if conditions else ""),
            cases=len(results), failures=tuple(failures[:_MAX_SHOWN]), failed_cases=len(failures), worst=worst, **base)
    head = f"worst {worst.op} at {worst.case}: error {worst.error:.3g} of {worst.allowed:.3g} allowed" if worst else ""
    every = f"; every measured op judged: {conditions}" if conditions else ""
    return ConformanceVerdict(Outcome.PASS, f"op-level conformance: {', '.join(judged)} within tolerance in "
                              f"{len(results)} cases at the served shapes on {base['device']}; {head}{every}",
                              cases=len(results), worst=worst, **base)
