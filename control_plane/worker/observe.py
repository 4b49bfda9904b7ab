"""What one pass of the worker observes (control_plane/worker/loop.py): readiness from the deployer, the metrics
window since the rollout's `observed_until` (a MetricsError makes it "no data": inconclusive, never a pass), the
failed actions of the last pass, the queued command, each engine (for the detail page: Observer.engines), and, when
it is due and canary and baseline are ready, the correctness gate's replay (adapters/inference/correctness.py),
stopped between prompts by a queued abort."""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from sits.control_plane.adapters.inference.correctness import (CorrectnessProbe, GateRun, PromptSetError,
                                                               ReplayInterrupted)
from sits.control_plane.adapters.deploy import Deployer
from sits.control_plane.adapters.metrics import MetricsError, MetricsSource, Target
from sits.control_plane.analysis import CorrectnessVerdict, Outcome, VariantData
from sits.control_plane.rollout import Command, Observation, Phase, Rollout, correctness_due
from sits.control_plane.store.db import Store
from sits.wire.tracing import Tracing, set_attributes

log = logging.getLogger("sits.control_plane.worker.loop")
_OBSERVED = (Phase.INITIALIZING, Phase.PROGRESSING, Phase.PAUSED)
ENGINES_EVERY_S = 2.0   # how often a rollout's engines are listed (each may cost a log read per pod)


class Observer:
    """`observe(rollout, now, command)` -> Observation; `correctness(rollout, observation, now)` -> (observation
    with the gate's verdict, interrupted)."""

    def __init__(self, store: Store, deployer: Deployer, source: MetricsSource, probe: CorrectnessProbe,
                 tracing: Tracing, *, abort_pending: Callable[[str], bool]) -> None:
        self.store, self.deployer, self.source, self.probe, self.tracing = store, deployer, source, probe, tracing
        self.abort_pending = abort_pending
        self._engines_at: dict[str, float] = {}   # rollout id -> when its engines were last listed

    def engines(self, r: Rollout, now: float) -> None:
        """The deployer's replicas() of the rollout's service into the store (store.engines), while its variants are
        deployed, at most every ENGINES_EVERY_S. Never fails the pass: the list is for people, not decisions."""
        if r.phase not in _OBSERVED:
            self._engines_at.pop(r.id, None)
            return
        if now - self._engines_at.get(r.id, float("-inf")) < ENGINES_EVERY_S:
            return
        self._engines_at[r.id] = now
        try:
            self.store.engines.put(r.id, [e.to_dict() for e in self.deployer.replicas(r.service)], now)
        except Exception as e:
            log.warning("rollout %s (%s): engines not listed: %s: %s", r.id, r.service, type(e).__name__, e)

    def observe(self, r: Rollout, now: float, command: tuple[int, Command, str] | None) -> Observation:
        failures = self.store.failures(r.id, r.version)
        failed = tuple(kind for kind, _ in failures)
        why = next((err.strip().splitlines()[0][:400] for _, err in failures if err.strip()), "")
        # the failed actions, why the first failed, and the queued command: in every observation of this pass
        cmd = dict(failed_actions=failed, failure=why,
                   **(dict(command=command[1], command_by=command[2]) if command else {}))
        errors: list[str] = []
        try:
            status = self.deployer.status(r.service) if r.phase in _OBSERVED else {}
        except Exception as e:
            status, errors = {}, [f"deployer status: {type(e).__name__}: {e}"]
        # ready: every replica up before traffic starts (INITIALIZING); afterwards "serving" (a replica count that is
        # catching up with a weight change, e.g. Kubernetes replica-ratio traffic, is not a canary failure)
        variants = {role: VariantData(ready=st.ready or (r.phase is not Phase.INITIALIZING and st.ready_replicas > 0),
                                      crashing=st.crashing and not st.ready) for role, st in status.items()}
        messages = {role: st.message for role, st in status.items()}   # why a variant is not ready, in its words
        if not errors and r.phase in (Phase.PROGRESSING, Phase.PAUSED):
            for role in ("canary", "baseline"):   # gone (e.g. local variants died with a previous worker)
                variants.setdefault(role, VariantData(ready=False))
        if not status:
            return Observation(variants=variants, errors=tuple(errors), status_messages=messages, **cmd)
        targets = {role: Target(role, st.endpoints or ((st.endpoint,) if st.endpoint else ()), st.ready)
                   for role, st in status.items()}
        required = ("canary", r.policy.compare_to) if r.phase is Phase.PROGRESSING else ()
        try:
            w = self.source.window(r.service, targets, r.observed_until, now, r.policy.metrics, required)
        except MetricsError as e:
            errors.append(f"{self.source.name}: {e}")
            return Observation(variants=variants, source=self.source.name, errors=tuple(errors),
                               status_messages=messages, **cmd)
        for role, v in w.variants.items():
            if role in variants:
                variants[role] = dataclasses.replace(v, ready=variants[role].ready, crashing=variants[role].crashing)
        return Observation(w.start, w.end, variants, w.source, dict(w.queries), tuple(errors),
                           status_messages=messages, **cmd)

    def correctness(self, r: Rollout, obs: Observation, now: float) -> tuple[Observation, bool]:
        """The gate's replay when it is due and canary and baseline are both ready; its verdict joins the
        observation. A replay that cannot run (no endpoint, unreadable prompt set) is INCONCLUSIVE, never a pass.
        Not run when the pass carries an abort; stopped between prompts when an abort is queued meanwhile (then
        (obs without a verdict, True))."""
        c, b = obs.variants.get("canary"), obs.variants.get("baseline")
        if not correctness_due(r, now) or c is None or b is None or not (c.ready and b.ready) \
                or obs.command is Command.ABORT:
            return obs, False
        policy = r.policy.correctness
        named = policy.prompt_set if isinstance(policy.prompt_set, str) else "inline"
        with self.tracing.span("sits.correctness", attributes={"sits.service": r.service,
                                                               "sits.prompt_set": named}) as span:
            try:
                status = self.deployer.status(r.service)
                urls = {role: (status[role].endpoints or (status[role].endpoint,))[0]
                        for role in ("canary", "baseline")}
                if not all(urls.values()):
                    raise KeyError("no endpoint")
                run = self.probe.run(urls["canary"], urls["baseline"], policy,
                                           interrupted=lambda: self.abort_pending(r.id))
            except ReplayInterrupted as e:
                log.info("rollout %s (%s): %s", r.id, r.service, e)
                set_attributes(span, {"sits.correctness.verdict": "interrupted"})
                return obs, True
            except PromptSetError as e:
                run = GateRun(CorrectnessVerdict(Outcome.INCONCLUSIVE, str(e)), 0, 0, 0.0)
            except Exception as e:   # the deployer or the replay failed: no verdict is not a pass
                run = GateRun(CorrectnessVerdict(Outcome.INCONCLUSIVE, f"replay failed: {type(e).__name__}: {e}"),
                              0, 0, 0.0)
            set_attributes(span, {"sits.correctness.verdict": run.verdict.outcome.value,
                                  "sits.correctness.reason": run.verdict.reason[:500],
                                  "sits.correctness.requests": run.requests})
        v = dataclasses.replace(run.verdict, requests=run.requests, seconds=round(run.seconds, 3))
        log.info("rollout %s (%s): correctness gate %s in %.1f s (%d requests): %s", r.id, r.service,
                 v.outcome.value, run.seconds, run.requests, v.reason)
        return dataclasses.replace(obs, correctness=v), False
