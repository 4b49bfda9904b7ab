"""KubernetesDeployer against a real kube-apiserver + etcd + kube-controller-manager (tests/fixtures/kube.py)."""
import threading
import time

import pytest
from kubernetes import client, watch

from sits.control_plane.adapters.deploy import DeployConflictError, DeployError, DeployNotFoundError, Deployer, VariantSpec
from sits.control_plane.adapters.deploy.kubernetes.manifests import deployment
from sits.control_plane.adapters.deploy.kubernetes.status import log_pod, pod_problems, pods_crashing
from sits.control_plane.adapters.deploy.log_line import last_log_line
from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer
from sits.wire.models import LOAD_FAILED
from tests.waiting import wait_for

SVC = "chat"


def spec(role, kernels="torch", **kw):
    return VariantSpec(service=SVC, role=role, kernels=kernels, image="registry.local/sits-engine:1", **kw)


@pytest.fixture
def apps(kube_cluster):
    return client.AppsV1Api(kube_cluster.api_client())


@pytest.fixture
def core(kube_cluster):
    return client.CoreV1Api(kube_cluster.api_client())


def make(kube_cluster, ns, **kw) -> KubernetesDeployer:
    return KubernetesDeployer(KubernetesConfig(namespace=ns, kubeconfig=kube_cluster.kubeconfig, backoff_s=0.02,
                                               **kw))


@pytest.fixture
def kd(kube_cluster, kube_namespace):
    return make(kube_cluster, kube_namespace)


def dep(apps, ns, role):
    return apps.read_namespaced_deployment(f"{SVC}-{role}", ns)


def names(apps, ns):
    return sorted(d.metadata.name for d in apps.list_namespaced_deployment(ns).items)


def mark_ready(kube_cluster, kd, ns, role, timeout=30.0):
    """Pods of the variant become Ready (kubelet's part, see make_pods_ready); the real controllers then set the
    Deployment status. Returns the deployer's status once it says ready."""
    def ready():
        kube_cluster.make_pods_ready(ns, f"app={SVC},sits.io/role={role}")
        st = kd.status(SVC)[role]
        return st if st.ready else None
    return wait_for(lambda: f"{role} ready: {kd.status(SVC)[role].message}", ready, timeout, 0.2)


def test_deploy_creates_labelled_deployment_and_services(kd, kube_namespace, apps, core):
    assert isinstance(kd, Deployer)
    ns = kube_namespace
    kd.deploy(spec("production", replicas=2, gpus=1, env={"HF_HOME": "/cache"}, args=("--max-num-seqs", "64")))
    d = dep(apps, ns, "production")
    assert d.metadata.labels["app"] == SVC and d.metadata.labels["sits.io/role"] == "production"
    assert d.metadata.labels["sits.io/kernel-version"] == "torch"
    assert d.spec.replicas == 2 and d.spec.selector.match_labels == {"app": SVC, "sits.io/role": "production"}
    t = d.spec.template
    assert t.metadata.annotations["prometheus.io/scrape"] == "true" and t.metadata.annotations["prometheus.io/port"] == "8000"
    c = t.spec.containers[0]
    assert c.image == "registry.local/sits-engine:1" and c.command == ["sits-engine"]
    assert c.args == ["serve", "--max-num-seqs", "64", "--model", "tiny", "--kernels", "torch", "--env", "production",
                      "--service", SVC, "--port", "8000", "--host", "0.0.0.0"]
    assert c.readiness_probe.http_get.path == "/readyz" and c.liveness_probe.http_get.path == "/healthz"
    assert c.resources.limits == {"nvidia.com/gpu": "1"}
    assert {e.name: e.value for e in c.env} == {"HF_HOME": "/cache"}
    per_variant = core.read_namespaced_service(f"{SVC}-production", ns)
    assert per_variant.spec.selector == {"app": SVC, "sits.io/role": "production"}
    assert core.read_namespaced_service(SVC, ns).spec.selector == {"app": SVC}  # replica-ratio: one Service
    # idempotent: the same spec again changes nothing. (Not resourceVersion: the deployment controller keeps writing
    # the status subresource meanwhile, which bumps it; spec writes bump metadata.generation, status writes don't.)
    gen = d.metadata.generation
    kd.deploy(spec("production", replicas=2, gpus=1, env={"HF_HOME": "/cache"}, args=("--max-num-seqs", "64")))
    again = dep(apps, ns, "production")
    assert again.metadata.generation == gen and again.spec.template == d.spec.template


