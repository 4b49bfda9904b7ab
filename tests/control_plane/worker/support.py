"""In-memory Deployer and a deterministic MetricsSource for the worker's state-machine tests (the project's style for
those: in-memory deployer, canned observations, frozen clock). End-to-end tests use the real LocalDeployer."""
from __future__ import annotations

import dataclasses
import threading
import time

from sits.control_plane.adapters.deploy import (DeployCancelled, DeployError, DeployNotFoundError, NotReadyError,
                                           ReplicaLimit, ReplicaStatus, VariantSpec, VariantStatus, normalize_weights)
from sits.control_plane.adapters.metrics import MetricsWindow, NoDataError
from sits.control_plane.analysis import REQUEST_LATENCY, HistogramSnapshot, VariantData
from sits.wire.buckets import LATENCY_BUCKETS
from tests.control_plane.helpers import lat

KEY = REQUEST_LATENCY + '{route="/v1/completions"}'


class InMemoryDeployer:
    """The Deployer protocol over a dict; every call is logged. `gates[service]` (an Event) blocks deploy() of that
    service until set; `fail[(service, role)]` makes deploy() of that variant raise; `not_ready[(service, role)]`
    makes it raise NotReadyError with that last log line, as the local deployer does after the spec's deadline;
    `crash((service, role))` makes the deployed variant's replicas exit (not ready, crashing) until it is deployed
    again. `deploy_calls`: every spec deploy() was called with."""

    def __init__(self) -> None:
        self.services: dict[str, dict] = {}
        self.calls: list[tuple] = []
        self.gates: dict[str, threading.Event] = {}
        self.fail: set[tuple[str, str]] = set()
        self.not_ready: dict[tuple[str, str], str] = {}
        self.deploy_calls: list[VariantSpec] = []
        self.crashed: set[tuple[str, str]] = set()
        self.closed = False
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def _svc(self, service: str, create: bool = False) -> dict:
        if service not in self.services and not create:
            raise DeployNotFoundError(f"service {service!r} is not deployed")
        return self.services.setdefault(service, {"variants": {}, "weights": {}})

    def deploy(self, spec: VariantSpec, interrupted=None) -> None:
        gate = self.gates.get(spec.service)
        while gate is not None and not gate.wait(0.01) and not self._cancelled.is_set():
            pass
        if self._cancelled.is_set():   # like the local deployer: a deploy waiting for its engines stops
            raise DeployCancelled(f"{spec.service}/{spec.role}: deploy cancelled")
        with self._lock:
            self.deploy_calls.append(spec)
        if (spec.service, spec.role) in self.fail:
            raise DeployError(f"{spec.service}/{spec.role}: image pull failed (simulated)")
        if (line := self.not_ready.get((spec.service, spec.role))) is not None:
            raise NotReadyError(f"{spec.service}/{spec.role}: engine not ready after {spec.ready_timeout_s:g} s; its "
                                f"last log line: {line}\nlog (simulated)", waited_s=spec.ready_timeout_s,
                                last_line=line)
        with self._lock:
            self.calls.append(("deploy", spec.service, spec.role, spec.kernels, spec.args))
            svc = self._svc(spec.service, create=True)
            svc["variants"][spec.role] = spec
            self.crashed.discard((spec.service, spec.role))
            if spec.role == "production" and not any(svc["weights"].values()):
                svc["weights"] = {"production": 100}

    def set_weights(self, service, weights) -> None:
        w = normalize_weights(weights)
        with self._lock:
            svc = self._svc(service)
            missing = [r for r, v in w.items() if v > 0 and r not in svc["variants"]]
            if missing:
                raise DeployNotFoundError(f"service {service}: cannot give traffic to {missing}: not deployed")
            self.calls.append(("set_weights", service, tuple(sorted(w.items()))))
            svc["weights"] = w

    def status(self, service):
        with self._lock:
            svc = self.services.get(service)
            if svc is None:
                return {}
            return {role: self._status(service, role) for role in svc["variants"]}

    def _status(self, service, role) -> VariantStatus:
        url = f"mem://{service}/{role}"
        if (service, role) in self.crashed:
            return VariantStatus(role, False, 1, 0, url, "0/1 ready; replica 0 exited with code 1", (url,),
                                 crashing=True)
        return VariantStatus(role, True, 1, 1, url, "1/1 ready", (url,))

    def replicas(self, service) -> list[ReplicaStatus]:
        """One engine per deployed variant, as status() says it is; its last log line an access-log line."""
        status = self.status(service)
        return [ReplicaStatus(role, f"{role}-0", st.ready, 0, "running" if st.ready else "exited 1",
                              f'127.0.0.1 - "GET /readyz HTTP/1.1" {200 if st.ready else 503}', address=st.endpoint)
                for role in ("production", "baseline", "canary") if (st := status.get(role)) is not None]

    def crash(self, service, role) -> None:
        with self._lock:
            self._svc(service)["variants"][role]   # KeyError if not deployed
            self.crashed.add((service, role))

    def replica_limit(self):
        return ReplicaLimit(8, "the in-memory test deployer")

    def router_url(self, service):
        return f"mem://{service}" if service in self.services else None

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:   # like the local deployer: every variant stops with it
        self.cancel()
        with self._lock:
            self.closed = True
            self.services.clear()
        self._cancelled.clear()

    def weights(self, service) -> dict[str, int]:
        return {**{r: 0 for r in ("production", "baseline", "canary")}, **self._svc(service)["weights"]}

    def promote(self, service) -> None:
        with self._lock:
            self.calls.append(("promote", service))
            svc = self._svc(service)
            canary = svc["variants"].pop("canary", None)
            if canary is not None:
                svc["variants"]["production"] = VariantSpec(service, "production", canary.kernels, args=canary.args)
                self.crashed.discard((service, "production"))
            svc["variants"].pop("baseline", None)
            svc["weights"] = {"production": 100}

    def rollback(self, service) -> None:
        with self._lock:
            self.calls.append(("rollback", service))
            svc = self._svc(service)
            svc["weights"] = {"production": 100}
            svc["variants"].pop("canary", None)
            svc["variants"].pop("baseline", None)

    def delete(self, service, role=None) -> None:
        with self._lock:
            self.calls.append(("delete", service, role))
            if role is None:
                self.services.pop(service, None)
            elif service in self.services:
                self.services[service]["variants"].pop(role, None)


