"""`helm install` into the real test API server (etcd + kube-apiserver 1.20 + controller manager): every object the
chart renders is created; monitoring objects only once their CRDs are served; the chart's ServiceAccount token can
do everything the Kubernetes deployer does and nothing else; `helm uninstall` removes what the chart made."""
from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from sits.control_plane.crd.api import GROUP, PLURAL, VERSION, KernelRolloutApi
from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer
from sits.control_plane.store.db import Store
from sits.control_plane.crd.watch import CrdWatcher
from tests.helm.support import CHART, MONITORING_KINDS, helm
from tests.waiting import wait_for

CRDS = Path(__file__).resolve().parent / "crds"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _namespace(kube_cluster, name: str | None = None) -> str:
    name = name or f"h-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube_cluster.api_client())
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as e:
        if e.status != 409:
            raise
    return name


def _install(home, kube_cluster, ns: str, scenario: str, *extra: str) -> tuple[list[dict], str]:
    r = helm("install", "rel", str(CHART), "--namespace", ns, "-f", str(CHART / "ci" / scenario), *extra,
             home=home, kubeconfig=kube_cluster.kubeconfig)
    manifest = helm("get", "manifest", "rel", "--namespace", ns, home=home, kubeconfig=kube_cluster.kubeconfig).stdout
    return [d for d in yaml.safe_load_all(manifest) if d], r.stdout


def _exists(dyn, doc: dict) -> bool:
    api = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    try:
        api.get(name=doc["metadata"]["name"], namespace=doc["metadata"].get("namespace"))
        return True
    except dynamic.exceptions.NotFoundError:
        return False


def test_install_creates_every_object_and_uninstall_removes_them(home, kube_cluster):
    ns = _namespace(kube_cluster)
    docs, notes = _install(home, kube_cluster, ns, "default-values.yaml")
    dyn = dynamic.DynamicClient(kube_cluster.api_client())
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap"] * 4 + ["Deployment", "NetworkPolicy", "Role", "RoleBinding"] + ["Secret"] * 2 + \
        ["Service", "ServiceAccount"]
    assert all(_exists(dyn, d) for d in docs)
    # the session key is made once and kept by upgrades (logins survive a restart)
    core = client.CoreV1Api(kube_cluster.api_client())
    key = core.read_namespaced_secret("rel-sits-control-session", ns).data["secret-key"]
    assert len(base64.b64decode(key)) == 64
    helm("upgrade", "rel", str(CHART), "--namespace", ns, "--set", "controlPlane.interval=7", home=home,
         kubeconfig=kube_cluster.kubeconfig)
    assert core.read_namespaced_secret("rel-sits-control-session", ns).data["secret-key"] == key
    cm = core.read_namespaced_config_map("rel-sits-control", ns)
    assert cm.data["SITS_INTERVAL"] == "7"
    dep = client.AppsV1Api(kube_cluster.api_client()).read_namespaced_deployment("rel-sits-control", ns)
    assert dep.spec.template.spec.containers[0].args[1] == "serve"
    # NOTES: how to reach the UI and make a token
    assert f"kubectl -n {ns} port-forward svc/rel-sits-control 8080:8080" in notes
    assert "sha256sum" in notes and "Authorization: Bearer" in notes and "nobody can log in" in notes
    helm("uninstall", "rel", "--namespace", ns, home=home, kubeconfig=kube_cluster.kubeconfig)
    wait_for(lambda: f"uninstall to delete {[d['kind'] for d in docs if _exists(dyn, d)]}",
             lambda: not any(_exists(dyn, d) for d in docs), timeout=30, interval=0.2)


def test_existing_secret_scenario_installs(home, kube_cluster):
    ns = _namespace(kube_cluster)
    docs, _ = _install(home, kube_cluster, ns, "existing-secret-values.yaml")
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"] == ["rel-sits-control-session"]
    dep = client.AppsV1Api(kube_cluster.api_client()).read_namespaced_deployment("rel-sits-control", ns)
    vols = {v.name: v for v in dep.spec.template.spec.volumes}
    assert vols["auth"].secret.secret_name == "sits-auth" and vols["auth"].secret.items[0].key == "users.yaml"


