"""Text views of rollouts and their evidence, shared by the CLI and the demo: a check's table (canary vs target per
metric, delta, its confidence interval, threshold, verdict), every measured percentile against both baseline and
production, a correctness-gate check (its diverged prompts with both continuations), the rollout list and `rollout
show`. Input is a check's view (view.decode_check of what the store or the API returns); numbers are written by
control_plane/numbers.py."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

from sits.control_plane.rollout import EventKind, Rollout
from sits.control_plane.store.db import Store
from sits.control_plane.view import CheckView, ReplicaView, ResultView, decode_check
from sits.control_plane.view.correctness import ConformanceView
from sits.control_plane.numbers import (ABS, count, delta, eta, interval, ms, number, percent, points, rate,
                                             seconds)


def when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


# ---- the correctness gate ----------------------------------------------------------------------------------------
_MAX_IDS = 24


def _ids(ids) -> str:
    ids = list(ids)
    return str(ids[:_MAX_IDS])[:-1] + (", ...]" if len(ids) > _MAX_IDS else "]")


def format_conformance(cf: ConformanceView | None) -> list[str]:
    """The op-level conformance part of a correctness check (analysis/conformance.py), or nothing when off."""
    if cf is None:
        return []
    where = " ".join(x for x in (cf.device, cf.dtype) if x)
    cost = f", {cf.cases} cases measured in {seconds(cf.seconds)}" if cf.seconds is not None else ""
    head = f"    op-level conformance: {cf.outcome.upper()} (the canary's engine{f' on {where}' if where else ''}" \
           f"{cost}, k={number(cf.k, 'g')})"
    lines = [head]
    if cf.judged_ops:
        same = f"; as production: {', '.join(cf.unchanged_ops)}" if cf.unchanged_ops else ""
        lines.append(f"      judged (changed from production's set): {', '.join(cf.judged_ops)}{same}")
    for f in cf.failures:
        own = "" if f.error is None and f.exception else f" (the reference's own {number(f.reference_error, '.3g')})"
        lines.append(f"      {f.op} at {f.case}: {f.problem}{own}")
    if cf.failed_cases > len(cf.failures):
        lines.append(f"      ... {cf.failed_cases - len(cf.failures)} more case(s) out of tolerance")
    if cf.outcome != "fail":
        lines.append(f"      {cf.reason}")
    return lines


def format_correctness(view: CheckView, steps_total: int = 0) -> list[str]:
    """One correctness check (a check whose verdict has a "correctness" entry)."""
    cv = view.correctness
    assert cv is not None
    where = "before traffic" if view.step < 0 else \
        f"step {view.step + 1}{f'/{steps_total}' if steps_total else ''} · canary at {view.weight} %"
    lines = [f"check {view.seq} · {where} · correctness gate: {cv.outcome.upper()} -> {view.decision}"]
    cost = f"; {cv.requests} requests in {seconds(cv.seconds)}" if cv.seconds is not None else ""
    if cv.prompts:
        lines.append(f"    {cv.prompts} prompts ({cv.dtype or 'unknown dtype'} tolerances): "
                     f"{number(cv.identical_fraction, '.0%')} identical, {cv.diverged} diverged, top-1 agreement "
                     f"{number(cv.top1_agreement, '.1%')} when fed the baseline's tokens, logprob drift mean "
                     f"{number(cv.drift_mean, '.2g')} max {number(cv.drift_max, '.2g')}{cost}")
    if cv.confident_positions:
        lines.append(f"    at the {cv.confident_positions} of {cv.positions} positions where the baseline was "
                     f"sure: top-1 agreement {number(cv.confident_top1, '.1%')}, logprob drift mean "
                     f"{number(cv.confident_drift_mean, '.2g')} max {number(cv.confident_drift_max, '.2g')}")
    lines += format_conformance(cv.conformance)
    if cv.errors:
        lines.append(f"    {cv.errors} prompt(s) could not be replayed")
    if cv.failed:
        lines.append(f"    failed: {', '.join(cv.failed)}")
    for e in cv.evidence:
        label = e.prompt.replace("\n", " ")
        if e.error:
            lines.append(f"    prompt {e.index} {label!r}: {e.error}")
            continue
        at = e.first_divergence
        head = f"first divergence at token {at}" if at is not None else "no divergence"
        margins = f" (baseline margin {number(e.baseline_margin, '.3g')}, canary margin " \
                  f"{number(e.canary_margin, '.3g')})" if at is not None else ""
        sure = f"; the canary's top-1 differed at {e.confident_disagreements} position(s) where the baseline was " \
               f"sure" if e.confident_disagreements else ""
        lines.append(f"    prompt {e.index} {label!r}: {head}{margins}; max drift {number(e.drift_max, '.2g')} "
                     f"before it, {number(e.forced_drift_max, '.2g')} fed the baseline's tokens{sure}")
        lines.append(f"      baseline: {_ids(e.baseline_tokens)} {e.baseline_text!r}")
        lines.append(f"      canary:   {_ids(e.canary_tokens)} {e.canary_text!r}")
    lines.append(f"    reason: {cv.reason}")
    return lines


def format_check(view: CheckView, steps: Sequence[int] = ()) -> list[str]:
    """One check's evidence: per metric the canary and target values, delta, CI of the delta, threshold, verdict."""
    if view.correctness is not None:
        return format_correctness(view, len(steps))
    target = view.compare_to
    window = f", {seconds(view.window_s)} of data" if view.window_s is not None else ""
    n = " / ".join(f"{role} {count(view.variants[role].requests)}" for role in ("canary", target)
                   if role in view.variants)
    step = f"step {view.step + 1}/{len(steps)}" if steps else f"step {view.step + 1}"
    lines = [f"check {view.seq} · {step} · canary at {view.weight} %{window} · requests {n or '-'}"
             f" · {view.outcome.upper()} -> {view.decision}"]
    if view.sequential:
        return (lines + _table(sequential_rows(view.results, target)) + replica_lines(view.replica)
                + [f"    reason: {view.reason}"])
    rows = [("metric", "canary", target, "delta", "CI of delta", "threshold", "verdict")]
    for r in view.results:
        value = rate if r.kind == ABS else ms
        rows.append((r.series_label, value(r.canary), value(r.target), delta(r.kind, r.effect),
                     interval(r.kind, r.ci_low, r.ci_high), f"<= {delta(r.kind, r.threshold)}", r.outcome.upper()))
    return lines + _table(rows) + [f"    reason: {view.reason}"]


