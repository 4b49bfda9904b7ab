import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Shared fixtures that start real servers: Prometheus, etcd + kube-apiserver + kube-controller-manager, and the
# test node agent that runs their pods (a kubelet test double).
pytest_plugins = ["tests.fixtures.prometheus", "tests.fixtures.kube", "tests.fixtures.node_agent"]


# `make test` runs the suite on three pytest-xdist workers (`-n 3`, docs/testing.md says why), then the `solo` tests
# alone. The scheduler below hands out whole test files, so a file's module fixtures (a rollout run for a page's
# tests, a deployer with its engines) start once and its tests run in order; and every file that uses the Kubernetes control plane goes to the
# same worker, so one etcd + kube-apiserver and one node agent serve them (the agent's pods take loopback IPs
# 127.0.1.N: two agents would hand out the same ones). A plain `pytest` runs everything in one process, as before.
KUBE_FIXTURES = {"kube_cluster", "node_agent"}
KUBE_FILES = frozenset({
    "tests/cluster/test_helm_e2e.py", "tests/cluster/test_kubernetes_e2e.py", "tests/cluster/test_node_agent.py",
    "tests/control_plane/deploy/test_kubernetes.py", "tests/control_plane/crd/test_crd_watch.py",
    "tests/control_plane/worker/test_kubernetes_worker.py", "tests/helm/test_chart_install.py"})


def pytest_collection_modifyitems(config, items):
    stray = sorted({i.nodeid.split("::", 1)[0] for i in items if KUBE_FIXTURES & set(i.fixturenames)} - KUBE_FILES)
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)}: uses the test Kubernetes cluster; add it to KUBE_FILES in "
                                "tests/conftest.py (such files must share one xdist worker)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "kube" if path in KUBE_FILES else path

    return ByFile(config, log)
