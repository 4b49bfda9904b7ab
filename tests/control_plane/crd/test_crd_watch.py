"""KernelRollout resources on the real kube-apiserver drive rollouts (`--watch-crds`): the CRD from the chart, the
real watch, status subresource and Events; the worker beside it runs the in-memory deployer with canned metrics."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sits.control_plane.crd.api import GROUP, PLURAL, VERSION, KernelRolloutApi
from sits.control_plane.rollout import Command, Phase
from sits.control_plane.service.rollouts import send_command
from sits.control_plane.store.db import Store
from sits.control_plane.worker.config import WorkerConfig
from sits.control_plane.crd.watch import CrdWatcher
from sits.control_plane.worker.loop import Worker
from tests.waiting import wait_for, wait_http_ok

from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

CRD = Path(__file__).resolve().parents[3] / "helm" / "sits-control" / "crds" / "kernelrollouts.sits.dev.yaml"
FAST = {"steps": [50], "check_interval_s": 0.3, "warmup_s": 0.0, "min_samples": 50, "failure_limit": 1,
        "window_s": 0.0, "min_windows": 4, "correctness": {"enabled": False}}   # sequential: windows by count
SLOW = {**FAST, "steps": [10, 50], "check_interval_s": 3600.0}   # stays at its first step: time to edit it


@pytest.fixture
def crd(kube_cluster):
    return kube_cluster.install_crd(CRD)


@pytest.fixture
def plane(kube_cluster, kube_namespace, crd, tmp_path):
    """A worker (in-memory deployer, canary latency x1.6) and a CrdWatcher on one store, in the test's namespace."""
    db = str(tmp_path / "sits.db")
    worker = Worker(Store(db), InMemoryDeployer(), CannedSource(rate=2000, scale={"chat": 1.6}),
                    config=WorkerConfig(interval_s=0.1)).start()
    store = Store(db)
    watcher = CrdWatcher(store, KernelRolloutApi(kube_cluster.api_client(), kube_namespace), sync_interval_s=0.2,
                         watch_timeout_s=30).start()
    try:
        yield watcher
    finally:
        watcher.stop()
        worker.stop()
        worker.store.close()
        store.close()


def custom(kube_cluster):
    return client.CustomObjectsApi(kube_cluster.api_client())


def apply(kube_cluster, ns, name, **spec):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KernelRollout", "metadata": {"name": name},
            "spec": {"service": "chat", "kernels": "triton-v1", **spec}}
    return custom(kube_cluster).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def get(kube_cluster, ns, name):
    return custom(kube_cluster).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def status_where(kube_cluster, ns, name, what, cond, timeout=45.0):
    last = {}

    def probe():
        last["status"] = st = get(kube_cluster, ns, name).get("status") or {}
        return st if cond(st) else None
    try:
        return wait_for(f"{name}: {what}", probe, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; last status: {last.get('status')}") from None


def condition(st, type_):
    return next((c for c in st.get("conditions", []) if c["type"] == type_), {})


def events(kube_cluster, ns, name):
    core = client.CoreV1Api(kube_cluster.api_client())
    return [(e.type, e.reason, e.message) for e in core.list_namespaced_event(ns).items
            if e.involved_object.name == name and e.involved_object.kind == "KernelRollout"]


def test_the_schema_rejects_what_cannot_be_a_kernel_rollout(kube_cluster, kube_namespace, crd):
    for bad in ({"replicas": 0}, {"service": "Not_A_Name"}, {"policy": {"steps": [0]}}, {"paused": "yes"},
                {"policy": {"on_inconclusive": "ignore"}}):
        with pytest.raises(ApiException) as e:
            apply(kube_cluster, kube_namespace, "bad", **bad)
        assert e.value.status == 422, bad
    with pytest.raises(ApiException) as e:   # kernels is required
        custom(kube_cluster).create_namespaced_custom_object(GROUP, VERSION, kube_namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "KernelRollout", "metadata": {"name": "nok"},
            "spec": {"service": "chat"}})
    assert e.value.status == 422 and "kernels" in e.value.body
    ok = apply(kube_cluster, kube_namespace, "ok", policy={"steps": [10, 50], "future_field": 1})
    assert ok["spec"]["policy"]["future_field"] == 1   # the open part of the policy is kept for the control plane


