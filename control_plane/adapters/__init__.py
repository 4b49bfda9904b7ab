"""Adapters: the control plane's I/O behind small Protocols, one package per role.

    deploy/      the `Deployer` protocol (deploy/__init__.py), `DeploySpec` and the engine args it allows; local/
                 (processes behind the weighted router, the embedded default) and kubernetes/
    metrics/     the `MetricsSource` protocol (metrics/__init__.py); scrape.py (each variant's /metrics, the default)
                 and prometheus.py (PromQL over Prometheus' HTTP API)
    inference/   requests to the engines' OpenAI API: the correctness gate's replays, low-traffic replay
    notify.py    the `Notifier` protocol and webhooks
    kernel_catalog.py  the kernel sets the engines have, as data (kernel_catalog.json: the built-in sets)
"""
