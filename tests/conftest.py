import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Shared fixtures that start real servers: Prometheus, etcd + kube-apiserver + kube-controller-manager, and the
# test node agent that runs their pods (a kubelet test double).
pytest_plugins = ["tests.fixtures.prometheus", "tests.fixtures.kube", "tests.fixtures.node_agent"]
