"""Helpers for the cluster tests: pod manifests (waiting: tests/waiting.py)."""
from __future__ import annotations



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
