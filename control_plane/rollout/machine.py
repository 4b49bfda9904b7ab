"""The rollout state machine: `reconcile(rollout, observation, now) -> (rollout, actions)`. Pure; never mutates input.

Phases: PENDING -> INITIALIZING (deploy baseline + canary, wait ready) -> PROGRESSING (step i at weight w; windows in
the warm-up after each weight change are dropped; every check_interval one look at the step's accumulated data) ->
PROMOTING -> SUCCEEDED, or ROLLING_BACK -> ROLLED_BACK; PAUSED (manual, too many inconclusive checks, or the manual
promotion gate); FAILED when promote/rollback itself failed. Manual PROMOTE/ABORT/PAUSE/RESUME arrive in the
observation. The worker persists the returned rollout with its `new_checks`/`new_events` and the actions in one
transaction (store.save), runs every action (idempotently, retrying) before the next call, and reports actions that
failed for good in `Observation.failed_actions`; PROMOTING/ROLLING_BACK complete on the call after their action ran.

Correctness gate (Policy.correctness, on by default): when `correctness_due(rollout, now)` the worker replays the
prompt set against canary and baseline and passes the verdict in `Observation.correctness`; each one is recorded as
a check (source "correctness", its evidence in `verdict.correctness`). Before the first traffic step (INITIALIZING,
both variants ready) the gate must PASS for traffic to start; within a step a PASS is needed before the step may
advance or promote; a FAIL rolls back at once (a guard: a wrong answer is never "noise"); INCONCLUSIVE is retried
after check_interval_s. With policy.correctness.interval_s > 0 it is also re-run every interval_s.

Observations carry WINDOW DELTAS, not cumulative counters: the worker takes per-replica deltas between its polls
(HistogramSnapshot.delta handles counter resets), sums replicas (merge), and reports [window_start, window_end].
Windows must not overlap what was already counted (start >= rollout.observed_until; overlapping ones are dropped and
logged) and windows starting inside the warm-up (before rollout.warmup_until) are dropped whole: poll at least every
warmup_s, or (Prometheus) query [max(observed_until, warmup_until), now]. Keys of VariantData.histograms are
promql.series_key(metric, labels), e.g. 'http_request_duration_seconds{route="/v1/completions"}' (5xx excluded).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from sits.control_plane.analysis import CorrectnessVerdict, Guard, Outcome, VariantData, Verdict, assess
from sits.control_plane.analysis.sequential import observe
from sits.control_plane.rollout.state import (ROLES, Action, Check, Command, Decision, Deploy, Event, EventKind, Notify,
                                         Observation, Phase, Promote, Rollback, Rollout, SetWeights, weights_for)
from sits.control_plane.rollout.builder import Builder as _Builder, accumulate as _accumulate

__all__ = ["ROLES", "Action", "Check", "Command", "Decision", "Deploy", "Event", "EventKind", "Notify", "Observation",
           "Phase", "Promote", "Rollback", "Rollout", "SetWeights", "allowed_commands", "correctness_due", "reconcile",
           "weights_for"]

_EPS = 1e-6

# the stored reason of every correctness check starts so (the UI strips it where it says "correctness gate")
CORRECTNESS_PREFIX = "correctness: "


def correctness_due(rollout: Rollout, now: float) -> bool:
    """Should the worker replay the correctness prompt set in this pass? (INITIALIZING: once both variants are
    ready, which the worker checks.) Due when the current step (step 0 before traffic) has no PASS yet -- retried
    after check_interval_s -- or, with correctness.interval_s > 0, when that long has passed since the last run."""
    c, r = rollout.policy.correctness, rollout
    if not c.enabled or r.phase not in (Phase.INITIALIZING, Phase.PROGRESSING):
        return False
    since = None if r.correctness_at is None else now - r.correctness_at
    if r.correctness_step != max(r.step, 0):
        return since is None or since >= r.policy.check_interval_s - _EPS
    return c.interval_s > 0 and since is not None and since >= c.interval_s - _EPS


def reconcile(rollout: Rollout, observation: Observation | None, now: float) -> tuple[Rollout, list[Action]]:
    """Advance `rollout` by one call. Checks (in order): failed actions, a manual command, then the phase's rule."""
    obs = observation or Observation()
    b = _Builder(rollout, float(now))
    if b.r.phase.terminal:
        if obs.command is not None:
            b.actor = obs.command_by
            b.event(EventKind.COMMAND, f"{obs.command.value} ignored: rollout already {b.r.phase.value}")
        return b.done()
    if obs.failed_actions and _on_failed_actions(b, obs):
        return b.done()
    if obs.command is not None:
        b.actor = obs.command_by
        applied = _on_command(b, obs)
        b.actor = ""
        if applied:
            return b.done()
    handler = {Phase.PENDING: _pending, Phase.INITIALIZING: _initializing, Phase.PROGRESSING: _progressing,
               Phase.PAUSED: _paused, Phase.PROMOTING: _promoting, Phase.ROLLING_BACK: _rolling_back}[b.r.phase]
    handler(b, obs)
    return b.done()


