"""`helm install sits-control` into the test cluster and SITS working through it, end to end.

The chart's control-plane pod runs on the test node agent (tests/fixtures/node_agent.py, a kubelet test double) with
in-cluster credentials (the mounted ServiceAccount token and CA, KUBERNETES_SERVICE_HOST/PORT) under the chart's
namespace-scoped Role and its store on a PVC (bound by the real PV controller to a hostPath PV: there is no
provisioner here). Through its API, canaries of real kernel sets run as engine pods; a real Prometheus scrapes them
with the documented relabelling (its discovery is the file_sd stand-in, refreshed from the API's pods) and is the
control plane's PromQL metrics source; load spreads over the shared Service's ready endpoints as kube-proxy does.
Faults: an engine pod that crash-loops, the control-plane pod deleted mid-rollout."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import threading
import time
import urllib.request

import pytest
import yaml
from kubernetes import client, dynamic

from tests.cluster.helm_support import (CP, REL, STORAGE_CLASS, SVC, VALUES, Load, Release, container_states,
                                        diagnose, pv_for, refresh_targets)
from tests.cluster.support import pid_alive
from tests.waiting import wait_for
from tests.fixtures.kube_proxy import ServiceLoadBalancer
from tests.fixtures.node_agent import managed_namespace
from tests.fixtures.prometheus import PrometheusServer, as_file_sd, documented_kubernetes_jobs
from tests.helm.support import CHART

@pytest.fixture(scope="module")
def release(kube_cluster, node_agent, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("helm-e2e")
    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    with managed_namespace(kube_cluster, node_agent, "helm") as ns:
        pv = f"sits-store-{ns}"
        core.create_persistent_volume(pv_for(pv, tmp / "store", ns))
        targets, stop = tmp / "targets.json", threading.Event()
        targets.write_text("[]")
        refresher = threading.Thread(target=refresh_targets, args=(core, ns, targets, stop), daemon=True)
        refresher.start()
        prom = PrometheusServer.start(tmp / "prom", scrape_configs=as_file_sd(documented_kubernetes_jobs(), targets),
                                      scrape_interval="500ms")
        token = secrets.token_urlsafe(32)
        r = Release(ns, tmp / "helm-home", token, "", prom, tmp / "store", api, kubeconfig=kube_cluster.kubeconfig,
                    agent=node_agent)
        try:
            out = r.helm("install", REL, str(CHART), "-f", str(VALUES),
                         "--set", f"metrics.prometheus.url={prom.url}",
                         "--set", f"persistence.storageClass={STORAGE_CLASS}",
                         "--set", "auth.users[0].name=ops,auth.users[0].role=operator",
                         "--set", f"auth.users[0].token_sha256={hashlib.sha256(token.encode()).hexdigest()}")
            r.notes = out.stdout
            try:
                wait_for("the control-plane pod Ready", r.control_pod, timeout=120, interval=0.5)
            except TimeoutError as e:
                raise AssertionError(f"{e}\n{diagnose(core, node_agent, ns)}") from None
            yield r
        finally:
            stop.set()
            refresher.join(10)
            prom.stop()
            r.helm("uninstall", REL, check=False)
            with_pids = [w for w in list(node_agent.workers.values()) if w.namespace == ns]
            pids = [pid for w in with_pids for pid in w.pids()]
    # managed_namespace has deleted the namespace and stopped its pods: no process may outlive the module
    with contextlib.suppress(Exception):
        core.delete_persistent_volume(pv)
    wait_for("every pod process of the module gone", lambda: not [p for p in pids if pid_alive(p)], timeout=20)


@pytest.fixture(scope="module")
def load(release):
    """Traffic through the shared Service `chat` (replica-ratio split) and, on its own, through production's Service:
    production must serve throughout. Started once the first rollout has deployed production."""
    loads: list[Load] = []
    yield loads
    for lo in loads:
        lo.stop.set()
    for lo in loads:
        lo.join(60)


def _start_load(release, load) -> None:
    if load:
        return
    wait_for("production serving", lambda: release.roles() >= {"production"} and ServiceLoadBalancer(
        release.api_client, release.ns, f"{SVC}-production").endpoints(), timeout=180, interval=0.5)
    load += [Load(release.api_client, release.ns, SVC, seed, rate=2.5) for seed in range(1, 13)]
    load.append(Load(release.api_client, release.ns, f"{SVC}-production", 13, rate=2))
    for lo in load:
        lo.start()


def _assert_production_served(release, load) -> None:
    prod = load[-1]
    assert prod.ok > 0
    # an endpoint's pod may be replaced (promotion) between the load's endpoint read (every 0.5 s) and its
    # connection, as with kube-proxy: a refused connection there is allowed, an HTTP error never
    assert not [f for f in prod.failures if f[2].startswith("HTTP")], prod.failures
    assert len(prod.failures) <= 3, (prod.failures, diagnose(release.core, release.agent, release.ns))


def test_install_runs_the_control_plane_in_cluster(release, node_agent, kube_cluster):
    ns = release.ns
    pod = release.control_pod()
    # the store's claim is bound to the hostPath PV by the real PV controller, and mounted at /data
    pvc = release.core.read_namespaced_persistent_volume_claim(CP, ns)
    assert pvc.status.phase == "Bound" and pvc.spec.volume_name == f"sits-store-{ns}"
    # in-cluster config: no kubeconfig anywhere, the mounted ServiceAccount token and CA, the `kubernetes` Service env
    w = node_agent.worker(ns, pod.metadata.name)
    env = w.containers[0].env
    host, port = kube_cluster.server.removeprefix("https://").rsplit(":", 1)
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (host, port) and "KUBECONFIG" not in env
    assert pod.spec.service_account_name == CP and any(
        m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount" for m in pod.spec.containers[0].volume_mounts)
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(release.url(path), timeout=10) as r:
            assert r.status == 200
    assert release.api("GET", "/api/v1/rollouts", token=None)[0] == 401
    assert release.api("GET", "/api/v1/rollouts", token="not-the-token")[0] == 401
    assert release.api("GET", "/api/v1/rollouts") == (200, {"rollouts": [], "total": 0, "limit": 50, "offset": 0})
    # NOTES say how to reach it and how to send the token
    assert f"port-forward svc/{CP} 8080:8080" in release.notes and "Authorization: Bearer" in release.notes
    assert f"metrics: prometheus from {release.prom.url}" in release.notes


def test_helm_test_passes(release, node_agent):
    out = release.helm("test", REL, "--timeout", "3m")
    assert "Phase:          Succeeded" in out.stdout, out.stdout
    log = node_agent.logs(release.ns, f"{CP}-test-readyz")
    # the hook pod reached the control plane by its Service's DNS name (cluster DNS + kube-proxy stand-ins)
    assert f"http://{CP}.{release.ns}.svc:8080/readyz 200" in log, log


def _checks(release, rid) -> list[dict]:
    return release.api("GET", f"/api/v1/rollouts/{rid}/checks")[1]["checks"]


def test_slow_canary_rolled_back_by_promql_analysis(release, load):
    # declared as a KernelRollout (the chart's CRD; the control plane watches it with deployer.watchCrds)
    kr = client.CustomObjectsApi(release.api_client)
    kr.create_namespaced_custom_object("sits.dev", "v1alpha1", release.ns, "kernelrollouts", {
        "apiVersion": "sits.dev/v1alpha1", "kind": "KernelRollout", "metadata": {"name": "chat-slow"},
        "spec": {"service": SVC, "kernels": "torch-slow-attn", "productionKernels": "torch"}})

    def kr_status():
        return kr.get_namespaced_custom_object("sits.dev", "v1alpha1", release.ns, "kernelrollouts",
                                               "chat-slow").get("status") or {}
    rid = wait_for("the KernelRollout's rollout", lambda: kr_status().get("rolloutId"), timeout=60, interval=0.5)
    _start_load(release, load)
    # the control plane (in-cluster, the chart's Role) made production, baseline and canary Deployments
    wait_for("three variants", lambda: release.roles() == {"production", "baseline", "canary"}, timeout=120)
    r = release.finish(rid)
    events = [e["message"][:300] for e in release.events(rid)]
    assert r["phase"] == "rolled_back", "\n".join(events)
    checks = _checks(release, rid)
    # the gate first (same answers: it passes), then the latency checks on Prometheus' data roll it back
    gate = checks[0]
    assert gate["source"] == "correctness" and gate["verdict"]["correctness"]["outcome"] == "pass", gate["verdict"]
    assert {c["source"] for c in checks[1:]} == {"prometheus"}
    last = checks[-1]
    assert last["decision"] == "rollback"
    p90 = next(x for x in last["verdict"]["results"] if x["check"] == "http_request_duration_seconds:p90")
    # sequential statistics: the sequence's lower bound cleared the ship boundary
    assert p90["outcome"] == "fail" and p90["ci_low"] > p90["ship"] and p90["canary"] > p90["target"], p90
    # the queries the analysis ran are PromQL over the relabelled pod labels
    assert any('env="canary"' in q for q in last["queries"].values())
    # the canary pod is gone (its series are stale now): what Prometheus scraped over the last minutes
    series = release.prom.query(f'count by (env, kernel_version) (count_over_time(http_request_duration_seconds_count'
                                f'{{namespace="{release.ns}",service="{SVC}"}}[5m]))')
    assert ("canary", "torch-slow-attn") in {(s["metric"]["env"], s["metric"]["kernel_version"]) for s in series}
    # rolled back: baseline and canary gone, production torch serving
    assert wait_for("canary and baseline removed", lambda: release.roles() == {"production"}, timeout=30)
    spec = json.loads(release.apps.read_namespaced_deployment(f"{SVC}-production", release.ns)
                      .metadata.annotations["sits.io/spec"])
    assert spec["kernels"] == "torch"
    _assert_production_served(release, load)
    # the resource shows it: rolled back by a failed check, Degraded, and keeps that status
    st = wait_for("the KernelRollout's final status", lambda: (s := kr_status()).get("phase") == "rolled_back" and s,
                  timeout=30, interval=0.5)
    assert st["rolloutId"] == rid and st["lastCheck"]["verdict"] == "fail" and st["checks"] == len(checks)
    assert {c["type"]: c["status"] for c in st["conditions"]} == {"Progressing": "False", "Completed": "True",
                                                                    "Degraded": "True"}
    kr.delete_namespaced_custom_object("sits.dev", "v1alpha1", release.ns, "kernelrollouts", "chat-slow")


def _engine_container(node_agent, ns, role):
    pods = [w for w in list(node_agent.workers.values()) if w.namespace == ns
            and w.pod["metadata"]["labels"].get("sits.io/role") == role and not w.finished]
    return pods[0] if pods else None


def test_crashing_canary_engine_rolled_back_within_30s(release, load, node_agent):
    rid = release.start("torch")
    _start_load(release, load)
    wait_for("traffic on the canary", lambda: release.rollout(rid)["phase"] == "progressing", timeout=180, interval=1)
    pod = _engine_container(node_agent, release.ns, "canary")
    crashed_at = time.time()
    t0 = time.monotonic()
    # the engine crashes each time it comes up (SIGKILL from outside, as an OOM kill would): restartCount grows
    stop = threading.Event()

    def crash_loop():
        while not stop.is_set():
            for pid in pod.pids():
                os.kill(pid, 9)
            stop.wait(0.2)
    killer = threading.Thread(target=crash_loop, daemon=True)
    killer.start()
    try:
        # the bound: 30 s from the first crash by the test's monotonic clock (wait_for), or this fails
        wait_for("rollback of the crashing canary", lambda: release.rollout(rid)["phase"]
                 in ("rolling_back", "rolled_back"), timeout=30 - (time.monotonic() - t0), interval=0.5)
    finally:
        stop.set()
        killer.join()
    cs = pod.containers[0]
    assert cs.restart_count >= 1 and cs.last_terminated["exitCode"] == 137   # SIGKILLed, restarted by the agent
    end = release.finish(rid)
    assert end["phase"] == "rolled_back", release.events_text(rid)
    # why, in the control plane's evidence: the crash guard (Kubernetes pod status read through the Role)
    decisive = next(c for c in _checks(release, rid) if c["decision"] == "rollback")
    assert decisive["verdict"]["guard"] == "crashing", decisive["verdict"]["reason"]
    back = next(e for e in release.events(rid) if e["phase"] == "rolling_back")
    assert 0 <= back["at"] - crashed_at <= 30, back   # the control plane's own event time agrees
    assert wait_for("canary and baseline removed", lambda: release.roles() == {"production"}, timeout=30)
    _assert_production_served(release, load)


def _proc_state(pid: int) -> str:
    """pid, state, what it waits in (wchan) and its command line, from /proc."""
    try:
        state = next(ln.split(":", 1)[1].strip() for ln in open(f"/proc/{pid}/status") if ln.startswith("State:"))
        wchan = open(f"/proc/{pid}/wchan").read().strip()
        argv = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
        return f"{pid} {state} wchan={wchan} {argv}"
    except OSError as e:
        return f"{pid}: {e}"


def _pods_now(release, node_agent) -> str:
    """The control plane's pods as the API server has them (phase, Ready, being deleted) with each one's last log
    line: the evidence a stuck restart leaves."""
    out = []
    for p in release.core.list_namespaced_pod(release.ns, label_selector="app.kubernetes.io/name=sits-control").items:
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        log = node_agent.logs(release.ns, p.metadata.name).strip().splitlines()
        w = node_agent.worker(release.ns, p.metadata.name)
        procs = [_proc_state(pid) for pid in (w.pids() if w is not None else [])]
        out.append(f"{p.metadata.name}: {p.status.phase}, ready={ready}, "
                   f"deleting={p.metadata.deletion_timestamp is not None}, containers: {container_states(p)}, "
                   f"processes: {procs}, last log: {log[-1][:300] if log else '-'}")
    return "; ".join(out) or "no control-plane pod"


def test_good_canary_promoted_across_a_control_plane_pod_deleted_mid_rollout(release, load, node_agent):
    """The good set (production's own kernels): promoted, although the control-plane pod is deleted after its first
    check; the Deployment's new pod opens the same store on the PV and drives the rollout on from there."""
    rid = release.start("torch")
    _start_load(release, load)
    before = wait_for("a check at 25 %", lambda: (r := release.rollout(rid))["checks"] >= 2 and r, timeout=180,
                      interval=1)   # the gate's check, then a first latency check
    assert before["phase"] == "progressing" and before["weight"] == 25
    old = release.control_pod()
    old_pids = node_agent.worker(release.ns, old.metadata.name).pids()
    deleted_at = time.time()
    release.core.delete_namespaced_pod(old.metadata.name, release.ns)
    def new_pod():
        p = release.control_pod()
        if p is not None and p.metadata.name != old.metadata.name:
            return p
        raise LookupError(_pods_now(release, node_agent))   # what a timeout reports: where every pod stands
    new = wait_for("the Deployment's new pod Ready", new_pod, timeout=120, interval=0.5)
    assert not [p for p in old_pids if pid_alive(p)]
    end = release.finish(rid)
    assert end["phase"] == "succeeded", release.events_text(rid)
    # the same rollout, its checks numbered on: the old pod's kept, the new pod's from the stored state onwards
    checks = _checks(release, rid)
    assert [c["seq"] for c in checks] == list(range(1, len(checks) + 1))
    assert [c["seq"] for c in checks if c["at"] < deleted_at] == list(range(1, before["checks"] + 1))
    assert any(c["at"] > deleted_at for c in checks) and checks[-1]["decision"] == "promote"
    assert "store /data/sits.db" in node_agent.logs(release.ns, new.metadata.name)
    assert (release.store_dir / "sits.db").exists()   # on the PV's hostPath, outside either pod
    # promoted: production runs the canary's spec, baseline and canary are gone
    assert wait_for("canary and baseline removed", lambda: release.roles() == {"production"}, timeout=30)
    _assert_production_served(release, load)


def test_uninstall_removes_what_the_chart_made(release, load, node_agent):
    manifest = release.helm("get", "manifest", REL).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    cp_pids = node_agent.worker(release.ns, release.control_pod().metadata.name).pids()
    release.helm("uninstall", REL)
    dyn = dynamic.DynamicClient(release.api_client)

    def exists(d):
        try:
            dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"]).get(
                name=d["metadata"]["name"], namespace=d["metadata"].get("namespace"))
            return True
        except dynamic.exceptions.NotFoundError:
            return False
    wait_for("every object of the chart gone", lambda: not [d for d in docs if exists(d)], timeout=60)
    left = [p.metadata.name for p in release.core.list_namespaced_pod(release.ns).items
            if p.metadata.name.startswith(CP)]
    assert not left   # the control-plane pod and the `helm test` hook pod too
    wait_for("the control plane's processes gone", lambda: not [p for p in cp_pids if pid_alive(p)], timeout=30)
    # what the deployer made: baseline and canary went with their rollouts; production is the service's, it stays
    assert release.roles() == {"production"}
    _assert_production_served(release, load)
