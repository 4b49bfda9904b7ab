"""What `sits-control worker` and `serve` build from their flags (control_plane/cli/main.py parses them): the store, the
secrets (from files or the environment, never from flags), the Prometheus source's config and the worker with its
deployer, metrics source, notifiers and tracing. Bad input is a CLIError: one line, exit code 2."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from control_plane.adapters.kernel_catalog import CatalogError, KernelCatalog
from control_plane.adapters.kubernetes import KubernetesConfig, KubernetesDeployer
from control_plane.adapters.local_config import LocalConfig
from control_plane.adapters.local import LocalDeployer
from control_plane.adapters.notify import MultiNotifier, WebhookConfig, WebhookNotifier
from control_plane.adapters.prometheus import PrometheusConfig, PrometheusSource
from control_plane.adapters.scrape import ScrapeSource
from control_plane.store.db import Store
from control_plane.tracing import Tracing
from control_plane.worker.loop import Worker
from control_plane.worker.config import WorkerConfig
from control_plane.worker.crd_watch import CrdApiError, CrdWatcher

log = logging.getLogger("control_plane.cli")


class CLIError(Exception):
    """Bad user input: printed as one line, exit code 2."""


def open_store(path: str, must_exist: bool = True, readonly: bool = False) -> Store:
    try:
        exists, is_dir = Path(path).exists(), Path(path).is_dir()
    except OSError as e:   # e.g. a directory on the way we may not enter
        raise CLIError(f"store {path}: {e.strerror}") from None
    if must_exist and path != ":memory:" and not exists:
        raise CLIError(f"no store at {path} (give --store PATH or set SITS_STORE)")
    if is_dir:
        raise CLIError(f"store {path} is a directory; give the store's file")
    return Store(path, readonly=readonly)


def secret(env: str, file: str | None) -> str | None:
    """A secret from a file (first line) or an environment variable; never from a flag (visible in `ps`)."""
    if file:
        try:
            with open(file) as f:
                value = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"cannot read secret file {file}: {getattr(e, 'strerror', None) or e}") from None
        if not value:
            raise CLIError(f"secret file {file} is empty")
        return value
    return os.environ.get(env) or None


def prometheus_config(a) -> PrometheusConfig:
    """`--prometheus-url` with its credentials (token file or $SITS_PROMETHEUS_TOKEN; basic auth)."""
    if not a.prometheus_url:
        raise CLIError("--metrics prometheus needs --prometheus-url")
    token = secret("SITS_PROMETHEUS_TOKEN", a.prometheus_token_file)
    basic = None
    if a.prometheus_user:
        basic = (a.prometheus_user, secret("SITS_PROMETHEUS_PASSWORD", a.prometheus_password_file) or "")
    return PrometheusConfig(a.prometheus_url, bearer_token=token, basic_auth=basic)


def build_worker(a) -> Worker:
    """The worker for `sits-control worker`: deployer, metrics source, notifiers and tracing from the flags."""
    try:
        tracing = Tracing.from_flags(a.otel_exporter, a.otlp_endpoint)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if a.deployer == "kubernetes":
        kw = {"image": a.engine_image} if a.engine_image else {}
        deployer = KubernetesDeployer(KubernetesConfig(namespace=a.namespace, kubeconfig=a.kubeconfig, **kw))
    else:
        deployer = LocalDeployer(LocalConfig(workdir=a.workdir, cpu_threads=a.cpu_threads,
                                             pin_token=secret("SITS_PIN_TOKEN", a.pin_token_file),
                                             max_replicas=a.max_replicas))
    if a.metrics == "prometheus":
        source = PrometheusSource(prometheus_config(a))
    else:
        if a.deployer == "kubernetes":
            log.warning("direct scrape on Kubernetes reaches one pod per Service endpoint per scrape: use --metrics "
                        "prometheus there")
        source = ScrapeSource()
    store = open_store(a.store, must_exist=False)
    # the webhook queues live in the store: notifications outlive a worker restart
    hooks = [WebhookNotifier(WebhookConfig(u, format="json"), journal=store.deliveries) for u in a.webhook or ()]
    hooks += [WebhookNotifier(WebhookConfig(u, format="slack"), journal=store.deliveries) for u in a.slack_webhook or ()]
    config = WorkerConfig(interval_s=a.interval, lease_ttl_s=max(30.0, 3 * a.interval))
    return Worker(store, deployer, source, MultiNotifier(hooks), config, tracing=tracing)


def start_crd_watcher(a, policy_defaults=None) -> CrdWatcher:
    """`serve --watch-crds`: KernelRollouts of --namespace become rollouts in --store (the kernel catalogue and policy
    defaults the API uses)."""
    try:
        catalog = KernelCatalog.discover(a.kernel_catalog)
        return CrdWatcher.open(a.store, a.namespace, kubeconfig=a.kubeconfig, kernel_sets=catalog,
                               policy_defaults=policy_defaults.to_dict() if policy_defaults is not None else None
                               ).start()
    except (CrdApiError, CatalogError) as e:
        raise CLIError(str(e)) from None
