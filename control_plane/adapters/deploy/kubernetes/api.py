"""Kubernetes API plumbing for the deployer: retries with backoff, error translation, dict-level CRUD.

Objects travel as plain dicts (`_preload_content=False` + json), never client models. `call(what, op)` runs a whole
read-modify-write and repeats it on 409 (re-reading gets the new resourceVersion), 429, 5xx and connection errors,
with exponential backoff; anything else becomes a DeployError naming the object, the status and the API's message.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import time
from typing import Callable

import urllib3
from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException

from sits.control_plane.adapters.deploy import DeployConflictError, DeployError, DeployNotFoundError
from sits.control_plane.adapters.deploy.kubernetes.manifests import GATEWAY_GROUP, WEIGHT_ANNOTATION

log = logging.getLogger(__name__)


class KubeApi:
    def __init__(self, api_client: client.ApiClient, namespace: str, *, retries: int, backoff_s: float,
                 max_backoff_s: float, request_timeout_s: float, httproute_version: str) -> None:
        self.api = api_client
        self.namespace = namespace
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.request_timeout_s = request_timeout_s
        self.httproute_version = httproute_version
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.sleep = time.sleep

    def call(self, what: str, op: Callable, *, retries: int | None = None):
        """Run op (a whole read-modify-write); retry it on 409, 429, 5xx and connection errors, `retries` times
        (default: the configured number; 0 for a best-effort read that must not hold its caller up)."""
        retries = self.retries if retries is None else retries
        delay = self.backoff_s
        for attempt in range(retries + 1):
            try:
                return op()
            except ApiException as e:
                retriable = e.status in (409, 429) or (e.status or 0) >= 500
                if not retriable:
                    raise translate(e, what, self.namespace) from None
                if attempt == retries:
                    err = (DeployConflictError if e.status == 409 else DeployError)(
                        f"{what}: still failing after {attempt + 1} attempt{'s' if attempt else ''}: "
                        f"{e.status} {_api_message(e)}")
                    err.status = e.status
                    raise err from None
                log.info("%s: %s %s; retry %d in %.2fs", what, e.status, _api_message(e), attempt + 1, delay)
            except urllib3.exceptions.HTTPError as e:
                if attempt == retries:
                    raise DeployError(f"{what}: Kubernetes API unreachable at {self.api.configuration.host}: "
                                      f"{e}") from None
            self.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    def list_deployments(self, label_selector: str) -> list[dict]:
        resp = self.apps.list_namespaced_deployment(self.namespace, label_selector=label_selector,
                                                    _preload_content=False, _request_timeout=self.request_timeout_s)
        return json.loads(resp.data).get("items", [])

    def list_pods(self, label_selector: str) -> list[dict]:
        resp = self.core.list_namespaced_pod(self.namespace, label_selector=label_selector,
                                             _preload_content=False, _request_timeout=self.request_timeout_s)
        return json.loads(resp.data).get("items", [])

    def read_pod_log(self, pod: str, container: str, *, tail_lines: int, limit_bytes: int,
                     timeout_s: float) -> str:
        """The last `tail_lines` lines `container` of `pod` logged (at most `limit_bytes`), as the kubelet keeps them,
        through the API server's pods/log subresource (RBAC: get pods/log)."""
        resp = self.core.read_namespaced_pod_log(pod, self.namespace, container=container, tail_lines=tail_lines,
                                                 limit_bytes=limit_bytes, _preload_content=False,
                                                 _request_timeout=min(timeout_s, self.request_timeout_s))
        return resp.data.decode("utf-8", errors="replace")

    def _kind(self, kind: str):
        ns, kw = self.namespace, {"_preload_content": False, "_request_timeout": self.request_timeout_s}
        route = (GATEWAY_GROUP, self.httproute_version, ns, "httproutes")
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

    def get(self, kind: str, name: str) -> dict | None:
        try:
            return json.loads(self._kind(kind)[0](name).data)
        except ApiException as e:
            if _object_missing(e, name):
                return None
            raise

    def create(self, kind: str, body: dict) -> None:
        self._kind(kind)[1](body)

    def replace(self, kind: str, name: str, body: dict) -> None:
        self._kind(kind)[2](name, body)

    def apply(self, what: str, kind: str, name: str, body: dict) -> None:
        def op() -> None:
            cur = self.get(kind, name)
            if cur is None:
                self.create(kind, body)
                return
            new = merged(cur, body)
            if kind == "service":  # clusterIP is immutable and allocated by the server
                for k in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "sessionAffinity"):
                    if k in cur.get("spec", {}):
                        new["spec"][k] = cur["spec"][k]
            if new != cur:
                self.replace(kind, name, new)
        self.call(what, op)

    def delete(self, what: str, kind: str, name: str) -> None:
        def op() -> None:
            try:
                self._kind(kind)[3](name)
            except ApiException as e:
                if not _object_missing(e, name):
                    raise
        self.call(f"delete {what}", op)




def merged(cur: dict, desired: dict) -> dict:
    """desired's spec on cur's identity: keeps resourceVersion (optimistic concurrency) and foreign metadata."""
    out = copy.deepcopy(cur)
    out.pop("status", None)
    md = out["metadata"]
    md["labels"] = {**md.get("labels", {}), **desired["metadata"].get("labels", {})}
    md["annotations"] = {**md.get("annotations", {}), **desired["metadata"].get("annotations", {})}
    if desired["metadata"].get("annotations", {}).get(WEIGHT_ANNOTATION) is None:
        md["annotations"].pop(WEIGHT_ANNOTATION, None)
    out["spec"] = {**cur.get("spec", {}), **desired["spec"]}
    return out


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


def translate(e: ApiException, what: str, namespace: str) -> DeployError:
    err = _translate(e, what, namespace)
    err.status = e.status
    return err


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


def load_client(kubeconfig: str | None, context: str | None, in_cluster: bool | None) -> client.ApiClient:
    """In-cluster service account (default when KUBERNETES_SERVICE_HOST is set) or a kubeconfig file."""
    cfg = client.Configuration()
    if in_cluster is None:
        in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            kube_config.load_incluster_config(client_configuration=cfg)
        else:
            kube_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (kube_config.ConfigException, OSError) as e:
        where = "in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise DeployError(f"cannot load Kubernetes credentials from {where}: {e}") from None
    return client.ApiClient(cfg)
