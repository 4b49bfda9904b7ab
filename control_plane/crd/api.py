"""The KernelRollout custom resource (`kernelrollouts.sits.dev/v1alpha1`, helm/sits-control/crds/) on the API server:
list, watch, status writes and Events, objects as plain dicts. Every call here is in the chart's Role
(tests/helm derive the Role's rules from this file). The watch loop that drives rollouts from these objects is
watch.py; what goes into `status` is status.py."""
from __future__ import annotations

import json
import time
import uuid
from typing import Iterator

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL, KIND = "sits.dev", "v1alpha1", "kernelrollouts", "KernelRollout"
COMPONENT = "sits-control"   # the Events' source


class CrdApiError(Exception):
    """A call about KernelRollouts failed (forbidden, CRD not installed, API server unreachable, ...)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WatchExpired(CrdApiError):
    """The watch's resourceVersion is too old (410 Gone, e.g. after etcd compaction): list again."""


def _error(what: str, e: Exception) -> CrdApiError:
    if isinstance(e, ApiException):
        if e.status == 410:
            return WatchExpired(f"{what}: resourceVersion expired (410 Gone): {e.reason}", 410)
        hint = {403: ": grant the SITS service account this verb (the chart's Role has it with watchCrds)",
                404: ": is the kernelrollouts.sits.dev CRD installed (helm/sits-control/crds/)?"}.get(e.status, "")
        try:
            msg = json.loads(e.body or "{}").get("message") or e.reason
        except ValueError:
            msg = e.reason
        return CrdApiError(f"{what}: {e.status} {msg}{hint}", e.status)
    return CrdApiError(f"{what}: Kubernetes API unreachable: {e}")


class KernelRolloutApi:
    """KernelRollouts of one namespace. `list()` -> (items, resourceVersion); `watch(rv, timeout_s)` yields
    (type, object) with bookmarks; `patch_status(name, status)`; `record_event(obj, type, reason, message)`."""

    def __init__(self, api_client: client.ApiClient, namespace: str, *, request_timeout_s: float = 30.0) -> None:
        self.namespace = namespace
        self.request_timeout_s = request_timeout_s
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self._watch: watch.Watch | None = None

    def list(self) -> tuple[list[dict], str]:
        try:
            resp = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                             _preload_content=False,
                                                             _request_timeout=self.request_timeout_s)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            raise _error(f"list {PLURAL} in namespace {self.namespace}", e) from None
        body = json.loads(resp.data)
        return body.get("items", []), body["metadata"]["resourceVersion"]

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict]]:
        """Events after `resource_version` until the server ends the watch (timeout_s) or stop_watch(); BOOKMARK
        events carry only metadata.resourceVersion. WatchExpired on 410; CrdApiError when the API is unreachable."""
        w = self._watch = watch.Watch()
        try:
            for ev in w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                               resource_version=resource_version, allow_watch_bookmarks=True,
                               timeout_seconds=timeout_s):
                # (deserialize=False would break the client's own handling of an ERROR event)
                yield ev["type"], ev["raw_object"]
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            raise _error(f"watch {PLURAL} in namespace {self.namespace}", e) from None
        finally:
            self._watch = None

    def stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def patch_status(self, name: str, status: dict) -> dict:
        """Merge-patch the status subresource (lists such as conditions are replaced whole)."""
        try:
            resp = self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, name,
                                                                     {"status": status}, _preload_content=False,
                                                                     _request_timeout=self.request_timeout_s)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            raise _error(f"update status of {KIND} {self.namespace}/{name}", e) from None
        return json.loads(resp.data)

    def record_event(self, obj: dict, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the resource (what `kubectl describe kr NAME` shows)."""
        meta = obj["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": self.namespace},
                "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"],
                                   "namespace": self.namespace, "uid": meta.get("uid"),
                                   "resourceVersion": meta.get("resourceVersion")},
                "type": type_, "reason": reason, "message": message[:1024], "count": 1,
                "firstTimestamp": now, "lastTimestamp": now, "source": {"component": COMPONENT}}
        try:
            self.core.create_namespaced_event(self.namespace, body, _preload_content=False,
                                              _request_timeout=self.request_timeout_s)
        except (ApiException, urllib3.exceptions.HTTPError) as e:
            raise _error(f"create Event for {KIND} {self.namespace}/{meta['name']}", e) from None
