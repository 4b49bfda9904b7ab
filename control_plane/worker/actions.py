"""The worker's outbox side: the actions a pass stored (Store.save) run through the deployer and the notifier, each
retried with backoff under the rollout's lease and then marked done or failed; every deployer call is one span; and
the restore of variants a previous control plane deployed and took with it.
`ActionRunner` is composed into `Worker` (control_plane/worker/loop.py): it gets everything it uses in __init__ (the
store, deployer, notifier, tracing, metrics, config and clock, and three callables of the worker's: take or renew a
lease, report a step to the step hook, tell whether an abort is queued) plus the worker's stop event."""
from __future__ import annotations

import contextvars
import dataclasses
import logging
import threading
from typing import Callable

from sits.control_plane.adapters.deploy import (DeployCancelled, Deployer, DeployInterrupted, DeployNotFoundError,
                                                NotReadyError)
from sits.control_plane.adapters.notify import Notification, Notifier
from sits.control_plane.redact import redact
from sits.control_plane.rollout import (ROLES, Action, Deploy, Event, EventKind, Notify, Phase, Promote, Rollback, Rollout,
                                   SetWeights, weights_for)
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import StoreUnavailableError
from sits.control_plane.worker.config import WorkerConfig, WorkerMetrics
from sits.wire.tracing import Tracing, set_attributes

log = logging.getLogger("sits.control_plane.worker")
# the variants a rollout in this phase has deployed (or is deploying): restored when a restart finds them gone
_EXPECTED = {Phase.INITIALIZING: ROLES, Phase.PROGRESSING: ROLES, Phase.PAUSED: ROLES,
             Phase.PROMOTING: ("production", "canary"), Phase.ROLLING_BACK: ("production",)}


_ABORTABLE = (Deploy, SetWeights)   # what a pending abort supersedes (a rollback, a promote or a notification runs)


class NoProductionError(Exception):
    """A rollback found no production and none ever ran for the service (it never got ready): nothing can be
    restored, and the rollout must not say production was; an operator has to act."""


class LeaseLostError(Exception):
    """Another worker took the rollout's lease during this pass (this one stalled past lease_ttl_s)."""


