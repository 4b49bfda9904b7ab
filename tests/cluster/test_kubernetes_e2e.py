"""The SITS Kubernetes deployer end to end: its Deployments' engine pods really run (tests/fixtures/node_agent.py, a
kubelet test double), readiness comes from real pod status through the real controllers, traffic spreads over the
Service's ready endpoints as kube-proxy would, a real Prometheus scrapes the pods with the documented relabelling, and
the deployer runs in-cluster on a mounted ServiceAccount token under a namespace-scoped Role."""
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kubernetes import client

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer
from tests.waiting import wait_for
from tests.fixtures.kube_proxy import ServiceLoadBalancer
from tests.fixtures.node_agent import managed_namespace
from tests.fixtures.prometheus import PrometheusServer, as_file_sd, documented_kubernetes_jobs, pod_sd_targets

SVC = "chat"
STUCK_ENGINE = Path(__file__).resolve().parent / "stuck_engine"   # a `sits-engine` that logs and never serves
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 2}


def spec(role, kernels="torch", **kw):
    return VariantSpec(service=SVC, role=role, kernels=kernels, image="registry.local/sits-engine:1", **kw)


def deployer(kube_cluster, ns, port) -> KubernetesDeployer:
    return KubernetesDeployer(KubernetesConfig(namespace=ns, kubeconfig=kube_cluster.kubeconfig, port=port,
                                               backoff_s=0.05))


@pytest.fixture(scope="module")
def core(kube_cluster):
    return client.CoreV1Api(kube_cluster.api_client())


@pytest.fixture(scope="module")
def three_variants(kube_cluster, node_agent, core):
    """production (2 replicas), baseline and canary deployed by the deployer, their pods run by the node agent,
    all Ready."""
    with managed_namespace(kube_cluster, node_agent, "e2e") as ns:
        port = process.free_port()
        kd = deployer(kube_cluster, ns, port)
        for role in ("production", "baseline", "canary"):
            kd.deploy(spec(role, replicas=2 if role == "production" else 1))
        status = wait_for("all three variants ready", lambda: (st := kd.status(SVC)) and len(st) == 3
                          and all(s.ready for s in st.values()) and st, timeout=90)
        yield ns, port, kd, status


def pods_by_role(core, ns) -> dict[str, list[client.V1Pod]]:
    out: dict[str, list] = {}
    for p in core.list_namespaced_pod(ns, label_selector="app=chat").items:
        out.setdefault(p.metadata.labels["sits.io/role"], []).append(p)
    return out


def test_readiness_comes_from_real_pod_status(three_variants, core, kube_cluster):
    ns, port, kd, status = three_variants
    pods = pods_by_role(core, ns)
    assert sorted(pods) == ["baseline", "canary", "production"]
    for role, st in status.items():
        n = 2 if role == "production" else 1
        assert st.ready and st.ready_replicas == n and f"{n}/{n} ready" in st.message
        assert len(pods[role]) == n
        for p in pods[role]:
            assert p.spec.node_name == "local-0" and p.status.phase == "Running"
            cs = p.status.container_statuses[0]
            assert cs.ready and cs.restart_count == 0 and cs.image == "registry.local/sits-engine:1"
        # the deployer's own per-variant Service resolves to exactly these pods (the real EndpointSlice controller,
        # which writes its slices a moment after the pods turn ready)
        want, lb = sorted((p.status.pod_ip, port) for p in pods[role]), \
            ServiceLoadBalancer(kube_cluster.api_client(), ns, f"{SVC}-{role}")
        wait_for(f"the {role} Service's endpoints to be its {n} pods", lambda: lb.endpoints() == want, timeout=30,
                 interval=0.2)
    # every Deployment status was written by the deployment controller from these pods: none was patched here
    apps = client.AppsV1Api(kube_cluster.api_client())
    for d in apps.list_namespaced_deployment(ns).items:
        assert d.status.ready_replicas == d.spec.replicas and d.status.observed_generation == d.metadata.generation