def test_controller_manager_acts_on_the_deployment(kd, kube_namespace, kube_cluster):
    kd.deploy(spec("production"))
    rs = client.AppsV1Api(kube_cluster.api_client())
    w = watch.Watch()
    found = None
    for ev in w.stream(rs.list_namespaced_replica_set, kube_namespace, timeout_seconds=30):
        found = ev["object"]
        w.stop()
    assert found is not None and found.metadata.labels["sits.io/role"] == "production"


def test_update_and_status_from_deployment_status(kd, kube_namespace, apps, kube_cluster):
    ns = kube_namespace
    kd.deploy(spec("canary"))
    st = kd.status(SVC)["canary"]
    assert not st.ready and st.ready_replicas == 0 and st.endpoint == f"http://{SVC}-canary.{ns}.svc:8000"
    st = mark_ready(kube_cluster, kd, ns, "canary")
    assert st.ready and st.ready_replicas == 1, st.message
    gen = dep(apps, ns, "canary").metadata.generation
    kd.deploy(spec("canary", kernels="triton-v2"))  # a new kernel version: a new template, not ready until rolled
    d = dep(apps, ns, "canary")
    assert d.metadata.generation == gen + 1 and d.metadata.labels["sits.io/kernel-version"] == "triton-v2"
    assert "triton-v2" in d.spec.template.spec.containers[0].args
    assert not kd.status(SVC)["canary"].ready
    st = mark_ready(kube_cluster, kd, ns, "canary")
    assert st.ready and st.ready_replicas == 1, st.message


def test_replica_ratio_weights_scale_deployments(kd, kube_namespace, apps, core):
    ns = kube_namespace
    kd.deploy(spec("production", replicas=8))
    kd.deploy(spec("baseline"))
    kd.deploy(spec("canary", kernels="triton-v2"))
    kd.set_weights(SVC, {"production": 80, "baseline": 10, "canary": 10})
    reps = {r: dep(apps, ns, r).spec.replicas for r in ("production", "baseline", "canary")}
    assert reps == {"production": 6, "baseline": 1, "canary": 1}
    kd.set_weights(SVC, {"production": 50, "baseline": 25, "canary": 25})
    reps = {r: dep(apps, ns, r).spec.replicas for r in ("production", "baseline", "canary")}
    assert reps == {"production": 4, "baseline": 2, "canary": 2}
    assert dep(apps, ns, "canary").metadata.annotations["sits.io/weight"] == "25"
    # re-deploying a weighted variant keeps the replicas its weight asks for
    kd.deploy(spec("canary", kernels="triton-v3"))
    assert dep(apps, ns, "canary").spec.replicas == 2
    kd.set_weights(SVC, {"production": 100})
    reps = {r: dep(apps, ns, r).spec.replicas for r in ("production", "baseline", "canary")}
    assert reps == {"production": 8, "baseline": 0, "canary": 0}
    assert "scaled to 0" in kd.status(SVC)["canary"].message
    assert core.read_namespaced_service(SVC, ns).spec.selector == {"app": SVC}


