"""The API's JSON shapes of rollouts and checks, from what the store holds (pure functions of stored data)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Mapping

from sits.control_plane.rollout import CORRECTNESS_PREFIX, ROLES, Phase, Rollout, weights_for
from sits.control_plane.view import Headline, decode_check, headline_of
from sits.control_plane.view.names import check_label
from sits.control_plane.numbers import ABS, TYPESET, delta
from sits.control_plane.web.common import nonfinite_to_null

class HeadlineCache:
    """Checks never change once stored: their headline (view.headline_of) is computed once per (store, rollout,
    seq)."""

    def __init__(self, size: int = 4096) -> None:
        self._d: OrderedDict[tuple, Headline | dict] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, store, rollout_id: str, seq: int) -> Headline | None:
        if seq <= 0:
            return None
        key = (store.path, rollout_id, seq)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
                return hit
        try:
            h = headline_of(decode_check(store.check(rollout_id, seq)))
        except KeyError:
            return None
        with self._lock:
            self._d[key] = h
            while len(self._d) > self._size:
                self._d.popitem(last=False)
        return h


    def ending(self, store, r: Rollout, last: Headline | None) -> dict | None:
        """ending() of an ended rollout, computed once (an ended rollout never changes); None while it runs."""
        if r.active:
            return None
        key = (store.path, r.id, "ending", r.version)
        with self._lock:
            hit = self._d.get(key)
        if hit is None:
            hit = ending(r, last, store.events(r.id, limit=100000), store.actions(r.id))
            with self._lock:
                self._d[key] = hit
                while len(self._d) > self._size:
                    self._d.popitem(last=False)
        return hit


def ending(r: Rollout, last: Headline | None, events: list[dict], actions: list[dict]) -> dict:
    """Why an ended rollout ended, as {"kind", "text"}: "deploy" (an action failed for good: its error), "aborted" or
    "promoted_manually" (a person's command: their name), "latency" / "guard" / "correctness" / "inconclusive" (the
    last check decided the rollback: its deciding result), "promoted" (every step passed), else "other" (the
    rollout's reason: a deadline, a readiness timeout)."""
    failed = [a for a in actions if a["status"] == "failed"]
    if r.phase is Phase.FAILED and failed:
        # a promote or rollback that failed for good: the variants stay as that action left them
        a = failed[-1]
        return {"kind": "failed", "action": a["kind"], "text": f"{a['kind']} failed: {first_line(a['error'])}"}
    manual = [e for e in events if e["kind"] == "phase" and e.get("actor")
              and e["phase"] in (Phase.ROLLING_BACK.value, Phase.ROLLED_BACK.value, Phase.PROMOTING.value)]
    decided = last is not None and last.decision == "rollback"
    if failed and not decided:
        a = failed[0]
        what = {"deploy": f"deploy of the {a['body'].get('role', '?')} ({a['body'].get('kernels', '?')})"}.get(
            a["kind"], a["kind"])
        return {"kind": "deploy", "text": f"{what} failed: {first_line(a['error'])}"}
    if manual and not decided:
        e = manual[-1]
        if e["phase"] == Phase.PROMOTING.value:
            return {"kind": "promoted_manually", "text": f"promoted by {e['actor']}"}
        return {"kind": "aborted", "text": f"aborted by {e['actor']}"}
    if decided:
        # the list puts the kind in words before the text ("correctness gate failed: ...", "guard: ..."): no repeat
        if last.source == "correctness":
            return {"kind": "correctness", "text": last.reason.removeprefix(CORRECTNESS_PREFIX)}
        if last.guard:
            return {"kind": "guard", "text": last.reason}
        if last.outcome == "fail" and last.label:
            def f(x):
                return delta(last.kind, x, TYPESET)
            bounds = f" [{f(last.ci_low)}, {f(last.ci_high)}]" if last.ci_low is not None else ""
            # sequential: the lower bound crossed the ship boundary (the smaller one), not the limit
            over = f"ship {f(last.ship)}" if last.sequential and last.ship is not None else f(last.threshold)
            return {"kind": "error_rate" if last.kind == ABS else "latency",
                    "text": f"{last.label} {f(last.delta)}{bounds} > {over}"}
        return {"kind": "inconclusive", "text": last.reason}
    if r.phase is Phase.SUCCEEDED:
        return {"kind": "promoted", "text": "every step passed"}
    return {"kind": "other", "text": r.reason}


def first_line(error: str | None, limit: int = 400) -> str:
    """What a failed action's error says first (the deployer's own summary: an engine's log tail and its log file
    follow on the next lines, for the detail page's outbox), without the exception's class name."""
    line = (error or "").strip().split("\n", 1)[0].strip()
    head, sep, rest = line.partition(": ")
    if sep and head.isidentifier() and head[:1].isupper() and (head.endswith("Error") or head.endswith("Exception")):
        line = rest
    if len(line) > limit:
        line = line[:limit - 1] + "…"
    return line or "no error recorded"


def weights_of(r: Rollout, actions: list[dict] | None = None) -> dict[str, int]:
    """The traffic split as the worker last set it. A FAILED rollout (its promote or rollback failed) left the router
    as it was: the last set_weights action that ran (`actions`, when given), else the step's weight."""
    if r.phase is Phase.FAILED:
        done = [a for a in actions or () if a["kind"] == "set_weights" and a["status"] == "done"]
        if done:
            w = done[-1]["body"].get("weights", {})
            return {role: int(w.get(role, 0)) for role in ("production", "baseline", "canary")}
        if r.weight > 0:
            return weights_for(r.weight)
    if r.phase in (Phase.PROGRESSING, Phase.PAUSED) and r.weight > 0:
        return weights_for(r.weight)
    return {"production": 100, "baseline": 0, "canary": 0}


def rollout_summary(r: Rollout, last_check: Headline | None, allowed: set, ended: dict | None = None,
                    actions: list[dict] | None = None) -> dict:
    """A rollout in the API's list: `last_check` its last check's headline."""
    return nonfinite_to_null({
        "id": r.id, "service": r.service, "kernels": r.canary_kernels, "production_kernels": r.production_kernels,
        "phase": r.phase.value, "active": r.active, "reason": r.reason, "step": r.step, "steps": list(r.policy.steps),
        "weight": r.weight, "weights": weights_of(r, actions), "created_at": r.created_at, "phase_since": r.phase_since,
        "started_at": r.started_at, "checks": r.checks, "awaiting_promotion": r.awaiting_promotion,
        "compare_to": r.policy.compare_to, "last_check": last_check.to_dict() if last_check else None, "ended": ended,
        "allowed_actions": sorted(c.value for c in allowed), "retry_of": r.retry_of})


def variants_of(r: Rollout, spec_replicas: int | None, actions: list[dict] | None = None) -> dict:
    """Each variant's kernels, weight, readiness and requests this step. "removed" after a rollback, "promoted" for a
    promoted canary and "replaced" for the production it replaced (the promotion stopped its engines: the canary's
    kernels serve production's weight now); "stranded" when the rollout FAILED (its promote or rollback failed: the
    variant still runs, as that action left it, and nothing watches it any more)."""
    kernels = {"production": r.production_kernels, "baseline": r.production_kernels, "canary": r.canary_kernels}
    weights = weights_of(r, actions)
    out = {}
    for role in ROLES:
        d = r.data.get(role)
        stranded = r.phase is Phase.FAILED and role != "production"
        if r.phase is Phase.SUCCEEDED and role != "baseline":
            state = "promoted" if role == "canary" else "replaced"
        elif not r.active and role != "production" and not stranded:
            state = "removed"
        else:
            state = "stranded" if stranded else "deployed" if d is not None else "unknown"
        gone = state in ("promoted", "replaced", "removed")
        out[role] = {"kernels": kernels[role], "replicas": spec_replicas, "weight": weights[role],
                     "ready": None if d is None or gone else d.ready,
                     "crashing": None if d is None or gone else d.crashing,
                     "requests": None if d is None else d.requests, "errors": None if d is None else d.errors,
                     "replayed": None if d is None else d.replayed, "state": state}
    return out


def low_traffic_of(r: Rollout) -> dict:
    """Low-traffic mode on the detail page: on or off, its bounds, and what it replayed to the canary (measured by
    the engines; the baseline got as many)."""
    lt = r.policy.low_traffic
    d = r.data.get("canary")
    return {"enabled": lt.enabled, "max_rps": lt.max_rps, "max_requests_per_step": lt.max_requests_per_step,
            "max_requests_per_rollout": lt.max_requests_per_rollout, "allow_replay_only": lt.allow_replay_only,
            "replayed_rollout": r.replayed_requests, "replayed_step": 0.0 if d is None else d.replayed,
            "live_step": 0.0 if d is None else d.live}


def step_timeline(r: Rollout, actions: list[dict], now: float) -> list[dict]:
    """Each policy step with when the canary's weight was set to it (the set_weights actions) and for how long."""
    entered: dict[int, float] = {}
    for a in actions:
        if a["kind"] == "set_weights":
            w = int(a["body"].get("weights", {}).get("canary", 0))
            entered.setdefault(w, a["created_at"])
    end = now if r.active else r.phase_since
    out = []
    for i, w in enumerate(r.policy.steps):
        at = entered.get(w)
        nxt = [entered[x] for x in r.policy.steps[i + 1:] if x in entered]
        left = min(nxt) if nxt else (end if at is not None and i == r.step else None)
        if w == 100 and r.phase is Phase.SUCCEEDED:
            at = at or r.phase_since
        state = "done" if i < r.step or (r.phase is Phase.SUCCEEDED) else ("current" if i == r.step else "todo")
        out.append({"index": i, "weight": w, "state": state, "entered_at": at,
                    "seconds": None if at is None or left is None else max(0.0, left - at)})
    return out


def check_compact(ev: Mapping) -> dict:
    """A check for the table: every result's values and bounds, requests per variant; no bucket counts."""
    v = ev["verdict"]
    variants = {role: {"requests": d.get("requests"), "errors": d.get("errors"), "ready": d.get("ready"),
                       "crashing": d.get("crashing"), "replayed": d.get("replayed", 0)}
                for role, d in ev.get("variants", {}).items()}
    return nonfinite_to_null({"seq": ev["seq"], "at": ev["at"], "step": ev["step"], "weight": ev["weight"],
                  "window_start": ev.get("window_start"), "window_end": ev.get("window_end"),
                  "decision": ev["decision"], "outcome": v["outcome"], "reason": v["reason"], "guard": v.get("guard"),
                  "need_more": v.get("need_more"), "compare_to": v.get("compare_to"), "variants": variants,
                  "source": ev.get("source"),
                  "correctness": correctness_summary(v["correctness"]) if v.get("correctness") else None,
                  "results": [dict(r, label=check_label(r["check"])) for r in v.get("results", [])],
                  # sequential statistics: production against baseline (same kernels), the live A/A
                  "replica": [dict(o, label=check_label(o["check"])) for o in v.get("replica") or []] or None})


# ---- the correctness gate ----------------------------------------------------------------------------------------
MAX_DIVERGENCES = 5                    # the detail payload's first divergences; GET .../checks/<seq> has them all
MAX_HISTORY = 100


def correctness_summary(cv: Mapping) -> dict:
    """A correctness verdict without its per-prompt evidence (a table row, a history line)."""
    return {k: cv.get(k) for k in ("outcome", "reason", "dtype", "prompts", "errors", "diverged", "tokens",
                                   "identical_fraction", "top1_agreement", "drift_mean", "drift_max", "failed",
                                   "requests", "seconds", "positions", "confident_positions", "confident_top1",
                                   "confident_drift_mean", "confident_drift_max", "conformance")}


def correctness_of(store, r: Rollout) -> dict:
    """The detail page's Correctness section: is the gate on, every correctness check (one line each, newest last)
    and the latest verdict with its first MAX_DIVERGENCES diverged prompts. Read from the checks' summary columns
    (no evidence parsed) plus one check's evidence."""
    rows = [c for c in store.check_summaries(r.id, limit=100000) if c["reason"].startswith(CORRECTNESS_PREFIX)]
    latest = None
    if rows:
        ev = store.check(r.id, rows[-1]["seq"])
        cv = ev["verdict"].get("correctness")
        if ev.get("source") == "correctness" and cv is not None:
            evidence = cv.get("evidence") or []
            latest = dict(correctness_summary(cv), seq=ev["seq"], at=ev["at"], step=ev["step"],
                          weight=ev["weight"], decision=ev["decision"], evidence=evidence[:MAX_DIVERGENCES],
                          evidence_total=len(evidence))
    history = [dict(c, reason=c["reason"][len(CORRECTNESS_PREFIX):]) for c in rows[-MAX_HISTORY:]]
    c = r.policy.correctness
    return {"enabled": c.enabled, "compare_tokens": c.compare_tokens, "runs": len(rows),
            "history": history, "latest": latest}


def action_row(a: Mapping) -> dict:
    """One deployer/notifier action of the outbox, with a short description of what it did."""
    b = a["body"]
    what = {"deploy": lambda: f"deploy {b.get('role')} ({b.get('kernels')})",
            "set_weights": lambda: "weights " + ", ".join(f"{k} {v} %" for k, v in b.get("weights", {}).items()),
            "notify": lambda: f"notify: {b.get('event')}"}.get(a["kind"], lambda: a["kind"])()
    return {"id": a["id"], "kind": a["kind"], "what": what, "status": a["status"], "error": a["error"],
            "created_at": a["created_at"], "done_at": a["done_at"]}