def test_the_shared_service_splits_traffic_by_replica_ratio(three_variants, core, kube_cluster):
    """Replica-ratio traffic as a cluster gives it: the shared Service selects every variant, each connection goes to
    a ready pod at random, so production (2 of 4 pods) gets ~50%, baseline and canary ~25% each."""
    ns, port, kd, _ = three_variants
    lb = ServiceLoadBalancer(kube_cluster.api_client(), ns, SVC, rng=random.Random(18))
    role_of = {p.status.pod_ip: role for role, ps in pods_by_role(core, ns).items() for p in ps}
    # the EndpointSlice controller catches up with the pods' readiness asynchronously
    assert wait_for("every pod in the Service's endpoints", lambda: sorted(ip for ip, _ in lb.endpoints()) == sorted(role_of))
    n = 200
    counts = lb.run(n, "/v1/models")
    assert all(set(c) == {200} for c in counts.values())
    assert set(counts) == set(role_of)   # every pod got traffic
    share = {r: sum(sum(c.values()) for ip, c in counts.items() if role_of[ip] == r) for r in ("production", "canary")}
    # binomial(200, 0.5) and (200, 0.25): mean +- 4 standard deviations (a false failure < 1e-4)
    assert 100 - 29 <= share["production"] <= 100 + 29, counts
    assert 50 - 25 <= share["canary"] <= 50 + 25, counts
    # a real completion through the Service, and each pod is the variant it claims (its metrics' env label)
    _, status, body = lb.request("/v1/completions", COMPLETION)
    assert status == 200 and json.loads(body)["choices"]
    for role in ("production", "baseline", "canary"):
        _, status, body = ServiceLoadBalancer(kube_cluster.api_client(), ns, f"{SVC}-{role}").request("/metrics")
        assert status == 200 and f'env="{role}"' in body.decode()


def test_prometheus_scrapes_the_pods_with_the_documented_relabelling(three_variants, core, kube_cluster, tmp_path):
    """The documented job's relabelling in a real Prometheus over the real pods. Its discovery step is stood in for:
    Debian's Prometheus has no kubernetes_sd_configs, so pod_sd_targets() writes the same targets (from the API's
    pods) to a file_sd file."""
    ns, port, kd, _ = three_variants
    jobs = documented_kubernetes_jobs()
    assert [sd["role"] for sd in jobs[0]["kubernetes_sd_configs"]] == ["pod"]
    pods = pods_by_role(core, ns)
    api = [core.api_client.sanitize_for_serialization(p) for p in core.list_namespaced_pod(ns).items]
    # a pod that is not SITS's must not be scraped (the keep rules)
    api.append({"metadata": {"namespace": ns, "name": "other", "uid": "u", "labels": {"app": "chat"},
                             "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {"containers": [{"name": "x", "ports": [{"name": "http", "containerPort": 9}]}]},
                "status": {"podIP": "127.0.1.250", "phase": "Running"}})
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(pod_sd_targets(api)))
    with PrometheusServer.start(tmp_path / "prom", scrape_configs=as_file_sd(jobs, targets),
                                scrape_interval="500ms") as prom:
        q = f'sum by (env, service, kernel_version, pod) (http_request_duration_seconds_count{{namespace="{ns}"}})'
        result = prom.wait_for(q, lambda r: len(r) == 4, timeout=45)
        got = {s["metric"]["pod"]: s["metric"] for s in result}
        assert got == {p.metadata.name: {"env": role, "service": SVC, "kernel_version": "torch",
                                         "pod": p.metadata.name} for role, ps in pods.items() for p in ps}
        up = prom.query(f'up{{job="sits-engines", namespace="{ns}"}}')
        assert sorted(s["metric"]["instance"] for s in up) == sorted(f"{p.status.pod_ip}:{port}"
                                                                     for ps in pods.values() for p in ps)
        assert not prom.query(f'count({{namespace="{ns}", exported_env!=""}})')


