"""Text views of rollouts and their evidence, shared by the CLI, the demo and the web UI: a check's table (canary vs
target per metric, delta, its confidence interval, threshold, verdict), every measured percentile against both
baseline and production, a correctness-gate check (its diverged prompts with both continuations), the rollout list
and `rollout show`. Input is what the store returns (JSON dicts)."""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Mapping, Sequence

from sits.control_plane.analysis import E2E, ERROR_RATE, ITL, REQUEST_LATENCY, TTFT
from sits.control_plane.rollout import EventKind, Rollout
from sits.control_plane.store.db import Store

SHORT_NAMES = {REQUEST_LATENCY: "request latency", TTFT: "TTFT", ITL: "inter-token", E2E: "e2e"}


def ms(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x) * 1000:.1f} ms"


def pct(x, signed: bool = True) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):   # "+Inf" / "-Inf" from the store's JSON
        return "+inf" if x.startswith("+") else "-inf"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def points(x) -> str:
    return "-" if x is None else f"{float(x) * 100:+.2f} pt"


def rate(x) -> str:
    return "-" if x is None else f"{float(x) * 100:.2f} %"


def when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def series_label(check: str, series: str) -> str:
    """'request latency p99 /v1/completions' for check 'http_request_duration_seconds:p99' on that route's series."""
    metric, _, q = check.partition(":p")
    if metric == ERROR_RATE:
        return "error rate"
    route = series.split('route="', 1)[1].split('"', 1)[0] if 'route="' in series else ""
    return f"{SHORT_NAMES.get(metric, metric)} p{q.replace('_', '.')} {route}".strip()


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


# ---- the correctness gate ----------------------------------------------------------------------------------------
_MAX_IDS = 24


