"""In-memory Deployer and a deterministic MetricsSource for the worker's state-machine tests (the project's style for
those: in-memory deployer, canned observations, frozen clock). End-to-end tests use the real LocalDeployer."""
from __future__ import annotations

import math
import threading
import time
from statistics import NormalDist

from control_plane.adapters.deploy import (DeployError, DeployNotFoundError, VariantSpec, VariantStatus,
                                           normalize_weights)
from control_plane.adapters.metrics import MetricsWindow, NoDataError
from control_plane.analysis import REQUEST_LATENCY, HistogramSnapshot, VariantData
from engine.buckets import LATENCY_BUCKETS

_Z = NormalDist()
KEY = REQUEST_LATENCY + '{route="/v1/completions"}'


def lognormal(n: int, median: float = 0.05, sigma: float = 0.4) -> HistogramSnapshot:
    """n observations on the normal quantile grid (deterministic), in the engine's bucket layout."""
    return HistogramSnapshot.from_values([median * math.exp(sigma * _Z.inv_cdf((i + 0.5) / n)) for i in range(n)],
                                         LATENCY_BUCKETS)


class InMemoryDeployer:
    """The Deployer protocol over a dict; every call is logged. `gates[service]` (an Event) blocks deploy() of that
    service until set; `fail[(service, role)]` makes deploy() of that variant raise."""

    def __init__(self) -> None:
        self.services: dict[str, dict] = {}
        self.calls: list[tuple] = []
        self.gates: dict[str, threading.Event] = {}
        self.fail: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _svc(self, service: str, create: bool = False) -> dict:
        if service not in self.services and not create:
            raise DeployNotFoundError(f"service {service!r} is not deployed")
        return self.services.setdefault(service, {"variants": {}, "weights": {}})

    def deploy(self, spec: VariantSpec) -> None:
        gate = self.gates.get(spec.service)
        if gate is not None:
            gate.wait()
        if (spec.service, spec.role) in self.fail:
            raise DeployError(f"{spec.service}/{spec.role}: image pull failed (simulated)")
        with self._lock:
            self.calls.append(("deploy", spec.service, spec.role, spec.kernels, spec.args))
            svc = self._svc(spec.service, create=True)
            svc["variants"][spec.role] = spec
            if spec.role == "production" and not any(svc["weights"].values()):
                svc["weights"] = {"production": 100}

    def set_weights(self, service, weights) -> None:
        w = normalize_weights(weights)
        with self._lock:
            self.calls.append(("set_weights", service, tuple(sorted(w.items()))))
            self._svc(service)["weights"] = w

    def status(self, service):
        with self._lock:
            svc = self.services.get(service)
            if svc is None:
                return {}
            return {role: VariantStatus(role, True, 1, 1, f"mem://{service}/{role}", "1/1 ready",
                                        (f"mem://{service}/{role}",)) for role in svc["variants"]}

    def promote(self, service) -> None:
        with self._lock:
            self.calls.append(("promote", service))
            svc = self._svc(service)
            canary = svc["variants"].pop("canary", None)
            if canary is not None:
                svc["variants"]["production"] = VariantSpec(service, "production", canary.kernels, args=canary.args)
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
            h = lognormal(n, 0.05 * s) if n else HistogramSnapshot.empty(LATENCY_BUCKETS)
            variants[role] = VariantData({KEY: h}, float(n), 0.0)
        return MetricsWindow(start, end, variants, self.name, {r: f"canned://{service}/{r}" for r in targets})

    def close(self) -> None:
        pass