def test_a_crashing_canary_is_seen_crashing(kube_cluster, node_agent, core):
    with managed_namespace(kube_cluster, node_agent, "crash") as ns:
        kd = deployer(kube_cluster, ns, process.free_port())
        kd.deploy(spec("canary", kernels="no-such-kernel-set"))   # the engine exits at start: unknown kernel set
        st = wait_for("CrashLoopBackOff in the deployer's status",
                      lambda: (s := kd.status(SVC)["canary"]) and "CrashLoopBackOff" in s.message and s, timeout=60)
        assert not st.ready and st.ready_replicas == 0
        assert "restarted" in st.message and "last exit code 2 Error" in st.message
        pod = core.list_namespaced_pod(ns, label_selector="sits.io/role=canary").items[0]
        assert pod.status.container_statuses[0].restart_count >= 1
        assert "unknown kernel set 'no-such-kernel-set'" in node_agent.logs(ns, pod.metadata.name)
        # and what the engine said before it exited (the run that ended, while the container waits to restart)
        assert (f"; pod {pod.metadata.name} last log line: sits-engine serve: error: unknown kernel set "
                "'no-such-kernel-set'; known kernel sets: torch") in st.message


def test_a_canary_that_never_gets_ready_shows_its_engines_last_log_line(kube_cluster, node_agent, core):
    """An engine that logs and never serves (tests/cluster/stuck_engine): status() and replicas() read its pod's last
    log line through the API server's pods/log (the node agent's kubelet endpoint), without escapes or control
    characters."""
    with managed_namespace(kube_cluster, node_agent, "stuck") as ns:
        kd = deployer(kube_cluster, ns, process.free_port())
        kd.deploy(spec("production"))
        kd.deploy(spec("canary", env={"PATH": f"{STUCK_ENGINE}:/usr/bin:/bin"}))
        st = wait_for("production ready, the canary's last log line in the deployer's status",
                      lambda: (s := kd.status(SVC))["production"].ready
                      and s["canary"].message.endswith("loading weights 3/4") and s, timeout=120)
        pod = core.list_namespaced_pod(ns, label_selector="sits.io/role=canary").items[0].metadata.name
        assert not st["canary"].ready and not st["canary"].crashing
        assert st["canary"].message.startswith("0/1 ready")
        assert st["canary"].message.endswith(f"; pod {pod} last log line: loading weights 3/4")
        assert "\x1b[2K" in node_agent.logs(ns, pod)   # what the engine wrote, escapes and all
        assert st["production"].ready and "log line" not in st["production"].message   # not read for a ready one
        # replicas(): every pod with its readiness, restarts and the last line its engine logged (pods/log)
        reps = {r.role: r for r in kd.replicas(SVC)}
        assert reps["canary"].name == pod and not reps["canary"].ready and reps["canary"].restarts == 0
        assert reps["canary"].state == "running" and reps["canary"].last_log_line == "loading weights 3/4"
        assert reps["production"].ready and reps["production"].log_error == ""


