"""LocalDeployer (the embedded default): each variant is `sits-engine serve` subprocesses behind a weighted router.

One WeightedRouter per service (its URL: `router_url(service)`); each replica of a variant is an engine process on a
free loopback port with `--env <role> --service <service>`, started by a ReplicaLauncher (replicas.py). The router is
control_plane/router/. deploy() blocks until the new replicas answer /readyz, then swaps them into the router and
drains and stops the old ones. Nothing is restarted silently: a crashed replica
shows as not ready (with its exit code and log tail) until deploy() is called again. Children die with this process
(own session + PR_SET_PDEATHSIG, see process.py) and are stopped by delete()/close().
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
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
        atexit.register(_close_ref, weakref.ref(self))

    # ---- Deployer protocol ----
    def deploy(self, spec: VariantSpec, interrupted: Callable[[], bool] | None = None) -> None:
        """Start spec's replicas, wait until every one answers /readyz, then swap them in. NotReadyError when one
        exits, says it failed to load, or misses the readiness deadline; DeployInterrupted as soon as
        `interrupted()` (asked about every second) says so; DeployCancelled on cancel()/close()."""
        svc = self._service(spec.service, create=True)
        with svc.role_locks[spec.role]:
            cur = svc.variants.get(spec.role)
            if cur is not None and cur.spec == spec and all(r.proc.poll() is None for r in cur.replicas):
                return  # already as desired
            self._reserve(spec)
            try:
                # raises (and cleans up) if they never get ready, when interrupted, or on close()
                new = self.launcher.start(spec, interrupted)
            finally:
                with self._lock:
                    self._starting -= spec.replicas
            with svc.state:
                svc.variants[spec.role] = _Variant(spec, new)
                svc.router.set_backends(spec.role, [r.url for r in new] or None)
                if not any(svc.router.weights().values()) and spec.role == "production" and new:
                    svc.router.set_weights({"production": 100})
            if cur is not None:
                self._stop_replicas(svc, spec.role, cur.replicas)
            log.info("deployed %s/%s (%s) on %s", spec.service, spec.role, spec.kernels, [r.url for r in new])

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
        return {role: self.launcher.status(role, v.spec, v.replicas, weights.get(role, 0))
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
                for rs in self.launcher.replica_statuses(role, variants[role].replicas)]

    def promote(self, service: str) -> None:
        svc = self._service(service)
        with svc.all_roles():
            canary, prod = svc.variants.get("canary"), svc.variants.get("production")
            if canary is None:
                if prod is None:
                    raise DeployNotFoundError(f"service {service}: nothing to promote (no canary, no production)")
            else:
                self.deploy(dataclasses.replace(canary.spec, role="production",
                                                replicas=prod.spec.replicas if prod else canary.spec.replicas))
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
