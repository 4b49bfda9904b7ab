"""KubernetesDeployer: variants as Deployments + Services in one namespace, through the official client.

Traffic: `traffic="replicas"` splits by replica ratio behind one Service `<service>` that selects every variant
(no mesh needed; coarse, as replicas are integers); `traffic="httproute"` writes Gateway API HTTPRoute backend weights
(exact percentages; replicas stay at spec.replicas). Writes are read-modify-write with the object's resourceVersion;
409 conflicts and 5xx/429 are retried with exponential backoff (re-reading first); 401/403/404/422 become DeployErrors
with the API's own message. Readiness comes from Deployment status, as the deployment controller writes it.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import urllib3
from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException

from control_plane.adapters import k8s_manifests as m
from control_plane.adapters.deploy import (ROLES, DeployConflictError, DeployError, DeployNotFoundError,
                                           VariantSpec, VariantStatus, check_role, normalize_weights)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class KubernetesConfig:
    namespace: str = "default"
    kubeconfig: str | None = None            # None: $KUBECONFIG or ~/.kube/config (unless in-cluster)
    context: str | None = None
    in_cluster: bool | None = None           # None: in-cluster when KUBERNETES_SERVICE_HOST is set
    image: str = "sits-engine:latest"        # used when a VariantSpec has no image
    port: int = 8000
    traffic: str = "replicas"                # "replicas" | "httproute"
    gateway: str | None = None               # HTTPRoute parentRef (required for "httproute")
    gateway_namespace: str | None = None
    hostnames: tuple[str, ...] = ()
    httproute_version: str = "v1"
    gpu_resource: str = "nvidia.com/gpu"
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # container requests/limits
    retries: int = 6
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.namespace or ""):
            raise DeployError(f"namespace {self.namespace!r} is not a valid namespace name (a DNS-1123 label)")
        if self.traffic not in ("replicas", "httproute"):
            raise DeployError(f"traffic must be 'replicas' or 'httproute', got {self.traffic!r}")
        if self.traffic == "httproute" and not self.gateway:
            raise DeployError("traffic='httproute' needs gateway=<name of the Gateway the route attaches to>")
        if not 0 < self.port < 65536:
            raise DeployError(f"port {self.port} out of range")
        if self.retries < 0 or self.backoff_s < 0 or self.request_timeout_s <= 0:
            raise DeployError("retries/backoff must be >= 0 and request_timeout_s > 0")
        self.hostnames = tuple(self.hostnames)


class KubernetesDeployer:
    def __init__(self, config: KubernetesConfig | None = None, *, api_client: client.ApiClient | None = None):
        self.config = config or KubernetesConfig()
        self.api = api_client or _load_client(self.config)
        self.apps = client.AppsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self._sleep = time.sleep

    # ---- Deployer protocol ----
    def deploy(self, spec: VariantSpec) -> None:
        ns, name = self.config.namespace, m.variant_name(spec.service, spec.role)
        self._apply_deployment(spec)
        self._apply(f"Service {name}", "service", name,
                    m.service(name, spec.service, m.selector(spec.service, spec.role), self.config.port, spec.role))
        if self.config.traffic == "replicas":
            self._apply(f"Service {spec.service}", "service", spec.service,
                        m.service(spec.service, spec.service, m.selector(spec.service), self.config.port, None))
        else:
            self._ensure_route_backend(spec.service, spec.role)
        log.info("deployed %s/%s (%s)", ns, name, spec.kernels)

    def set_weights(self, service: str, weights: Mapping[str, int]) -> None:
        w = normalize_weights(weights)
        specs = self._specs(service)
        missing = [r for r, v in w.items() if v > 0 and r not in specs]
        if missing:
            raise DeployNotFoundError(f"service {service}: cannot give traffic to {missing}: not deployed "
                                      f"(deployed: {sorted(specs) or 'none'})")
        if self.config.traffic == "httproute":
            self._write_route(service, {r: w[r] for r in specs})
            return
        total = self._total_replicas(specs)
        reps = m.replicas_for_weights({r: w[r] for r in specs}, total)
        for role in ROLES:  # scale up the receiving side before scaling the other down
            if role in specs and reps[role] > 0:
                self._scale(service, role, reps[role], w[role])
        for role in ROLES:
            if role in specs and reps[role] == 0:
                self._scale(service, role, 0, 0)

    def status(self, service: str) -> dict[str, VariantStatus]:
        sel = ",".join(f"{k}={v}" for k, v in {**m.selector(service), **m.MANAGED_BY}.items())
        items = self._call(f"list Deployments of {service}", lambda: self._json(
            self.apps.list_namespaced_deployment(self.config.namespace, label_selector=sel,
                                                 _preload_content=False, _request_timeout=self._timeout())))
        out = {}
        for d in items.get("items", []):
            role = d["metadata"].get("labels", {}).get(m.ROLE_LABEL)
            if role in ROLES:
                out[role] = self._variant_status(service, role, d)
        return out

    def promote(self, service: str) -> None:
        specs = self._specs(service)
        canary = specs.get("canary")
        if canary is None:
            if "production" not in specs:
                raise DeployNotFoundError(f"service {service}: nothing to promote (no canary, no production)")
            log.info("promote %s: no canary left; finishing cleanup", service)
        else:
            prod = specs.get("production")
            self.deploy(dataclasses.replace(canary, role="production",
                                            replicas=prod.replicas if prod else canary.replicas))
        self.set_weights(service, {"production": 100})
        self.delete(service, "canary")
        self.delete(service, "baseline")

    def rollback(self, service: str) -> None:
        specs = self._specs(service)
        if "production" in specs:  # traffic off the canary first, then remove it
            self.set_weights(service, {"production": 100})
        self.delete(service, "canary")
        self.delete(service, "baseline")

    def delete(self, service: str, role: str | None = None) -> None:
        check_role(role)
        roles = ROLES if role is None else (role,)
        if self.config.traffic == "httproute":
            if role is None:
                self._delete(f"HTTPRoute {service}", "route", service)
            else:
                self._remove_route_backend(service, role)
        for r in roles:
            name = m.variant_name(service, r)
            self._delete(f"Deployment {name}", "deployment", name)
            self._delete(f"Service {name}", "service", name)
        if role is None:
            self._delete(f"Service {service}", "service", service)

    # ---- deployments ----
    def _apply_deployment(self, spec: VariantSpec) -> None:
        name = m.variant_name(spec.service, spec.role)
        image = spec.image or self.config.image

        def op() -> None:
            cur = self._get("deployment", name)
            weight, replicas = None, spec.replicas
            if cur is not None and self.config.traffic == "replicas":
                weight = _int_or_none(cur["metadata"].get("annotations", {}).get(m.WEIGHT_ANNOTATION))
                if weight is not None:  # replicas are governed by the traffic weight
                    specs = self._specs(spec.service)
                    specs[spec.role] = spec
                    weights = {r: (weight if r == spec.role else self._weight_of(spec.service, r)) for r in specs}
                    replicas = m.replicas_for_weights(weights, self._total_replicas(specs))[spec.role]
            body = m.deployment(spec, image=image, port=self.config.port, replicas=replicas,
                                gpu_resource=self.config.gpu_resource, resources=self.config.resources,
                                weight=weight)
            if cur is None:
                self._create("deployment", body)
                return
            ann = cur["metadata"].get("annotations", {})
            if (ann.get(m.HASH_ANNOTATION) == body["metadata"]["annotations"][m.HASH_ANNOTATION]
                    and cur["spec"].get("replicas") == replicas):
                return  # already as desired
            self._replace("deployment", name, _merged(cur, body))
        self._call(f"apply Deployment {name}", op)

    def _scale(self, service: str, role: str, replicas: int, weight: int) -> None:
        name = m.variant_name(service, role)

        def op() -> None:
            cur = self._get("deployment", name)
            if cur is None:
                raise DeployNotFoundError(f"Deployment {name} disappeared while setting weights")
            ann = cur["metadata"].setdefault("annotations", {})
            if cur["spec"].get("replicas") == replicas and ann.get(m.WEIGHT_ANNOTATION) == str(weight):
                return
            ann[m.WEIGHT_ANNOTATION] = str(weight)
            cur["spec"]["replicas"] = replicas
            cur.pop("status", None)
            self._replace("deployment", name, cur)
        self._call(f"scale Deployment {name}", op)

    def _variant_status(self, service: str, role: str, d: dict) -> VariantStatus:
        want = int(d["spec"].get("replicas", 1))
        st = d.get("status", {})
        ready_n = int(st.get("readyReplicas", 0) or 0)
        updated = int(st.get("updatedReplicas", 0) or 0)
        available = int(st.get("availableReplicas", 0) or 0)
        total = int(st.get("replicas", 0) or 0)
        observed = int(st.get("observedGeneration", 0) or 0) >= int(d["metadata"].get("generation", 0))
        # rollout complete (as `kubectl rollout status`): every pod runs the current template and is available
        ready = (want > 0 and observed and updated >= want and total == updated and available >= want
                 and ready_n >= want)
        if want == 0:
            msg = "scaled to 0"
        elif not observed:
            msg = "spec change not yet observed by the deployment controller"
        else:
            msg = f"{ready_n}/{want} ready, {updated} updated, {available} available"
            if total > updated:
                msg += f", {total - updated} old replicas still running"
            for c in st.get("conditions", []):
                if c.get("status") == "False" and c.get("message"):
                    msg += f"; {c['type']}: {c['message']}"
        w = d["metadata"].get("annotations", {}).get(m.WEIGHT_ANNOTATION)
        if w is not None:
            msg += f"; weight {w}%"
        endpoint = f"http://{m.variant_name(service, role)}.{self.config.namespace}.svc:{self.config.port}"
        return VariantStatus(role=role, ready=ready, replicas=want, ready_replicas=ready_n, endpoint=endpoint,
                             message=msg)

    def _specs(self, service: str) -> dict[str, VariantSpec]:
        out = {}
        for role in ROLES:
            d = self._call(f"read Deployment {m.variant_name(service, role)}",
                           lambda role=role: self._get("deployment", m.variant_name(service, role)))
            if d is not None:
                raw = d["metadata"].get("annotations", {}).get(m.SPEC_ANNOTATION)
                if raw is None:
                    raise DeployError(f"Deployment {m.variant_name(service, role)} exists but was not created by "
                                      f"SITS (no {m.SPEC_ANNOTATION} annotation); refusing to manage it")
                out[role] = VariantSpec.from_dict(json.loads(raw))
        return out

    def _weight_of(self, service: str, role: str) -> int:
        d = self._get("deployment", m.variant_name(service, role))
        return _int_or_none((d or {}).get("metadata", {}).get("annotations", {}).get(m.WEIGHT_ANNOTATION)) or 0

    @staticmethod
    def _total_replicas(specs: Mapping[str, VariantSpec]) -> int:
        if "production" in specs:
            return max(1, specs["production"].replicas)
        return max([1] + [s.replicas for s in specs.values()])

    # ---- HTTPRoute ----
    def _write_route(self, service: str, weights: Mapping[str, int]) -> None:
        c = self.config
        body = m.httproute(service, weights, c.port, gateway=c.gateway, gateway_namespace=c.gateway_namespace,
                           hostnames=c.hostnames, version=c.httproute_version)

        def op() -> None:
            cur = self._get("route", service)
            if cur is None:
                self._create("route", body)
            elif cur.get("spec") != body["spec"]:
                self._replace("route", service, _merged(cur, body))
        self._call(f"write HTTPRoute {service}", op)

    def _ensure_route_backend(self, service: str, role: str) -> None:
        cur = self._call(f"read HTTPRoute {service}", lambda: self._get("route", service))
        weights = m.route_weights(cur) if cur else {}
        if role not in weights:  # a new variant joins with no traffic, except a first production
            weights[role] = 100 if role == "production" and not any(weights.values()) else 0
            self._write_route(service, weights)

    def _remove_route_backend(self, service: str, role: str) -> None:
        cur = self._call(f"read HTTPRoute {service}", lambda: self._get("route", service))
        if cur is None:
            return
        weights = m.route_weights(cur)
        if role in weights:
            w = weights.pop(role)
            if w > 0 and "production" in weights:  # never route to a removed backend: its share goes to production
                weights["production"] += w
            self._write_route(service, weights)

    # ---- API plumbing: every call goes through _call (retries) and _get/_create/_replace/_delete ----
    def _call(self, what: str, op: Callable):
        """Run op (a whole read-modify-write); retry it on 409, 429, 5xx and connection errors."""
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                return op()
            except ApiException as e:
                retriable = e.status in (409, 429) or (e.status or 0) >= 500
                if not retriable:
                    raise _translate(e, what, self.config.namespace) from None
                if attempt == self.config.retries:
                    err = DeployConflictError if e.status == 409 else DeployError
                    raise err(f"{what}: still failing after {attempt + 1} attempts: "
                              f"{e.status} {_api_message(e)}") from None
                log.info("%s: %s %s; retry %d in %.2fs", what, e.status, _api_message(e), attempt + 1, delay)
            except urllib3.exceptions.HTTPError as e:
                if attempt == self.config.retries:
                    raise DeployError(f"{what}: Kubernetes API unreachable at {self.api.configuration.host}: "
                                      f"{e}") from None
            self._sleep(delay)
            delay = min(delay * 2, self.config.max_backoff_s)

    def _timeout(self) -> float:
        return self.config.request_timeout_s

    @staticmethod
    def _json(resp) -> dict:
        return json.loads(resp.data)

    def _kind(self, kind: str):
        ns, c, kw = self.config.namespace, self.config, {"_preload_content": False,
                                                         "_request_timeout": self._timeout()}
        route = (m.GATEWAY_GROUP, c.httproute_version, ns, "httproutes")
        return {
            "deployment": (lambda n: self.apps.read_namespaced_deployment(n, ns, **kw),
                           lambda b: self.apps.create_namespaced_deployment(ns, b, **kw),
                           lambda n, b: self.apps.replace_namespaced_deployment(n, ns, b, **kw),
                           lambda n: self.apps.delete_namespaced_deployment(n, ns, **kw)),
            "service": (lambda n: self.core.read_namespaced_service(n, ns, **kw),
                        lambda b: self.core.create_namespaced_service(ns, b, **kw),
                        lambda n, b: self.core.replace_namespaced_service(n, ns, b, **kw),
                        lambda n: self.core.delete_namespaced_service(n, ns, **kw)),
            "route": (lambda n: self.custom.get_namespaced_custom_object(*route, n, **kw),
                      lambda b: self.custom.create_namespaced_custom_object(*route, b, **kw),
                      lambda n, b: self.custom.replace_namespaced_custom_object(*route, n, b, **kw),
                      lambda n: self.custom.delete_namespaced_custom_object(*route, n, **kw)),
        }[kind]

    def _get(self, kind: str, name: str) -> dict | None:
        try:
            return self._json(self._kind(kind)[0](name))
        except ApiException as e:
            if _object_missing(e, name):
                return None
            raise

    def _create(self, kind: str, body: dict) -> None:
        self._kind(kind)[1](body)

    def _replace(self, kind: str, name: str, body: dict) -> None:
        self._kind(kind)[2](name, body)

    def _apply(self, what: str, kind: str, name: str, body: dict) -> None:
        def op() -> None:
            cur = self._get(kind, name)
            if cur is None:
                self._create(kind, body)
                return
            merged = _merged(cur, body)
            if kind == "service":  # clusterIP is immutable and allocated by the server
                for k in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "sessionAffinity"):
                    if k in cur.get("spec", {}):
                        merged["spec"][k] = cur["spec"][k]
            if merged != cur:
                self._replace(kind, name, merged)
        self._call(what, op)

    def _delete(self, what: str, kind: str, name: str) -> None:
        def op() -> None:
            try:
                self._kind(kind)[3](name)
            except ApiException as e:
                if not _object_missing(e, name):
                    raise
        self._call(f"delete {what}", op)


def _merged(cur: dict, desired: dict) -> dict:
    """desired's spec on cur's identity: keeps resourceVersion (optimistic concurrency) and foreign metadata."""
    out = copy.deepcopy(cur)
    out.pop("status", None)
    md = out["metadata"]
    md["labels"] = {**md.get("labels", {}), **desired["metadata"].get("labels", {})}
    md["annotations"] = {**md.get("annotations", {}), **desired["metadata"].get("annotations", {})}
    if desired["metadata"].get("annotations", {}).get(m.WEIGHT_ANNOTATION) is None:
        md["annotations"].pop(m.WEIGHT_ANNOTATION, None)
    out["spec"] = {**cur.get("spec", {}), **desired["spec"]}
    return out


def _int_or_none(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body).get("message", "") or str(e.reason)
    except (TypeError, ValueError, AttributeError):
        return str(e.reason or e.body or "")


def _namespace_missing(e: ApiException) -> bool:
    return e.status == 404 and _status(e).get("details", {}).get("kind") == "namespaces"


def _status(e: ApiException) -> dict:
    try:
        body = json.loads(e.body)
        return body if isinstance(body, dict) else {}
    except (TypeError, ValueError):
        return {}


def _object_missing(e: ApiException, name: str) -> bool:
    """404 for this very object (not for its namespace, nor for a resource type the server does not serve)."""
    st = _status(e)
    return e.status == 404 and st.get("reason") == "NotFound" and st.get("details", {}).get("name") == name \
        and st.get("details", {}).get("kind") != "namespaces"


def _crd_missing(e: ApiException) -> bool:
    # an unserved resource type answers 404 with a plain-text body or the generic "could not find the requested
    # resource" Status, never a NotFound Status naming an object
    st = _status(e)
    return e.status == 404 and (not st.get("details", {}).get("name")
                                or "could not find the requested resource" in st.get("message", ""))


def _translate(e: ApiException, what: str, namespace: str) -> DeployError:
    msg = _api_message(e)
    if e.status == 401:
        return DeployError(f"{what}: unauthorized (401): the credentials in the kubeconfig/service account were "
                           f"rejected: {msg}")
    if e.status == 403:
        return DeployError(f"{what}: forbidden (403) in namespace {namespace}: grant the SITS service account "
                           f"RBAC for this verb and resource: {msg}")
    if e.status == 404:
        if _namespace_missing(e):
            return DeployNotFoundError(f"{what}: namespace {namespace} does not exist: {msg}")
        if _crd_missing(e):
            return DeployNotFoundError(f"{what}: resource type not served by this cluster (is the Gateway API "
                                       f"HTTPRoute CRD installed?): {msg}")
        return DeployNotFoundError(f"{what}: not found (404): {msg}")
    if e.status == 422:
        return DeployError(f"{what}: rejected as invalid (422): {msg}")
    return DeployError(f"{what}: {e.status} {msg}")


def _load_client(c: KubernetesConfig) -> client.ApiClient:
    cfg = client.Configuration()
    in_cluster = c.in_cluster if c.in_cluster is not None else bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=cfg)
        else:
            kube_config.load_kube_config(config_file=c.kubeconfig, context=c.context, client_configuration=cfg)
    except (kube_config.ConfigException, OSError) as e:
        where = "in-cluster service account" if in_cluster else f"kubeconfig {c.kubeconfig or '(default)'}"
        raise DeployError(f"cannot load Kubernetes credentials from {where}: {e}") from None
    return client.ApiClient(cfg)