def test_promote_moves_the_canary_spec_into_production(kd, kube_namespace, apps, core):
    ns = kube_namespace
    kd.deploy(spec("production", replicas=3))
    kd.deploy(spec("baseline"))
    kd.deploy(spec("canary", kernels="triton-v2", args=("--seed", "7")))
    kd.set_weights(SVC, {"production": 80, "baseline": 10, "canary": 10})
    kd.promote(SVC)
    assert names(apps, ns) == [f"{SVC}-production"]
    d = dep(apps, ns, "production")
    assert d.metadata.labels["sits.io/kernel-version"] == "triton-v2"
    args = d.spec.template.spec.containers[0].args
    assert args[args.index("--kernels") + 1] == "triton-v2" and args[args.index("--env") + 1] == "production"
    assert "--seed" in args and d.spec.replicas == 3
    assert sorted(s.metadata.name for s in core.list_namespaced_service(ns).items) == [SVC, f"{SVC}-production"]
    kd.promote(SVC)  # idempotent
    assert names(apps, ns) == [f"{SVC}-production"]
    assert set(kd.status(SVC)) == {"production"}


def _watch_deployment_events(apps, ns, name, events, stop):
    w = watch.Watch()
    for ev in w.stream(apps.list_namespaced_deployment, ns, field_selector=f"metadata.name={name}",
                       timeout_seconds=30):
        events.append((ev["type"], ev["object"].spec.replicas))
        if ev["type"] == "DELETED" or stop.is_set():
            w.stop()


def test_rollback_takes_traffic_off_the_canary_before_removing_it(kd, kube_namespace, apps):
    ns = kube_namespace
    kd.deploy(spec("production", replicas=4))
    kd.deploy(spec("baseline"))
    kd.deploy(spec("canary", kernels="triton-v2"))
    kd.set_weights(SVC, {"production": 50, "baseline": 25, "canary": 25})
    events, stop = [], threading.Event()
    t = threading.Thread(target=_watch_deployment_events, args=(apps, ns, f"{SVC}-canary", events, stop))
    t.start()
    try:
        time.sleep(0.5)
        kd.rollback(SVC)
        t.join(30)
    finally:
        stop.set()
    types = [e[0] for e in events]
    assert "DELETED" in types
    # canary scaled to 0 (weight 0) strictly before it was deleted
    first_zero = next(i for i, e in enumerate(events) if e[0] == "MODIFIED" and e[1] == 0)
    assert first_zero < types.index("DELETED")
    assert names(apps, ns) == [f"{SVC}-production"] and dep(apps, ns, "production").spec.replicas == 4
    kd.rollback(SVC)  # idempotent


def test_delete_is_idempotent(kd, kube_namespace, apps, core):
    ns = kube_namespace
    kd.deploy(spec("production"))
    kd.deploy(spec("canary"))
    kd.delete(SVC, "canary")
    assert names(apps, ns) == [f"{SVC}-production"]
    kd.delete(SVC, "canary")
    kd.delete(SVC)
    kd.delete(SVC)
    assert names(apps, ns) == [] and core.list_namespaced_service(ns).items == []
    assert kd.status(SVC) == {}