def test_prometheus_credentials_install_into_the_secret_and_stay_out_of_the_notes(home, kube_cluster):
    """Issue 26 row 13: a Prometheus URL with user:password@ was in the ConfigMap, the command line and the notes."""
    ns = _namespace(kube_cluster)
    url = "http://sits:hunter-notes@prometheus.monitoring.svc:9090"
    docs, notes = _install(home, kube_cluster, ns, "default-values.yaml", "--set",
                           f"metrics.source=prometheus,metrics.prometheus.url={url}")
    core = client.CoreV1Api(kube_cluster.api_client())
    assert base64.b64decode(core.read_namespaced_secret("rel-sits-control-prometheus", ns).data["url"]).decode() == url
    assert "SITS_PROMETHEUS_URL" not in core.read_namespaced_config_map("rel-sits-control", ns).data
    dep = client.AppsV1Api(kube_cluster.api_client()).read_namespaced_deployment("rel-sits-control", ns)
    assert "hunter-notes" not in json.dumps(dep.to_dict(), default=str)
    assert "hunter-notes" not in notes and "http://prometheus.monitoring.svc:9090 (credentials in the Secret)" in notes
    assert "NetworkPolicy: only pods of namespace" in notes
    helm("uninstall", "rel", "--namespace", ns, home=home, kubeconfig=kube_cluster.kubeconfig)


def test_monitoring_objects_left_out_without_crds(home, kube_cluster):
    """Without prometheus-operator's CRDs the install succeeds and its notes say what was left out."""
    ext = client.ApiextensionsV1Api(kube_cluster.api_client())
    if "monitoring.coreos.com" in {c.spec.group for c in ext.list_custom_resource_definition().items}:
        pytest.skip("this session's API server already serves monitoring.coreos.com (installed by a test before)")
    ns = _namespace(kube_cluster)
    docs, notes = _install(home, kube_cluster, ns, "monitoring-values.yaml")
    kinds = {d["kind"] for d in docs}
    assert "Ingress" in kinds and not kinds & set(MONITORING_KINDS)
    assert all(_exists(dynamic.DynamicClient(kube_cluster.api_client()), d) for d in docs)
    assert "WARNING: PrometheusRule was requested but this cluster does not serve" in notes


def test_monitoring_objects_created_with_crds(home, kube_cluster):
    """With the CRDs installed, the ServiceMonitor, PodMonitor and PrometheusRule are created."""
    for crd in sorted(CRDS.glob("*.yaml")):
        kube_cluster.install_crd(crd)
    ns = _namespace(kube_cluster)
    def installed_with_monitoring():
        docs, notes = _install(home, kube_cluster, ns, "monitoring-values.yaml")
        if set(MONITORING_KINDS) <= {d["kind"] for d in docs}:
            return docs, notes
        helm("uninstall", "rel", "--namespace", ns, home=home, kubeconfig=kube_cluster.kubeconfig)
        return None
    # helm reads the served kinds from discovery, which may lag the CRD
    docs, notes = wait_for("an install with the monitoring kinds", installed_with_monitoring, timeout=30, interval=1)
    assert "WARNING" not in notes
    assert all(_exists(dynamic.DynamicClient(kube_cluster.api_client()), d) for d in docs)


def _service_account_client(kube_cluster, ns: str, name: str, timeout: float = 30) -> client.ApiClient:
    """An API client holding the ServiceAccount's token (the token controller writes it into a Secret)."""
    core = client.CoreV1Api(kube_cluster.api_client())

    def token() -> str | None:
        return next((base64.b64decode(s.data["token"]).decode() for s in core.list_namespaced_secret(ns).items
                     if s.type == "kubernetes.io/service-account-token" and (s.data or {}).get("token")
                     and (s.metadata.annotations or {}).get("kubernetes.io/service-account.name") == name), None)
    return kube_cluster.api_client(token=wait_for(f"a token Secret for ServiceAccount {ns}/{name}", token, timeout,
                                                  0.2, error=TimeoutError))


