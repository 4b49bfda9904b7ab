"""Running the real helm binary (.ci/install-helm.sh puts it in /var/cache/sits/helm/bin) on the chart."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sits-control"
SCENARIOS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
MONITORING_API_VERSIONS = [f"monitoring.coreos.com/v1/{k}" for k in MONITORING_KINDS]
HELM_BIN = os.environ.get("SITS_HELM") or shutil.which("helm") or "/var/cache/sits/helm/bin/helm"


_NO_CLUSTER = {"apiVersion": "v1", "kind": "Config", "current-context": "none",
               "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],   # discard: refused
               "users": [{"name": "none", "user": {}}],
               "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}


def helm(*args: str, home: Path, kubeconfig: str | None = None, check: bool = True,
         timeout: float = 120) -> subprocess.CompletedProcess:
    """Run helm with its own cache/config dirs; without `kubeconfig` it can reach no cluster (never the default
    localhost:8080, where someone else's server may listen)."""
    if not os.access(HELM_BIN, os.X_OK):
        pytest.fail(f"no helm binary at {HELM_BIN}: run `bash .ci/install-helm.sh`", pytrace=False)
    if kubeconfig is None:
        kubeconfig = str(home / "no-cluster.kubeconfig")
        Path(kubeconfig).write_text(yaml.safe_dump(_NO_CLUSTER))
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"), "KUBECONFIG": kubeconfig}
    r = subprocess.run([HELM_BIN, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({r.returncode}):\n{r.stderr}\n{r.stdout[-2000:]}")
    return r


def render(home: Path, scenario: str | None = None, *extra: str, monitoring: bool = True,
           namespace: str = "sits") -> list[dict]:
    """`helm template` of the chart (monitoring CRDs announced as served unless monitoring=False) -> its objects."""
    args = ["template", "rel", str(CHART), "--namespace", namespace]
    if scenario:
        args += ["-f", str(CHART / "ci" / scenario)]
    if monitoring:
        for v in MONITORING_API_VERSIONS:
            args += ["--api-versions", v]
    out = helm(*args, *extra, home=home).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


# ---- what the Kubernetes deployer calls, read from its code --------------------------------------------------------
_VERBS = {"read": "get", "list": "list", "create": "create", "replace": "update", "delete": "delete",
          "patch": "patch", "get": "get", "watch": "watch"}
_API_GROUPS = {"apps": "apps", "core": ""}
_PLURAL = {"deployment": "deployments", "service": "services", "pod": "pods", "pod_log": "pods/log"}
# the only two modules that call the Kubernetes API: the deployer's and the KernelRollout watcher's
DEPLOYER_API = ROOT / "control_plane" / "adapters" / "deploy" / "kubernetes" / "api.py"
CRD_API = ROOT / "control_plane" / "crd" / "api.py"


def deployer_permissions() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every Kubernetes API call in DEPLOYER_API:
    `self.apps.read_namespaced_deployment(...)` -> ("apps", "deployments", "get"), `read_namespaced_pod_log` -> the
    pods/log subresource; custom objects go to HTTPRoutes."""
    from sits.control_plane.adapters.deploy.kubernetes.manifests import GATEWAY_GROUP
    tree = ast.parse(DEPLOYER_API.read_text())
    perms = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"):
            continue
        api, method = node.value.attr, node.attr
        if api in _API_GROUPS and "_namespaced_" in method:
            verb, kind = method.split("_namespaced_")
            perms.add((_API_GROUPS[api], _PLURAL[kind], _VERBS[verb]))
        elif api == "custom" and method.endswith("_namespaced_custom_object"):
            perms.add((GATEWAY_GROUP, "httproutes", _VERBS[method.split("_namespaced_")[0]]))
    return perms


def role_permissions(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def crd_watch_permissions() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every call in CRD_API (the KernelRollout watcher's):
    `self.custom.list_namespaced_custom_object` -> list (and watch, when streamed by `watch.Watch`),
    `..._custom_object_status` -> the status subresource, `self.core.create_namespaced_event` -> events."""
    from sits.control_plane.crd.api import GROUP, PLURAL
    source = CRD_API.read_text()
    perms = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"):
            continue
        api, method = node.value.attr, node.attr
        if api == "custom" and "_namespaced_custom_object" in method:
            resource = PLURAL + ("/status" if method.endswith("_status") else "")
            perms.add((GROUP, resource, _VERBS[method.split("_namespaced_")[0]]))
        elif api == "core" and method.endswith("_namespaced_event"):
            perms.add(("", "events", _VERBS[method.split("_namespaced_")[0]]))
    if "w.stream(self.custom.list_namespaced_custom_object" in source:
        perms.add((GROUP, PLURAL, "watch"))
    return perms
