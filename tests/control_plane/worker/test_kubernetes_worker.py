"""The worker driving the real KubernetesDeployer against a real kube-apiserver + controller-manager (pods never run
there: a thread does the kubelet's part, the real controllers derive the Deployment status). Metrics are canned."""
import threading

import pytest
from kubernetes import client

from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer
from sits.control_plane.analysis import Policy
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig
from tests.waiting import wait_for

from .support import CannedSource

SVC = "chat"
FAST = Policy(steps=(25, 50), check_interval_s=0.3, warmup_s=0.0, ready_timeout_s=60,
              correctness={"enabled": False},   # canned metrics, no engines to replay prompts on
              window_s=1.0)   # the sequence's 6 windows in ~6 s, not 60: this is about the deployer


@pytest.mark.parametrize("scale,final,kernels", [(1.0, Phase.SUCCEEDED, "triton-v1.1"),
                                                 (1.6, Phase.ROLLED_BACK, "torch")])
def test_worker_rolls_out_on_kubernetes(kube_cluster, kube_namespace, tmp_path, scale, final, kernels):
    ns = kube_namespace
    kd = KubernetesDeployer(KubernetesConfig(namespace=ns, kubeconfig=kube_cluster.kubeconfig, backoff_s=0.02))
    stop = threading.Event()

    def kubelet():
        while not stop.wait(0.2):
            try:
                kube_cluster.make_pods_ready(ns, f"app={SVC}")
            except Exception:   # a pod deleted while being marked: next round
                pass
    threading.Thread(target=kubelet, daemon=True).start()
    store = Store(str(tmp_path / "k.db"))
    start_rollout(store, SVC, "triton-v1.1", "torch", FAST, DeploySpec(replicas=4, canary_args=("--seed", "7"),
                                                                        canary_image="registry.local/sits:2"),
                  rollout_id="r1")
    w = Worker(store, kd, CannedSource(rate=2000, scale={SVC: scale}), config=WorkerConfig(interval_s=0.2)).start()
    try:
        wait_for(lambda: f"rollout r1 to end: {[e['message'] for e in store.events('r1')]}",
                 lambda: not store.get("r1").active, timeout=90, interval=0.2)
    finally:
        w.stop()
        stop.set()
    r = store.get("r1")
    assert r.phase is final, "\n".join(e["message"] for e in store.events("r1"))
    assert all(a["status"] == "done" for a in store.actions("r1"))
    apps = client.AppsV1Api(kube_cluster.api_client())
    deps = {d.metadata.name: d for d in apps.list_namespaced_deployment(ns).items}
    assert set(deps) == {f"{SVC}-production"}                      # canary and baseline removed
    prod = deps[f"{SVC}-production"]
    assert prod.metadata.labels["sits.io/kernel-version"] == kernels
    args = prod.spec.template.spec.containers[0].args
    assert args[args.index("--kernels") + 1] == kernels and ("--seed" in args) == (final is Phase.SUCCEEDED)
    assert (prod.spec.template.spec.containers[0].image == "registry.local/sits:2") == (final is Phase.SUCCEEDED)
    weights = [a["body"]["weights"] for a in store.actions("r1") if a["kind"] == "set_weights"]
    assert weights[0] == {"production": 50, "baseline": 25, "canary": 25}
    store.close()
