"""Bounds on what one deploy may start: replicas per machine (local) or per policy (Kubernetes), replicas started in
bounded batches, close() cancelling deploys in progress, and engine children that get an explicit environment."""
import os
import sys
import threading
from pathlib import Path

import pytest

from sits.control_plane.adapters.deploy.local import config as local_config, process
from sits.control_plane.adapters.deploy import DeployCancelled, DeployError, VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.deploy.local.replicas import ReplicaLauncher
from sits.control_plane.adapters.deploy.local.config import (ENGINE_MEMORY_BYTES as ENGINE, default_max_replicas,
                                                             engine_environment)
from tests.engine.server.processes import children
from tests.waiting import wait_for

GB = 1 << 30


def _engines(service: str) -> list[int]:
    """pids of live engine processes serving `service` (from /proc, not from the deployer's own bookkeeping)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--service" in argv and argv[argv.index(b"--service") + 1:][:1] == [service.encode()] \
                and process.pid_alive(int(d.name)):
            pids.append(int(d.name))
    return pids


@pytest.mark.parametrize("cpus,memory,want", [(2, 24 * GB, 4), (16, 128 * GB, 32), (64, 8 * GB, 8),
                                              (1, GB // 2, 1), (8, 0, 1)])
def test_default_max_replicas_by_cores_and_memory(cpus, memory, want):
    assert default_max_replicas(cpus, memory) == want


def test_default_bound_on_this_machine_is_the_formula_of_its_cores_and_memory(monkeypatch):
    """The deployer's default is default_max_replicas of this machine's usable cores and the memory available now
    (read once here and held, as MemAvailable moves between two reads)."""
    cpus, memory = len(os.sched_getaffinity(0)), local_config._available_memory()
    with open("/proc/meminfo") as f:
        assert "MemAvailable:" in f.read() and memory > 0
    monkeypatch.setattr(local_config, "_available_memory", lambda: memory)
    d = LocalDeployer(LocalConfig())
    try:
        assert d.max_replicas == default_max_replicas(cpus, memory) == max(1, min(2 * cpus, memory // ENGINE))
    finally:
        d.close()


@pytest.mark.parametrize("bad", [{"max_replicas": 0}, {"start_batch": 0}, {"max_replicas": True},
                                 {"start_batch": 1.5}])
def test_limit_config_validation(bad):
    with pytest.raises(DeployError):
        LocalConfig(**bad)


def test_replicas_beyond_the_bound_are_refused_before_anything_starts(tmp_path):
    with LocalDeployer(LocalConfig(workdir=str(tmp_path), max_replicas=2)) as d:
        with pytest.raises(DeployError, match="at most 2 fit"):
            d.deploy(VariantSpec(service="bound", role="production", kernels="torch", replicas=3))
        assert not list(tmp_path.glob("*.log")) and not _engines("bound")
        assert d.status("bound") == {}


def test_kubernetes_policy_maximum():
    from kubernetes import client

    from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer

    kd = KubernetesDeployer(KubernetesConfig(max_replicas=4), api_client=client.ApiClient())
    with pytest.raises(DeployError, match="policy maximum of 4"):   # refused before any API call
        kd.deploy(VariantSpec(service="chat", role="production", kernels="torch", replicas=5))
    with pytest.raises(DeployError):
        KubernetesConfig(max_replicas=0)


class _RecordingLauncher(ReplicaLauncher):
    """Records, at each replica start, how many replicas started before it answer /readyz."""

    def __init__(self, config, workdir):
        super().__init__(config, workdir)
        self.ready_at_start: list[int] = []
        self.urls: list[str] = []

    def start_one(self, spec, index, gpu_env=None, **kw):
        self.ready_at_start.append(sum(self.ready(u) for u in self.urls))
        r = super().start_one(spec, index, gpu_env, **kw)
        self.urls.append(r.url)
        return r


def test_replicas_start_in_bounded_batches_with_an_explicit_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SITS_PROMETHEUS_TOKEN", "prom-token-secret")
    monkeypatch.setenv("SITS_PROMETHEUS_PASSWORD", "prom-password-secret")
    monkeypatch.setenv("SOME_OTHER_SECRET", "x")
    cfg = LocalConfig(workdir=str(tmp_path), cpu_threads=1, max_replicas=3, start_batch=2, ready_timeout_s=240)
    launcher = _RecordingLauncher(cfg, tmp_path)
    with LocalDeployer(cfg, launcher=launcher) as d:
        d.deploy(VariantSpec(service="batches", role="production", kernels="torch", replicas=3,
                             env={"SITS_SPEC_VAR": "given"}))
        # replicas 0 and 1 started together; replica 2 only once both answered /readyz
        assert launcher.ready_at_start == [0, 0, 2]
        assert d.status("batches")["production"].ready_replicas == 3
        for pid in _engines("batches"):
            env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if kv)
            assert b"SITS_PROMETHEUS_TOKEN" not in env and b"SITS_PROMETHEUS_PASSWORD" not in env
            assert b"SOME_OTHER_SECRET" not in env
            assert env[b"SITS_SPEC_VAR"] == b"given" and env[b"PATH"] == os.environ["PATH"].encode()
        # a fourth engine would exceed the bound, even while the three run
        with pytest.raises(DeployError, match="at most 3 fit"):
            d.deploy(VariantSpec(service="batches", role="canary", kernels="torch"))
    assert not _engines("batches")


def test_engine_environment_passes_only_named_variables():
    parent = {"PATH": "/bin", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "0", "TRITON_INTERPRET": "1", "HOME": "/h",
              "SITS_PROMETHEUS_TOKEN": "t", "SITS_PROMETHEUS_PASSWORD": "p", "AWS_SECRET_ACCESS_KEY": "k",
              "SITS_API_TOKEN": "a", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=x"}
    env = engine_environment(parent, {"A": "1"}, {"A": "2"})
    assert env == {"PATH": "/bin", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "0", "TRITON_INTERPRET": "1",
                   "HOME": "/h", "A": "2"}


def test_engine_environment_passes_kernel_plugins_and_an_absolute_pythonpath(tmp_path, monkeypatch):
    # a plugin set the control plane lists (docs/kernels.md: SITS_KERNEL_PLUGINS + PYTHONPATH) must load in the
    # engines, which run in their own work dir: relative PYTHONPATH entries are resolved against ours
    monkeypatch.chdir(tmp_path)
    env = engine_environment({"SITS_KERNEL_PLUGINS": "my_kernels", "PYTHONPATH": f".{os.pathsep}/abs/lib"})
    assert env == {"SITS_KERNEL_PLUGINS": "my_kernels", "PYTHONPATH": f"{tmp_path}{os.pathsep}/abs/lib"}


def test_close_cancels_a_deploy_in_progress(tmp_path):
    # real engines behind a start-up delay, so that the deploy is certainly still waiting when close() comes
    slow = ("sh", "-c", 'sleep 120 & wait; exec "$0" -m sits.engine.cli "$@"', sys.executable)
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path), engine_command=slow, max_replicas=4, start_batch=2,
                                  stop_timeout_s=5))
    outcome = {}

    def deploy():
        try:
            d.deploy(VariantSpec(service="cancel", role="production", kernels="torch", replicas=4))
        except BaseException as e:   # noqa: BLE001 - the test inspects it
            outcome["error"] = e
    t = threading.Thread(target=deploy)
    t.start()
    assert process.wait_until(lambda: len(list(tmp_path.glob("*.log"))) == 2, 30)   # batch one started
    d.close()
    t.join(60)
    assert not t.is_alive()
    assert isinstance(outcome.get("error"), DeployCancelled), outcome
    assert len(list(tmp_path.glob("*.log"))) == 2   # the second batch never started
    assert process.wait_until(lambda: not _engines("cancel"), 10)
    assert d.status("cancel") == {}


def test_cpu_engines_fork_their_cores_from_one_zygote_that_holds_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("SITS_PROMETHEUS_TOKEN", "prom-token-secret")
    cfg = LocalConfig(workdir=str(tmp_path), cpu_threads=1, gpu_devices=())
    with LocalDeployer(cfg) as d:
        d.deploy(VariantSpec(service="zyg", role="production", kernels="torch"))
        d.deploy(VariantSpec(service="zyg", role="canary", kernels="torch", env={"SITS_SPEC_VAR": "given"}))
        zygote = d.launcher.zygote.process
        assert zygote.poll() is None
        cores = children(zygote.pid)
        assert len(cores) == 2 and all(Path(f"/proc/{c}/comm").read_text().strip() == "sits-core" for c in cores)
        env = Path(f"/proc/{zygote.pid}/environ").read_bytes()   # what every core starts from
        assert b"prom-token-secret" not in env and b"SITS_SPEC_VAR" not in env
        assert len(_engines("zyg")) == 2 and not set(_engines("zyg")) & set(cores)   # the deployer's children
        logs = sorted(tmp_path.glob("zyg-*.log"))
        assert len(logs) == 2 and all("forked by the engine zygote" in p.read_text() for p in logs)
        d.delete("zyg", "canary")
        wait_for("the canary's core to end with it", lambda: len(children(zygote.pid)) == 1, 15)
    # close(): the engines and the zygote are gone
    assert zygote.poll() is not None and not _engines("zyg")
