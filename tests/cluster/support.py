"""Helpers for the cluster tests: waiting on API state, pod manifests."""
from __future__ import annotations

import time


def wait_for(what: str, fn, timeout: float = 45.0, interval: float = 0.2):
    """Poll fn() until it returns something truthy; returns it, or raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # e.g. 404 until the object exists
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"{what}: not after {timeout}s (last: {last!r})")


def pod(name: str, command: list[str], *, volumes=(), mounts=(), env=(), grace: int = 30, **container) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"terminationGracePeriodSeconds": grace, "volumes": list(volumes),
                     "containers": [{"name": "main", "image": "registry.local/busybox:1", "command": command,
                                     "volumeMounts": list(mounts), "env": list(env), **container}]}}


def container_status(core, ns: str, name: str) -> dict:
    p = core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, ns))
    return (p.get("status", {}).get("containerStatuses") or [{}])[0]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
