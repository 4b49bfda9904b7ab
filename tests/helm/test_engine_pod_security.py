"""The engine pods the Kubernetes deployer creates run restricted (issue 26): the Deployment it sends, checked
against the Kubernetes schema (strict) and the Pod Security Standard "restricted" profile's rules."""
from __future__ import annotations

import kubernetes_validate
import pytest

from sits.control_plane.adapters.deploy.kubernetes import manifests as m
from sits.control_plane.adapters.deploy import VariantSpec

K8S_VERSION = "1.30.0"


def restricted_violations(pod: dict) -> list[str]:
    """The checks of the "restricted" Pod Security Standard (v1.30) that a pod spec can fail."""
    out = []
    psc = pod.get("securityContext", {})
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        out.append("host namespaces")
    if psc.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        out.append("pod seccompProfile")
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    for v in pod.get("volumes", []):
        if not set(v) - {"name"} <= allowed_volumes:
            out.append(f"volume {v['name']}")
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            out.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsUser 0")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            out.append(f"{c['name']}: capabilities not dropped")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities added")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
    return out


@pytest.mark.parametrize("gpus", [0, 1])
def test_engine_pods_are_restricted_with_a_read_only_root(gpus):
    spec = VariantSpec(service="chat", role="canary", kernels="torch", gpus=gpus, env={"SITS_X": "1"})
    dep = m.deployment(spec, image="sits:1", port=8000, replicas=2, gpu_resource="nvidia.com/gpu")
    kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
    pod = dep["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] != 0 and pod["automountServiceAccountToken"] is False
    # the one writable path: /tmp (the image's HOME and TRITON_CACHE_DIR, see the Dockerfile), an emptyDir
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    assert c["env"] == [{"name": "SITS_X", "value": "1"}]


def test_the_checker_catches_what_an_unrestricted_pod_does():
    """The profile check above is not vacuous: the pod spec the deployer sent before (no securityContext) fails."""
    bare = {"containers": [{"name": "engine", "image": "sits:1"}]}
    assert set(restricted_violations(bare)) == {"pod seccompProfile", "engine: allowPrivilegeEscalation",
                                                 "engine: runAsNonRoot", "engine: capabilities not dropped"}
