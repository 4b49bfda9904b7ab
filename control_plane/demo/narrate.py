"""What the demo prints: a timestamped line per event, one line per check, the evidence at the deciding check, the load
per scenario and the summary. runner.py runs the demo and calls these; they read the store and the load generator.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Callable, Sequence

from sits.control_plane.analysis import ITL, MetricCheck, Policy
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.rollout import Command, Decision, EventKind, Phase
from sits.control_plane.service.format import format_check
from sits.control_plane.store.db import Store
from sits.control_plane.view import CheckView, ResultView, VariantView, decode_check
from sits.control_plane.view.names import terse_label
from sits.control_plane.numbers import ABS, REL, count, limit, percent, plural

if TYPE_CHECKING:
    from sits.control_plane.demo.runner import DemoResult


def printer(t0: float) -> Callable[[str], None]:
    lock = threading.Lock()

    def out(line: str = "") -> None:
        with lock:
            print(f"[{time.monotonic() - t0:6.1f}s] {line}" if line else "", flush=True)
    return out


def gate(c: MetricCheck) -> str:
    if c.max_rel_delta is not None:
        return f"{c.name} <= {limit(REL, c.max_rel_delta)}"
    return f"{c.name} <= {limit(ABS, c.max_abs_delta)}"


def _pick(results: Sequence[ResultView], check: str) -> ResultView:
    """The series a check's line shows: /v1/completions when the check has it, else its first."""
    rows = [r for r in results if r.check == check]
    return next((r for r in rows if '"/v1/completions"' in r.series), rows[0])


def _effect(r: ResultView) -> str:
    """"+195.1 % [+167.7, +203.8]": the delta and its interval, the interval without units."""
    return f"{percent(r.delta_rel)} [{percent(r.ci_low, unit=False)}, {percent(r.ci_high, unit=False)}]"


def check_line(view: CheckView, steps: int) -> str:
    """One check in one line: step, weight, each latency gate's delta with its interval (request latency's P99 and
    P90 unnamed, others named: ITL P99), verdict and decision."""
    head = f"check {view.seq:>2} · step {view.step + 1}/{steps} at {view.weight:>3} %"
    cv = view.correctness
    if cv is not None:
        cf = cv.conformance
        ops = f" (ops {cf.outcome.upper()}{': ' + ', '.join(cf.judged_ops) if cf.judged_ops else ''})" if cf else ""
        return f"{head} · correctness gate: {cv.outcome.upper()}{ops} -> {view.decision}"
    parts = []
    for check in dict.fromkeys(r.check for r in view.results if ":p" in r.check):   # latency gates, in order
        r = _pick(view.results, check)
        label = terse_label(check)
        if r.sequential:   # the confidence sequence between its two boundaries
            if r.ci_low is None:
                parts.append(f"{label} not yet ({plural(r.windows, 'window')})")
            else:
                parts.append(f"{label} {_effect(r)} (ship {limit(REL, r.ship)} / limit {limit(REL, r.threshold)}, "
                             f"{plural(r.windows, 'window')})")
        elif r.delta_rel is None:
            parts.append(f"{label} not yet (too few {'tokens' if r.metric == ITL else 'requests'})")
        else:
            parts.append(f"{label} {_effect(r)} (<= {limit(REL, r.threshold)})")
    c = view.variants.get("canary") or VariantView(0.0)
    return (f"{head} · {' · '.join(parts)} · {count(c.requests or 0)} canary req ({count(c.replayed)} replayed) · "
            f"{view.outcome.upper()} -> {view.decision}")