def allowed_commands(rollout: Rollout) -> set[Command]:
    """The manual commands that change the rollout in its current phase (what a UI enables); reconcile ignores the
    others (with an event)."""
    phase = rollout.phase
    if phase is Phase.PENDING:
        return {Command.ABORT}
    if phase is Phase.INITIALIZING:
        return {Command.ABORT, Command.PAUSE}
    if phase is Phase.PROGRESSING:
        return {Command.ABORT, Command.PAUSE, Command.PROMOTE}
    if phase is Phase.PAUSED:
        return {Command.ABORT, Command.PROMOTE} | (set() if rollout.awaiting_promotion else {Command.RESUME})
    return set()   # PROMOTING / ROLLING_BACK finish on their own; terminal phases take nothing


def _on_failed_actions(b: _Builder, obs: Observation) -> bool:
    failed = ", ".join(obs.failed_actions)
    why = f": {obs.failure}" if obs.failure else ""
    if b.r.phase in (Phase.PROMOTING, Phase.ROLLING_BACK):
        b.go(Phase.FAILED, f"{failed} failed during {b.r.phase.value}{why}; needs an operator", "failed")
        return True
    if b.r.phase in (Phase.INITIALIZING, Phase.PROGRESSING, Phase.PAUSED):
        b.go(Phase.ROLLING_BACK, f"{failed} failed{why}", "rolling_back")
        return True
    return False


def _on_command(b: _Builder, obs: Observation) -> bool:
    cmd, who, phase = obs.command, f" by {obs.command_by}" if obs.command_by else "", b.r.phase
    if cmd is Command.ABORT:
        if phase is Phase.PENDING:
            b.go(Phase.ROLLED_BACK, f"aborted{who} before anything was deployed", "rolled_back")
        elif phase in (Phase.PROMOTING, Phase.ROLLING_BACK):
            b.event(EventKind.COMMAND, f"abort{who} ignored while {phase.value}")
            return False
        else:
            b.go(Phase.ROLLING_BACK, f"aborted{who}", "rolling_back")
        return True
    if cmd is Command.PROMOTE and phase in (Phase.PROGRESSING, Phase.PAUSED):
        b.set(awaiting_promotion=False)
        _leave_pause(b)
        b.go(Phase.PROMOTING, f"promoted manually{who} at {b.r.weight} %", "promoting")
        return True
    if cmd is Command.PAUSE and phase in (Phase.INITIALIZING, Phase.PROGRESSING):
        b.set(paused_from=phase)
        b.go(Phase.PAUSED, f"paused{who}", "paused")
        return True
    if cmd is Command.RESUME and phase is Phase.PAUSED and not b.r.awaiting_promotion:
        back = b.r.paused_from or Phase.PROGRESSING
        _leave_pause(b)
        # data seen while paused is dropped; the step's earlier data is kept (same weight, same comparison)
        b.set(paused_from=None, consecutive_inconclusive=0, last_check_at=b.now,
              warmup_until=max(b.r.warmup_until, b.now), sequence=b.r.sequence.without_pending())
        b.go(back, f"resumed{who}", "resumed")
        return True
    b.event(EventKind.COMMAND, f"{cmd.value}{who} ignored in phase {phase.value}"
            + (" (awaiting promotion: use promote or abort)" if b.r.awaiting_promotion else ""))
    return False


def _leave_pause(b: _Builder) -> None:
    if b.r.phase is Phase.PAUSED and b.r.started_at is not None:
        b.set(paused_total_s=b.r.paused_total_s + (b.now - b.r.phase_since))


