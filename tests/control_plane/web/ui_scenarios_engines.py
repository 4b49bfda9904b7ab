"""Rollouts for the retry and engines browser tests, on top of ui_scenarios.build and in the same store, driven by the
real worker and state machine (frozen clock, canned metrics):

- pods: progressing, its engines listed as a Kubernetes deployer lists pods: production 2 ready, baseline ready, the
  canary's pod restarted 3 times after crashing, not ready, its last log line a long traceback line;
- gpus: progressing with tensor_parallel_size 2, its engines listed as the local deployer lists them on a machine of
  four GPUs: production 0,1 and baseline 2,3 held by them, the canary sharing all four (none left free), so the
  first two say they are shared too;
- the rest as ui_scenarios says (chat promoted then rolled back, embed aborted, search's deploy failed, rank running).
"""
from __future__ import annotations

from sits.control_plane.adapters.deploy import ReplicaStatus
from sits.control_plane.adapters.deploy.local.gpus import OWN, Placement
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.worker.loop import Worker

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

from . import ui_scenarios
from .ui_scenarios import POLICY

CRASH_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.19 GiB total "
              "capacity; 75.31 GiB already allocated; 1.12 GiB free; 76.02 GiB reserved in total by PyTorch) If reserved memory "
              "is >> allocated memory try setting max_split_size_mb")[:199] + "…"   # as log_line.py cuts it


class PodsDeployer(InMemoryDeployer):
    """Lists engines as KubernetesDeployer.replicas() does for a service whose canary pod crash-loops."""

    def replicas(self, service):
        return [ReplicaStatus("production", f"{service}-production-7c9f-x2k4p", True, 0, "running",
                              '10.244.0.7 - "POST /v1/completions HTTP/1.1" 200', address="10.244.0.7"),
                ReplicaStatus("production", f"{service}-production-7c9f-q8mzt", True, 0, "running",
                              '10.244.0.8 - "POST /v1/completions HTTP/1.1" 200', address="10.244.0.8"),
                ReplicaStatus("baseline", f"{service}-baseline-5d6b-m4n2c", True, 0, "running",
                              '10.244.0.9 - "POST /v1/completions HTTP/1.1" 200', address="10.244.0.9"),
                ReplicaStatus("canary", f"{service}-canary-6f8d-j7w5r", False, 3, "CrashLoopBackOff", CRASH_LINE,
                              address="10.244.0.10")]


GPU_SHARED_NOTE = "shares GPUs 0-3 with the other engines: 1 engine × 2 GPUs needed, 0 of 4 free"
# what the local deployer reports for a variant's own GPUs that the canary shares (Placement.describe, sharers=1)
HELD = {role: Placement(OWN, (gpus,), ("0", "1", "2", "3"), sharers=1)
        for role, gpus in (("production", ("0", "1")), ("baseline", ("2", "3")))}


class GpuDeployer(InMemoryDeployer):
    """Lists engines as LocalDeployer.replicas() does with four GPUs and two per engine."""

    def replicas(self, service):
        def engine(role, gpus, placement, note):
            return ReplicaStatus(role, f"{role}-0", True, 0, "running", "INFO: Application startup complete.",
                                 address=f"http://127.0.0.1:{9000 + len(role)}", gpu_placement=placement,
                                 gpus=gpus, gpu_note=note)
        return [*(engine(role, p.sets[0], p.seen_as, p.describe(0)) for role, p in HELD.items()),
                engine("canary", ("0", "1", "2", "3"), "shared", GPU_SHARED_NOTE)]


def build(path: str):
    sc = ui_scenarios.build(path)
    t = sc.clock + 10
    sc.pods = start_rollout(sc.store, "pods", "triton-v1.1", "triton-v1", POLICY, DeploySpec(replicas=2), now=t,
                            actor="otto").id
    now = [t]
    w = Worker(sc.store, PodsDeployer(), CannedSource(rate=20.0), clock=lambda: now[0], owner="test-worker")
    for _ in range(4):
        now[0] += 5.0
        w.reconcile_rollout(sc.pods)
    assert sc.store.get(sc.pods).phase is Phase.PROGRESSING
    sc.gpus = start_rollout(sc.store, "gpus", "triton-v1.1", "triton-v1", POLICY, DeploySpec(tensor_parallel_size=2),
                            now=now[0], actor="otto").id
    w = Worker(sc.store, GpuDeployer(), CannedSource(rate=20.0), clock=lambda: now[0], owner="test-worker")
    for _ in range(4):
        now[0] += 5.0
        w.reconcile_rollout(sc.gpus)
    assert sc.store.get(sc.gpus).phase is Phase.PROGRESSING
    sc.clock = now[0]
    return sc