def follow(store: Store, rollout_id: str, load: LoadGenerator, policy: Policy, timeout_s: float, out) -> str:
    """Print phase changes and one line per check as they are stored (the full evidence at the deciding check) until
    the rollout ends; past `timeout_s` abort it (and give up 120 s later). Returns its final phase."""
    seen_event, seen_check, last_load = 0, 0, time.monotonic()
    deadline, aborted = time.monotonic() + timeout_s, False
    steps = len(policy.steps)
    while True:
        r = store.get(rollout_id)
        for e in store.events(rollout_id, since_id=seen_event):
            seen_event = e["id"]
            if e["kind"] in (EventKind.PHASE, EventKind.COMMAND):
                out(f"      {e['message']}")
        for view in (decode_check(ev) for ev in store.checks(rollout_id, since_seq=seen_check)):
            seen_check = view.seq
            out("      " + check_line(view, steps))
            if view.decision in (Decision.ROLLBACK, Decision.PROMOTE):
                for line in format_check(view, policy.steps)[1:]:
                    out("        " + line)
        if not r.active and not store.pending_actions(rollout_id):
            return r.phase.value
        if r.phase is Phase.PROGRESSING and time.monotonic() - last_load >= 10:
            last_load = time.monotonic()
            s = load.summary(10.0)
            parts = [f"{v} {x['share'] * 100:.0f} % p90 {x['p90_ms']:.0f} ms" for v, x in s["variants"].items()]
            out(f"      load {s['rate']:.1f} req/s, {s['errors']} failed: " + ", ".join(parts) + " (client side)")
        if time.monotonic() > deadline and not aborted:
            out(f"      rollout did not finish within {timeout_s:g} s: aborting it")
            store.commands.add(rollout_id, Command.ABORT, "demo timeout")
            aborted, deadline = True, time.monotonic() + 120
        elif time.monotonic() > deadline:
            return r.phase.value
        time.sleep(0.5)


def scenario_load(load: LoadGenerator, before: dict, out, gpu_memory: dict[str, float] | None = None) -> None:
    """Requests answered/failed per variant during the scenario, client-side TTFT/ITL P50/P99 of its streams, and
    (on a GPU) each engine's peak allocator memory as its /metrics said."""
    now = load.counts()
    parts = [f"{v} {c['answered'] - before.get(v, {}).get('answered', 0)} answered / "
             f"{c['failed'] - before.get(v, {}).get('failed', 0)} failed" for v, c in now.items()]
    out("      scenario load: " + "; ".join(parts))
    lat = load.token_latency(reset=True)
    out("      client TTFT p50/p99, ITL p50/p99 (ms): " + "; ".join(
        f"{v} {x['ttft_p50'] * 1e3:.0f}/{x['ttft_p99'] * 1e3:.0f}, {x['itl_p50'] * 1e3:.1f}/{x['itl_p99'] * 1e3:.1f}"
        f" ({x['streams']} streams)" for v, x in lat.items()))
    if gpu_memory is not None:
        out("      GPU memory per engine (peak held by its CUDA allocator, sits_device_memory_reserved_bytes): "
            + (", ".join(f"{role} {b / 2**20:,.0f} MiB" for role, b in sorted(gpu_memory.items())) or "not read"))


def summary(result: DemoResult, store: Store, loads: list[tuple[str, LoadGenerator]], out, replayed) -> None:
    """Each rollout's outcome and why, what was replayed, the load per variant, where the UI and the store are.
    `loads`: (lane tag, its load generator) per lane; one lane has the tag ''."""
    out("")
    out(f"Summary ({result.seconds / 60:.1f} min):")
    for i, (rid, sc, phase) in enumerate(result.rollouts):
        r = store.get(rid)
        ok = "OK" if phase == sc.expected.value else f"UNEXPECTED (wanted {sc.expected.value})"
        lane = f"[{r.service}] " if len(loads) > 1 else ""
        out(f"  {i + 1}. {lane}{sc.name:5s} {sc.canary(r.production_kernels):16s} {phase:11s} after {r.checks} checks, "
            f"{r.phase_since - r.created_at:.0f} s - {ok}")
        out(f"     why: {r.reason}")
        if r.replayed_requests:
            out(f"     low-traffic mode replayed {r.replayed_requests:.0f} requests to the canary (and as many to the "
                "baseline) next to the live ones")
    if len(result.rollouts) < result.wanted:
        out(f"  {result.wanted - len(result.rollouts)} scenario(s) NOT RUN: the product refused their rollouts (the "
            "lines above say why)")
    for tag, load in loads:
        counts = load.counts()
        out(f"  load{f' [{tag}]' if tag else ''}: " + "; ".join(
            f"{v} {c['answered']} answered / {c['failed']} failed" for v, c in counts.items())
            + f" ({load.sent} sent, every token verified)")
    total: Counter = Counter()   # per variant, over every lane's service
    for s in (s for m in replayed.collect() for s in m.samples if s.name.endswith("_total")):
        total[s.labels["variant"]] += s.value
    out("  replayed (low-traffic mode, sits_replayed_requests_total): " + (", ".join(
        f"{v} {n:.0f}" for v, n in sorted(total.items())) or "none"))
    out(f"  UI {result.url} · store {result.store_path}")
    out("demo " + ("passed" if result.ok else "FAILED"))
    sys.stdout.flush()