def _fmt(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ids(ids) -> str:
    ids = list(ids)
    return str(ids[:_MAX_IDS])[:-1] + (", ...]" if len(ids) > _MAX_IDS else "]")


def format_conformance(cf: Mapping | None) -> list[str]:
    """The op-level conformance part of a correctness check (analysis/conformance.py), or nothing when off."""
    if not cf:
        return []
    where = " ".join(x for x in (cf.get("device"), cf.get("dtype")) if x)
    cost = f", {cf['cases']} cases measured in {cf['seconds']:.1f} s" if cf.get("seconds") is not None else ""
    head = f"    op-level conformance: {cf['outcome'].upper()} (the canary's engine{f' on {where}' if where else ''}" \
           f"{cost}, k={_fmt(cf.get('k'), 'g')})"
    lines = [head]
    if cf.get("judged_ops"):
        same = f"; as production: {', '.join(cf['unchanged_ops'])}" if cf.get("unchanged_ops") else ""
        lines.append(f"      judged (changed from production's set): {', '.join(cf['judged_ops'])}{same}")
    for f in cf.get("failures", ()):
        got = f["exception"] if f.get("error") is None and f.get("exception") else \
            f"error {_fmt(f.get('error'), '.3g')} > allowed {f['allowed']:.3g} (the reference's own " \
            f"{f['reference_error']:.3g})"
        lines.append(f"      {f['op']} at {f['case']}: {got}")
    if cf.get("failed_cases", 0) > len(cf.get("failures", ())):
        lines.append(f"      ... {cf['failed_cases'] - len(cf['failures'])} more case(s) out of tolerance")
    if cf["outcome"] != "fail":
        lines.append(f"      {cf['reason']}")
    return lines


def format_correctness(ev: Mapping, steps_total: int = 0) -> list[str]:
    """One correctness check (a check dict whose verdict has a "correctness" entry)."""
    cv, decision = ev["verdict"]["correctness"], ev["decision"]
    where = "before traffic" if ev["step"] < 0 else f"step {ev['step'] + 1}{f'/{steps_total}' if steps_total else ''}" \
        f" · canary at {ev['weight']} %"
    lines = [f"check {ev['seq']} · {where} · correctness gate: {cv['outcome'].upper()} -> {decision}"]
    cost = f"; {cv['requests']} requests in {cv['seconds']:.1f} s" if cv.get("seconds") is not None else ""
    if cv["prompts"]:
        lines.append(f"    {cv['prompts']} prompts ({cv['dtype'] or 'unknown dtype'} tolerances): "
                     f"{_fmt(cv['identical_fraction'], '.0%')} identical, {cv['diverged']} diverged, top-1 agreement "
                     f"{_fmt(cv['top1_agreement'], '.1%')} when fed the baseline's tokens, logprob drift mean "
                     f"{_fmt(cv['drift_mean'], '.2g')} max {_fmt(cv['drift_max'], '.2g')}{cost}")
    if cv.get("confident_positions"):
        lines.append(f"    at the {cv['confident_positions']} of {cv['positions']} positions where the baseline was "
                     f"sure: top-1 agreement {_fmt(cv['confident_top1'], '.1%')}, logprob drift mean "
                     f"{_fmt(cv['confident_drift_mean'], '.2g')} max {_fmt(cv['confident_drift_max'], '.2g')}")
    lines += format_conformance(cv.get("conformance"))
    if cv["errors"]:
        lines.append(f"    {cv['errors']} prompt(s) could not be replayed")
    if cv["failed"]:
        lines.append(f"    failed: {', '.join(cv['failed'])}")
    for e in cv["evidence"]:
        label = e["prompt"].replace("\n", " ")
        if e.get("error"):
            lines.append(f"    prompt {e['index']} {label!r}: {e['error']}")
            continue
        at = e["first_divergence"]
        head = f"first divergence at token {at}" if at is not None else "no divergence"
        margins = f" (baseline margin {_fmt(e['baseline_margin'], '.3g')}, canary margin " \
                  f"{_fmt(e['canary_margin'], '.3g')})" if at is not None else ""
        sure = f"; the canary's top-1 differed at {e['confident_disagreements']} position(s) where the baseline was " \
               f"sure" if e.get("confident_disagreements") else ""
        lines.append(f"    prompt {e['index']} {label!r}: {head}{margins}; max drift {_fmt(e['drift_max'], '.2g')} "
                     f"before it, {_fmt(e['forced_drift_max'], '.2g')} fed the baseline's tokens{sure}")
        lines.append(f"      baseline: {_ids(e['baseline_tokens'])} {e['baseline_text']!r}")
        lines.append(f"      canary:   {_ids(e['canary_tokens'])} {e['canary_text']!r}")
    lines.append(f"    reason: {cv['reason']}")
    return lines


def format_check(ev: dict, steps: Sequence[int] = ()) -> list[str]:
    """One check's evidence: per metric the canary and target values, delta, CI of the delta, threshold, verdict."""
    if ev["verdict"].get("correctness") is not None:
        return format_correctness(ev, len(steps))
    v, target = ev["verdict"], ev["verdict"]["compare_to"]
    window = ""
    if ev.get("window_start") is not None and ev.get("window_end") is not None:
        window = f", {float(ev['window_end']) - float(ev['window_start']):.1f} s of data"
    var = ev.get("variants", {})
    n = " / ".join(f"{r} {var[r]['requests']:.0f}" for r in ("canary", target) if r in var)
    step = f"step {ev['step'] + 1}/{len(steps)}" if steps else f"step {ev['step'] + 1}"
    lines = [f"check {ev['seq']} · {step} · canary at {ev['weight']} %{window} · requests {n or '-'}"
             f" · {v['outcome'].upper()} -> {ev['decision']}"]
    if any(r.get("method") == "sequential" for r in v["results"]):
        return lines + _table(sequential_rows(v["results"], target)) + replica_lines(v) + [f"    reason: {v['reason']}"]
    rows = [("metric", "canary", target, "delta", "CI of delta", "threshold", "verdict")]
    for r in v["results"]:
        if r["check"] == ERROR_RATE:
            vals = (rate(r["canary"]), rate(r["target"]), points(r["delta_abs"]),
                    f"[{points(r['ci_low'])}, {points(r['ci_high'])}]", f"<= {points(r['threshold'])}")
        else:
            vals = (ms(r["canary"]), ms(r["target"]), pct(r["delta_rel"]),
                    f"[{pct(r['ci_low'])}, {pct(r['ci_high'])}]", f"<= {pct(r['threshold'])}")
        rows.append((series_label(r["check"], r["series"]), *vals, r["outcome"].upper()))
    return lines + _table(rows) + [f"    reason: {v['reason']}"]


def sequential_rows(results: Sequence[dict], target: str) -> list[tuple[str, ...]]:
    """Sequential statistics: per series the step's values, the windows' mean effect, the confidence sequence, the two
    boundaries (ship / limit), the windows used (and blocks when correlated windows were averaged), the time to decide."""
    rows = [("metric", "canary", target, "effect", "sequence", "ship / limit", "windows", "decides in", "verdict")]
    for r in results:
        err = r["check"] == ERROR_RATE
        f, val = (points, rate) if err else (pct, ms)
        seq = f"[{f(r['ci_low'])}, {f(r['ci_high'])}]" if r.get("ci_low") is not None else "-"
        windows = str(r.get("windows") or 0) + (f" (x{r['block']})" if (r.get("block") or 1) > 1 else "")
        eta = r.get("eta_s")
        eta = "-" if r["outcome"] != "inconclusive" or eta is None else f"~{eta:.0f} s"
        rows.append((series_label(r["check"], r["series"]), val(r["canary"]), val(r["target"]), f(r["delta_rel"]),
                     seq, f"{f(r['ship'])} / {f(r['threshold'])}", windows, eta, r["outcome"].upper()))
    return rows


def replica_lines(v: dict) -> list[str]:
    """The live A/A: production against baseline (the same kernels, at the same time), how far two identical
    engines differ here."""
    out = []
    for o in v.get("replica") or []:
        f = points if o["check"] == ERROR_RATE else pct
        bounds = f" [{f(o['ci_low'])}, {f(o['ci_high'])}]" if o.get("ci_low") is not None else ""
        out.append(f"    replica offset (production vs baseline, same kernels) {series_label(o['check'], o['series'])}: "
                   f"{f(o['delta'])}{bounds} over {o['windows']} windows")
    return out


def format_deltas(ev: dict) -> list[str]:
    """What was measured but not necessarily decided on: P90/P99 of every series (request latency per route, TTFT,
    inter-token, e2e) for canary, baseline and production, and the canary's relative deltas against both."""
    deltas = ev["verdict"].get("deltas") or []
    if not deltas:
        return []
    rows = [("series", "canary", "baseline", "production", "vs baseline", "vs production")]
    for d in deltas:
        if d["series"] == ERROR_RATE:
            rows.append(("error rate", rate(d["canary"]), rate(d["baseline"]), rate(d["production"]),
                         points(d["vs_baseline_abs"]), points(d["vs_production_abs"])))
        else:
            q = d["quantile"]
            metric = d["series"].split("{", 1)[0]
            label = series_label(f"{metric}:p{round(q * 100):d}" if q is not None else metric, d["series"])
            rows.append((label, ms(d["canary"]), ms(d["baseline"]), ms(d["production"]), pct(d["vs_baseline_rel"]),
                         pct(d["vs_production_rel"])))
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
    out = [f"rollout {r.id}  service {r.service}  canary {r.canary_kernels}  production {r.production_kernels}",
           f"phase {r.phase.value} ({r.reason or '-'}); step {r.step + 1}/{len(r.policy.steps)} at {r.weight} %; "
           f"{r.checks} checks; source {r.source or '-'}", "events:"]
    out += [f"  {when(e['at'])}  [{e['phase']}] {e['message']}" for e in store.events(r.id)
            if e["kind"] != EventKind.CHECK]
    out.append("checks:")
    checks = store.checks(r.id)
    out += ["  " + line for ev in checks for line in format_check(ev, r.policy.steps)]
    last = format_deltas(checks[-1]) if checks else []
    if last:
        out.append(f"all measured percentiles at the last check (#{checks[-1]['seq']}), canary against baseline and "
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