def _pending(b: _Builder, obs: Observation) -> None:
    b.actions += [Deploy("baseline", b.r.production_kernels), Deploy("canary", b.r.canary_kernels)]
    b.go(Phase.INITIALIZING, f"deploying canary {b.r.canary_kernels} and baseline {b.r.production_kernels}",
         "started")


def _correctness_check(b: _Builder, cv: CorrectnessVerdict) -> bool:
    """Record a correctness verdict as a check; True when it rolled the rollout back."""
    r = b.r
    seq = r.checks + 1
    decision = {Outcome.PASS: Decision.PASS, Outcome.FAIL: Decision.ROLLBACK,
                Outcome.INCONCLUSIVE: Decision.HOLD}[cv.outcome]
    verdict = Verdict(cv.outcome, CORRECTNESS_PREFIX + cv.reason, r.policy.compare_to,
                      guard=Guard.CORRECTNESS if cv.outcome is Outcome.FAIL else None, correctness=cv)
    b.checks.append(Check(seq, b.now, r.step, r.weight, None, None, "correctness", {}, {}, verdict, decision))
    b.set(checks=seq, correctness_at=b.now)
    if cv.outcome is Outcome.PASS:
        b.set(correctness_step=max(r.step, 0))
    where = "before traffic" if r.step < 0 else f"at {r.weight} %"
    b.event(EventKind.CHECK, f"correctness check {seq} {where}: {cv.outcome.value} -> {decision.value}: "
            f"{cv.reason}")
    if cv.outcome is Outcome.FAIL:
        b.go(Phase.ROLLING_BACK, f"correctness gate (check {seq}): {cv.reason}", "rolling_back")
        return True
    return False


def _initializing(b: _Builder, obs: Observation) -> None:
    canary, baseline = obs.variants.get("canary"), obs.variants.get("baseline")
    gated = b.r.policy.correctness.enabled
    if canary is not None and canary.crashing:
        b.go(Phase.ROLLING_BACK, "canary is crashing during start-up", "rolling_back")
    elif gated and canary is not None and baseline is not None and canary.ready and baseline.ready \
            and b.r.correctness_step != 0:
        # traffic starts only once the canary gives the baseline's answers
        if obs.correctness is not None and _correctness_check(b, obs.correctness):
            return
        if b.r.correctness_step == 0:
            _start_traffic(b, obs, "canary and baseline ready, correctness gate passed")
        elif b.now - b.r.phase_since > b.r.policy.ready_timeout_s:
            b.go(Phase.ROLLING_BACK, f"no passing correctness verdict within {b.r.policy.ready_timeout_s:g} s",
                 "rolling_back")
    elif canary is not None and baseline is not None and canary.ready and baseline.ready:
        _start_traffic(b, obs, "canary and baseline ready")
    elif b.now - b.r.phase_since > b.r.policy.ready_timeout_s:
        b.go(Phase.ROLLING_BACK, f"not ready after {b.r.policy.ready_timeout_s:g} s{_not_ready_why(obs)}",
             "rolling_back")


def _not_ready_why(obs: Observation, limit: int = 300) -> str:
    """": canary: <the deployer's status message>; baseline: ..." for those of the two that are not ready, each on
    one line of at most `limit` characters (the middle cut: the counts lead and the engine's last log line ends)."""
    parts = []
    for role in ("canary", "baseline"):
        v = obs.variants.get(role)
        if v is None:
            parts.append(f"{role}: not reported by the deployer")
        elif not v.ready:
            msg = " ".join(obs.status_messages.get(role, "").split()) or "not ready"
            if len(msg) > limit:
                head = (limit - 3) // 2
                msg = f"{msg[:head]} … {msg[len(msg) - (limit - 3 - head):]}"
            parts.append(f"{role}: {msg}")
    return ": " + "; ".join(parts) if parts else ""


def _start_traffic(b: _Builder, obs: Observation, reason: str) -> None:
    # the data cursor starts now at the latest: sources that query [observed_until, now] need a start
    b.set(started_at=b.now, observed_until=obs.window_end if obs.window_end is not None else b.now)
    b.go(Phase.PROGRESSING, reason)
    b.start_step(0, "first step")