def test_apply_runs_a_rollout_and_status_shows_its_checks(kube_cluster, kube_namespace, plane):
    apply(kube_cluster, kube_namespace, "slow", policy=FAST, args=["--seed", "7"])
    st = status_where(kube_cluster, kube_namespace, "slow", "rolled back", lambda s: s.get("phase") == "rolled_back")
    r = plane.store.get(st["rolloutId"])
    assert r.phase is Phase.ROLLED_BACK and r.canary_kernels == "triton-v1" and r.production_kernels == "torch"
    assert plane.store.spec(r.id).canary_args == ("--seed", "7")
    assert st["checks"] == r.checks >= 1 and st["lastCheck"]["seq"] == r.checks
    assert st["lastCheck"]["verdict"] == "fail" and st["lastCheck"]["metric"].startswith("http_request_duration")
    assert st["lastCheck"]["delta"].startswith("+") and st["lastCheck"]["interval"].startswith("[+")
    assert condition(st, "Completed")["status"] == "True" and condition(st, "Degraded")["reason"] == "RolledBack"
    assert condition(st, "Progressing")["status"] == "False"
    assert st["observedGeneration"] == 1
    reasons = [e[1] for e in events(kube_cluster, kube_namespace, "slow")]
    assert "Started" in reasons
    # a finished resource keeps its final status, and no second rollout starts for it
    plane.sync()
    assert get(kube_cluster, kube_namespace, "slow")["status"] == st
    assert [x.id for x in plane.store.list(service="chat")] == [r.id]


def test_pause_resume_edit_and_delete(kube_cluster, kube_namespace, plane):
    ns, api = kube_namespace, custom(kube_cluster)
    apply(kube_cluster, ns, "kr", policy=SLOW)
    first = status_where(kube_cluster, ns, "kr", "progressing", lambda s: s.get("phase") == "progressing")["rolloutId"]

    api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kr", {"spec": {"paused": True}})
    st = status_where(kube_cluster, ns, "kr", "paused", lambda s: s.get("phase") == "paused")
    assert st["specPaused"] is True and st["observedGeneration"] == 2 and st["rolloutId"] == first
    # the UI/API resumes it: the status shows that, and the watcher does not pause it again
    send_command(plane.store, first, Command.RESUME, "alice")
    status_where(kube_cluster, ns, "kr", "resumed by the API", lambda s: s.get("phase") == "progressing")
    plane.sync()
    assert plane.store.get(first).phase is Phase.PROGRESSING

    api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kr", {"spec": {"kernels": "triton-v1.1"}})
    st = status_where(kube_cluster, ns, "kr", "a new rollout", lambda s: s.get("rolloutId") not in (None, first))
    old, new = plane.store.get(first), plane.store.get(st["rolloutId"])
    assert old.phase is Phase.ROLLED_BACK and old.canary_kernels == "triton-v1"
    assert new.canary_kernels == "triton-v1.1" and new.active and st["observedGeneration"] == 3
    assert "Superseded" in [e[1] for e in events(kube_cluster, ns, "kr")]

    # spec.paused is still true: the new rollout is paused too
    status_where(kube_cluster, ns, "kr", "new one paused", lambda s: s.get("phase") == "paused")
    api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "kr")
    wait_for("the deleted resource's rollout aborted", lambda: plane.store.get(new.id).phase is Phase.ROLLED_BACK)
    assert any(e["actor"] == f"kernelrollout/{ns}/kr" for e in plane.store.events(new.id))


def test_a_resource_deleted_while_no_watcher_ran_aborts_its_rollout(kube_cluster, kube_namespace, plane):
    ns = kube_namespace
    apply(kube_cluster, ns, "gone", policy=SLOW)
    apply(kube_cluster, ns, "kept", service="other", policy=SLOW)
    gone, kept = (status_where(kube_cluster, ns, n, "progressing", lambda s: s.get("phase") == "progressing")[
        "rolloutId"] for n in ("gone", "kept"))
    plane.stop()
    custom(kube_cluster).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gone")
    fresh = CrdWatcher(plane.store, plane.api, sync_interval_s=0.2).start()   # a new process: nothing in memory
    try:
        wait_for("the orphaned rollout aborted", lambda: plane.store.get(gone).phase is Phase.ROLLED_BACK)
        assert plane.store.get(kept).phase is Phase.PROGRESSING
    finally:
        fresh.stop()


