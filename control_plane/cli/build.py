"""What `sits-control worker` and `serve` build from their flags (control_plane/cli/main.py parses them): the store, the
secrets (from files or the environment, never from flags), the Prometheus source's config and the worker with its
deployer, metrics source, notifiers and tracing. Bad input is a CLIError: one line, exit code 2."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from sits.control_plane.adapters.inference.correctness import CorrectnessProbe
from sits.control_plane.adapters.deploy import DeployError
from sits.control_plane.adapters.kernel_catalog import CatalogError, KernelCatalog
from sits.control_plane.adapters.deploy.kubernetes.deployer import KubernetesConfig, KubernetesDeployer
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.notify import MultiNotifier, WebhookConfig, WebhookNotifier
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig, PrometheusSource
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane.redact import redact_url
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig
from sits.control_plane.crd.watch import CrdApiError, CrdWatcher
from sits.wire.tracing import Tracing

log = logging.getLogger("sits.control_plane.cli")


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


def _beside(store: str) -> str | None:
    """Where the local deployer remembers its routers' ports: next to the store, so a restart serves on them."""
    return None if store == ":memory:" else f"{store}.routers.json"


def argv_url(flag: str, url: str, instead: str) -> str:
    """A URL given on the command line, refused when it carries a credential (user:password@, a token-like query
    parameter): every user of the machine reads a command line in `ps` and /proc/PID/cmdline."""
    if redact_url(url) != url:
        raise CLIError(f"{flag} {redact_url(url)}: a URL with credentials on the command line is visible to every "
                       f"user (ps); {instead}")
    return url


def url_list(env: str, files: list[str] | None) -> list[str]:
    """URLs from files (one a line; blank lines and # comments skipped) and from $env (separated by spaces, commas
    or newlines): where secret-bearing URLs come from (a Kubernetes Secret as a file or an env var)."""
    urls = []
    for file in files or ():
        try:
            with open(file) as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"cannot read URL file {file}: {getattr(e, 'strerror', None) or e}") from None
        urls += [(x.strip(), f"{file} line {i}") for i, x in enumerate(lines, 1)
                 if x.strip() and not x.strip().startswith("#")]
    urls += [(x, f"${env} entry {i}") for i, x in enumerate(os.environ.get(env, "").replace(",", " ").split(), 1)]
    for url, where in urls:   # never echoed: the URL may be the secret (a Slack webhook's path is)
        if not url.startswith(("http://", "https://")):
            raise CLIError(f"{where}: a webhook URL must start with http:// or https://")
    return [url for url, _ in urls]


def webhooks(a) -> tuple[list[str], list[str]]:
    """(generic JSON webhook URLs, Slack webhook URLs): argv only for generic URLs without credentials."""
    if a.slack_webhook:
        raise CLIError("--slack-webhook is no longer accepted: a Slack webhook URL is itself the secret and a "
                       "command line is visible to every user (ps); use --slack-webhook-file FILE or "
                       "$SITS_SLACK_WEBHOOK_URLS")
    generic = [argv_url("--webhook", u, "use --webhook-file FILE or $SITS_WEBHOOK_URLS") for u in a.webhook or ()]
    return (generic + url_list("SITS_WEBHOOK_URLS", a.webhook_file),
            url_list("SITS_SLACK_WEBHOOK_URLS", a.slack_webhook_file))


def prometheus_config(a) -> PrometheusConfig:
    """`--prometheus-url` (no credentials on argv) or $SITS_PROMETHEUS_URL, with its credentials (token file or
    $SITS_PROMETHEUS_TOKEN; basic auth)."""
    if a.prometheus_url:
        url = argv_url("--prometheus-url", a.prometheus_url, "give --prometheus-user and the password in "
                       "--prometheus-password-file or $SITS_PROMETHEUS_PASSWORD (or the whole URL in "
                       "$SITS_PROMETHEUS_URL)")
    else:
        url = os.environ.get("SITS_PROMETHEUS_URL") or ""
    if not url:
        raise CLIError("--metrics prometheus needs --prometheus-url (or $SITS_PROMETHEUS_URL)")
    token = secret("SITS_PROMETHEUS_TOKEN", a.prometheus_token_file)
    basic = None
    if a.prometheus_user:
        basic = (a.prometheus_user, secret("SITS_PROMETHEUS_PASSWORD", a.prometheus_password_file) or "")
    return PrometheusConfig(url, bearer_token=token, basic_auth=basic)


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
        try:   # a bad pin token stops the start with one line, not a traceback per pass
            deployer = LocalDeployer(LocalConfig(workdir=a.workdir, cpu_threads=a.cpu_threads,
                                                 pin_token=secret("SITS_PIN_TOKEN", a.pin_token_file),
                                                 max_replicas=a.max_replicas, router_state=_beside(a.store)))
        except DeployError as e:
            raise CLIError(str(e)) from None
    if a.metrics == "prometheus":
        source = PrometheusSource(prometheus_config(a))
    else:
        if a.deployer == "kubernetes":
            log.warning("direct scrape on Kubernetes reaches one pod per Service endpoint per scrape: use --metrics "
                        "prometheus there")
        source = ScrapeSource()
    store = open_store(a.store, must_exist=False)
    # the webhook queues live in the store: notifications outlive a worker restart
    generic, slack = webhooks(a)
    hooks = [WebhookNotifier(WebhookConfig(u, format="json"), journal=store.deliveries) for u in generic]
    hooks += [WebhookNotifier(WebhookConfig(u, format="slack"), journal=store.deliveries) for u in slack]
    config = WorkerConfig(interval_s=a.interval, lease_ttl_s=max(30.0, 3 * a.interval))
    return Worker(store, deployer, source, MultiNotifier(hooks), config, tracing=tracing,
                  correctness=CorrectnessProbe(prompt_dir=a.prompt_set_dir))


def start_crd_watcher(a, policy_defaults=None) -> CrdWatcher:
    """`serve --watch-crds`: KernelRollouts of --namespace become rollouts in --store (the kernel catalogue and policy
    defaults the API uses)."""
    try:
        catalog = KernelCatalog.discover(a.kernel_catalog)
        return CrdWatcher.open(a.store, a.namespace, kubeconfig=a.kubeconfig, kernel_sets=catalog,
                               policy_defaults=policy_defaults.to_dict() if policy_defaults is not None else None,
                               local_models=a.deployer == "local").start()
    except (CrdApiError, CatalogError) as e:
        raise CLIError(str(e)) from None
