"""The helm end-to-end test's parts (tests/cluster/test_helm_e2e.py): the installed release and its API, load
through a Service the way kube-proxy spreads it, the hostPath PV that stands in for a provisioner, the file_sd
refresher that stands in for Prometheus' pod discovery."""
from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client

from tests.waiting import wait_for
from tests.fixtures.kube_proxy import NoEndpointsError, ServiceLoadBalancer
from tests.fixtures.prometheus import PrometheusServer, pod_sd_targets
from tests.helm.support import helm

VALUES = Path(__file__).resolve().parent / "helm-e2e-values.yaml"
REL, SVC, STORAGE_CLASS = "rel", "chat", "sits-test-hostpath"
CP = f"{REL}-sits-control"   # the chart's fullname
# a ~190-token prompt: the slow set's row-at-a-time prefill makes it several times slower than torch's (with the
# ~95-token half, the P90 delta was +70 % on a quiet machine, too close to the 35 % limit for comfort)
LOAD = {"model": "tiny", "max_tokens": 2, "prompt": 2 * ("Write a short paragraph that explains why the sky looks "
        "blue during the day and red at sunset. ")}
TERMINAL = ("succeeded", "rolled_back", "failed")
MAX_DURATION_S = yaml.safe_load(VALUES.read_text())["policy"]["max_duration_s"]


@dataclass
class Release:
    ns: str
    home: Path
    token: str
    notes: str
    prom: PrometheusServer
    store_dir: Path
    api_client: client.ApiClient
    kubeconfig: str
    agent: object   # the NodeAgent
    core: client.CoreV1Api = field(init=False)
    apps: client.AppsV1Api = field(init=False)

    def __post_init__(self):
        self.core, self.apps = client.CoreV1Api(self.api_client), client.AppsV1Api(self.api_client)

    def helm(self, *args, **kw):
        return helm(*args, "--namespace", self.ns, home=self.home, kubeconfig=self.kubeconfig, **kw)

    def control_pod(self) -> client.V1Pod | None:
        """The control plane's Running and Ready pod (None while there is none)."""
        for p in self.core.list_namespaced_pod(self.ns, label_selector="app.kubernetes.io/name=sits-control").items:
            if p.metadata.deletion_timestamp is None and p.status.phase == "Running" and any(
                    c.type == "Ready" and c.status == "True" for c in p.status.conditions or []):
                return p
        return None

    def url(self, path: str) -> str:
        return f"http://{self.control_pod().status.pod_ip}:8080{path}"

    def api(self, method: str, path: str, body: dict | None = None, token: str | None = "") -> tuple[int, dict]:
        """A call to the control plane's API at its pod IP (as the Service would reach it)."""
        headers = {"Content-Type": "application/json"}
        token = self.token if token == "" else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url(path), method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def rollout(self, rid: str) -> dict:
        status, body = self.api("GET", f"/api/v1/rollouts/{rid}")
        assert status == 200, body
        return body

    def events(self, rid: str) -> list[dict]:
        return self.api("GET", f"/api/v1/rollouts/{rid}/events")[1]["events"]

    def events_text(self, rid: str) -> str:
        """Every event of the rollout, one per line: what a failed assertion prints whole (a list's repr is cut short)."""
        return "rollout events:\n" + "\n".join(f"{e['at']:.1f} {e['message']}" for e in self.events(rid))

    def start(self, kernels: str) -> str:
        status, body = self.api("POST", "/api/v1/rollouts", {"service": SVC, "kernels": kernels,
                                                              "production_kernels": "torch"})
        assert status == 201, body
        return body["id"]

    def finish(self, rid: str, timeout: float = MAX_DURATION_S + 60) -> dict:
        """The rollout's final state. By default this waits past the policy's own bound (max_duration_s from the first
        traffic, then a promotion's deploy), so a rollout that cannot decide ends with the product's reason; a
        timeout here means the control plane stopped driving it, and the failure lists every event."""
        def done():
            with_pod = self.control_pod()   # None while the pod is replaced
            return with_pod and (r := self.rollout(rid))["phase"] in TERMINAL and r
        try:
            return wait_for(f"rollout {rid} to end", done, timeout=timeout, interval=1, error=TimeoutError)
        except TimeoutError as e:
            raise AssertionError(f"{e}; {self.events_text(rid)}") from None

    def roles(self) -> set[str]:
        return {d.metadata.labels["sits.io/role"] for d in self.apps.list_namespaced_deployment(
            self.ns, label_selector=f"app={SVC},app.kubernetes.io/managed-by=sits").items}


class Load(threading.Thread):
    """Completions through a Service, Poisson arrivals at `rate` per second per thread (as fast as answered, if
    slower), each on a new connection to a random ready endpoint. Many such threads give bursts, so requests meet in
    the engines' batches (where the slow set's per-sequence attention costs most), without starving 2 cores."""

    def __init__(self, api_client, ns: str, service: str, seed: int, rate: float):
        super().__init__(daemon=True, name=f"load-{service}-{seed}")
        self.lb = ServiceLoadBalancer(api_client, ns, service, rng=random.Random(seed), refresh_s=0.5)
        self.ok = 0
        self.failures: list[tuple[float, str, str]] = []   # (monotonic time, endpoint, what)
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.rate, self.rng = rate, random.Random(seed)

    def run(self):
        due = time.monotonic()
        while not self.stop.is_set():
            due = max(due + self.rng.expovariate(self.rate), time.monotonic() - 1.0)
            self.stop.wait(max(0.0, due - time.monotonic()))
            ip = "?"
            try:
                ip, port = self.lb.pick()
                status, _ = _post(ip, port)
            except NoEndpointsError as e:
                self.failures.append((time.monotonic(), "-", str(e)))
                self.stop.wait(0.5)
                continue
            except OSError as e:
                self.failures.append((time.monotonic(), ip, repr(e)))
                continue
            if status == 200:
                self.ok += 1
            else:
                self.failures.append((time.monotonic(), ip, f"HTTP {status}"))


def _post(ip: str, port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(ip, port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(LOAD).encode(),
                     headers={"Content-Type": "application/json", "Connection": "close"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def pv_for(name: str, path: Path, ns: str) -> dict:
    """A hostPath PersistentVolume reserved for the chart's claim (no provisioner here: this stands in)."""
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS,
                     "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": ns, "name": CP}}}


def refresh_targets(core, ns: str, path: Path, stop: threading.Event) -> None:
    """What kubernetes_sd_configs' pod watch gives Prometheus, from the API's pods (the file_sd stand-in)."""
    while not stop.is_set():
        try:
            pods = [core.api_client.sanitize_for_serialization(p) for p in core.list_namespaced_pod(ns).items]
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(pod_sd_targets(pods)))
            os.replace(tmp, path)
        except Exception:   # the apiserver briefly busy: the next round writes it
            pass
        stop.wait(0.5)


def container_states(pod) -> list[tuple]:
    """(name, ready, restarts, state, last terminated) of each container: how a stuck pod's containers stand."""
    return [(c.name, c.ready, c.restart_count, c.state.to_dict(),
             c.last_state.terminated.to_dict() if c.last_state and c.last_state.terminated else None)
            for c in pod.status.container_statuses or []]


def diagnose(core, node_agent, ns: str) -> str:
    out = []
    for p in core.list_namespaced_pod(ns).items:
        out.append(f"pod {p.metadata.name}: {p.status.phase} {p.spec.node_name} {container_states(p)} "
                   f"{[(c.type, c.status, c.message) for c in p.status.conditions or []]}\n"
                   f"{node_agent.logs(ns, p.metadata.name)[-3000:]}")
    return "\n".join(out) or "no pods"