class ActionRunner:
    """`run(rollout, pending)` executes a pass's outbox; `restore(rollout)` once per rollout and worker start
    (`restored`: the ids done)."""

    def __init__(self, store: Store, deployer: Deployer, notifier: Notifier, *, tracing: Tracing,
                 metrics: WorkerMetrics, config: WorkerConfig, clock: Callable[[], float],
                 lease: Callable[[str, float], bool], step: Callable[[str], None],
                 abort_pending: Callable[[str], bool], stopping: threading.Event) -> None:
        self.store, self.deployer, self.notifier = store, deployer, notifier
        self.tracing, self.metrics, self.config, self.clock = tracing, metrics, config, clock
        self._lease, self._at, self.abort_pending, self._stop = lease, step, abort_pending, stopping
        self.restored: set[str] = set()   # rollouts whose variants this worker has checked since it started

    # ---- actions -------------------------------------------------------------------------------------------------
    def restore(self, r: Rollout) -> Rollout:
        """First pass of this worker over the rollout: variants its phase has deployed but the deployer does not know
        (local processes died with a previous worker) are deployed again, as they were, with the traffic split of the
        current step; the event is stored before anything is deployed, and windows of the next warm-up are dropped.
        Killed while restoring, the next worker restores again (every deploy is idempotent)."""
        want = _EXPECTED.get(r.phase, ())
        status = self.deployer.status(r.service) if want else {}
        missing = [role for role in want if role not in status]
        if missing and r.active and self.abort_pending(r.id):
            # the abort applies in this pass: no restore first (it may take ready_timeout_s, or never succeed)
            log.warning("rollout %s (%s): %s not deployed; not restored, an abort is pending", r.id, r.service,
                        ", ".join(missing))
            missing = []
        if missing:
            now = self.clock()
            msg = (f"restart: {', '.join(missing)} not deployed (gone with a previous control plane); deploying "
                   f"{'them' if len(missing) > 1 else 'it'} again at weight {r.weight} %")
            log.warning("rollout %s (%s): %s", r.id, r.service, msg)
            r = self.store.save(dataclasses.replace(
                r, warmup_until=max(r.warmup_until, now + r.policy.warmup_s) if r.step >= 0 else r.warmup_until,
                new_events=(Event(now, EventKind.PHASE, msg, r.phase),)))
            spec = self.store.spec(r.id)
            kernels = {"production": r.production_kernels, "baseline": r.production_kernels,
                       "canary": r.canary_kernels}
            if "production" in missing:
                self._deploy(variant(r, spec, "production", r.production_kernels))
            others = [role for role in missing if role != "production"]
            # re-raised: the pass fails and the next one restores again
            in_parallel(lambda role: self._deploy(variant(r, spec, role, kernels[role])),
                         [(role,) for role in others])
            if r.step >= 0 and r.phase in (Phase.PROGRESSING, Phase.PAUSED):
                self._set_weights(r.service, weights_for(r.weight))
            self._at("restored")
        self.restored.add(r.id)
        return r

    def restore_idle(self) -> list[str]:
        """Once per worker start: every service with no active rollout whose production a previous control plane ran
        (its router is recorded) and the deployer does not know now (local engines died with it) gets production
        back as its last rollout left it -- the promoted canary's kernels and args after a success, production's
        otherwise -- all traffic on it, its router recorded again. Returns the services restored; a service whose
        deploy fails is logged and left (its next rollout deploys production first)."""
        active = {service for _, service in self.store.active_ids()}
        restored = []
        for service in sorted(set(self.store.services.routers()) - active):
            if self._stop.is_set():
                break
            last = self.store.list_summaries(service=service, limit=1)
            if not last or "production" in self.deployer.status(service):
                continue
            r = last[0]
            spec = self.store.spec(r.id)
            if r.phase is Phase.SUCCEEDED:   # the canary was promoted: production is what the canary ran
                want = dataclasses.replace(variant(r, spec, "canary", r.canary_kernels), role="production")
            else:
                want = variant(r, spec, "production", r.production_kernels)
            log.warning("service %s: idle (last rollout %s %s) and production is not deployed (gone with a previous "
                        "control plane); deploying production %s again", service, r.id, r.phase.value, want.kernels)
            try:
                self._deploy(want)
                self._set_weights(service, {"production": 100})
                router = self.deployer.router_url(service)
                if router and self.store.services.routers().get(service) != router:
                    self.store.services.set_router(service, router)
            except Exception as e:
                log.warning("service %s: production not restored: %s", service,
                            first_line(redact(f"{type(e).__name__}: {e}")))
                continue
            restored.append(service)
        return restored

    def run(self, r: Rollout, pending: list[tuple[int, Action]]) -> None:
        spec = self.store.spec(r.id)
        i = 0
        while i < len(pending):
            group = [pending[i]]
            while isinstance(group[0][1], Deploy) and i + len(group) < len(pending) \
                    and isinstance(pending[i + len(group)][1], Deploy):
                group.append(pending[i + len(group)])
            parallel = len(group) > 1
            if parallel:   # variants start in parallel (production first if the service has none)
                try:
                    self._ensure_production(r, spec)
                except (NotReadyError, DeployInterrupted) as e:   # each action would wait for production again
                    for action_id, action in group:
                        self._finish(r, action_id, action, e)
                    i += len(group)
                    continue
                except Exception as e:   # e.g. RBAC forbids it: one at a time, so each action retries and records it
                    log.warning("rollout %s: production could not be deployed (%s): the deploy actions run one at a "
                                "time", r.id, first_line(redact(f"{type(e).__name__}: {e}")))
                    parallel = False
            if parallel:
                # re-raised in this thread (a simulated crash must stop the pass)
                in_parallel(lambda aid, a: self._run_one(r, spec, aid, a), group)
            else:
                self._run_one(r, spec, *group[0])
            i += len(group)

    def _run_one(self, r: Rollout, spec: DeploySpec, action_id: int, action: Action) -> None:
        c, last = self.config, ""
        for attempt in range(c.action_retries + 1):
            if isinstance(action, _ABORTABLE) and self.abort_pending(r.id):
                # traffic moves and deploys wait for no retry with an abort queued: the next pass applies the abort
                # (rolls back). Not run at all, the action is superseded; after a failure, it failed for good
                if not attempt:
                    self._finish(r, action_id, action, DeployInterrupted("not run: an abort is pending"))
                    return
                last = f"{last}; not retried: an abort is pending"
                log.warning("rollout %s: %s %s", r.id, action.kind, first_line(last))
                break
            if attempt:
                self._stop.wait(c.action_backoff_s * 2 ** (attempt - 1))
            # stalled past the TTL and replaced: the new holder runs this action
            if not self._lease(r.id, c.lease_ttl_s / 10):
                raise LeaseLostError(f"rollout {r.id}: lease lost to {(self.store.leases.get(r.id) or ('?',))[0]}")
            if attempt and self._stop.is_set():
                raise DeployCancelled(f"rollout {r.id}: {action.kind} not retried, the worker is stopping")
            try:
                self._execute(r, spec, action, action_id)
                self._at(f"executed:{action.kind}")
                self.store.mark_action(action_id, "done")
                return
            except StoreUnavailableError:   # executed but not recorded: stays pending, repeated once the store is back
                raise
            except DeployInterrupted as e:   # an abort is queued: it applies next pass, this action gives way
                self._finish(r, action_id, action, e)
                return
            except DeployCancelled as e:   # shutting down: the action stays pending for the next worker (not failed)
                log.info("rollout %s: %s left pending: %s", r.id, action.kind, e)
                raise
            except Exception as e:
                last = redact(f"{type(e).__name__}: {e}")
                # one line per attempt (the whole error, with the engine's log tail, is stored with the action)
                log.warning("rollout %s: %s failed (attempt %d): %s", r.id, action.kind, attempt + 1, first_line(last))
                if isinstance(e, (NotReadyError, NoProductionError)):   # retrying changes nothing: failed for good
                    break
        self.metrics.action_failures.labels(r.service, action.kind).inc()
        self.store.mark_action(action_id, "failed", last[:4000])

    def _finish(self, r: Rollout, action_id: int, action: Action, e: Exception) -> None:
        """Record an action that ends without running to completion: superseded by a queued abort
        (DeployInterrupted: not a failure, the abort applies next pass), else failed for good with e."""
        text = redact(f"{type(e).__name__}: {e}")
        if isinstance(e, DeployInterrupted):
            log.warning("rollout %s: %s superseded: %s", r.id, action.kind, first_line(text))
            self.store.mark_action(action_id, "superseded", text[:4000])
            return
        log.warning("rollout %s: %s failed: %s", r.id, action.kind, first_line(text))
        self.metrics.action_failures.labels(r.service, action.kind).inc()
        self.store.mark_action(action_id, "failed", text[:4000])

    def _ensure_production(self, r: Rollout, spec: DeploySpec, interruptible: bool = True) -> None:
        deployed = "production" in self.deployer.status(r.service)
        if not deployed:
            self._deploy(variant(r, spec, "production", r.production_kernels),
                         self._interrupted(r) if interruptible else None)
        # recorded also for a production someone else deployed (the demo does, before its first rollout)
        router = self.deployer.router_url(r.service)
        if router and self.store.services.routers().get(r.service) != router:
            self.store.services.set_router(r.service, router)
        if not deployed:
            log.info("service %s: production %s deployed%s", r.service, r.production_kernels,
                     f"; traffic enters at {router}" if router else "")

    def _execute(self, r: Rollout, spec: DeploySpec, action: Action, action_id: int = 0) -> None:
        if isinstance(action, Deploy):
            if action.role != "production":
                self._ensure_production(r, spec)
            self._deploy(variant(r, spec, action.role, action.kernels), self._interrupted(r))
        elif isinstance(action, SetWeights):
            self._set_weights(r.service, dict(action.weights))
        elif isinstance(action, Promote):
            self._deployer_call("promote", r.service, "canary", self.deployer.promote, r.service)
        elif isinstance(action, Rollback):
            # the rollout will say "production restored": production gone (with a previous control plane) is
            # deployed again first; one that never ran here (it never got ready) fails the rollback, saying why
            ran_before = r.service in self.store.services.routers()
            if ran_before:
                self._ensure_production(r, spec, interruptible=False)
            has_production = ran_before or "production" in self.deployer.status(r.service)
            try:
                self._deployer_call("rollback", r.service, "canary", self.deployer.rollback, r.service)
            except DeployNotFoundError as e:   # nothing deployed: no canary to take traffic from, already rolled back
                log.warning("rollout %s: rollback found nothing to roll back (%s)", r.id, e)
            if not has_production:
                raise NoProductionError(f"service {r.service}: no production to restore: production "
                                        f"{r.production_kernels} never ran here ({r.reason or 'no reason given'})")
        elif isinstance(action, Notify):
            # the key makes a replayed Notify action (crash before it was marked done) a no-op in a journal
            self.notifier.notify(Notification(action.event, r.service, r.id, action.message, r.phase.value,
                                              details={"canary_kernels": r.canary_kernels, "step": r.step + 1,
                                                       "weight": r.weight, "reason": r.reason},
                                              key=f"{r.id}:{action_id}"))
        else:
            raise ValueError(f"unknown action {action!r}")

    # ---- deployer calls, one span each ---------------------------------------------------------------------------
    def _deploy(self, spec, interrupted: Callable[[], bool] | None = None) -> None:
        self._deployer_call("deploy", spec.service, spec.role, self.deployer.deploy, spec, interrupted,
                            attributes={"sits.kernels": spec.kernels, "sits.replicas": spec.replicas})

    def _interrupted(self, r: Rollout) -> Callable[[], bool]:
        """What a deploy of r's asks while its engines load: an abort queued for r makes it stop (DeployInterrupted)."""
        return lambda: self.abort_pending(r.id)

    def _set_weights(self, service: str, weights: dict) -> None:
        self._deployer_call("set_weights", service, "canary", self.deployer.set_weights, service, weights,
                            attributes={f"sits.weight.{role}": w for role, w in weights.items()})

    def _deployer_call(self, kind: str, service: str, variant: str, fn: Callable[..., None], *args,
                       attributes: dict | None = None) -> None:
        with self.tracing.span(f"sits.deploy.{kind}", attributes={"sits.action": kind, "sits.service": service,
                                                                   "sits.variant": variant, **(attributes or {})}) as s:
            try:
                fn(*args)
            except Exception as e:
                set_attributes(s, {"sits.result": type(e).__name__})
                raise
            set_attributes(s, {"sits.result": "ok"})