def _take_window(b: _Builder, obs: Observation) -> None:
    """Add the observation's window to the step's data unless it overlaps one already counted or the warm-up."""
    if obs.source:
        b.set(source=obs.source, queries=dict(obs.queries) or b.r.queries)
    for err in obs.errors:
        b.event(EventKind.METRICS, f"metrics source: {err}")
    start, end = obs.window_start, obs.window_end
    if start is None and end is not None and b.r.observed_until is None:
        b.set(observed_until=end)   # a source's first poll: nothing to diff yet, but the cursor starts here
    if start is None or end is None or end <= start:
        return
    r = b.r
    if r.observed_until is not None and start < r.observed_until - _EPS:
        b.event(EventKind.WINDOW, f"window [{start:.3f}, {end:.3f}] overlaps data already counted (until "
                f"{r.observed_until:.3f}); dropped")
        return
    b.set(observed_until=end)
    c = obs.variants.get("canary")
    if c is not None and c.replayed:   # the rollout's replay budget counts every replayed request, warm-up included
        b.set(replayed_requests=r.replayed_requests + c.replayed)
    if start < r.warmup_until - _EPS or r.phase is not Phase.PROGRESSING:
        b.set(excluded_requests=r.excluded_requests + (c.requests if c else 0.0))
        return
    has = {role: _has_data(obs.variants.get(role)) for role in ("canary", r.policy.compare_to)}
    if len(set(has.values())) > 1:   # the comparison is concurrent: a window with one side missing is not used
        missing = next(role for role, ok in has.items() if not ok)
        b.event(EventKind.WINDOW, f"window [{start:.3f}, {end:.3f}] has no data from {missing}; dropped")
        return
    b.set(data=_accumulate(r.data, obs.variants), data_since=r.data_since if r.data_since is not None else start)
    if r.policy.statistics == "sequential":
        b.set(sequence=observe(r.sequence, obs.variants, r.policy, start, end))


def _has_data(v: VariantData | None) -> bool:
    return v is not None and (v.requests > 0 or any(h.total > 0 for h in v.histograms.values()))


def _with_readiness(data: Mapping[str, VariantData], obs: Observation) -> dict[str, VariantData]:
    out = dict(data)
    for role, v in obs.variants.items():
        if role in out:
            d = out[role]
            out[role] = VariantData(d.histograms, d.requests, d.errors, v.ready, v.crashing, d.replayed, d.streamed)
        else:
            out[role] = VariantData(ready=v.ready, crashing=v.crashing)
    return out


