"""One check as every renderer reads it: a typed view of the dict the store keeps for a check (store/codec.py
`check_to_dict`, also the API's JSON of `GET .../checks`), decoded once and tolerant of older checks (keys added
later default: `method` "fixed", no `replica`, no `replayed`). Numbers are floats or None (NaN, and the store's
"NaN" string, become None; "+Inf" / "-Inf" become infinities)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from sits.control_plane.analysis import ERROR_RATE
from sits.control_plane.view.correctness import CorrectnessView, decode_correctness
from sits.control_plane.view.names import check_label, metric_of, quantile_of, series_label
from sits.control_plane.numbers import ABS, REL, finite

SEQUENTIAL = "sequential"


def _int(x: Any) -> int | None:
    v = finite(x)
    return None if v is None or math.isinf(v) else int(v)


@dataclass(frozen=True, slots=True)
class ResultView:
    """One gated check on one series (analysis TestResult). Latency deltas are relative, the error rate's absolute
    (points); under sequential statistics delta_rel, ci_low and ci_high are the windows' mean effect and the
    confidence sequence, `ship` the smaller boundary and `threshold` the larger (the limit)."""
    check: str
    series: str
    outcome: str
    reason: str = ""
    threshold: float | None = None
    canary: float | None = None
    target: float | None = None
    n_canary: float | None = None
    n_target: float | None = None
    delta_abs: float | None = None
    delta_rel: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    need_more: int | None = None
    low_traffic: bool = False
    vs_production: tuple[float | None, float | None] | None = None
    method: str = "fixed"
    ship: float | None = None
    alpha: float | None = None
    windows: int = 0
    block: int = 1
    lag1: float | None = None
    window_s: float | None = None
    eta_s: float | None = None
    jumps: int = 0

    @property
    def kind(self) -> str:
        return ABS if self.check == ERROR_RATE else REL

    @property
    def sequential(self) -> bool:
        return self.method == SEQUENTIAL

    @property
    def effect(self) -> float | None:
        """The delta the check judged: the sequence's mean effect (sequential), else the error rate's points or the
        latency's relative delta."""
        return self.delta_rel if self.sequential or self.kind == REL else self.delta_abs

    @property
    def metric(self) -> str:
        return self.check.partition(":p")[0]

    @property
    def quantile(self) -> float:
        """99.0 for a p99 check; 0.0 for one without a quantile (the error rate)."""
        try:
            return float(quantile_of(self.check) or 0.0)
        except ValueError:
            return 0.0

    @property
    def label(self) -> str:
        """'p99 request latency'."""
        return check_label(self.check)

    @property
    def series_label(self) -> str:
        """'request latency p99 /v1/completions'."""
        return series_label(self.check, self.series)


def decode_result(d: Mapping) -> ResultView:
    vs = d.get("vs_production")
    return ResultView(
        check=str(d.get("check") or ""), series=str(d.get("series") or d.get("check") or ""),
        outcome=str(d.get("outcome") or "inconclusive"), reason=str(d.get("reason") or ""),
        threshold=finite(d.get("threshold")), canary=finite(d.get("canary")), target=finite(d.get("target")),
        n_canary=finite(d.get("n_canary")), n_target=finite(d.get("n_target")),
        delta_abs=finite(d.get("delta_abs")), delta_rel=finite(d.get("delta_rel")),
        ci_low=finite(d.get("ci_low")), ci_high=finite(d.get("ci_high")), need_more=_int(d.get("need_more")),
        low_traffic=bool(d.get("low_traffic", False)),
        vs_production=None if vs is None else (finite(vs[0]), finite(vs[1])),
        method=str(d.get("method") or "fixed"), ship=finite(d.get("ship")), alpha=finite(d.get("alpha")),
        windows=_int(d.get("windows")) or 0, block=_int(d.get("block")) or 1, lag1=finite(d.get("lag1")),
        window_s=finite(d.get("window_s")), eta_s=finite(d.get("eta_s")), jumps=_int(d.get("jumps")) or 0)


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """Production against baseline under sequential statistics (the live A/A): shown, never decided on."""
    check: str
    series: str
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    windows: int

    @property
    def kind(self) -> str:
        return ABS if self.check == ERROR_RATE else REL

    @property
    def series_label(self) -> str:
        return series_label(self.check, self.series)