def sequential_rows(results: Sequence[ResultView], target: str) -> list[tuple[str, ...]]:
    """Sequential statistics: per series the step's values, the windows' mean effect, the confidence sequence, the two
    boundaries (ship / limit), the windows used (and blocks when correlated windows were averaged), the time to decide."""
    rows = [("metric", "canary", target, "effect", "sequence", "ship / limit", "windows", "decides in", "verdict")]
    for r in results:
        value = rate if r.kind == ABS else ms
        seq = interval(r.kind, r.ci_low, r.ci_high) if r.ci_low is not None else "-"
        windows = str(r.windows) + (f" (x{r.block})" if r.block > 1 else "")
        rows.append((r.series_label, value(r.canary), value(r.target), delta(r.kind, r.effect), seq,
                     f"{delta(r.kind, r.ship)} / {delta(r.kind, r.threshold)}", windows,
                     eta(r.eta_s) if r.outcome == "inconclusive" else "-", r.outcome.upper()))
    return rows


def replica_lines(replica: Sequence[ReplicaView]) -> list[str]:
    """The live A/A: production against baseline (the same kernels, at the same time), how far two identical
    engines differ here."""
    out = []
    for o in replica:
        bounds = f" {interval(o.kind, o.ci_low, o.ci_high)}" if o.ci_low is not None else ""
        out.append(f"    replica offset (production vs baseline, same kernels) {o.series_label}: "
                   f"{delta(o.kind, o.delta)}{bounds} over {o.windows} windows")
    return out


def format_deltas(view: CheckView) -> list[str]:
    """What was measured but not necessarily decided on: P90/P99 of every series (request latency per route, TTFT,
    inter-token, e2e) for canary, baseline and production, and the canary's relative deltas against both."""
    if not view.deltas:
        return []
    rows = [("series", "canary", "baseline", "production", "vs baseline", "vs production")]
    for d in view.deltas:
        if d.quantile is None:   # the error rate
            rows.append((d.series_label, rate(d.canary), rate(d.baseline), rate(d.production),
                         points(d.vs_baseline_abs), points(d.vs_production_abs)))
        else:
            rows.append((d.series_label, ms(d.canary), ms(d.baseline), ms(d.production), percent(d.vs_baseline_rel),
                         percent(d.vs_production_rel)))
    return _table(rows)


def rollout_table(rollouts: Sequence[Rollout]) -> list[str]:
    if not rollouts:
        return ["no rollouts"]
    lines = [f"{'ID':40} {'SERVICE':12} {'PHASE':13} {'STEP':6} {'WEIGHT':6} {'CHECKS':6} CREATED"]
    for r in rollouts:
        step = f"{r.step + 1}/{len(r.policy.steps)}" if r.step >= 0 else "-"
        lines.append(f"{r.id:40} {r.service:12} {r.phase.value:13} {step:6} {r.weight:>5}% {r.checks:>6} "
                     f"{when(r.created_at)}")
    return lines


def rollout_report(store: Store, rollout_id: str) -> list[str]:
    """`sits-control rollout show`: the rollout, its events, every check's evidence, the last check's percentiles
    against both targets, the last window's queries and the webhook deliveries."""
    r = store.get(rollout_id)
    flags = store.spec(r.id).changed_flags()   # what a release of engine flags changes
    out = [f"rollout {r.id}  service {r.service}  canary {r.canary_kernels}"
           + (f" with {'; '.join(flags)}" if flags else "") + f"  production {r.production_kernels}",
           f"phase {r.phase.value} ({r.reason or '-'}); step {r.step + 1}/{len(r.policy.steps)} at {r.weight} %; "
           f"{r.checks} checks; source {r.source or '-'}", "events:"]
    out += [f"  {when(e['at'])}  [{e['phase']}] {e['message']}" for e in store.events(r.id)
            if e["kind"] != EventKind.CHECK]
    out.append("checks:")
    checks = [decode_check(ev) for ev in store.checks(r.id)]
    out += ["  " + line for view in checks for line in format_check(view, r.policy.steps)]
    last = format_deltas(checks[-1]) if checks else []
    if last:
        out.append(f"all measured percentiles at the last check (#{checks[-1].seq}), canary against baseline and "
                   "production:")
        out += ["  " + line for line in last]
    if r.queries:
        out.append("queries of the last window:")
        out += [f"  {k}: {q}" for k, q in r.queries.items()]
    notes = store.deliveries.of_rollout(r.id)
    if notes:
        out.append("notifications (webhook deliveries):")
        for d in notes:
            tail = f" ({d['attempts']} attempts{': ' + d['error'] if d['error'] else ''})" if d["attempts"] != 1 \
                else ""
            out.append(f"  {when(d['at'])}  {d['event']:12} webhook {d['webhook']}  {d['status']}{tail}")
    return out