IN_CLUSTER = textwrap.dedent("""
    import json, sys
    from sits.control_plane.adapters.deploy import DeployError, VariantSpec
    from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer
    kd = KubernetesDeployer(KubernetesConfig(namespace=sys.argv[1], port=int(sys.argv[2]), retries=1, backoff_s=0.05))
    out = {"host": kd.kube.api.configuration.host}
    kd.deploy(VariantSpec(service="chat", role="production", kernels="torch", replicas=0))
    out["status"] = {r: s.message for r, s in kd.status("chat").items()}
    try:
        kd.delete("chat", "production")
    except DeployError as e:
        out["error"] = str(e)
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_deployer_in_cluster_under_a_namespace_role_missing_a_verb(kube_cluster, node_agent, core):
    with managed_namespace(kube_cluster, node_agent, "incl") as ns:
        rbac = client.RbacAuthorizationV1Api(kube_cluster.api_client())
        core.create_namespaced_service_account(ns, {"metadata": {"name": "sits"}})
        rbac.create_namespaced_role(ns, {"metadata": {"name": "sits"}, "rules": [   # no "delete" on Deployments
            {"apiGroups": ["apps"], "resources": ["deployments"],
             "verbs": ["get", "list", "watch", "create", "update"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create", "update", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "sits"},
                                                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                             "name": "sits"},
                                                 "subjects": [{"kind": "ServiceAccount", "name": "sits",
                                                               "namespace": ns}]})
        wait_for("sits token", lambda: core.read_namespaced_service_account("sits", ns).secrets)
        core.create_namespaced_pod(ns, {"metadata": {"name": "deployer"}, "spec": {
            "serviceAccountName": "sits", "restartPolicy": "Never",
            "containers": [{"name": "deployer", "image": "registry.local/sits-control:1",
                            "command": ["python", "-c", IN_CLUSTER, ns, "8000"]}]}})
        wait_for("deployer pod finished", lambda: core.read_namespaced_pod("deployer", ns).status.phase
                 in ("Succeeded", "Failed"), timeout=60)
        logs = node_agent.logs(ns, "deployer")
        assert core.read_namespaced_pod("deployer", ns).status.phase == "Succeeded", logs   # no crash
        out = json.loads(logs.split("RESULT ", 1)[1])
        assert out["host"] == kube_cluster.server   # KUBERNETES_SERVICE_HOST/PORT of the pod
        assert out["status"] == {"production": "scaled to 0"}
        # the missing verb: a clear DeployError naming the verb, the object and the ServiceAccount
        assert "forbidden (403)" in out["error"] and "grant the SITS service account RBAC" in out["error"]
        assert f'User "system:serviceaccount:{ns}:sits" cannot delete resource "deployments"' in out["error"]
        # what the Role allows was really done with the mounted token
        apps = client.AppsV1Api(kube_cluster.api_client())
        assert apps.read_namespaced_deployment("chat-production", ns).spec.replicas == 0


@pytest.fixture(scope="module")
def worker_pod(kube_cluster, node_agent, core, tmp_path_factory):
    """`sits-control worker` itself in a pod (the sits-control image's entrypoint: no command given), in-cluster
    credentials, a Role without `create` on Deployments, and a rollout in its store (a hostPath volume)."""
    tmp = tmp_path_factory.mktemp("worker")
    with managed_namespace(kube_cluster, node_agent, "wrk") as ns:
        rbac = client.RbacAuthorizationV1Api(kube_cluster.api_client())
        core.create_namespaced_service_account(ns, {"metadata": {"name": "sits-control"}})
        rbac.create_namespaced_role(ns, {"metadata": {"name": "sits-control"}, "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"],
             "verbs": ["get", "list", "watch", "update", "delete"]},   # no create
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create", "update", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
        rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "sits-control"},
                                                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                             "name": "sits-control"},
                                                 "subjects": [{"kind": "ServiceAccount", "name": "sits-control",
                                                               "namespace": ns}]})
        wait_for("sits-control token", lambda: core.read_namespaced_service_account("sits-control", ns).secrets)
        store = tmp / "sits.db"
        cli = os.path.join(os.path.dirname(sys.executable), "sits-control")
        out = subprocess.run([cli, "rollout", "start", "--service", SVC, "--kernels", "torch", "--store", str(store)],
                             capture_output=True, text=True, check=True)
        rid = out.stdout.split()[1]
        core.create_namespaced_pod(ns, {"metadata": {"name": "worker"}, "spec": {
            "serviceAccountName": "sits-control",
            "volumes": [{"name": "store", "hostPath": {"path": str(tmp)}}],
            "containers": [{"name": "worker", "image": "registry.local/sits-control:1",
                            "args": ["worker", "--deployer", "kubernetes", "--namespace", ns,
                                     "--store", "/data/sits.db", "--interval", "0.5"],
                            "volumeMounts": [{"name": "store", "mountPath": "/data"}]}]}})
        wait_for("the worker hit the missing verb", lambda: "forbidden (403)" in node_agent.logs(ns, "worker"))
        yield ns, rid, store, cli


def test_worker_in_cluster_says_which_verb_is_missing_and_keeps_running(worker_pod, core, node_agent):
    ns, rid, store, cli = worker_pod
    log = node_agent.logs(ns, "worker")
    assert "worker: store /data/sits.db" in log
    assert ('apply Deployment chat-production: forbidden (403) in namespace ' + ns + ': grant the SITS service '
            'account RBAC') in log
    assert f'User "system:serviceaccount:{ns}:sits-control" cannot create resource "deployments"' in log
    def failed_actions():
        show = subprocess.run([cli, "rollout", "show", rid, "--json", "--store", str(store)], capture_output=True,
                              text=True, check=True)
        return [a for a in json.loads(show.stdout)["actions"] if a["status"] == "failed"]
    assert wait_for("the failed deploy recorded", failed_actions, timeout=60)   # handled, not a crash
    st = core.read_namespaced_pod("worker", ns).status
    assert st.phase == "Running" and st.container_statuses[0].ready
    assert st.container_statuses[0].restart_count == 0   # no crash loop


def test_worker_in_cluster_records_the_missing_verb_on_the_rollout(worker_pod):
    ns, rid, store, cli = worker_pod
    show = subprocess.run([cli, "rollout", "show", rid, "--json", "--store", str(store)], capture_output=True,
                          text=True, check=True)
    doc = json.loads(show.stdout)
    errors = [a["error"] or "" for a in doc["actions"] if a["status"] == "failed"]
    assert any("cannot create resource \"deployments\"" in e for e in errors), doc["actions"]


def test_a_plugin_set_reaches_the_canary_pod_through_its_image_environment(kube_cluster, node_agent, core):
    """docs/kernels.md, "On Kubernetes": the plugin travels in the canary's image, whose ENV names the module
    (SITS_KERNEL_PLUGINS) and puts it on PYTHONPATH; a rollout's env may not set either. The node agent runs the
    installed engine for every image, so the image's ENV is the pod's env here. The canary pod serves the plugin set
    (tests/fixtures/wrong_kernels.py), its warm-up measured the op it changes, and the correctness gate's judgement
    against production's pod fails it naming that op."""
    from sits.control_plane.analysis import Outcome
    from sits.control_plane.analysis.conformance import judge
    from sits.control_plane.analysis.gate_policy import ConformancePolicy
    image_env = {"SITS_KERNEL_PLUGINS": "tests.fixtures.wrong_kernels",
                 "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with managed_namespace(kube_cluster, node_agent, "plugin") as ns:
        kd = deployer(kube_cluster, ns, process.free_port())
        kd.deploy(spec("production"))
        kd.deploy(spec("canary", kernels="bug-softmax-scale", env=image_env))
        wait_for("production and the plugin canary ready", lambda: (s := kd.status(SVC)) and len(s) == 2
                 and all(v.ready for v in s.values()), timeout=120)
        reports = {}
        for role in ("production", "canary"):
            lb = ServiceLoadBalancer(kube_cluster.api_client(), ns, f"{SVC}-{role}")
            wait_for(f"the {role} pod in its Service's endpoints", lb.endpoints)
            _, status, body = lb.request("/conformance")
            assert status == 200, body[:300]
            reports[role] = json.loads(body)
        assert reports["canary"]["kernel_set"] == "bug-softmax-scale"
        assert reports["canary"]["measured_ops"] == ["paged_decode_attention"]
        v = judge(reports["canary"], reports["production"], ConformancePolicy())
        assert v.outcome is Outcome.FAIL and v.judged_ops == ("paged_decode_attention",), v.reason