def test_httproute_weights(kube_cluster, kube_namespace, httproute_crd, apps):
    ns = kube_namespace
    kd = make(kube_cluster, ns, traffic="httproute", gateway="sits-gw", gateway_namespace="infra",
              hostnames=("chat.example.com",))
    custom = client.CustomObjectsApi(kube_cluster.api_client())

    def route():
        return custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", ns, "httproutes", SVC)

    def weights():
        rule = route()["spec"]["rules"][0]
        assert "headers" not in rule["matches"][0]
        return {b["name"].rsplit("-", 1)[1]: b["weight"] for b in rule["backendRefs"]}

    kd.deploy(spec("production", replicas=3))
    assert weights() == {"production": 100}
    r = route()
    assert r["spec"]["parentRefs"][0] == {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                          "name": "sits-gw", "namespace": "infra"}
    assert r["spec"]["hostnames"] == ["chat.example.com"]
    kd.deploy(spec("baseline"))
    kd.deploy(spec("canary", kernels="triton-v2"))
    assert weights() == {"production": 100, "baseline": 0, "canary": 0}  # new variants join without traffic
    kd.set_weights(SVC, {"production": 90, "baseline": 5, "canary": 5})
    assert weights() == {"production": 90, "baseline": 5, "canary": 5}
    assert "HTTPRoute weight 5%" in kd.status(SVC)["canary"].message
    ref = route()["spec"]["rules"][0]["backendRefs"][2]
    assert ref == {"kind": "Service", "name": f"{SVC}-canary", "port": 8000, "weight": 5}
    pinned = {rule["matches"][0]["headers"][0]["value"]: rule["backendRefs"][0]["name"]
              for rule in route()["spec"]["rules"][1:]}
    assert pinned == {r: f"{SVC}-{r}" for r in ("production", "baseline", "canary")}
    # replicas are not used for traffic in this mode
    assert {r: dep(apps, ns, r).spec.replicas for r in ("production", "canary")} == {"production": 3, "canary": 1}
    rv = route()["metadata"]["resourceVersion"]
    kd.set_weights(SVC, {"production": 90, "baseline": 5, "canary": 5})
    assert route()["metadata"]["resourceVersion"] == rv  # idempotent
    # rollback: canary weight 0 is written while the canary still exists, then it is removed
    seen = []
    w = watch.Watch()
    done = threading.Event()

    def watch_route():
        for ev in w.stream(custom.list_namespaced_custom_object, "gateway.networking.k8s.io", "v1", ns,
                           "httproutes", timeout_seconds=30):
            rule = ev["object"]["spec"]["rules"][0]
            seen.append({b["name"].rsplit("-", 1)[1]: b["weight"] for b in rule["backendRefs"]})
            if "canary" not in seen[-1] and "baseline" not in seen[-1]:
                break
        done.set()
    t = threading.Thread(target=watch_route)
    t.start()
    time.sleep(0.3)
    kd.rollback(SVC)
    done.wait(30)
    w.stop()
    assert {"production": 100, "baseline": 0, "canary": 0} in seen
    zero = seen.index({"production": 100, "baseline": 0, "canary": 0})
    assert seen[-1] == {"production": 100} and zero < len(seen) - 1
    assert names(apps, ns) == [f"{SVC}-production"]
    kd.delete(SVC)
    assert custom.list_namespaced_custom_object("gateway.networking.k8s.io", "v1", ns, "httproutes")["items"] == []


def test_concurrent_update_conflict_is_retried(kd, kube_namespace, kube_cluster, apps):
    ns = kube_namespace
    kd.deploy(spec("canary"))
    other = client.AppsV1Api(kube_cluster.api_client())
    real_read = kd.kube.apps.read_namespaced_deployment
    calls = []

    def read_then_interfere(name, namespace, **kw):
        resp = real_read(name, namespace, **kw)  # the deployer now holds this (soon stale) version
        calls.append(name)
        if len(calls) == 1:  # another writer changes the object between our read and our write
            other.patch_namespaced_deployment(name, namespace,
                                              {"metadata": {"annotations": {"team/owner": "someone-else"}}})
        return resp
    kd.kube.apps.read_namespaced_deployment = read_then_interfere
    sleeps = []
    kd.kube.sleep = sleeps.append
    kd.deploy(spec("canary", kernels="triton-v2"))
    d = dep(apps, ns, "canary")
    assert d.metadata.labels["sits.io/kernel-version"] == "triton-v2"       # our write landed...
    assert d.metadata.annotations["team/owner"] == "someone-else"          # ...without losing theirs
    # a real 409, then re-read and retried with backoff (the deployment controller's own status writes can add
    # further conflicts, so "at least once")
    assert calls.count(f"{SVC}-canary") >= 2 and sleeps[:2] == [0.02, 0.04][:len(sleeps)] and sleeps


