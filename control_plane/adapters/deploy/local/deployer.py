"""LocalDeployer (the embedded default): each variant is `sits-engine serve` subprocesses behind a weighted router.

One WeightedRouter per service (its URL: `router_url(service)`); each replica of a variant is an engine process on a
free loopback port with `--env <role> --service <service>`, started by a ReplicaLauncher (replicas.py). The router is
control_plane/router/. deploy() blocks until the new replicas answer /readyz, then swaps them into the router and
drains and stops the old ones. On GPUs each variant's engines get GPUs of their own while enough are free, else share
them all (gpus.py); a redeploy keeps the variant's GPUs, a promotion hands the canary's to production. Nothing is
restarted silently: a crashed replica shows as not ready (with its exit code and log tail) until deploy() is called
again. Children die with this process (own session + PR_SET_PDEATHSIG, see process.py) and are stopped by
delete()/close().
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import secrets
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from sits.control_plane.adapters.deploy import (DeployError, DeployNotFoundError, ReplicaLimit, ReplicaStatus,
                                                VariantSpec, VariantStatus, check_role, normalize_weights)
from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy.local.config import LocalConfig, default_max_replicas
from sits.control_plane.adapters.deploy.local.gpus import OWN, SHARED, GpuPool, Placement, Sets, visible_gpus
from sits.control_plane.adapters.deploy.local.replicas import Replica, ReplicaLauncher
from sits.control_plane.rollout import ROLES
from sits.control_plane.router import RouterError
from sits.control_plane.router.config import RouterConfig
from sits.control_plane.router.proxy import WeightedRouter
from sits.control_plane.router.ports import RouterPorts

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Variant:
    spec: VariantSpec
    replicas: list[Replica]
    placement: Placement = field(default_factory=Placement)


@dataclass(slots=True)
class _Service:
    router: WeightedRouter
    variants: dict[str, _Variant] = field(default_factory=dict)
    # one lock per role: variants of one service deploy in parallel; multi-role operations take them in ROLES order
    role_locks: dict[str, threading.RLock] = field(default_factory=lambda: {r: threading.RLock() for r in ROLES})
    state: threading.RLock = field(default_factory=threading.RLock)  # variants + router, held briefly

    def all_roles(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for r in ROLES:
            stack.enter_context(self.role_locks[r])
        return stack


class LocalDeployer:
    def __init__(self, config: LocalConfig | None = None, *, launcher: ReplicaLauncher | None = None) -> None:
        self.config = config or LocalConfig()
        self._tmp = None
        if self.config.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sits-local-")
        self.workdir = Path(self.config.workdir or self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._services: dict[str, _Service] = {}
        self._ports = RouterPorts(self.config.router_state)
        self._lock = threading.Lock()
        self.launcher = launcher or ReplicaLauncher(self.config, self.workdir)
        self.pin_token = self.config.pin_token or secrets.token_urlsafe(24)
        self.max_replicas = self.config.max_replicas or default_max_replicas()
        self._starting = 0                  # replicas being started now (counted against max_replicas)
        self._gpus: GpuPool | None = None   # the first deploy that may run on a GPU lists them (_gpu_pool)
        atexit.register(_close_ref, weakref.ref(self))

    # ---- Deployer protocol ----
    def deploy(self, spec: VariantSpec, interrupted: Callable[[], bool] | None = None) -> None:
        """Start spec's replicas, wait until every one answers /readyz, then swap them in. NotReadyError when one
        exits, says it failed to load, or misses the readiness deadline; DeployInterrupted as soon as
        `interrupted()` (asked about every second) says so; DeployCancelled on cancel()/close()."""
        self._deploy(spec, interrupted)

    def _deploy(self, spec: VariantSpec, interrupted: Callable[[], bool] | None = None, prefer: Sets = ()) -> None:
        """deploy(); `prefer`: GPU sets the new engines take first (a promotion passes the canary's)."""
        svc = self._service(spec.service, create=True)
        with svc.role_locks[spec.role]:
            cur = svc.variants.get(spec.role)
            if cur is not None and cur.spec == spec and all(r.proc.poll() is None for r in cur.replicas):
                return  # already as desired
            self._reserve(spec)
            placed = False
            try:
                placement = self._place(spec, prefer)
                placed = True
                # raises (and cleans up) if they never get ready, when interrupted, or on close()
                new = self.launcher.start(spec, interrupted, placement)
            except BaseException:
                if placed and self._gpus is not None:
                    self._gpus.abort(spec.service, spec.role)   # the variant keeps what it held
                raise
            finally:
                with self._lock:
                    self._starting -= spec.replicas
            with svc.state:
                svc.variants[spec.role] = _Variant(spec, new, placement)
                svc.router.set_backends(spec.role, [r.url for r in new] or None)
                if not any(svc.router.weights().values()) and spec.role == "production" and new:
                    svc.router.set_weights({"production": 100})
            if cur is not None:
                self._stop_replicas(svc, spec.role, cur.replicas)
            if self._gpus is not None:   # the old engines are gone: the variant holds the new ones' GPUs only
                self._gpus.commit(spec.service, spec.role)
            log.info("deployed %s/%s (%s) on %s%s", spec.service, spec.role, spec.kernels, [r.url for r in new],
                     f"; {placement.describe()}" if placement.describe() else "")

    def set_weights(self, service: str, weights: Mapping[str, int]) -> None:
        w = normalize_weights(weights)
        svc = self._service(service)
        with svc.state:
            missing = [r for r, v in w.items() if v > 0 and not (r in svc.variants and svc.variants[r].replicas)]
            if missing:
                raise DeployNotFoundError(f"service {service}: cannot give traffic to {missing}: not deployed "
                                          f"(deployed: {sorted(svc.variants) or 'none'})")
            svc.router.set_weights(w)

    def status(self, service: str) -> dict[str, VariantStatus]:
        with self._lock:
            svc = self._services.get(service)
        if svc is None:
            return {}
        with svc.state:
            variants = dict(svc.variants)
            weights = svc.router.weights()
        return {role: self.launcher.status(role, v.spec, v.replicas, weights.get(role, 0),
                                           self._seen_placement(service, role, v.placement))
                for role, v in variants.items()}

    def replicas(self, service: str) -> list[ReplicaStatus]:
        """Every engine process of the service, variant by variant (ROLES order); [] before its first deploy."""
        with self._lock:
            svc = self._services.get(service)
        if svc is None:
            return []
        with svc.state:
            variants = dict(svc.variants)
        return [rs for role in ROLES if role in variants
                for rs in self.launcher.replica_statuses(
                    role, variants[role].replicas, self._seen_placement(service, role, variants[role].placement))]

    def _seen_placement(self, service: str, role: str, placement: Placement) -> Placement:
        """The variant's placement as its status reports it: GPUs of its own, unless engines of other variants placed
        SHARED (too few GPUs free when they started) run on them too (Placement.sharers)."""
        if placement.mode != OWN:
            return placement
        with self._lock:
            services = list(self._services.items())
        sharers = 0
        for name, svc in services:
            with svc.state:
                sharers += sum(len(v.replicas) for r, v in svc.variants.items()
                               if v.placement.mode == SHARED and (name, r) != (service, role))
        return dataclasses.replace(placement, sharers=sharers) if sharers else placement

    def promote(self, service: str) -> None:
        svc = self._service(service)
        with svc.all_roles():
            canary, prod = svc.variants.get("canary"), svc.variants.get("production")
            if canary is None:
                if prod is None:
                    raise DeployNotFoundError(f"service {service}: nothing to promote (no canary, no production)")
            else:   # the new production runs where the canary ran: its GPUs go with it
                self._deploy(dataclasses.replace(canary.spec, role="production",
                                                 replicas=prod.spec.replicas if prod else canary.spec.replicas),
                             prefer=self._gpus.held(service, "canary") if self._gpus is not None else ())
            self.set_weights(service, {"production": 100})
            self.delete(service, "canary")
            self.delete(service, "baseline")

    def rollback(self, service: str) -> None:
        svc = self._service(service)
        with svc.all_roles():
            if "production" in svc.variants and svc.variants["production"].replicas:
                self.set_weights(service, {"production": 100})  # traffic off the canary first
            self.delete(service, "canary")
            self.delete(service, "baseline")

    def delete(self, service: str, role: str | None = None) -> None:
        check_role(role)
        with self._lock:
            svc = self._services.get(service)
        if svc is None:
            return
        with svc.all_roles() if role is None else svc.role_locks[role]:
            for r in ROLES if role is None else (role,):
                with svc.state:
                    v = svc.variants.pop(r, None)
                    if v is None:
                        continue
                    w = svc.router.weights()
                    if w[r] > 0:  # never route to a stopped variant: its share goes to production if it remains,
                        moved, w[r] = w[r], 0  # else to the remaining variant with the most traffic
                        heirs = [k for k in ROLES if k in svc.variants and (k == "production" or w[k] > 0)]
                        if heirs:
                            w[heirs[0] if heirs[0] == "production" else max(heirs, key=w.get)] += moved
                            svc.router.set_weights(w)
                        else:  # nothing left to take the traffic: the router answers 503 until a new deploy
                            svc.router.set_weights({k: 100 if k == r else 0 for k in w})
                    svc.router.set_backends(r, None)
                self._stop_replicas(svc, r, v.replicas)
                if self._gpus is not None:
                    self._gpus.release(service, r)
            if role is None:
                svc.router.stop()
                with self._lock:
                    self._services.pop(service, None)

    def replica_limit(self) -> ReplicaLimit:
        """Every engine runs on this machine: production, baseline and canary share max_replicas."""
        return ReplicaLimit(max(1, self.max_replicas // 3), f"{self.max_replicas} engines fit on this machine in all; "
                            "production, baseline and canary each run this many")

    def router_url(self, service: str) -> str:
        """The service's weighted router (DeployNotFoundError before its first deploy)."""
        return self._service(service).router.url

    def cancel(self) -> None:
        """Deploys in progress (other threads) stop starting and waiting: they stop the replicas they started and
        raise DeployCancelled. Until close(), later deploys are cancelled at once too."""
        self.launcher.cancel()

    def close(self) -> None:
        """Stop every variant and router of every service, cancelling deploys in progress first (no waiting for
        engines to load); each service's traffic goes to production alone first (where it runs), so requests in
        flight finish on the variant that stops last."""
        self.cancel()
        with self._lock:
            names = list(self._services)
        for name in names:
            try:
                self.set_weights(name, {"production": 100})
            except DeployError:   # no production here: its variants stop all the same
                pass
            self.delete(name)
        self.launcher.close()   # usable again (a later deploy starts afresh)

    def __enter__(self) -> "LocalDeployer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals ----
    def _service(self, name: str, create: bool = False) -> _Service:
        with self._lock:
            svc = self._services.get(name)
            if svc is None:
                if not create:
                    raise DeployNotFoundError(f"service {name!r} is not deployed")
                svc = self._services[name] = _Service(self._start_router(name))
            return svc

    def _start_router(self, name: str) -> WeightedRouter:
        """The service's router, on the port it had before a restart where one is remembered (else a free one)."""
        port = self._ports.get(name)
        for attempt in (port, 0) if port else (0,):
            try:
                router = WeightedRouter(RouterConfig(service=name, host=self.config.host, port=attempt,
                                                     pin_token=self.pin_token,
                                                     pin_sources=tuple(self.config.pin_sources)))
                router.start()
            except OSError as e:   # taken by another process meanwhile: a new port (and URL) beats no service
                log.warning("service %s: router port %d unavailable (%s); taking a free one", name, attempt, e)
                continue
            except RouterError as e:   # a bad pin source, or it never started: the Deployer contract's error
                raise DeployError(f"service {name}: {e}") from None
            self._ports.remember(name, int(router.url.rsplit(":", 1)[1]))
            return router
        raise DeployError(f"service {name}: no port for its router")

    def _reserve(self, spec: VariantSpec) -> None:
        """Count spec's replicas against max_replicas (engines running plus being started) or refuse the deploy."""
        with self._lock:
            running = sum(len(v.replicas) for svc in self._services.values() for v in svc.variants.values())
            cur = self._services[spec.service].variants.get(spec.role) if spec.service in self._services else None
            # the variant's current replicas stop once the new ones are ready: both run for a while
            if running + self._starting + spec.replicas > self.max_replicas:
                raise DeployError(
                    f"{spec.service}/{spec.role}: {spec.replicas} replicas would make "
                    f"{running + self._starting + spec.replicas} engines on this machine; at most "
                    f"{self.max_replicas} fit (LocalConfig.max_replicas; {len(cur.replicas) if cur else 0} of the "
                    f"running ones are this variant's current replicas)")
            self._starting += spec.replicas

    def _gpu_pool(self) -> GpuPool:
        """The GPUs engines are placed on: LocalConfig.gpu_devices, else visible_gpus(), listed once."""
        if self._gpus is None:
            devices = self.config.gpu_devices
            if devices is None:
                devices = visible_gpus({**os.environ, **self.config.env})
            with self._lock:
                if self._gpus is None:
                    self._gpus = GpuPool(devices)
                    log.info("GPUs for engines: %s", ", ".join(devices) or "none listed")
        return self._gpus

    def _place(self, spec: VariantSpec, prefer: Sets) -> Placement:
        """Reserve the GPUs of spec's new engines (the GpuPool's rules), or none: on the CPU (`--device cpu`), on a
        machine with no GPU listed, or with `--device cuda:N` (a device picked by hand: it shares, as before)."""
        device = spec.engine_device()
        if device == "cpu" and self._gpus is None:
            return Placement()   # nothing to list, nothing held
        pool = self._gpu_pool()
        if device == "cpu" or not pool.devices or (device or "").startswith("cuda:"):
            pool.reserve_none(spec.service, spec.role)
            return Placement() if device == "cpu" or not pool.devices else \
                Placement(SHARED, visible=pool.devices, note=f"--device {device} picks its GPU by hand")
        placement = pool.reserve(spec.service, spec.role, spec.gpus_per_engine, spec.replicas, prefer)
        if placement.mode == SHARED:
            log.warning("%s/%s: too few free GPUs for engines of their own (%s); its engines share every GPU",
                        spec.service, spec.role, placement.note)
        return placement

    def _stop_replicas(self, svc: _Service, role: str, replicas: list[Replica]) -> None:
        # requests already in flight on the old replicas finish before they stop (bounded by drain_timeout_s)
        if svc.router.in_flight(role) and self.config.drain_timeout_s:
            process.wait_until(lambda: svc.router.in_flight(role) == 0, self.config.drain_timeout_s)
        self.launcher.stop(replicas)


def _close_ref(ref) -> None:
    d = ref()
    if d is not None:
        try:
            d.close()
        except Exception:  # interpreter shutdown: PDEATHSIG still reaps the children
            pass