def test_a_spec_the_control_plane_refuses_is_degraded(kube_cluster, kube_namespace, plane):
    ns = kube_namespace
    apply(kube_cluster, ns, "unknown", kernels="no-such-set", policy=FAST)
    apply(kube_cluster, ns, "badpolicy", service="other", policy={**FAST, "steps": [50, 10]})
    for name, field in (("unknown", "kernels"), ("badpolicy", "policy.steps")):
        st = status_where(kube_cluster, ns, name, "Degraded", lambda s: condition(s, "Degraded").get("status") == "True")
        deg = condition(st, "Degraded")
        assert deg["reason"] == "InvalidSpec" and field in deg["message"] and "rolloutId" not in st
        assert ("Warning", "InvalidSpec", deg["message"]) in events(kube_cluster, ns, name)
    assert plane.store.list() == []
    # fixing the spec starts the rollout
    custom(kube_cluster).patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "unknown",
                                                        {"spec": {"kernels": "triton-v1"}})
    st = status_where(kube_cluster, ns, "unknown", "started after the fix", lambda s: s.get("rolloutId"))
    assert condition(st, "Degraded")["status"] == "False" and plane.store.get(st["rolloutId"]).canary_kernels == \
        "triton-v1"


def test_the_watch_survives_410_gone_and_an_apiserver_restart(kube_cluster, kube_namespace, plane):
    ns = kube_namespace
    apply(kube_cluster, ns, "a", service="svc-a", policy=SLOW)
    status_where(kube_cluster, ns, "a", "started", lambda s: s.get("rolloutId"))
    lists = plane.relists
    # a watcher that was away long enough for its resourceVersion to be compacted away: 410 Gone -> list again
    plane.stop()
    apply(kube_cluster, ns, "b", service="svc-b", policy=SLOW)
    plane.resource_version = "1"
    plane.sync_interval_s = 3600.0   # only the watch (and its relist) may find "b"
    plane.start()
    status_where(kube_cluster, ns, "b", "started after the relist", lambda s: s.get("rolloutId"))
    assert plane.relists == lists + 1

    kube_cluster.restart_apiserver()
    apply(kube_cluster, ns, "c", service="svc-c", policy=SLOW)
    st = status_where(kube_cluster, ns, "c", "started after the restart", lambda s: s.get("rolloutId"), timeout=60)
    assert plane.store.get(st["rolloutId"]).service == "svc-c"
    assert len({r.id for r in plane.store.list()}) == 3


def test_serve_watch_crds_runs_the_watcher(kube_cluster, kube_namespace, crd, tmp_path):
    """`sits-control serve --watch-crds` (a real process; --no-worker: the rollout waits in pending) turns a
    KernelRollout into a rollout with the service's policy defaults under the resource's policy."""
    (tmp_path / "policy.yaml").write_text("check_interval_s: 42\nsteps: [5, 50]\n")
    db = str(tmp_path / "sits.db")
    argv = [sys.executable, "-m", "sits.control_plane.cli", "serve", "--port", "0", "--no-worker", "--watch-crds",
            "--namespace", kube_namespace, "--kubeconfig", kube_cluster.kubeconfig, "--store", db,
            "--policy-defaults", str(tmp_path / "policy.yaml")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        apply(kube_cluster, kube_namespace, "chat", policy={"steps": [20, 60]})
        st = wait_for("serve --watch-crds started the rollout", lambda: (get(
            kube_cluster, kube_namespace, "chat").get("status") or {}).get("rolloutId"), proc=proc)
        with Store(db, readonly=True) as s:
            r = s.get(st)
        assert r.policy.steps == (20, 60) and r.policy.check_interval_s == 42 and r.canary_kernels == "triton-v1"
        seen = []
        for line in proc.stdout:   # its URL, then (answering) the server runs and SIGTERM stops it cleanly
            seen.append(line)
            if line.startswith("sits-control serve:"):
                break
        assert proc.poll() is None, "".join(seen)
        wait_http_ok(line.split()[2] + "healthz", 30, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out


def test_serve_watch_crds_without_credentials_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sits.control_plane.cli", "serve", "--port", "0", "--no-worker",
                        "--watch-crds", "--kubeconfig", str(tmp_path / "missing"), "--store", str(tmp_path / "s.db")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "KUBERNETES_SERVICE_HOST": ""})
    assert r.returncode == 2 and "--watch-crds: cannot load Kubernetes credentials" in r.stderr, r.stderr