def _progressing(b: _Builder, obs: Observation) -> None:
    p = b.r.policy
    _take_window(b, obs)
    if b.r.started_at is not None and b.now - b.r.started_at - b.r.paused_total_s > p.max_duration_s \
            and _deadline(b, assess(b.r.data, p, b.r.sequence).reason):
        return
    if obs.correctness is not None and _correctness_check(b, obs.correctness):
        return
    canary = obs.variants.get("canary")
    # one slow or failed readiness probe is not a failure (a burst of large requests can hold /readyz for seconds):
    # the guard fires once the canary has been not ready on every observation for not_ready_grace_s
    down = canary is not None and not canary.ready and not canary.crashing
    since = (b.r.not_ready_since if b.r.not_ready_since is not None else b.now) if down else None
    if since != b.r.not_ready_since:
        b.set(not_ready_since=since)
    sustained = since is not None and b.now - since >= p.not_ready_grace_s - _EPS
    guard_now = canary is not None and (canary.crashing or sustained)
    if not guard_now and b.now < b.r.last_check_at + p.check_interval_s - _EPS:
        return
    data = _with_readiness(b.r.data, obs)
    if down and not sustained:   # within the grace period: judged on its metrics, not on one probe
        data["canary"] = dataclasses.replace(data["canary"], ready=True)
    verdict = assess(data, p, b.r.sequence)
    if verdict.guard is Guard.NOT_READY:
        verdict = dataclasses.replace(verdict, reason=f"canary not ready for {b.now - since:.0f} s (grace "
                                      f"{p.not_ready_grace_s:g} s){_not_ready_why(obs)}")
    r = b.r
    decision = Decision.HOLD
    seq = r.checks + 1
    waiting_gate = p.correctness.enabled and r.correctness_step != r.step
    if verdict.outcome is Outcome.PASS:
        b.set(consecutive_failures=0, consecutive_inconclusive=0)
        nxt = r.step + 1
        if waiting_gate:
            decision = Decision.HOLD   # latency passed; the step's correctness gate has not (yet)
        elif nxt < len(p.steps) and p.steps[nxt] < 100:
            decision = Decision.ADVANCE
        else:
            decision = Decision.PROMOTE if p.auto_promote else Decision.GATE
    elif verdict.outcome is Outcome.FAIL:
        fails = r.consecutive_failures + 1
        b.set(consecutive_failures=fails, consecutive_inconclusive=0)
        # sequential: a FAIL is the sequence leaving a boundary, final at any look (no count of failures)
        if verdict.guard or fails >= p.failure_limit or p.statistics == "sequential":
            decision = Decision.ROLLBACK
    else:
        incs = r.consecutive_inconclusive + 1
        b.set(consecutive_failures=0, consecutive_inconclusive=incs)
        # sequential: an inconclusive look only waits (the boundaries' gap bounds the time; max_duration_s the rest)
        if incs >= p.inconclusive_limit and p.statistics == "fixed":
            decision = Decision.PAUSE if p.on_inconclusive == "pause" else Decision.ROLLBACK
    b.checks.append(Check(seq, b.now, r.step, r.weight, r.data_since, r.observed_until, r.source, dict(r.queries),
                          data, verdict, decision))
    b.set(checks=seq, step_checks=r.step_checks + 1, last_check_at=b.now)
    b.event(EventKind.CHECK, f"check {seq} at {r.weight} %: {verdict.outcome.value} -> {decision.value}: "
            f"{verdict.reason}" + ("; waiting for this step's correctness gate"
                                   if waiting_gate and verdict.outcome is Outcome.PASS else ""))
    if decision is Decision.ADVANCE:
        b.start_step(r.step + 1, f"check {seq} passed")
    elif decision is Decision.PROMOTE:
        b.go(Phase.PROMOTING, f"every step passed (check {seq})", "promoting")
    elif decision is Decision.GATE:
        b.set(awaiting_promotion=True, paused_from=Phase.PROGRESSING)
        b.go(Phase.PAUSED, f"every step passed (check {seq}); awaiting manual promotion", "paused")
    elif decision is Decision.ROLLBACK:
        why = (f"guard: {verdict.reason}" if verdict.guard else
               f"check {seq}: {verdict.reason}" if verdict.outcome is Outcome.FAIL and p.statistics == "sequential"
               else f"{b.r.consecutive_failures} failed check(s): {verdict.reason}" if verdict.outcome is Outcome.FAIL
               else f"{b.r.consecutive_inconclusive} inconclusive checks: {verdict.reason}")
        b.go(Phase.ROLLING_BACK, why, "rolling_back")
    elif decision is Decision.PAUSE:
        b.set(paused_from=Phase.PROGRESSING)
        b.go(Phase.PAUSED, f"{b.r.consecutive_inconclusive} inconclusive checks: {verdict.reason}", "paused")


def _deadline(b: _Builder, last: str) -> bool:
    """max_duration_s has passed (paused time excluded): policy.on_max_duration says what follows, and the reason
    carries the last check's evidence (why nothing decided). True when the rollout left PROGRESSING."""
    p = b.r.policy
    why = f"max duration {p.max_duration_s:g} s reached undecided ({last})"
    if p.on_max_duration == "rollback":
        b.go(Phase.ROLLING_BACK, why, "rolling_back")
        return True
    if p.on_max_duration == "pause":
        b.set(paused_from=Phase.PROGRESSING)
        b.go(Phase.PAUSED, why + "; waiting for an operator to promote or abort", "paused")
        return True
    if not b.r.deadline_hit:   # hold: keep checking at this weight; said once
        b.set(deadline_hit=True)
        b.event(EventKind.PHASE, why + "; holding at the current weight (on_max_duration: hold)")
    return False


def _paused(b: _Builder, obs: Observation) -> None:
    _take_window(b, obs)  # advances observed_until; the data is not analysed


def _promoting(b: _Builder, obs: Observation) -> None:
    b.go(Phase.SUCCEEDED, f"canary {b.r.canary_kernels} is production", "promoted")


def _rolling_back(b: _Builder, obs: Observation) -> None:
    b.go(Phase.ROLLED_BACK, f"production {b.r.production_kernels} restored ({b.r.reason})", "rolled_back")