@dataclass(frozen=True, slots=True)
class DeltaView:
    """Shown, not decided (analysis/deltas.py): one series at one quantile (None: the error rate) per variant, and
    the canary's deltas against baseline and production."""
    series: str
    quantile: float | None
    canary: float | None
    baseline: float | None
    production: float | None
    vs_baseline_abs: float | None
    vs_baseline_rel: float | None
    vs_production_abs: float | None
    vs_production_rel: float | None

    @property
    def series_label(self) -> str:
        if self.series == ERROR_RATE:
            return series_label(ERROR_RATE, ERROR_RATE)
        q = self.quantile
        check = metric_of(self.series) + (f":p{round(q * 100):d}" if q is not None else "")
        return series_label(check, self.series)


@dataclass(frozen=True, slots=True)
class VariantView:
    """What one variant did in the check's window (no bucket counts)."""
    requests: float | None = None
    errors: float | None = None
    ready: bool | None = None
    crashing: bool | None = None
    replayed: float = 0.0


@dataclass(frozen=True, slots=True)
class CheckView:
    seq: int
    at: float
    step: int
    weight: int
    decision: str
    outcome: str
    reason: str = ""
    source: str = ""
    window_start: float | None = None
    window_end: float | None = None
    guard: str | None = None
    need_more: int | None = None
    compare_to: str = "baseline"
    results: tuple[ResultView, ...] = ()
    replica: tuple[ReplicaView, ...] = ()
    deltas: tuple[DeltaView, ...] = ()
    correctness: CorrectnessView | None = None
    variants: Mapping[str, VariantView] = field(default_factory=dict)

    @property
    def sequential(self) -> bool:
        return any(r.sequential for r in self.results)

    @property
    def window_s(self) -> float | None:
        if self.window_start is None or self.window_end is None:
            return None
        return self.window_end - self.window_start

    @property
    def deciding(self) -> frozenset[str]:
        """The gated checks that made this check's outcome: those with a result of that outcome (the failing ones of
        a failed check, the inconclusive ones of an inconclusive check, every passing one of a passed check)."""
        return frozenset(r.check for r in self.results if r.outcome == self.outcome)


def decode_check(d: Mapping) -> CheckView:
    """The view of a stored check (or of the API's JSON of one)."""
    v = d.get("verdict") or {}
    variants = {str(role): VariantView(finite(x.get("requests")), finite(x.get("errors")), x.get("ready"),
                                       x.get("crashing"), finite(x.get("replayed")) or 0.0)
                for role, x in (d.get("variants") or {}).items()}
    return CheckView(
        seq=int(d.get("seq", 0)), at=finite(d.get("at")) or 0.0, step=int(d.get("step", 0)),
        weight=int(d.get("weight", 0)), decision=str(d.get("decision") or ""),
        outcome=str(v.get("outcome") or "inconclusive"), reason=str(v.get("reason") or ""),
        source=str(d.get("source") or ""), window_start=finite(d.get("window_start")),
        window_end=finite(d.get("window_end")), guard=v.get("guard"), need_more=_int(v.get("need_more")),
        compare_to=str(v.get("compare_to") or "baseline"),
        results=tuple(decode_result(r) for r in v.get("results") or ()),
        replica=tuple(ReplicaView(str(o.get("check") or ""), str(o.get("series") or ""), finite(o.get("delta")),
                                  finite(o.get("ci_low")), finite(o.get("ci_high")), _int(o.get("windows")) or 0)
                      for o in v.get("replica") or ()),
        deltas=tuple(DeltaView(str(x.get("series") or ""), finite(x.get("quantile")),
                               *(finite(x.get(k)) for k in ("canary", "baseline", "production", "vs_baseline_abs",
                                                            "vs_baseline_rel", "vs_production_abs",
                                                            "vs_production_rel")))
                     for x in v.get("deltas") or ()),
        correctness=decode_correctness(v["correctness"]) if v.get("correctness") else None,
        variants=variants)
