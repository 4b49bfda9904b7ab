"""Kubernetes objects for one variant (Deployment + Service), the shared Service and the Gateway API HTTPRoute.

Pure functions from specs to plain dicts (what the API accepts); no API calls here.
Names: Deployment and Service `<service>-<role>`; shared Service (replica-ratio mode) and HTTPRoute `<service>`.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Mapping

from sits.control_plane.rollout import ROLES
from sits.control_plane.adapters.deploy import VariantSpec

MANAGED_BY = {"app.kubernetes.io/managed-by": "sits"}
ROLE_LABEL = "sits.io/role"
KERNEL_LABEL = "sits.io/kernel-version"
SPEC_ANNOTATION = "sits.io/spec"
HASH_ANNOTATION = "sits.io/applied-hash"
WEIGHT_ANNOTATION = "sits.io/weight"
PIN_HEADER = "X-SITS-Variant"
GATEWAY_GROUP = "gateway.networking.k8s.io"
ENGINE_CONTAINER = "engine"   # the engine's container in every variant's pod template
# engine pods run restricted (Pod Security "restricted"): the image's non-root uid, nothing writable but /tmp
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                      "privileged": False, "capabilities": {"drop": ["ALL"]}}


def variant_name(service: str, role: str) -> str:
    return f"{service}-{role}"


def label_value(s: str) -> str:
    """A valid label value (<= 63 chars of [-A-Za-z0-9_.], alphanumeric at both ends) derived from s."""
    v = re.sub(r"[^-A-Za-z0-9_.]", "-", s)[:63].strip("-_.")
    return v or "unknown"


def selector(service: str, role: str | None = None) -> dict[str, str]:
    sel = {"app": service}
    if role is not None:
        sel[ROLE_LABEL] = role
    return sel


def labels(spec: VariantSpec) -> dict[str, str]:
    return {**selector(spec.service, spec.role), KERNEL_LABEL: label_value(spec.kernels), **MANAGED_BY}


def spec_hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def deployment(spec: VariantSpec, *, image: str, port: int, replicas: int, gpu_resource: str,
               resources: Mapping | None = None, weight: int | None = None) -> dict:
    """The Deployment for one variant. `image` is spec.image or the deployer's default."""
    container: dict = {
        "name": ENGINE_CONTAINER,
        "image": image,
        "command": ["sits-engine"],
        "args": spec.engine_args(port=port, host="0.0.0.0"),
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [{"name": k, "value": v} for k, v in sorted(spec.env.items())],
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],   # the image's HOME and Triton cache: all it writes
        # an engine that cannot load exits 1 with its error as its last log line: the pod's status then carries it
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # /readyz is 200 only once the model is loaded and warmed up; /healthz only says the process serves HTTP
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 6},
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5,
                         "failureThreshold": 120},
    }
    res = {k: dict(v) for k, v in (resources or {}).items()}
    if gpus := spec.gpu_request():   # an engine on CUDA: its GPUs (tensor_parallel_size of them, or `gpus`)
        res.setdefault("limits", {})[gpu_resource] = str(gpus)
    if res:
        container["resources"] = res
    lab = labels(spec)
    template_spec = {"metadata": {"labels": lab, "annotations": {
                         "prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                         "prometheus.io/path": "/metrics"}},
                     "spec": {"containers": [container], "terminationGracePeriodSeconds": 30,
                              "securityContext": POD_SECURITY, "automountServiceAccountToken": False,
                              "volumes": [{"name": "tmp", "emptyDir": {}}]}}
    body_spec = {"replicas": replicas, "selector": {"matchLabels": selector(spec.service, spec.role)},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
                 "template": template_spec}
    # the hash covers what deploy() owns; replicas are compared separately (set_weights may scale them)
    annotations = {SPEC_ANNOTATION: json.dumps(spec.to_dict(), sort_keys=True),
                   HASH_ANNOTATION: spec_hash({**body_spec, "replicas": None, "labels": lab})}
    if weight is not None:
        annotations[WEIGHT_ANNOTATION] = str(weight)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": variant_name(spec.service, spec.role), "labels": lab, "annotations": annotations},
            "spec": body_spec}


def service(name: str, service_name: str, sel: Mapping[str, str], port: int, role: str | None) -> dict:
    lab = {"app": service_name, **MANAGED_BY}
    if role is not None:
        lab[ROLE_LABEL] = role
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": lab},
            "spec": {"type": "ClusterIP", "selector": dict(sel),
                     "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}}


def httproute(service_name: str, weights: Mapping[str, int], port: int, *, gateway: str,
              gateway_namespace: str | None, hostnames: tuple[str, ...], version: str) -> dict:
    """One weighted rule over the deployed variants, plus one rule per variant pinned by the X-SITS-Variant header.

    `weights` holds only deployed roles (weight 0 keeps a backendRef with no traffic, so the route stays valid)."""
    parent = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace
    roles = [r for r in ROLES if r in weights]

    def ref(role: str, w: int) -> dict:
        # group omitted = "" (core): kube-apiserver 1.20 built with Go >= 1.18 rejects "" in typed CR string fields
        return {"kind": "Service", "name": variant_name(service_name, role), "port": port, "weight": w}
    rules = [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
              "backendRefs": [ref(r, int(weights[r])) for r in roles]}]
    rules += [{"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                            "headers": [{"type": "Exact", "name": PIN_HEADER, "value": r}]}],
               "backendRefs": [ref(r, 1)]} for r in roles]
    spec: dict = {"parentRefs": [parent], "rules": rules}
    if hostnames:
        spec["hostnames"] = list(hostnames)
    return {"apiVersion": f"{GATEWAY_GROUP}/{version}", "kind": "HTTPRoute",
            "metadata": {"name": service_name, "labels": {"app": service_name, **MANAGED_BY}},
            "spec": spec}


def route_weights(route: Mapping) -> dict[str, int]:
    """{role: weight} from the weighted (first, header-less) rule of an HTTPRoute written by `httproute`."""
    for rule in route.get("spec", {}).get("rules", []):
        if any("headers" in m for m in rule.get("matches", [])):
            continue
        out = {}
        for b in rule.get("backendRefs", []):
            for r in ROLES:
                if b.get("name", "").endswith(f"-{r}"):
                    out[r] = int(b.get("weight", 1))
        return out
    return {}


def replicas_for_weights(weights: Mapping[str, int], total: int) -> dict[str, int]:
    """Replica-ratio traffic: split `total` replicas by weight (Argo-style): every role with weight > 0 gets at
    least one replica, weight 0 gets none; production takes what the others leave (at least 1 while weighted)."""
    out = {r: 0 for r in weights}
    for r, w in weights.items():
        if r != "production" and w > 0:
            out[r] = max(1, -(-total * w // 100))  # ceil
    if weights.get("production", 0) > 0:
        out["production"] = max(1, total - sum(v for r, v in out.items() if r != "production"))
    return out
