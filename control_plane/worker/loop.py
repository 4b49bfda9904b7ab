"""The control loop: every interval, for each active rollout (each in its own thread, so a slow deployer or metrics
source delays only its own rollout):

    1. finish the outbox: pending actions of the last pass (after a crash or failure) run, idempotently; done for now
    2. load the rollout, gather an Observation (worker/observe.py): readiness from the deployer, the window since
       `observed_until` from the metrics source (a MetricsError makes the window "no data": inconclusive, never a
       pass), a queued manual command, and the actions of the last pass that failed for good; when
       `correctness_due` and both variants are ready, the correctness gate's replay of the prompt set against canary
       and baseline (adapters/inference/correctness.py), stopped between prompts by a queued abort
    3. reconcile(rollout, observation, now)                                   (pure)
    4. persist the new state + its checks + events + actions in ONE transaction (Store.save)
    5. run the actions through the deployer (each retried, then marked done/failed in the outbox) and the notifier

Killed between any two steps, a restarted worker converges: before 4 nothing was written and the pass is redone from
the same persisted state (same window start, same check seq); after 4 the outbox holds what is left to do. Warm-up
windows are dropped by reconcile (Policy.warmup_s after every deploy or weight change). Several workers may share a
store: a pass runs only under the rollout's lease (Store.acquire_lease), so one worker drives each rollout at a time.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable

from prometheus_client import CollectorRegistry

from sits.control_plane.adapters.inference.correctness import CorrectnessProbe, load_prompt_set
from sits.control_plane.adapters.deploy import Deployer, DeployCancelled
from sits.control_plane.adapters.metrics import MetricsSource
from sits.control_plane.adapters.notify import MultiNotifier, Notifier
from sits.control_plane.adapters.inference.replay import HTTPReplaySender, ReplaySender
from sits.control_plane.rollout import Command, Rollout, reconcile
from sits.control_plane.redact import redact
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import StoreUnavailableError
from sits.control_plane.worker.actions import ActionRunner, LeaseLostError
from sits.control_plane.worker.check_span import check_attributes
from sits.control_plane.worker.config import WorkerConfig, WorkerMetrics, default_owner
from sits.control_plane.worker.observe import Observer
from sits.control_plane.worker.replay import Replayer
from sits.wire.tracing import Tracing, set_attributes

log = logging.getLogger(__name__)


class Worker:
    """`Worker(store, deployer, metrics_source, notifier)`; `start()`/`stop()` run the loop in threads,
    `run_once()` does one synchronous round, `reconcile_rollout(id)` one pass of one rollout.
    `step_hook(name)` (tests) is called between the steps of a pass: raising there simulates a crash.
    `owner`: this worker's lease identity (default hostname:pid:random). A pass drives a rollout only while this
    worker holds its lease (Store.acquire_lease, lease_ttl_s long; renewed every round, all of a round in one
    transaction, also while a pass still runs (for at most max_pass_s), and before saving and before every action
    unless renewed less than lease_ttl_s / 10 ago): several workers on one
    store never drive one rollout at once, and one that stops renewing is replaced after the lease expires."""

    def __init__(self, store: Store, deployer: Deployer, metrics_source: MetricsSource,
                 notifier: Notifier | None = None, config: WorkerConfig | None = None, *,
                 clock: Callable[[], float] = time.time, registry: CollectorRegistry | None = None,
                 owner: str | None = None, correctness: CorrectnessProbe | None = None,
                 tracing: Tracing | None = None, replay_sender: ReplaySender | None = None) -> None:
        self.store, self.deployer, self.source = store, deployer, metrics_source
        self.tracing = tracing or Tracing()
        self.correctness = correctness or CorrectnessProbe()
        self.notifier = notifier or MultiNotifier()
        self.config = config or WorkerConfig()
        self.clock = clock
        self.owner = owner or default_owner()
        self.metrics = WorkerMetrics(registry)
        self.step_hook: Callable[[str], None] | None = None
        self._threads: dict[str, threading.Thread] = {}
        self._pass_started: dict[str, float] = {}   # rollout id -> when (self.clock) its running pass started
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self._recovered = False
        self._idle_restore: threading.Thread | None = None   # restore_idle at the first round (see _recover)
        self._renewed: dict[str, float] = {}   # rollout id -> when (self.clock) this worker last renewed its lease
        self.store_error: str | None = None   # the last write failure, until a pass writes again (readiness)
        self.observer = Observer(store, deployer, metrics_source, self.correctness, self.tracing,
                                 abort_pending=self.abort_pending)
        self.replay = Replayer(replay_sender or HTTPReplaySender(), clock=clock, halted=self.halt_pending,
                               load_prompts=lambda ps: load_prompt_set(ps, self.correctness.prompt_dir),
                               counted=lambda service, variant: self.metrics.replayed.labels(service, variant).inc())
        self.actions = ActionRunner(store, deployer, self.notifier, tracing=self.tracing, metrics=self.metrics,
                                    config=self.config, clock=clock, lease=self._lease, step=self._at,
                                    abort_pending=self.abort_pending, stopping=self._stop)

    # ---- the loop ------------------------------------------------------------------------------------------------
    def tick(self) -> list[threading.Thread]:
        """Start a pass for every active rollout whose previous pass has finished and whose lease this worker holds
        (all renewed in one transaction); returns the started threads."""
        if not self._recovered:
            self._recover()
        active = self.store.active_ids()
        self.metrics.active.set(len(active))
        # still busy (slow deployer, metrics source or correctness gate): only this rollout waits, and its pass keeps
        # the lease (renewed here every round, for at most max_pass_s: a pass hung longer is given up, and another
        # worker takes the rollout once the lease expires)
        due, busy = [], []
        for rid, service in active:
            (busy if (t := self._threads.get(rid)) is not None and t.is_alive() else due).append((rid, service))
        now = self.clock()
        keep = [rid for rid, _ in busy if now - self._pass_started.get(rid, now) < self.config.max_pass_s]
        try:
            held = self.store.leases.acquire_many([rid for rid, _ in due] + keep, self.owner, self.config.lease_ttl_s,
                                             now)
        except StoreUnavailableError as e:   # no lease, no pass: nothing is decided that could not be recorded
            self._store_failed(e, f"round of {len(due)} rollout(s)")
            return []
        self._renewed.update(dict.fromkeys(held, now))
        for rid, service in busy:
            if rid not in held:   # its pass finds out at its next lease check (before saving, before each action)
                self._renewed.pop(rid, None)
                log.warning("rollout %s (%s): pass running for %.0f s%s; its lease is no longer renewed", rid,
                            service, now - self._pass_started.get(rid, now),
                            "" if rid in keep else f" (> max_pass_s {self.config.max_pass_s:g})")
        started = []
        for rid, service in due:
            if rid not in held:
                if log.isEnabledFor(logging.DEBUG):   # the holder's name costs a read per rollout
                    log.debug("rollout %s: leased by %s; skipped", rid, (self.store.leases.get(rid) or ("?",))[0])
                continue
            t = threading.Thread(target=self._pass, args=(rid, service), name=f"sits-rollout-{service}", daemon=True)
            self._threads[rid] = t
            self._pass_started[rid] = now
            t.start()
            started.append(t)
        ids = {rid for rid, _ in active}
        for rid in [k for k, t in self._threads.items() if k not in ids and not t.is_alive()]:
            del self._threads[rid]
            self._pass_started.pop(rid, None)
        self.metrics.busy.set(sum(t.is_alive() for t in self._threads.values()))
        return started

    def run_once(self, timeout: float | None = None) -> None:
        for t in self.tick():
            t.join(timeout)

    @property
    def alive(self) -> bool:
        """The loop thread runs (what /readyz reports)."""
        return self._loop is not None and self._loop.is_alive() and not self._stop.is_set()

    def start(self) -> "Worker":
        self._stop.clear()
        self._loop = threading.Thread(target=self._run, name="sits-worker", daemon=True)
        self._loop.start()
        return self

    def stop(self) -> None:
        """Stop the loop; wait (join_timeout_s in all) for passes in flight, then give up the leases of the rollouts
        whose pass ended (another worker takes them over at once). A pass still running after that (a hung deployer
        call) is abandoned with its lease: its outbox rows stay pending and the next holder finishes them. A store
        that cannot be written (disk full or read-only) keeps the leases until they expire."""
        self._stop.set()
        self.replay.close()
        deadline = time.monotonic() + self.config.join_timeout_s
        if self._loop is not None:
            self._loop.join(max(0.0, deadline - time.monotonic()))
        if self._idle_restore is not None:   # a deploy in it stops with the deployer (DeployCancelled at close)
            self._idle_restore.join(max(0.0, deadline - time.monotonic()))
        for rid, t in list(self._threads.items()):
            t.join(max(0.0, deadline - time.monotonic()))
            if not t.is_alive():
                try:
                    self._release(rid)
                except StoreUnavailableError as e:
                    log.warning("rollout %s: lease not released, it expires in %g s: %s", rid,
                                self.config.lease_ttl_s, e)

    def close(self) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except StoreUnavailableError as e:
                self._store_failed(e, "worker tick")
            except Exception:
                log.exception("worker tick failed")
            self._stop.wait(self.config.interval_s)

    def _pass(self, rollout_id: str, service: str) -> None:
        try:
            self.reconcile_rollout(rollout_id, leased=True)
            self.store_error = None
        except StoreUnavailableError as e:
            self._store_failed(e, f"rollout {rollout_id} ({service})")
        except LeaseLostError as e:
            log.warning("%s; this pass stops here", e)
        except DeployCancelled as e:   # shutdown: the pass ends, its pending actions stay for the next worker
            log.info("rollout %s (%s): %s", rollout_id, service, e)
        except Exception:
            self.metrics.errors.labels(service).inc()
            log.exception("rollout %s (%s): pass failed; retried next interval", rollout_id, service)

    def _store_failed(self, e: StoreUnavailableError, where: str) -> None:
        # nothing the pass decided was stored, so nothing was done: an action runs only once its outbox row exists,
        # and one that ran but could not be marked done stays pending and is repeated (idempotently) later. One line
        # when the problem starts (or changes), then quiet: /readyz and the counter keep saying it every pass
        self.metrics.store_errors.inc()
        if str(e) == self.store_error:
            log.debug("%s: %s (still)", where, e)
            return
        self.store_error = str(e)
        log.error("%s: %s; passes stop without acting, retried every %g s until the store can be used (logged once)",
                  where, e, self.config.interval_s)

    def _recover(self) -> None:
        """Finished rollouts whose last actions (notifications) never ran because of a crash; and, in a thread of its
        own (an engine takes a while to get ready; active rollouts do not wait for it), the production of every idle
        service that a previous control plane ran (ActionRunner.restore_idle)."""
        for r in self.store.list(active=False, limit=50):
            pending = self.store.pending_actions(r.id)
            if pending and self._lease(r.id):
                self.actions.run(r, pending)
                self._release(r.id)
        self._recovered = True
        self._idle_restore = threading.Thread(target=self._restore_idle, name="sits-restore-idle", daemon=True)
        self._idle_restore.start()

    def _restore_idle(self) -> None:
        try:
            self.actions.restore_idle()
        except StoreUnavailableError as e:
            self._store_failed(e, "restoring idle services")
        except Exception as e:   # never the loop's end: the service's next rollout deploys production anyway
            log.warning("idle services not restored: %s: %s", type(e).__name__, redact(str(e)))

    def _lease(self, rollout_id: str, fresh_s: float = 0.0) -> bool:
        """Take or renew the lease. `fresh_s`: renewed by this worker less than that long ago, it is still held
        (for lease_ttl_s - fresh_s at least) and the store is not asked: no commit per action."""
        now = self.clock()
        if fresh_s and now - self._renewed.get(rollout_id, float("-inf")) < fresh_s:
            return True
        if self.store.leases.acquire(rollout_id, self.owner, self.config.lease_ttl_s, now):
            self._renewed[rollout_id] = now
            return True
        self._renewed.pop(rollout_id, None)
        return False

    def _release(self, rollout_id: str) -> None:
        self._renewed.pop(rollout_id, None)
        self.store.leases.release(rollout_id, self.owner)

    def abort_pending(self, rollout_id: str) -> bool:
        """An abort is queued for the rollout (long steps stop for it: gate replays, deploy retries, restores)."""
        return any(c["command"] == Command.ABORT.value for c in self.store.commands.pending(rollout_id))

    def halt_pending(self, rollout_id: str) -> bool:
        """A pause or abort is queued for the rollout: low-traffic replay sends nothing more."""
        return any(c["command"] in (Command.ABORT.value, Command.PAUSE.value)
                   for c in self.store.commands.pending(rollout_id))

    def holds(self, rollout_id: str) -> bool:
        """Whether this worker holds the rollout's lease now."""
        held = self.store.leases.get(rollout_id)
        return held is not None and held[0] == self.owner and held[1] > self.clock()

    def _engine_urls(self, service: str) -> dict[str, str]:
        """Canary's and baseline's first engine endpoint (low-traffic replay goes there, never via the router)."""
        status = self.deployer.status(service)
        return {role: (st.endpoints or (st.endpoint,))[0] or "" for role, st in status.items()
                if role in ("canary", "baseline")}

    # ---- one pass ------------------------------------------------------------------------------------------------
    def _at(self, step: str) -> None:
        if self.step_hook is not None:
            self.step_hook(step)

    def reconcile_rollout(self, rollout_id: str, *, leased: bool = False) -> Rollout:
        """One pass: returns the rollout as this pass left it (unchanged if another worker holds its lease).
        `leased`: the caller has just taken the lease (tick renews every due rollout's in one transaction). Traced
        as one `sits.reconcile` span; its checks, the correctness replay and the deployer calls are its children."""
        with self.tracing.span("sits.reconcile", attributes={"sits.rollout_id": rollout_id}) as span:
            r = self._reconcile_rollout(rollout_id, span, leased)
            set_attributes(span, {"sits.service": r.service, "sits.phase": r.phase.value, "sits.step": r.step,
                                  "sits.weight": r.weight, "sits.checks": r.checks})
            return r

    def _reconcile_rollout(self, rollout_id: str, span, leased: bool) -> Rollout:
        r = self.store.get(rollout_id)
        set_attributes(span, {"sits.service": r.service, "sits.phase_before": r.phase.value})
        if not leased and not self._lease(r.id):
            log.debug("rollout %s: leased by %s; skipped", r.id, (self.store.leases.get(r.id) or ("?",))[0])
            return r
        if r.id not in self.actions.restored:
            r = self.actions.restore(r)
        pending = self.store.pending_actions(r.id)
        if pending:   # only after a crash or an interrupted pass: finish it, reconcile next interval
            self._at("recover")
            self.actions.run(r, pending)
            return r
        if not r.active:
            self._release(r.id)
            return r
        self._at("loaded")
        now = self.clock()
        t0 = time.perf_counter()
        command = self.store.commands.next(r.id)
        if command is not None and command[1] in (Command.PAUSE, Command.ABORT):
            self.replay.stop(r.id, f"{command[1].value} by {command[2] or 'someone'}")
        obs = self.observer.observe(r, now, command)
        self.observer.engines(r, now)
        tc = time.perf_counter()
        obs, interrupted = self.observer.correctness(r, obs, now)
        if interrupted:   # an abort arrived during the replay: it applies in this pass
            command = self.store.commands.next(r.id)
            obs = dataclasses.replace(obs, command=command[1] if command else None,
                                      command_by=command[2] if command else "")
        t1 = time.perf_counter()
        self._at("observed")
        new, actions = reconcile(r, obs, now)
        for check in new.new_checks if self.tracing.enabled else ():   # traced off (the default): no attributes built
            with self.tracing.span("sits.check", attributes=check_attributes(check)):
                pass
        t2 = time.perf_counter()
        self._at("reconciled")
        saved = r
        if not self._lease(r.id, fresh_s=self.config.lease_ttl_s / 10):   # replaced during a long pass: save nothing
            raise LeaseLostError(f"rollout {r.id}: lease lost to {(self.store.leases.get(r.id) or ('?',))[0]}")
        if actions or new.new_checks or new.new_events or dataclasses.replace(new, new_checks=(), new_events=()) != r:
            saved = self.store.save(new, actions)
            for e in new.new_events:
                log.info("rollout %s (%s): %s", r.id, r.service, redact(e.message))
        t3 = time.perf_counter()
        self._at("saved")
        if command is not None:
            self.store.commands.consume(command[0])
            self._at("consumed")
        try:   # low-traffic replay: fed, started or stopped by what this pass decided (never fails the pass)
            self.replay.after_pass(new, lambda: self._engine_urls(r.service))
        except Exception as e:
            log.warning("rollout %s (%s): low-traffic replay not started: %s: %s", r.id, r.service,
                        type(e).__name__, e)
        self.actions.run(saved, self.store.pending_actions(r.id))
        t4 = time.perf_counter()
        for stage, dt in (("observe", tc - t0), ("correctness", t1 - tc), ("reconcile", t2 - t1), ("persist", t3 - t2),
                          ("actions", t4 - t3)):
            self.metrics.stage.labels(r.service, stage).observe(dt)
        self.metrics.reconcile.observe(t4 - t0)
        return saved
