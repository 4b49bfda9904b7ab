"""What one `reconcile` call (control_plane/rollout/machine.py) builds up: a mutable shadow of the rollout with the actions,
checks and events it causes (`Builder`), and the step's accumulated data (`accumulate`)."""
from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace
from typing import Mapping

from sits.control_plane.analysis import VariantData
from sits.control_plane.rollout.state import (Action, Check, Event, EventKind, Notify, Phase, Promote, Rollback, Rollout,
                                         SetWeights, weights_for)


def accumulate(acc: Mapping[str, VariantData], window: Mapping[str, VariantData]) -> dict[str, VariantData]:
    out = dict(acc)
    for role, w in window.items():
        old = out.get(role)
        if old is None:
            out[role] = w
            continue
        hists = dict(old.histograms)
        for key, h in w.histograms.items():
            hists[key] = hists[key].merge(h) if key in hists else h
        out[role] = VariantData(hists, old.requests + w.requests, old.errors + w.errors, w.ready, w.crashing,
                                old.replayed + w.replayed, old.streamed + w.streamed)
    return out


class Builder:
    """Collects the changes, actions and records of one reconcile call."""

    def __init__(self, rollout: Rollout, now: float):
        # a mutable shadow of the rollout's fields; one frozen Rollout is built at the end (replace() is slow)
        self.r = SimpleNamespace(**{f.name: getattr(rollout, f.name) for f in fields(Rollout)})
        self.now = now
        self.actions: list[Action] = []
        self.checks: list[Check] = []
        self.events: list[Event] = []
        self.actor = ""   # while a command is applied: its actor, recorded on the events it causes

    def set(self, **changes) -> None:
        for k, v in changes.items():
            setattr(self.r, k, v)

    def event(self, kind: EventKind, message: str) -> None:
        self.events.append(Event(self.now, kind, message, self.r.phase, self.actor))

    def go(self, phase: Phase, reason: str, notify: str | None = None) -> None:
        old = self.r.phase
        self.set(phase=phase, phase_since=self.now, reason=reason)
        self.event(EventKind.PHASE, f"{old.value} -> {phase.value}: {reason}")
        if notify:
            self.actions.append(Notify(notify, f"{self.r.service}: {reason}"))
        if phase is Phase.ROLLING_BACK:
            self.actions.append(Rollback())
        elif phase is Phase.PROMOTING:
            self.actions.append(Promote())

    def start_step(self, index: int, reason: str) -> None:
        weight = self.r.policy.steps[index]
        p = self.r.policy
        self.set(step=index, weight=weight, warmup_until=self.now + p.warmup_s, last_check_at=self.now,
                 step_checks=0, consecutive_failures=0, consecutive_inconclusive=0, data={}, data_since=None,
                 excluded_requests=0.0, sequence=self.r.sequence.without_pending())
        self.actions.append(SetWeights(weights_for(weight)))
        self.actions.append(Notify("step", f"{self.r.service}: canary at {weight} % ({reason})"))
        self.event(EventKind.PHASE, f"step {index + 1}/{len(p.steps)}: canary at {weight} % ({reason})")

    def done(self) -> tuple[Rollout, list[Action]]:
        self.set(new_checks=tuple(self.checks), new_events=tuple(self.events))
        return Rollout(**vars(self.r)), self.actions