def test_conflict_retries_are_bounded(kube_cluster, kube_namespace):
    kd = make(kube_cluster, kube_namespace, retries=2)
    kd.deploy(spec("canary"))
    other = client.AppsV1Api(kube_cluster.api_client())
    real_read = kd.kube.apps.read_namespaced_deployment
    n = [0]

    def always_interfere(name, namespace, **kw):
        resp = real_read(name, namespace, **kw)
        n[0] += 1
        other.patch_namespaced_deployment(name, namespace, {"metadata": {"annotations": {"n": str(n[0])}}})
        return resp
    kd.kube.apps.read_namespaced_deployment = always_interfere
    kd.kube.sleep = lambda s: None
    with pytest.raises(DeployConflictError, match="3 attempts"):
        kd.deploy(spec("canary", kernels="triton-v2"))


def test_clear_errors_for_403_404_422(kube_cluster, kube_namespace):
    viewer = KubernetesDeployer(KubernetesConfig(namespace=kube_namespace),
                                api_client=kube_cluster.api_client(kube_cluster.viewer_token))
    with pytest.raises(DeployError, match=r"forbidden \(403\).*nobody"):
        viewer.deploy(spec("production"))
    missing_ns = make(kube_cluster, "no-such-namespace")
    with pytest.raises(DeployNotFoundError, match="namespace no-such-namespace does not exist"):
        missing_ns.deploy(spec("production"))
    kd = make(kube_cluster, kube_namespace)
    with pytest.raises(DeployError, match=r"rejected as invalid \(422\).*BAD NAME"):
        kd.deploy(spec("production", env={"BAD NAME": "x"}))
    no_crd = make(kube_cluster, kube_namespace, traffic="httproute", gateway="gw", httproute_version="v9")
    with pytest.raises(DeployNotFoundError, match="HTTPRoute CRD installed"):
        no_crd.deploy(spec("production"))
    with pytest.raises(DeployNotFoundError, match="not deployed"):
        kd.set_weights(SVC, {"production": 50, "canary": 50})


def test_unreachable_apiserver_is_a_deploy_error():
    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:9"
    kd = KubernetesDeployer(KubernetesConfig(namespace="x", retries=1, backoff_s=0.01),
                            api_client=client.ApiClient(cfg))
    with pytest.raises(DeployError, match="unreachable"):
        kd.status(SVC)


def test_config_validation():
    with pytest.raises(DeployError, match="gateway"):
        KubernetesConfig(traffic="httproute")
    with pytest.raises(DeployError, match="traffic"):
        KubernetesConfig(traffic="mesh")
    with pytest.raises(DeployError, match="namespace"):
        KubernetesConfig(namespace="Prod_NS")
    with pytest.raises(DeployError, match="role"):
        VariantSpec(service=SVC, role="gray", kernels="torch")
    with pytest.raises(DeployError, match="DNS label"):
        VariantSpec(service="Chat_1", role="canary", kernels="torch")


def test_5xx_is_retried_with_backoff_then_reported(kube_cluster, kube_namespace):
    # a real 503 from the real apiserver: an aggregated API whose backing Service does not exist
    reg = client.ApiregistrationV1Api(kube_cluster.api_client())
    name = "v1alpha9.gateway.networking.k8s.io"
    reg.create_api_service({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                            "metadata": {"name": name},
                            "spec": {"group": "gateway.networking.k8s.io", "version": "v1alpha9",
                                     "groupPriorityMinimum": 10, "versionPriority": 10,
                                     "insecureSkipTLSVerify": True,
                                     "service": {"namespace": kube_namespace, "name": "nowhere", "port": 443}}})
    try:
        custom = client.CustomObjectsApi(kube_cluster.api_client())
        def unavailable() -> bool:   # the aggregator picks the APIService up asynchronously
            try:
                custom.list_namespaced_custom_object("gateway.networking.k8s.io", "v1alpha9", kube_namespace,
                                                     "httproutes")
            except client.exceptions.ApiException as e:
                return e.status == 503
            return False
        wait_for("the aggregated API to answer 503", unavailable, timeout=20, interval=0.2, retry_on=())
        kd = make(kube_cluster, kube_namespace, traffic="httproute", gateway="gw", httproute_version="v1alpha9",
                  retries=3)
        sleeps = []
        kd.kube.sleep = sleeps.append
        with pytest.raises(DeployError, match=r"still failing after 4 attempts: 503"):
            kd.deploy(spec("production"))
        assert sleeps == [0.02, 0.04, 0.08]  # exponential backoff between the attempts
    finally:
        reg.delete_api_service(name)


