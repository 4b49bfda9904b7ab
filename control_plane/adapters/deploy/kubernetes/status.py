"""What the Kubernetes objects say of a variant: its Deployment's rollout status and its pods' container statuses.

Pure functions of the objects the API returns (plain dicts), no API calls: `deployment_status` reads readiness as
`kubectl rollout status` does; `pod_problems` says in the kubelet's words why pods do not serve (crash loops, image
pulls, OOM kills, a restart after a kill), and `pods_crashing` tells the crash guard whether the engine keeps dying.
`log_pod` picks the pod whose engine log says most about a variant that is not ready (log_line.py makes what it
logged last one bounded, printable line).
"""
from __future__ import annotations

from sits.control_plane.adapters.deploy.kubernetes import manifests as m
from sits.control_plane.adapters.deploy import GPU_OWN, ReplicaStatus, VariantStatus
from sits.wire.models import LOAD_FAILED


def deployment_status(d: dict, role: str, *, endpoint: str) -> VariantStatus:
    """A variant's status from its Deployment: ready once every pod runs the current template and is available."""
    want = int(d["spec"].get("replicas", 1))
    st = d.get("status", {})
    ready_n = int(st.get("readyReplicas", 0) or 0)
    updated = int(st.get("updatedReplicas", 0) or 0)
    available = int(st.get("availableReplicas", 0) or 0)
    total = int(st.get("replicas", 0) or 0)
    observed = int(st.get("observedGeneration", 0) or 0) >= int(d["metadata"].get("generation", 0))
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
    return VariantStatus(role=role, ready=ready, replicas=want, ready_replicas=ready_n, endpoint=endpoint,
                         message=msg)


_BENIGN_WAITING = {"ContainerCreating", "PodInitializing"}


def pods_crashing(pods: list[dict]) -> bool:
    """A container in CrashLoopBackOff, exited with an error (not yet restarted: the kubelet reports the exit before
    it counts the restart), or restarted after exiting with an error and not ready again."""
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            state = cs.get("state", {}) or {}
            if (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                return True
            if (state.get("terminated") or {}).get("exitCode"):
                return True
            last = cs.get("lastState", {}).get("terminated") or {}
            if last.get("exitCode") and not cs.get("ready"):
                return True
    return False


def pod_problems(pods: list[dict]) -> str:
    """What keeps a variant's pods from serving, in the kubelet's words (CrashLoopBackOff, ImagePullBackOff, ...)."""
    out = []
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            waiting = cs.get("state", {}).get("waiting") or {}
            last = cs.get("lastState", {}).get("terminated") or {}
            if waiting.get("reason") and waiting["reason"] not in _BENIGN_WAITING:
                msg = f"pod {pod['metadata']['name']}: {cs['name']} {waiting['reason']}"
                if cs.get("restartCount"):
                    msg += f" (restarted {cs['restartCount']} times"
                    msg += f", last exit code {last['exitCode']} {last.get('reason', '')})" if last else ")"
                out.append(msg.rstrip() + load_failure(last))
            elif last.get("reason") == "OOMKilled":
                out.append(f"pod {pod['metadata']['name']}: {cs['name']} OOMKilled")
            elif cs.get("restartCount") and last.get("exitCode") and not cs.get("ready"):   # restarted, not up yet
                n = cs["restartCount"]
                out.append(f"pod {pod['metadata']['name']}: {cs['name']} restarted {n} time{'s' if n != 1 else ''}, "
                           f"last exit code {last['exitCode']} {last.get('reason', '')}".rstrip() + load_failure(last))
    return "; ".join(out[:5]) + (f"; ... {len(out) - 5} more" if len(out) > 5 else "")


def load_failure(terminated: dict) -> str:
    """": engine failed to load: <its error>" when a container's termination message (its log's end, by the
    manifest's FallbackToLogsOnError) holds the line an engine writes last when it cannot load; else ""."""
    lines = [x for x in str(terminated.get("message") or "").splitlines() if x.startswith(LOAD_FAILED)]
    return f": engine failed to load: {lines[-1][len(LOAD_FAILED):][:300]}" if lines else ""


def log_pod(pods: list[dict]) -> str | None:
    """The newest pod (not being deleted) that is not ready and whose engine container has run, so the kubelet has
    its log: running, or terminated, or waiting to restart after a run (the kubelet then serves the run that ended).
    None when there is none: a pod still waiting for its first start has no log to read."""
    def ran(pod: dict) -> bool:
        for cs in pod.get("status", {}).get("containerStatuses", []) or []:
            if cs.get("name") == m.ENGINE_CONTAINER:
                state, last = cs.get("state") or {}, cs.get("lastState") or {}
                return not cs.get("ready") and ("running" in state or "terminated" in state or "terminated" in last)
        return False
    mine = [p for p in pods if not p["metadata"].get("deletionTimestamp") and ran(p)]
    if not mine:
        return None
    return max(mine, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))[
        "metadata"]["name"]


def pod_replica(pod: dict, role: str, gpu_resource: str = "nvidia.com/gpu") -> ReplicaStatus:
    """One pod as an engine of `role`: ready from its Ready condition, restarts and state from the engine container's
    status (the waiting or termination reason in the kubelet's words; "pending" before the pod has one), the GPUs its
    engine container asks for (the device plugin gives each pod GPUs of its own). No log."""
    meta, st = pod["metadata"], pod.get("status", {})
    engine = next((c for c in pod.get("spec", {}).get("containers", []) or [] if c.get("name") == m.ENGINE_CONTAINER),
                  {})
    gpus = str(((engine.get("resources") or {}).get("limits") or {}).get(gpu_resource, ""))
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions", []) or [])
    cs = next((c for c in st.get("containerStatuses", []) or [] if c.get("name") == m.ENGINE_CONTAINER), None)
    state = "pending" if st.get("phase", "Pending") == "Pending" else str(st.get("phase", "")).lower()
    if cs is not None:
        s = cs.get("state") or {}
        if "waiting" in s:
            state = (s["waiting"] or {}).get("reason") or "waiting"
        elif "terminated" in s:
            t = s["terminated"] or {}
            state = f"{t.get('reason') or 'terminated'} {t.get('exitCode', '')}".strip()
        elif "running" in s:
            state = "running"
    if meta.get("deletionTimestamp"):
        state = "terminating"
    return ReplicaStatus(role=role, name=meta["name"], ready=ready, restarts=int((cs or {}).get("restartCount", 0)),
                         state=state, address=st.get("podIP"), gpu_placement=GPU_OWN if gpus else "",
                         gpu_note=f"{gpus} {gpu_resource} of its own" if gpus else "")


def has_run(pod: dict) -> bool:
    """Whether the engine container has started at least once (the kubelet has a log of it to serve)."""
    for cs in pod.get("status", {}).get("containerStatuses", []) or []:
        if cs.get("name") == m.ENGINE_CONTAINER:
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            return "running" in state or "terminated" in state or "terminated" in last
    return False