def first_line(text: str) -> str:
    """The first line of an error (its log tail follows on the next ones), with how many lines were left out."""
    lines = text.strip().splitlines() or [""]
    return lines[0] + (f" [+{len(lines) - 1} lines]" if len(lines) > 1 else "")


def variant(r: Rollout, spec: DeploySpec, role: str, kernels: str):
    """The VariantSpec a deploy of `role` gets: the spec's readiness deadline, else the policy's."""
    return spec.variant(r.service, role, kernels, ready_timeout_s=spec.ready_timeout_s or r.policy.ready_timeout_s)


def in_parallel(fn: Callable[..., None], calls: list[tuple], *, daemon: bool = False) -> None:
    """fn(*args) for every args in its own thread; waits for all, then re-raises the first exception raised.
    `daemon`: threads that do not keep the process alive (the caller's Ctrl-C ends the wait; the demo's lanes)."""
    raised: list[BaseException] = []

    def run(*args) -> None:
        try:
            fn(*args)
        except BaseException as e:
            raised.append(e)
    # each thread runs in a copy of the caller's context: the caller's span stays the parent of what they trace
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(run, *args), daemon=daemon)
               for args in calls]
    for t in threads:
        t.start()
    for t in threads:   # joined in naps: on the main thread (the demo) a Ctrl-C taken by another thread still ends it
        while t.is_alive():
            t.join(0.5)
    if raised:
        raise raised[0]
