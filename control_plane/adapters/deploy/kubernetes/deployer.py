"""KubernetesDeployer: variants as Deployments + Services in one namespace, through the official client.

Traffic: `traffic="replicas"` splits by replica ratio behind one Service `<service>` that selects every variant
(no mesh needed; coarse, as replicas are integers); `traffic="httproute"` writes Gateway API HTTPRoute backend weights
(exact percentages; replicas stay at spec.replicas). Writes are read-modify-write with the object's resourceVersion;
409 conflicts and 5xx/429 are retried with exponential backoff (re-reading first); 401/403/404/422 become DeployErrors
with the API's own message. Readiness comes from Deployment status, as the deployment controller writes it, and
why a variant is not ready from its pods' container statuses (status.py) and the last line its newest not-ready
pod's engine logged (the pods/log subresource, best-effort).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from kubernetes import client

from sits.control_plane.adapters.deploy.kubernetes import manifests as m
from sits.control_plane.rollout import ROLES
from sits.control_plane.adapters.deploy import (DeployError, DeployNotFoundError, ReplicaLimit, ReplicaStatus,
                                                VariantSpec, VariantStatus, check_role, normalize_weights)
from sits.control_plane.adapters.deploy.kubernetes.api import KubeApi, load_client, merged
from sits.control_plane.adapters.deploy.kubernetes.status import (deployment_status, has_run, log_pod, pod_problems,
                                                                  pod_replica, pods_crashing)
from sits.control_plane.adapters.deploy.log_line import shown_log_line

log = logging.getLogger(__name__)
# what status() reads of a not-ready variant's engine log: enough lines to find the last one with text on it, bounded
# in bytes, and never waiting on a kubelet longer than this
_LOG_TAIL_LINES, _LOG_LIMIT_BYTES, _LOG_TIMEOUT_S = 20, 64 * 1024, 5.0
_REPLICA_LOG_LINES = 3   # replicas(): the last line of each pod, with a little room for a blank last line


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
    max_replicas: int = 32                   # policy maximum per variant: a typo cannot ask the cluster for 100000

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
        if isinstance(self.max_replicas, bool) or not isinstance(self.max_replicas, int) or self.max_replicas < 1:
            raise DeployError(f"max_replicas must be an integer >= 1, got {self.max_replicas!r}")
        self.hostnames = tuple(self.hostnames)


class KubernetesDeployer:
    def __init__(self, config: KubernetesConfig | None = None, *, api_client: client.ApiClient | None = None):
        self.config = config or KubernetesConfig()
        c = self.config
        self._owns_client = api_client is None
        self.kube = KubeApi(api_client or load_client(c.kubeconfig, c.context, c.in_cluster), c.namespace,
                            retries=c.retries, backoff_s=c.backoff_s, max_backoff_s=c.max_backoff_s,
                            request_timeout_s=c.request_timeout_s, httproute_version=c.httproute_version)

    # ---- Deployer protocol ----
    def cancel(self) -> None:
        """Nothing to cancel: deploy() applies objects and returns; readiness is observed, never waited for here."""

    def deploy(self, spec: VariantSpec, interrupted: Callable[[], bool] | None = None) -> None:
        """Apply the variant's objects and return: readiness is observed later, never waited for (`interrupted`
        has nothing to stop)."""
        ns, name = self.config.namespace, m.variant_name(spec.service, spec.role)
        if spec.replicas > self.config.max_replicas:
            raise DeployError(f"{spec.service}/{spec.role}: {spec.replicas} replicas exceed the policy maximum of "
                              f"{self.config.max_replicas} (KubernetesConfig.max_replicas)")
        self._apply_deployment(spec)
        self.kube.apply(f"Service {name}", "service", name,
                    m.service(name, spec.service, m.selector(spec.service, spec.role), self.config.port, spec.role))
        if self.config.traffic == "replicas":
            self.kube.apply(f"Service {spec.service}", "service", spec.service,
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
        items = self.kube.call(f"list Deployments of {service}", lambda: self.kube.list_deployments(sel))
        out = {}
        for d in items:
            role = d["metadata"].get("labels", {}).get(m.ROLE_LABEL)
            if role in ROLES:
                out[role] = deployment_status(d, role, endpoint=self._endpoint(service, role))
        if out and self.config.traffic == "httproute":
            route = self.kube.call(f"read HTTPRoute {service}", lambda: self.kube.get("route", service))
            weights = m.route_weights(route) if route else {}
            for role, st in list(out.items()):
                out[role] = dataclasses.replace(st, message=f"{st.message}; HTTPRoute weight {weights.get(role, 0)}%")
        if any(not s.ready and s.replicas for s in out.values()):  # say why: crash loops, image pulls, OOM kills
            pods = self.kube.call(f"list Pods of {service}", lambda: self.kube.list_pods(sel.split(",")[0]))
            for role, st in list(out.items()):
                if st.ready:
                    continue
                mine = [p for p in pods if p["metadata"].get("labels", {}).get(m.ROLE_LABEL) == role]
                why = pod_problems(mine)
                msg = f"{st.message}; {why}" if why else st.message
                if st.replicas:   # and what its engine said last
                    msg += self._log_line(log_pod(mine))
                out[role] = dataclasses.replace(st, message=msg, crashing=pods_crashing(mine))
        return out

    def _log_line(self, pod: str | None) -> str:
        """"; pod P last log line: ..." for the pod log_pod() chose (nothing when it logged nothing)."""
        if pod is None:
            return ""
        line, error = self._read_log(pod, _LOG_TAIL_LINES)
        if error:
            return f"; pod {pod} logs unavailable ({error})"
        return f"; pod {pod} last log line: {line}" if line else ""

    def _read_log(self, pod: str, tail_lines: int) -> tuple[str, str]:
        """(its engine's last log line, "") or ("", why it could not be read). Best-effort: one try with a short
        timeout; a failure (no RBAC for pods/log, a kubelet that does not answer) is said in a few words, never
        raised."""
        try:
            text = self.kube.call(f"read the log of pod {pod}", lambda: self.kube.read_pod_log(
                pod, m.ENGINE_CONTAINER, tail_lines=tail_lines, limit_bytes=_LOG_LIMIT_BYTES,
                timeout_s=_LOG_TIMEOUT_S), retries=0)
        except DeployError as e:
            log.debug("%s", e)
            return "", {403: "403: grant get on pods/log", None: "no answer"}.get(e.status, str(e.status))
        return shown_log_line(text), ""

    def replicas(self, service: str) -> list[ReplicaStatus]:
        """Every pod of the service's variants (ROLES order, then by name) with readiness, restarts and the last
        line its engine logged (a few lines read per pod that has run; pods/log, best-effort)."""
        sel = ",".join(f"{k}={v}" for k, v in {**m.selector(service), **m.MANAGED_BY}.items())
        pods = self.kube.call(f"list Pods of {service}", lambda: self.kube.list_pods(sel.split(",")[0]))
        out = []
        for pod in pods:
            role = pod["metadata"].get("labels", {}).get(m.ROLE_LABEL)
            if role not in ROLES:
                continue
            rs = pod_replica(pod, role, self.config.gpu_resource)
            if has_run(pod):
                line, error = self._read_log(rs.name, _REPLICA_LOG_LINES)
                rs = dataclasses.replace(rs, last_log_line=line, log_error=error)
            out.append(rs)
        return sorted(out, key=lambda r: (ROLES.index(r.role), r.name))

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
                self.kube.delete(f"HTTPRoute {service}", "route", service)
            else:
                self._remove_route_backend(service, role)
        for r in roles:
            name = m.variant_name(service, r)
            self.kube.delete(f"Deployment {name}", "deployment", name)
            self.kube.delete(f"Service {name}", "service", name)
        if role is None:
            self.kube.delete(f"Service {service}", "service", service)

    def replica_limit(self) -> ReplicaLimit:
        return ReplicaLimit(self.config.max_replicas, "the Kubernetes deployer's max_replicas")

    def router_url(self, service: str) -> str | None:
        """The in-cluster URL of the Service that splits traffic by replicas; None with an HTTPRoute (the
        Gateway's address is the cluster's, not ours)."""
        if self.config.traffic != "replicas":
            return None
        return f"http://{service}.{self.config.namespace}.svc:{self.config.port}"

    def close(self) -> None:
        """Close the API client if this deployer made it (a client passed in belongs to the caller)."""
        if self._owns_client:
            self.kube.api.close()

    # ---- deployments ----
    def _apply_deployment(self, spec: VariantSpec) -> None:
        name = m.variant_name(spec.service, spec.role)
        image = spec.image or self.config.image

        def op() -> None:
            cur = self.kube.get("deployment", name)
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
                self.kube.create("deployment", body)
                return
            ann = cur["metadata"].get("annotations", {})
            if (ann.get(m.HASH_ANNOTATION) == body["metadata"]["annotations"][m.HASH_ANNOTATION]
                    and cur["spec"].get("replicas") == replicas):
                return  # already as desired
            self.kube.replace("deployment", name, merged(cur, body))
        self.kube.call(f"apply Deployment {name}", op)

    def _scale(self, service: str, role: str, replicas: int, weight: int) -> None:
        name = m.variant_name(service, role)

        def op() -> None:
            cur = self.kube.get("deployment", name)
            if cur is None:
                raise DeployNotFoundError(f"Deployment {name} disappeared while setting weights")
            ann = cur["metadata"].setdefault("annotations", {})
            if cur["spec"].get("replicas") == replicas and ann.get(m.WEIGHT_ANNOTATION) == str(weight):
                return
            ann[m.WEIGHT_ANNOTATION] = str(weight)
            cur["spec"]["replicas"] = replicas
            cur.pop("status", None)
            self.kube.replace("deployment", name, cur)
        self.kube.call(f"scale Deployment {name}", op)

    def _endpoint(self, service: str, role: str) -> str:
        return f"http://{m.variant_name(service, role)}.{self.config.namespace}.svc:{self.config.port}"

    def _specs(self, service: str) -> dict[str, VariantSpec]:
        out = {}
        for role in ROLES:
            d = self.kube.call(f"read Deployment {m.variant_name(service, role)}",
                           lambda role=role: self.kube.get("deployment", m.variant_name(service, role)))
            if d is not None:
                raw = d["metadata"].get("annotations", {}).get(m.SPEC_ANNOTATION)
                if raw is None:
                    raise DeployError(f"Deployment {m.variant_name(service, role)} exists but was not created by "
                                      f"SITS (no {m.SPEC_ANNOTATION} annotation); refusing to manage it")
                out[role] = VariantSpec.from_dict(json.loads(raw))
        return out

    def _weight_of(self, service: str, role: str) -> int:
        d = self.kube.get("deployment", m.variant_name(service, role))
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
            cur = self.kube.get("route", service)
            if cur is None:
                self.kube.create("route", body)
            elif cur.get("spec") != body["spec"]:
                self.kube.replace("route", service, merged(cur, body))
        self.kube.call(f"write HTTPRoute {service}", op)

    def _ensure_route_backend(self, service: str, role: str) -> None:
        cur = self.kube.call(f"read HTTPRoute {service}", lambda: self.kube.get("route", service))
        weights = m.route_weights(cur) if cur else {}
        if role not in weights:  # a new variant joins with no traffic, except a first production
            weights[role] = 100 if role == "production" and not any(weights.values()) else 0
            self._write_route(service, weights)

    def _remove_route_backend(self, service: str, role: str) -> None:
        cur = self.kube.call(f"read HTTPRoute {service}", lambda: self.kube.get("route", service))
        if cur is None:
            return
        weights = m.route_weights(cur)
        if role in weights:
            w = weights.pop(role)
            if w > 0 and "production" in weights:  # never route to a removed backend: its share goes to production
                weights["production"] += w
            self._write_route(service, weights)


def _int_or_none(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
