"""The one rule for which result of a check is its headline (the line a rollout list, `sits-control rollout start
--wait`, the demo and a KernelRollout's status show for a check), and the headline itself: `headline_of(view)`,
serialized as the API's `last_check` (`to_dict`) and read back by the CLI (`from_dict`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from sits.control_plane.view.check import SEQUENTIAL, CheckView, ResultView
from sits.control_plane.view.names import check_label
from sits.control_plane.numbers import ABS, REL, finite

RANK = {"fail": 0, "inconclusive": 1, "pass": 2}


def lead(results: Sequence[ResultView], outcome: str | None = None) -> ResultView | None:
    """The result that says most about `outcome` (default: the worst outcome among `results`):
      1. one with that outcome (it made the check's: a fail, else an inconclusive, else a pass),
      2. then the worse outcome,
      3. one that decided before one skipped for too little traffic (another series of its check decided),
      4. one with a delta before one without,
      5. the highest quantile (the error rate last),
      6. the largest delta."""
    if not results:
        return None
    if outcome is None:
        outcome = min((r.outcome for r in results), key=lambda o: RANK.get(o, 3))
    return min(results, key=lambda r: (r.outcome != outcome, RANK.get(r.outcome, 3), r.low_traffic,
                                       r.effect is None, -r.quantile,
                                       -(r.effect if r.effect is not None else -math.inf)))


@dataclass(frozen=True, slots=True)
class Headline:
    """A check in one line: when, its outcome and decision, and its lead result (check None: no result, e.g. a
    guard or a correctness check). `delta` is the lead's effect, `result` the lead's own outcome."""
    seq: int
    at: float
    step: int
    weight: int
    outcome: str
    decision: str
    reason: str = ""
    guard: str | None = None
    need_more: int | None = None
    compare_to: str | None = None
    source: str | None = None
    check: str | None = None
    label: str | None = None
    series: str | None = None
    kind: str = REL
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None
    result: str | None = None
    method: str = "fixed"
    ship: float | None = None
    windows: int | None = None
    eta_s: float | None = None

    @property
    def sequential(self) -> bool:
        return self.method == SEQUENTIAL

    def to_dict(self) -> dict:
        """The API's `last_check`."""
        out = {"seq": self.seq, "at": self.at, "step": self.step, "weight": self.weight, "outcome": self.outcome,
               "decision": self.decision, "reason": self.reason, "guard": self.guard, "need_more": self.need_more,
               "compare_to": self.compare_to, "source": self.source}
        if self.check is not None:
            out.update(check=self.check, label=self.label, series=self.series, kind=self.kind, delta=self.delta,
                       ci=[self.ci_low, self.ci_high], threshold=self.threshold, result=self.result)
            if self.sequential:
                out.update(method=SEQUENTIAL, ship=self.ship, windows=self.windows, eta_s=self.eta_s)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Headline":
        """The API's `last_check` back (keys it lacks take their defaults)."""
        ci = list(d.get("ci") or ()) + [None, None]
        windows = finite(d.get("windows"))
        return cls(seq=int(d.get("seq", 0)), at=finite(d.get("at")) or 0.0, step=int(d.get("step", 0)),
                   weight=int(d.get("weight", 0)), outcome=str(d.get("outcome") or ""),
                   decision=str(d.get("decision") or ""), reason=str(d.get("reason") or ""), guard=d.get("guard"),
                   need_more=d.get("need_more"), compare_to=d.get("compare_to"), source=d.get("source"),
                   check=d.get("check"), label=d.get("label"), series=d.get("series"),
                   kind=ABS if d.get("kind") == ABS else REL, delta=finite(d.get("delta")), ci_low=finite(ci[0]),
                   ci_high=finite(ci[1]), threshold=finite(d.get("threshold")),
                   result=d.get("result"), method=str(d.get("method") or "fixed"),
                   ship=finite(d.get("ship")), windows=None if windows is None else int(windows),
                   eta_s=finite(d.get("eta_s")))


def headline_of(view: CheckView) -> Headline:
    """The check's headline: its lead result (`lead`, with the check's own outcome) and the check's summary."""
    base = Headline(seq=view.seq, at=view.at, step=view.step, weight=view.weight, outcome=view.outcome,
                    decision=view.decision, reason=view.reason, guard=view.guard, need_more=view.need_more,
                    compare_to=view.compare_to, source=view.source or None)
    r = lead(view.results, view.outcome)
    if r is None:
        return base
    seq = r.sequential
    return replace(base, check=r.check, label=check_label(r.check), series=r.series, kind=r.kind, delta=r.effect,
                   ci_low=r.ci_low, ci_high=r.ci_high, threshold=r.threshold, result=r.outcome, method=r.method,
                   ship=r.ship if seq else None, windows=r.windows if seq else None, eta_s=r.eta_s if seq else None)
