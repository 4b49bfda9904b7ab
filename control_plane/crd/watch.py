"""`--watch-crds`: KernelRollout resources drive rollouts, and their status shows them.

Two threads. The watch thread keeps a cache of the namespace's KernelRollouts: list, then watch from the list's
resourceVersion with bookmarks; a 410 Gone (resourceVersion compacted away) or `relist_s` without a list means list
again (objects gone from the new list count as deleted); an unreachable API server is retried with back-off. The
sync thread reconciles every cached resource every `sync_interval_s` (and the watch thread each one it hears of),
level-triggered from the resource and the store:
  - no rollout yet, or the last one finished and spec.kernels differs: start_rollout (the API's validation; a
    refusal -> the Degraded condition and a Warning Event; a busy service is retried, a bad spec waits for an edit)
  - spec.kernels differs from the active rollout's: abort it; the new one starts once it is rolled back
  - spec.paused differs from status.specPaused (what was last applied): pause / resume, once the phase allows it
  - always: status from the rollout and its last check, written only when it changed
A deleted resource aborts its active rollout (one deleted while no watcher ran: at the next list, by the creation
event's actor). UI/API commands act on the same rollout, so the status shows them.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Collection, Mapping

from sits.control_plane.adapters.deploy import DeployError
from sits.control_plane.adapters.deploy.kubernetes.api import load_client
from sits.control_plane.crd.api import CrdApiError, KernelRolloutApi, WatchExpired
from sits.control_plane.crd.status import RolloutRequest, refused_status, rollout_status
from sits.control_plane.errors import ConflictError, NotFoundError, SitsError, ValidationError
from sits.control_plane.rollout import Command, Phase, Rollout, allowed_commands
from sits.control_plane.service.rollouts import send_command, start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import StoreError

log = logging.getLogger(__name__)


class CrdWatcher:
    """`CrdWatcher(store, api, kernel_sets=..., policy_defaults=...)`; `start()` / `stop()`; `reconcile(obj)` one
    resource. `relists` counts lists (the first, 410s, resyncs), `api_errors` failed watches."""

    def __init__(self, store: Store, api: KernelRolloutApi, *, kernel_sets: Collection[str] | None = None,
                 policy_defaults: Mapping | None = None, local_models: bool = False,
                 sync_interval_s: float = 1.0, watch_timeout_s: int = 60,
                 relist_s: float = 300.0, backoff_s: float = 0.5, clock: Callable[[], float] = time.time) -> None:
        if not sync_interval_s > 0 or watch_timeout_s < 1 or not relist_s > 0:
            raise ValueError("sync_interval_s and relist_s must be > 0, watch_timeout_s >= 1")
        self.store, self.api = store, api
        self.kernel_sets, self.policy_defaults = kernel_sets, dict(policy_defaults or {})
        self.local_models = local_models   # start_rollout's: a checkpoint path must be a directory on this machine
        self.sync_interval_s, self.watch_timeout_s, self.relist_s = sync_interval_s, watch_timeout_s, relist_s
        self.backoff_s, self.clock = backoff_s, clock
        self.cache: dict[str, dict] = {}
        self.resource_version: str | None = None
        self.relists = 0
        self.api_errors = 0
        self._listed_at = 0.0
        self._refused: dict[str, tuple[int, str, bool]] = {}   # name -> (generation, message, busy): last refusal
        self._rollouts: dict[str, str] = {}   # resource uid -> its current rollout's id
        self._sent: set[tuple[str, str]] = set()   # (uid, generation:reason) of the Events sent with once=True
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def open(cls, store_path: str, namespace: str, *, kubeconfig: str | None = None,
             kernel_sets: Collection[str] | None = None, policy_defaults: Mapping | None = None,
             local_models: bool = False) -> "CrdWatcher":
        """What `sits-control serve --watch-crds` runs: its own connection to the store, the in-cluster service
        account (or `kubeconfig`) for the API. CrdApiError when the credentials cannot be loaded."""
        try:
            api_client = load_client(kubeconfig, None, None)
        except DeployError as e:
            raise CrdApiError(f"--watch-crds: {e}") from None
        return cls(Store(store_path), KernelRolloutApi(api_client, namespace), kernel_sets=kernel_sets,
                   policy_defaults=policy_defaults, local_models=local_models)

    def close(self) -> None:
        self.stop()
        self.store.close()

    # ---- threads ---------------------------------------------------------------------------------------------
    def start(self) -> "CrdWatcher":
        self._stop.clear()
        self._threads = [threading.Thread(target=self._watch_loop, name="sits-crd-watch", daemon=True),
                         threading.Thread(target=self._sync_loop, name="sits-crd-sync", daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.api.stop_watch()
        for t in self._threads:
            t.join(timeout)
        self._threads = []

    def _watch_loop(self) -> None:
        delay = self.backoff_s
        while not self._stop.is_set():
            try:
                if self.resource_version is None or time.monotonic() - self._listed_at > self.relist_s:
                    self.relist()
                for type_, obj in self.api.watch(self.resource_version, self.watch_timeout_s):
                    if self._stop.is_set():
                        break
                    self._on_event(type_, obj)
                delay = self.backoff_s
            except WatchExpired as e:
                log.info("%s; listing again", e)
                self.resource_version = None
            except CrdApiError as e:
                self.api_errors += 1
                log.warning("KernelRollout watch: %s; retrying in %.1fs", e, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
            except Exception:   # noqa: BLE001  a bug must not end the watch for good: log it, list again
                log.exception("KernelRollout watch failed; listing again in %.1fs", delay)
                self.api_errors += 1
                self.resource_version = None
                self._stop.wait(delay)

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.sync_interval_s):
            self.sync()

    def sync(self) -> None:
        """Reconcile every cached resource (each failure logged, the others still run)."""
        for obj in list(self.cache.values()):
            self._reconcile_logged(obj)

    # ---- the cache -------------------------------------------------------------------------------------------
    def relist(self) -> None:
        items, rv = self.api.list()
        fresh = {o["metadata"]["name"]: o for o in items}
        with self._lock:
            gone = [o for name, o in self.cache.items() if name not in fresh]
            self.cache = fresh
        for obj in gone:
            self._deleted(obj)
        self._abort_orphans(fresh)
        self.resource_version, self._listed_at = rv, time.monotonic()
        self.relists += 1
        for obj in items:
            self._reconcile_logged(obj)

    def _on_event(self, type_: str, obj: dict) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if type_ == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        name = obj["metadata"]["name"]
        if type_ == "DELETED":
            with self._lock:
                self.cache.pop(name, None)
            self._deleted(obj)
        elif type_ in ("ADDED", "MODIFIED"):
            with self._lock:
                self.cache[name] = obj
            self._reconcile_logged(obj)
        self.resource_version = rv or self.resource_version

    def _deleted(self, obj: dict) -> None:
        name = obj["metadata"]["name"]
        rid = self._rollouts.pop(obj["metadata"]["uid"], None) or (obj.get("status") or {}).get("rolloutId")
        self._refused.pop(name, None)
        if not rid:
            return
        try:
            if self.store.get(rid).active:
                send_command(self.store, rid, Command.ABORT, self._actor(obj))
                log.info("KernelRollout %s deleted: rollout %s aborted", name, rid)
        except (NotFoundError, ConflictError) as e:   # gone, or already ending
            log.info("KernelRollout %s deleted: rollout %s: %s", name, rid, e)

    def _abort_orphans(self, fresh: Mapping[str, dict]) -> None:
        """Active rollouts created by a KernelRollout of this namespace that no longer exists (deleted while no
        watcher ran): aborted, as the deletion would have."""
        ours = {self._actor(o) for o in fresh.values()}
        for r in self.store.active():
            created = self.store.events(r.id, limit=1)
            actor = created[0]["actor"] if created else ""
            if actor.split("/")[:2] == ["kernelrollout", self.api.namespace] and actor not in ours:
                try:
                    send_command(self.store, r.id, Command.ABORT, actor)
                    log.info("rollout %s: its %s is gone; aborted", r.id, actor)
                except ConflictError as e:   # already ending
                    log.info("rollout %s: its %s is gone: %s", r.id, actor, e)

    # ---- one resource ----------------------------------------------------------------------------------------
    def _reconcile_logged(self, obj: dict) -> None:
        try:
            self.reconcile(obj)
        except (CrdApiError, SitsError, StoreError) as e:   # e.g. API down, a command racing a phase change
            log.warning("KernelRollout %s: %s", obj["metadata"]["name"], e)

    def _actor(self, obj: dict) -> str:
        return f"kernelrollout/{self.api.namespace}/{obj['metadata']['name']}"

    def _current(self, obj: dict) -> Rollout | None:
        """The resource's rollout: the one this watcher last started or saw for it (a watch event may still carry
        an older status), else this generation's, else the status's."""
        uid = obj["metadata"]["uid"]
        for rid in (self._rollouts.get(uid), self._rollout_id(obj), (obj.get("status") or {}).get("rolloutId")):
            if not rid:
                continue
            try:
                r = self.store.get(rid)
            except NotFoundError:
                continue
            self._rollouts[uid] = rid
            return r
        return None

    @staticmethod
    def _rollout_id(obj: dict) -> str:
        """The id a rollout of this resource's generation gets: a crash between creating it and writing the status
        finds it again instead of starting a second one."""
        m = obj["metadata"]
        return f"{m['name']}-{m['uid'][:8]}-g{m.get('generation', 1)}"

    def reconcile(self, obj: dict) -> None:
        with self._lock:
            name = obj["metadata"]["name"]
            if name not in self.cache:   # deleted meanwhile
                return
            obj = self.cache[name]
            req, status = RolloutRequest.from_object(obj), obj.get("status") or {}
            r = self._current(obj)
            if r is not None and r.canary_kernels == req.kernels:
                self._write(obj, self._steer(obj, r, req, status))
            elif r is not None and r.active:   # spec.kernels edited: the old one first rolls back
                if Command.ABORT in allowed_commands(r):
                    send_command(self.store, r.id, Command.ABORT, self._actor(obj))
                    self._event(obj, "Normal", "Superseded", f"spec.kernels is now {req.kernels!r}: aborting rollout "
                                f"{r.id} ({r.canary_kernels}); the new one starts once it is rolled back", once=True)
                self._write(obj, rollout_status(r, self._last_check(r), status.get("observedGeneration", 0),
                                                status, self.clock()) | {"specPaused": status.get("specPaused", False)})
            else:
                self._start(obj, req, status)

    def _steer(self, obj: dict, r: Rollout, req: RolloutRequest, status: dict) -> dict:
        applied = bool(status.get("specPaused", False)) if status.get("rolloutId") == r.id else False
        if req.paused != applied and r.active:
            cmd = Command.PAUSE if req.paused else Command.RESUME
            if (r.phase is Phase.PAUSED) == req.paused:   # already there (e.g. by the UI)
                applied = req.paused
            elif cmd in allowed_commands(r):
                send_command(self.store, r.id, cmd, self._actor(obj))
                self._event(obj, "Normal", "Paused" if req.paused else "Resumed",
                            f"spec.paused={str(req.paused).lower()}: {cmd.value} sent to rollout {r.id}")
                applied = req.paused
            # else the phase does not take it yet (pending, promoting, rolling back): the next pass tries again
        gen = obj["metadata"].get("generation", 1)
        return rollout_status(r, self._last_check(r), gen, status, self.clock()) | {"specPaused": applied}

    def _start(self, obj: dict, req: RolloutRequest, status: dict) -> None:
        name, gen = obj["metadata"]["name"], obj["metadata"].get("generation", 1)
        refused = self._refused.get(name)
        if refused is not None and refused[0] == gen and not refused[2]:
            return   # the same invalid spec: wait for an edit (a busy service is tried again)
        try:
            r = start_rollout(self.store, req.service, req.kernels, req.production_kernels,
                              self._policy(req.policy), req.spec, rollout_id=self._rollout_id(obj),
                              actor=self._actor(obj), kernel_sets=self.kernel_sets, local_models=self.local_models)
        except (ValidationError, ConflictError) as e:
            busy = isinstance(e, ConflictError)
            msg, reason = f"refused: {e}", "ServiceBusy" if busy else "InvalidSpec"
            if refused is None or refused[:2] != (gen, msg):
                self._event(obj, "Warning", reason, msg)
            self._refused[name] = (gen, msg, busy)
            self._write(obj, refused_status(msg, reason, gen, status, self.clock()))
            return
        self._refused.pop(name, None)
        self._rollouts[obj["metadata"]["uid"]] = r.id
        self._event(obj, "Normal", "Started", f"rollout {r.id}: {req.kernels} against {req.production_kernels} "
                    f"for service {req.service}")
        self._write(obj, rollout_status(r, None, gen, None, self.clock()) | {"specPaused": False})

    def _policy(self, policy: object) -> object:
        if not self.policy_defaults or policy is not None and not isinstance(policy, Mapping):
            return policy   # start_rollout says what is wrong with a non-object
        return {**self.policy_defaults, **(policy or {})}

    def _last_check(self, r: Rollout) -> dict | None:
        if not r.checks:
            return None
        got = self.store.checks(r.id, since_seq=r.checks - 1, limit=1)
        return got[0] if got else None

    def _write(self, obj: dict, status: dict) -> None:
        if status == obj.get("status"):
            return
        new = self.api.patch_status(obj["metadata"]["name"], status)
        with self._lock:
            if obj["metadata"]["name"] in self.cache:
                self.cache[obj["metadata"]["name"]] = new

    def _event(self, obj: dict, type_: str, reason: str, message: str, once: bool = False) -> None:
        key = (obj["metadata"]["uid"], f"{obj['metadata'].get('generation')}:{reason}")
        if once and key in self._sent:
            return
        self._sent.add(key)
        try:
            self.api.record_event(obj, type_, reason, message)
        except CrdApiError as e:   # an Event is for people; the status is what matters
            log.warning("KernelRollout %s: %s", obj["metadata"]["name"], e)
