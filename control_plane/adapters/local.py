"""LocalDeployer (the embedded default): each variant is `sits-engine serve` subprocesses behind a weighted router.

One WeightedRouter per service (its URL: `router_url(service)`); each replica of a variant is an engine process on a
free loopback port with `--env <role> --service <service>`. deploy() blocks until the new replicas answer /readyz,
then swaps them into the router and drains and stops the old ones. Nothing is restarted silently: a crashed replica
shows as not ready (with its exit code and log tail) until deploy() is called again. Children die with this process
(own session + PR_SET_PDEATHSIG, see process.py) and are stopped by delete()/close().
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
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import httpx

from control_plane.adapters import process
from control_plane.rollout import ROLES
from control_plane.adapters.deploy import (DeployCancelled, DeployError, DeployNotFoundError, NotReadyError,
                                           ReplicaLimit, VariantSpec, VariantStatus, check_role, normalize_weights)
from control_plane.adapters.local_config import LocalConfig, default_max_replicas, engine_environment
from control_plane.adapters.router_config import RouterConfig
from control_plane.adapters.router import WeightedRouter
from control_plane.adapters.router_ports import RouterPorts

log = logging.getLogger(__name__)
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(slots=True)
class _Replica:
    proc: object
    port: int
    url: str
    log_path: Path


@dataclass(slots=True)
class _Variant:
    spec: VariantSpec
    replicas: list[_Replica]


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
    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._tmp = None
        if self.config.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sits-local-")
        self.workdir = Path(self.config.workdir or self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._services: dict[str, _Service] = {}
        self._ports = RouterPorts(self.config.router_state)
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=self.config.probe_timeout_s, trust_env=False)
        self.pin_token = self.config.pin_token or secrets.token_urlsafe(24)
        self.max_replicas = self.config.max_replicas or default_max_replicas()
        self._start_batch = self.config.start_batch or len(os.sched_getaffinity(0))
        self._closing = threading.Event()   # set by close(): deploys in progress stop starting and waiting
        self._starting = 0                  # replicas being started now (counted against max_replicas)
        atexit.register(_close_ref, weakref.ref(self))

    # ---- Deployer protocol ----
    def deploy(self, spec: VariantSpec) -> None:
        svc = self._service(spec.service, create=True)
        with svc.role_locks[spec.role]:
            cur = svc.variants.get(spec.role)
            if cur is not None and cur.spec == spec and all(r.proc.poll() is None for r in cur.replicas):
                return  # already as desired
            self._reserve(spec)
            try:
                new = self._start_replicas(spec)  # raises (and cleans up) if they never get ready or on close()
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
        return {role: self._variant_status(role, v, weights.get(role, 0)) for role, v in variants.items()}

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
        self._closing.set()

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
        self._http.close()
        self._closing.clear()   # usable again (a later deploy starts afresh)

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
            router = WeightedRouter(RouterConfig(service=name, host=self.config.host, port=attempt,
                                                 pin_token=self.pin_token, pin_sources=tuple(self.config.pin_sources)))
            try:
                router.start()
            except OSError as e:   # taken by another process meanwhile: a new port (and URL) beats no service
                log.warning("service %s: router port %d unavailable (%s); taking a free one", name, attempt, e)
                continue
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

    def _start_replicas(self, spec: VariantSpec) -> list[_Replica]:
        started: list[_Replica] = []
        try:
            for first in range(0, spec.replicas, self._start_batch):   # bounded batches: start some, wait, repeat
                batch = []
                for i in range(first, min(spec.replicas, first + self._start_batch)):
                    self._check_closing(spec)
                    batch.append(self._start_one(spec, i))
                    started.append(batch[-1])
                started_at = time.monotonic()
                for r in batch:
                    self._wait_ready(spec, r, started_at)
        except BaseException:
            for r in started:
                process.stop(r.proc, self.config.stop_timeout_s)
            raise
        return started

    def _start_one(self, spec: VariantSpec, index: int) -> _Replica:
        port = process.free_port(self.config.host)
        log_path = self.workdir / f"{spec.service}-{spec.role}-{index}-{port}.log"
        argv = [*self.config.engine_command, *spec.engine_args(port=port, host=self.config.host)]
        env = engine_environment(os.environ, self.config.env, spec.env, {"PYTHONUNBUFFERED": "1"})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        if self.config.cpu_threads is not None:
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS"):
                env[k] = str(self.config.cpu_threads)
        log_path.write_text(f"$ {' '.join(argv)}\n")
        proc = process.spawn(argv, log_path=log_path, env=env, cwd=str(self.workdir))
        return _Replica(proc, port, f"http://{self.config.host}:{port}", log_path)

    def _check_closing(self, spec: VariantSpec) -> None:
        if self._closing.is_set():
            raise DeployCancelled(f"{spec.service}/{spec.role}: deploy cancelled (the deployer is shutting down)")

    def _wait_ready(self, spec: VariantSpec, r: _Replica, started_at: float) -> None:
        """Until r answers /readyz; NotReadyError (its engine's last log line in it) once it exits or the spec's
        readiness deadline (else LocalConfig.ready_timeout_s) has passed since its batch started."""
        limit = spec.ready_timeout_s or self.config.ready_timeout_s
        while True:
            self._check_closing(spec)
            rc = r.proc.poll()
            if rc is not None or time.monotonic() - started_at > limit:
                waited = time.monotonic() - started_at
                line = last_line(r.log_path)
                why = (f"engine exited with code {rc} before it was ready" if rc is not None
                       else f"engine not ready after {limit:g} s")
                raise NotReadyError(f"{spec.service}/{spec.role}: {why}; its last log line: {line or '(none)'}\n"
                                    f"log {r.log_path}:\n{_tail(r.log_path)}", waited_s=waited, last_line=line,
                                    exit_code=rc)
            if self._readyz(r.url):
                return
            self._closing.wait(0.1)

    def _readyz(self, url: str) -> bool:
        if self._http.is_closed:  # used again after close()
            self._http = httpx.Client(timeout=self.config.probe_timeout_s, trust_env=False)
        try:
            return self._http.get(url + "/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _stop_replicas(self, svc: _Service, role: str, replicas: list[_Replica]) -> None:
        # requests already in flight on the old replicas finish before they stop (bounded by drain_timeout_s)
        if svc.router.in_flight(role) and self.config.drain_timeout_s:
            process.wait_until(lambda: svc.router.in_flight(role) == 0, self.config.drain_timeout_s)
        for r in replicas:
            process.stop(r.proc, self.config.stop_timeout_s)

    def _variant_status(self, role: str, v: _Variant, weight: int) -> VariantStatus:
        ready_n, exited, problems = 0, 0, []
        for i, r in enumerate(v.replicas):
            rc = r.proc.poll()
            if rc is not None:
                exited += 1
                problems.append(f"replica {i} (pid {r.proc.pid}) exited with code {rc}; "
                                f"log {r.log_path}:\n{_tail(r.log_path, 800)}")
            elif self._readyz(r.url):
                ready_n += 1
            else:
                problems.append(f"replica {i} at {r.url} not ready (/readyz)")
        want = len(v.replicas)
        msg = f"{ready_n}/{want} ready; weight {weight}%; kernels {v.spec.kernels}"
        if problems:
            msg += "; " + "; ".join(problems)
        return VariantStatus(role=role, ready=want > 0 and ready_n == want, replicas=want, ready_replicas=ready_n,
                             endpoint=v.replicas[0].url if v.replicas else None, message=msg,
                             endpoints=tuple(r.url for r in v.replicas), crashing=exited > 0)


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-empty line of a replica's log (what its engine said last), at most `limit` characters."""
    lines = [x.strip() for x in _tail(path, 8192).splitlines() if x.strip()]
    return lines[-1][:limit] if lines else ""


def _close_ref(ref) -> None:
    d = ref()
    if d is not None:
        try:
            d.close()
        except Exception:  # interpreter shutdown: PDEATHSIG still reaps the children
            pass
