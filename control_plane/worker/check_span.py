"""A check's verdict as OpenTelemetry span attributes (the worker's `sits.check` span)."""
from __future__ import annotations

from sits.control_plane.rollout import Check
from sits.wire.tracing import clean_attributes


def check_attributes(check: Check) -> dict[str, object]:
    """A check's verdict as span attributes: outcome, decision, reason; per test (check name and series) the
    relative delta with its interval; the shown P90/P99 deltas vs baseline and production; the correctness gate's
    verdict and figures when the check is the gate's."""
    v = check.verdict
    out: dict[str, object] = {"sits.check.seq": check.seq, "sits.check.source": check.source,
                              "sits.step": check.step, "sits.weight": check.weight, "sits.verdict": v.outcome,
                              "sits.decision": check.decision, "sits.reason": v.reason[:500],
                              "sits.compare_to": v.compare_to, "sits.guard": v.guard, "sits.need_more": v.need_more}
    for t in v.results:
        key = f"sits.test.{t.check}.{t.series}"
        out.update({f"{key}.outcome": t.outcome, f"{key}.delta_rel": t.delta_rel, f"{key}.ci_low": t.ci_low,
                    f"{key}.ci_high": t.ci_high, f"{key}.n_canary": t.n_canary})
    for d in v.deltas:
        if d.quantile in (0.9, 0.99):
            key = f"sits.delta.p{d.quantile * 100:g}.{d.series}"
            out.update({f"{key}.vs_baseline_rel": d.vs_baseline_rel, f"{key}.vs_production_rel": d.vs_production_rel})
    c = v.correctness
    if c is not None:
        out.update({"sits.correctness.verdict": c.outcome, "sits.correctness.reason": c.reason[:500],
                    "sits.correctness.prompts": c.prompts, "sits.correctness.identical_fraction":
                    c.identical_fraction, "sits.correctness.top1_agreement": c.top1_agreement,
                    "sits.correctness.drift_max": c.drift_max})
    return clean_attributes(out)
