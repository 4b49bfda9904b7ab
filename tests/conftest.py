import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Shared fixtures that start real servers: Prometheus, and etcd + kube-apiserver + kube-controller-manager.
pytest_plugins = ["tests.fixtures.prometheus", "tests.fixtures.kube"]