def test_service_account_can_deploy_and_nothing_more(home, kube_cluster):
    """The deployer, holding only the chart's ServiceAccount token, deploys production/baseline/canary, shifts
    weights, reads status, promotes and cleans up in the variants' namespace; other verbs, resources and
    namespaces are forbidden."""
    release_ns = _namespace(kube_cluster)
    variants_ns = _namespace(kube_cluster, "sits-variants")   # the scenario's deployer namespace
    docs, _ = _install(home, kube_cluster, release_ns, "kubernetes-prometheus-values.yaml")
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == variants_ns
    assert "PersistentVolumeClaim" in {x["kind"] for x in docs}
    assert all(_exists(dynamic.DynamicClient(kube_cluster.api_client()), x) for x in docs)
    sa = _service_account_client(kube_cluster, release_ns, "rel-sits-control")
    d = KubernetesDeployer(KubernetesConfig(namespace=variants_ns, retries=1, backoff_s=0.01), api_client=sa)
    service = f"s{uuid.uuid4().hex[:6]}"
    for role_name in ("production", "baseline", "canary"):
        d.deploy(VariantSpec(service=service, role=role_name, kernels="torch" if role_name != "canary"
                             else "triton-v1"))
    d.set_weights(service, {"production": 80, "baseline": 10, "canary": 10})
    st = d.status(service)   # pods never become ready here: status lists them to say why
    assert set(st) == {"production", "baseline", "canary"}
    core, apps = client.CoreV1Api(sa), client.AppsV1Api(sa)
    pod = wait_for("a canary pod", lambda: core.list_namespaced_pod(
        variants_ns, label_selector=f"app={service},sits.io/role=canary").items)[0].metadata.name
    log = core.read_namespaced_pod_log(pod, variants_ns, container="engine", tail_lines=20, _preload_content=False)
    assert log.status == 204 and log.data == b""   # get on pods/log; the pod runs nowhere: no content
    d.promote(service)
    assert set(d.status(service)) == {"production"}
    d.delete(service)
    assert d.status(service) == {}
    forbidden = [lambda: core.list_namespaced_secret(variants_ns),
                 lambda: core.create_namespaced_config_map(variants_ns, {"metadata": {"name": "x"}}),
                 lambda: core.delete_collection_namespaced_pod(variants_ns),
                 lambda: apps.list_namespaced_deployment(release_ns),     # only the variants' namespace
                 lambda: core.list_namespaced_service(variants_ns)]      # the deployer never lists Services
    for call in forbidden:
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403


def test_service_account_can_drive_kernel_rollouts(home, kube_cluster, tmp_path):
    """`helm install` brings the KernelRollout CRD (crds/); the watcher, holding only the chart's ServiceAccount
    token, lists and watches KernelRollouts, writes their status and records Events; it may not change their spec or
    delete them."""
    ns = _namespace(kube_cluster)
    _install(home, kube_cluster, ns, "default-values.yaml")
    ext = client.ApiextensionsV1Api(kube_cluster.api_client())
    wait_for("the chart's CRD Established", lambda: any(
        c.type == "Established" and c.status == "True"
        for c in ext.read_custom_resource_definition("kernelrollouts.sits.dev").status.conditions or []))
    admin = client.CustomObjectsApi(kube_cluster.api_client())
    admin.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "KernelRollout", "metadata": {"name": "chat"},
        "spec": {"service": "chat", "kernels": "triton-v1"}})
    sa = _service_account_client(kube_cluster, ns, "rel-sits-control")
    store = Store(str(tmp_path / "sits.db"))
    watcher = CrdWatcher(store, KernelRolloutApi(sa, ns), sync_interval_s=0.2).start()
    try:
        st = wait_for("status written with the SA token", lambda: (admin.get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "chat").get("status") or {}).get("rolloutId"))
        assert store.get(st).service == "chat" and watcher.api_errors == 0
        reasons = [e.reason for e in client.CoreV1Api(kube_cluster.api_client()).list_namespaced_event(ns).items
                   if e.involved_object.kind == "KernelRollout"]
        assert "Started" in reasons
    finally:
        watcher.stop()
        store.close()
    sa_custom = client.CustomObjectsApi(sa)
    for call in (lambda: sa_custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat",
                                                                  {"spec": {"kernels": "torch"}}),
                 lambda: sa_custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "chat")):
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403
    helm("uninstall", "rel", "--namespace", ns, home=home, kubeconfig=kube_cluster.kubeconfig)
