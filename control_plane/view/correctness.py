"""A correctness-gate check as its renderers read it: the summary of the greedy replay's comparison, the op-level
conformance (if on) and the diverged prompts; decoded from the stored verdict's "correctness" entry, tolerant of
checks stored before a field existed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sits.control_plane.numbers import finite, number


def _i(d: Mapping, k: str) -> int:
    v = finite(d.get(k))
    return 0 if v is None else int(v)


def _strs(x: Any) -> tuple[str, ...]:
    return tuple(str(s) for s in x or ())


@dataclass(frozen=True, slots=True)
class CaseView:
    """One op-level case out of tolerance: its error (None: the kernel raised `exception`) and the allowed one."""
    op: str
    case: str
    error: float | None
    allowed: float | None
    reference_error: float | None
    exception: str = ""

    @property
    def problem(self) -> str:
        """What went wrong: the kernel's exception, else "error 0.031 > allowed 0.002"."""
        if self.error is None and self.exception:
            return self.exception
        return f"error {number(self.error, '.3g')} > allowed {number(self.allowed, '.3g')}"


@dataclass(frozen=True, slots=True)
class ConformanceView:
    outcome: str
    reason: str = ""
    device: str = ""
    dtype: str = ""
    cases: int = 0
    seconds: float | None = None
    k: float | None = None
    judged_ops: tuple[str, ...] = ()
    unchanged_ops: tuple[str, ...] = ()
    failures: tuple[CaseView, ...] = ()
    failed_cases: int = 0


@dataclass(frozen=True, slots=True)
class PromptView:
    """One diverged (or failed) prompt: where it diverged, the margins there, both continuations."""
    index: int
    prompt: str
    error: str = ""
    first_divergence: int | None = None
    baseline_margin: float | None = None
    canary_margin: float | None = None
    confident_disagreements: int = 0
    drift_max: float | None = None
    forced_drift_max: float | None = None
    baseline_tokens: tuple[int, ...] = ()
    canary_tokens: tuple[int, ...] = ()
    baseline_text: str = ""
    canary_text: str = ""


@dataclass(frozen=True, slots=True)
class CorrectnessView:
    outcome: str
    reason: str = ""
    dtype: str = ""
    prompts: int = 0
    errors: int = 0
    diverged: int = 0
    identical_fraction: float | None = None
    top1_agreement: float | None = None
    drift_mean: float | None = None
    drift_max: float | None = None
    failed: tuple[str, ...] = ()
    requests: int = 0
    seconds: float | None = None
    positions: int = 0
    confident_positions: int = 0
    confident_top1: float | None = None
    confident_drift_mean: float | None = None
    confident_drift_max: float | None = None
    conformance: ConformanceView | None = None
    evidence: tuple[PromptView, ...] = ()


def _case(f: Mapping) -> CaseView:
    return CaseView(str(f.get("op", "")), str(f.get("case", "")), finite(f.get("error")), finite(f.get("allowed")),
                    finite(f.get("reference_error")), str(f.get("exception") or ""))


def _conformance(cf: Mapping) -> ConformanceView:
    return ConformanceView(str(cf.get("outcome") or ""), str(cf.get("reason") or ""), str(cf.get("device") or ""),
                           str(cf.get("dtype") or ""), _i(cf, "cases"), finite(cf.get("seconds")), finite(cf.get("k")),
                           _strs(cf.get("judged_ops")), _strs(cf.get("unchanged_ops")),
                           tuple(_case(f) for f in cf.get("failures") or ()), _i(cf, "failed_cases"))


def _prompt(e: Mapping) -> PromptView:
    fd = e.get("first_divergence")
    return PromptView(_i(e, "index"), str(e.get("prompt") or ""), str(e.get("error") or ""),
                      None if fd is None else int(fd), finite(e.get("baseline_margin")),
                      finite(e.get("canary_margin")), _i(e, "confident_disagreements"), finite(e.get("drift_max")),
                      finite(e.get("forced_drift_max")), tuple(e.get("baseline_tokens") or ()),
                      tuple(e.get("canary_tokens") or ()), str(e.get("baseline_text") or ""),
                      str(e.get("canary_text") or ""))


def decode_correctness(cv: Mapping) -> CorrectnessView:
    return CorrectnessView(
        outcome=str(cv.get("outcome") or "inconclusive"), reason=str(cv.get("reason") or ""),
        dtype=str(cv.get("dtype") or ""), prompts=_i(cv, "prompts"), errors=_i(cv, "errors"),
        diverged=_i(cv, "diverged"), identical_fraction=finite(cv.get("identical_fraction")),
        top1_agreement=finite(cv.get("top1_agreement")), drift_mean=finite(cv.get("drift_mean")),
        drift_max=finite(cv.get("drift_max")), failed=_strs(cv.get("failed")), requests=_i(cv, "requests"),
        seconds=finite(cv.get("seconds")), positions=_i(cv, "positions"),
        confident_positions=_i(cv, "confident_positions"), confident_top1=finite(cv.get("confident_top1")),
        confident_drift_mean=finite(cv.get("confident_drift_mean")),
        confident_drift_max=finite(cv.get("confident_drift_max")),
        conformance=_conformance(cv["conformance"]) if cv.get("conformance") else None,
        evidence=tuple(_prompt(e) for e in cv.get("evidence") or ()))