class CannedSource:
    """A stateless MetricsSource: the window [start, end] holds `rate` requests/s per variant, lognormal latencies,
    the canary's scaled by `scale[service]`. `delay[service]` seconds of sleep simulate a slow source."""
    name = "canned"

    def __init__(self, rate: float = 100.0, scale: dict | None = None, delay: dict | None = None) -> None:
        self.rate, self.scale, self.delay = rate, scale or {}, delay or {}
        self.calls = 0

    def window(self, service, targets, start, end, metrics=(REQUEST_LATENCY,), required=()):
        self.calls += 1
        time.sleep(self.delay.get(service, 0.0))
        missing = [r for r in required if r not in targets]
        if missing:
            raise NoDataError(f"no {missing}")
        if start is None:
            return MetricsWindow(None, end, {}, self.name, {})
        n = int(round((end - start) * self.rate))
        variants = {}
        for role in targets:
            s = self.scale.get(service, 1.0) if role == "canary" else 1.0
            h = lat(n, s, sigma=0.4, bounds=LATENCY_BUCKETS) if n else HistogramSnapshot.empty(
                LATENCY_BUCKETS)
            variants[role] = VariantData({KEY: h}, float(n), 0.0)
        return MetricsWindow(start, end, variants, self.name, {r: f"canned://{service}/{r}" for r in targets})

    def close(self) -> None:
        pass


class FixedEndpointDeployer(InMemoryDeployer):
    """InMemoryDeployer whose every variant reports one endpoint `url` (a real engine for both, or an address where
    nothing listens)."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url

    def status(self, service):
        return {role: dataclasses.replace(st, endpoint=self.url, endpoints=(self.url,))
                for role, st in super().status(service).items()}