def test_crash_looping_pods_are_named_in_the_status(kd, kube_namespace, kube_cluster):
    ns = kube_namespace
    kd.deploy(spec("production"))
    kd.deploy(spec("canary", kernels="triton-v2"))
    assert mark_ready(kube_cluster, kd, ns, "production").ready
    assert not kd.status(SVC)["canary"].crashing                   # pending, not crashing
    # what a kubelet reports for an engine that exits at start-up (e.g. an unknown kernel set)
    wait_for("the ReplicaSet controller to create the canary pod", lambda: kube_cluster.crash_pods(
        ns, f"app={SVC},sits.io/role=canary", restarts=4, exit_code=2), timeout=30, interval=0.2)
    pod = client.CoreV1Api(kube_cluster.api_client()).list_namespaced_pod(
        ns, label_selector=f"app={SVC},sits.io/role=canary").items[0]
    st = kd.status(SVC)
    assert not st["canary"].ready and st["canary"].crashing
    assert f"pod {pod.metadata.name}: engine CrashLoopBackOff (restarted 4 times, last exit code 2 Error)" \
        in st["canary"].message
    assert st["production"].ready and not st["production"].crashing
    assert "CrashLoopBackOff" not in st["production"].message


def test_a_container_restarted_after_a_kill_is_crashing_before_any_back_off(kd, kube_namespace, kube_cluster):
    # between a SIGKILL (an OOM kill, a crash) and the kubelet's next back-off the container runs again, not ready,
    # with no waiting reason: the crash guard must see it (it said "not ready" instead)
    ns = kube_namespace
    kd.deploy(spec("production"))
    kd.deploy(spec("canary", kernels="triton-v2"))
    assert mark_ready(kube_cluster, kd, ns, "production").ready
    wait_for("the ReplicaSet controller to create the canary pod", lambda: kube_cluster.crash_pods(
        ns, f"app={SVC},sits.io/role=canary", restarts=1, exit_code=137, backoff=False), timeout=30, interval=0.2)
    st = kd.status(SVC)
    assert not st["canary"].ready and st["canary"].crashing
    assert "engine restarted 1 time, last exit code 137 Error" in st["canary"].message
    assert not st["production"].crashing


def test_replicas_lists_every_pod_with_readiness_restarts_and_state(kd, kube_namespace, kube_cluster):
    """replicas(): each pod of each variant, ready from its Ready condition, restarts and state from the engine
    container's status; the fake node has no kubelet, so a pod that has run says why its log is missing instead."""
    ns = kube_namespace
    kd.deploy(spec("production", replicas=2))
    kd.deploy(spec("canary", kernels="triton-v2"))
    assert mark_ready(kube_cluster, kd, ns, "production").ready
    deadline = time.monotonic() + 30
    while not kube_cluster.crash_pods(ns, f"app={SVC},sits.io/role=canary", restarts=3, exit_code=2):
        assert time.monotonic() < deadline, "the ReplicaSet controller never created the canary pod"
        time.sleep(0.2)
    core = client.CoreV1Api(kube_cluster.api_client())
    names = {r: sorted(p.metadata.name for p in core.list_namespaced_pod(
        ns, label_selector=f"app={SVC},sits.io/role={r}").items) for r in ("production", "canary")}
    reps = kd.replicas(SVC)
    assert [(r.role, r.name) for r in reps] == [("production", n) for n in names["production"]] + [
        ("canary", names["canary"][0])]
    for r in reps[:2]:
        assert r.ready and r.restarts == 0 and r.state == "running" and r.address.startswith("10.244.0.")
        assert r.last_log_line == "" and r.log_error == "500"   # the API server cannot reach a kubelet here
    canary = reps[2]
    assert not canary.ready and canary.restarts == 3 and canary.state == "CrashLoopBackOff"
    assert canary.address is None   # never bound: no pod IP
    assert kd.replicas("nothing-here") == []


