import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Shared fixtures that start real servers: Prometheus, etcd + kube-apiserver + kube-controller-manager, and the
# test node agent that runs their pods (a kubelet test double).
pytest_plugins = ["tests.fixtures.prometheus", "tests.fixtures.kube", "tests.fixtures.node_agent"]


# `make test` runs the suite on four pytest-xdist workers (`-n 4`, docs/testing.md says why), then the `solo` tests
# alone. The scheduler below hands out whole test files, so a file's module fixtures (a rollout run for a page's
# tests, a deployer with its engines) start once and its tests run in order; and every file that uses the Kubernetes
# control plane goes to the same worker, so one etcd + kube-apiserver and one node agent serve them (the agent's pods
# take loopback IPs 127.0.1.N: two agents would hand out the same ones). A plain `pytest` runs everything in one
# process, as before.
KUBE_FIXTURES = {"kube_cluster", "node_agent"}
KUBE_FILES = frozenset({
    "tests/cluster/test_helm_e2e.py", "tests/cluster/test_kubernetes_e2e.py", "tests/cluster/test_node_agent.py",
    "tests/control_plane/deploy/test_kubernetes.py", "tests/control_plane/crd/test_crd_watch.py",
    "tests/control_plane/worker/test_kubernetes_worker.py", "tests/helm/test_chart_install.py"})


# The files that keep a worker busy the longest in `make test` (its --durations, three workers on two cores: 45 s to
# 170 s each; the Kubernetes group, about 470 s, comes before them). They are handed out first, longest first, so the
# run ends on short files rather than on one worker with a long file while the others idle. Every other file follows
# in its usual order; a stale entry here only costs balance.
LONG_FILES = (
    "tests/control_plane/e2e/test_faults.py", "tests/kernels/test_paged_decode_attention.py",
    "tests/control_plane/e2e/test_plugin_canary.py", "tests/control_plane/worker/test_correctness_end_to_end.py",
    "tests/control_plane/worker/test_end_to_end.py", "tests/engine/test_tensor_parallel.py",
    "tests/engine/test_conformance.py", "tests/kernels/test_engine_triton.py",
    "tests/control_plane/worker/test_worker_processes.py", "tests/control_plane/e2e/test_kill.py",
    "tests/test_bench_scripts.py", "tests/control_plane/web/test_browser_rollout_states.py",
    "tests/kernels/test_prefill_attention_fp8_tma.py", "tests/control_plane/worker/test_cli_bad_input.py",
    "tests/control_plane/deploy/test_steering.py", "tests/control_plane/test_demo_lanes.py",
    "tests/control_plane/web/test_browser_rollout_pages.py", "tests/control_plane/web/test_browser_sequence.py",
    "tests/control_plane/deploy/test_local.py", "tests/test_import_names.py", "tests/kernels/test_prefill_attention.py",
    "tests/control_plane/web/test_serve_cli.py", "tests/engine/server/test_engine_process.py",
    "tests/engine/server/test_lifecycle.py")


def _file_rank(path: str) -> int:
    if path in KUBE_FILES:
        return -1
    return LONG_FILES.index(path) if path in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(config, items):
    stray = sorted({i.nodeid.split("::", 1)[0] for i in items if KUBE_FIXTURES & set(i.fixturenames)} - KUBE_FILES)
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)}: uses the test Kubernetes cluster; add it to KUBE_FILES in "
                                "tests/conftest.py (such files must share one xdist worker)")
    items.sort(key=lambda i: _file_rank(i.nodeid.split("::", 1)[0]))   # stable: a file's tests keep their order


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    # after the Kubernetes group's last test (its files run together, first): stop the session's cluster and node agent
    if item.nodeid.split("::", 1)[0] in KUBE_FILES and (nextitem is None
                                                         or nextitem.nodeid.split("::", 1)[0] not in KUBE_FILES):
        from tests.fixtures.kube import stop_kube_session
        stop_kube_session()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    # files go out in the collection's order (the Kubernetes group and LONG_FILES first), not by their number of tests
    config.option.loadscopereorder = False

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "kube" if path in KUBE_FILES else path

    return ByFile(config, log)