def test_a_failing_pod_log_read_never_fails_status(kd, kube_namespace, kube_cluster):
    """status() reads the last log line of a not-ready variant's pod best-effort: without RBAC for pods/log (403), or
    with a kubelet the API server cannot reach (the fake node has no address: 500), it says so in a few words, once
    (no retries), and still reports the rest."""
    ns = kube_namespace
    rbac = client.RbacAuthorizationV1Api(kube_cluster.api_client())
    rbac.create_namespaced_role(ns, {"metadata": {"name": "no-logs"}, "rules": [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "no-logs"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-logs"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "nobody"}]})
    no_logs = KubernetesDeployer(KubernetesConfig(namespace=ns, backoff_s=0.02),
                                 api_client=kube_cluster.api_client(kube_cluster.viewer_token))
    kd.deploy(spec("canary"))
    sleeps = []
    kd.kube.sleep = no_logs.kube.sleep = sleeps.append
    sel = f"app={SVC},sits.io/role=canary"
    wait_for("the ReplicaSet controller to create the canary pod",   # bound to the fake node, which has no address
             lambda: kube_cluster.make_pods_ready(ns, sel), timeout=30, interval=0.2)
    # the controllers count it ready before it crashes: else their late view of it ready can follow the crash
    wait_for("the Deployment to count the canary ready", lambda: kd.status(SVC)["canary"].ready, timeout=60,
             interval=0.2)
    kube_cluster.crash_pods(ns, sel, restarts=1, exit_code=137, backoff=False)   # running again, not ready
    core = client.CoreV1Api(kube_cluster.api_client())
    pod = core.list_namespaced_pod(ns, label_selector=sel).items[0].metadata.name
    core.patch_namespaced_pod_status(pod, ns, {"status": {"conditions": [
        {"type": t, "status": "False"} for t in ("ContainersReady", "Ready")]}})
    def unready():   # the controllers saw the pod go unready
        got = no_logs.status(SVC)["canary"]
        return None if got.ready else got
    st = wait_for("the Deployment to lose its ready replica", unready, timeout=60, interval=0.2)
    assert not st.ready and st.crashing and "engine restarted 1 time, last exit code 137 Error" in st.message
    assert st.message.endswith(f"; pod {pod} logs unavailable (403: grant get on pods/log)")
    st = kd.status(SVC)["canary"]
    assert st.crashing and st.message.endswith(f"; pod {pod} logs unavailable (500)")
    assert sleeps == []   # one try each


@pytest.mark.parametrize("container,crashing", [
    ({"ready": False, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}, True),
    ({"ready": False, "restartCount": 1, "state": {"running": {}},
      "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}, True),
    ({"ready": True, "restartCount": 1, "state": {"running": {}},
      "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}, False),   # recovered
    ({"ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}, False),
    # the moment between an exit and the restart: the kubelet has reported the exit, not yet counted the restart
    ({"ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}, True),
    ({"ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}},
      "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}, True),
    ({"ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}, False),
    ({"ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}, False),
])
def test_pods_crashing_reads_restarts_and_the_waiting_reason(container, crashing):
    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"name": "engine", **container}]}}
    assert pods_crashing([pod]) is crashing


@pytest.mark.parametrize("text,line", [
    ("loading llama3-8b\ncapturing CUDA graphs 12/35\n\n  \n", "capturing CUDA graphs 12/35"),
    # colours, a cleared line, a progress bar's carriage returns, a tab, a bell, a window title, a bidi override
    ("\x1b[1;32mINFO\x1b[0m  loading weights 1/4\rloading weights 2/4\r\x1b[2Kloading\tweights 3/4\x07\r\n",
     "loading weights 3/4"),
    ("\x1b]0;engine\x07ready in \u202e5 s\x1b[K", "ready in 5 s"),
    ("unterminated title \x1b]2;title\nnext line \x1b", "next line"),
    ("x" * 500, "x" * 199 + "…"),
    ("", ""), ("\x1b[31m\x1b[0m\n\r\n", ""),
])
def test_last_log_line_is_one_printable_bounded_line(text, line):
    assert last_log_line(text) == line


def _pod(name, created, *, ready=False, deleting=False, **state):
    cs = {"name": "engine", "ready": ready, "restartCount": 0, "state": state or {"waiting": {"reason": "x"}}}
    md = {"name": name, "creationTimestamp": created, **({"deletionTimestamp": created} if deleting else {})}
    return {"metadata": md, "status": {"containerStatuses": [cs]}}


def test_log_pod_is_the_newest_not_ready_pod_whose_engine_has_run():
    running = {"startedAt": "2026-01-01T00:00:04Z"}
    old = _pod("old", "2026-01-01T00:00:01Z", running=running)
    new = _pod("new", "2026-01-01T00:00:02Z", running=running)
    assert log_pod([old, new]) == "new" and log_pod([new, old]) == "new"
    assert log_pod([old, _pod("ready", "2026-01-01T00:00:03Z", ready=True, running=running)]) == "old"
    assert log_pod([old, _pod("going", "2026-01-01T00:00:03Z", deleting=True, running=running)]) == "old"
    fresh = _pod("fresh", "2026-01-01T00:00:03Z", waiting={"reason": "ContainerCreating"})
    assert log_pod([fresh]) is None and log_pod([old, fresh]) == "old"           # no run yet: no log
    assert log_pod([{"metadata": {"name": "pending"}, "status": {}}]) is None
    crashed = _pod("crashed", "2026-01-01T00:00:03Z", waiting={"reason": "CrashLoopBackOff"})
    crashed["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1}}
    assert log_pod([old, crashed]) == "crashed"                                      # the run that ended
    assert log_pod([_pod("done", "2026-01-01T00:00:03Z", terminated={"exitCode": 0})]) == "done"


def test_a_crash_looping_engine_that_cannot_load_is_named_with_its_load_error():
    """The engine exits 1 with its load error as its last log line; the manifest's FallbackToLogsOnError puts the
    log's end into the termination message, and the variant's problem names the error, not only the exit code."""
    message = ("INFO loading /models/llama\nTraceback ...\n"
               f"{LOAD_FAILED}ValueError: /models/llama has no config.json\n")
    pod = _pod("p", "2026-01-01T00:00:01Z", waiting={"reason": "CrashLoopBackOff"})
    cs = pod["status"]["containerStatuses"][0]
    cs["restartCount"], cs["lastState"] = 3, {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
    assert pod_problems([pod]) == ("pod p: engine CrashLoopBackOff (restarted 3 times, last exit code 1 Error): "
                                   "engine failed to load: ValueError: /models/llama has no config.json")
    cs["lastState"]["terminated"]["message"] = "Killed\n"   # no load error line: the exit code alone, as before
    assert pod_problems([pod]) == "pod p: engine CrashLoopBackOff (restarted 3 times, last exit code 1 Error)"
    manifest = deployment(VariantSpec(service="llm", role="canary", kernels="torch", model="tiny"), image="sits:dev",
                          port=8000, replicas=1, gpu_resource="nvidia.com/gpu")
    assert manifest["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
