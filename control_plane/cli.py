"""`sits-control`: demo, the worker loop, and rollouts (start, list, show with evidence, promote/abort/pause/resume).

    sits-control demo                                   # the README's main command (CPU, no cluster)
    sits-control worker --store sits.db                 # run the control loop (local deployer + direct scrape)
    sits-control rollout start --service chat --kernels triton-v2 [--policy policy.json] [--args --seed 7]
    sits-control rollout list | show ID | promote ID | abort ID | pause ID | resume ID
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Sequence

import yaml
from prometheus_client import start_http_server

from control_plane import format as fmt
from control_plane import service
from control_plane.adapters.deploy import DeployError
from control_plane.adapters.kubernetes import KubernetesConfig, KubernetesDeployer
from control_plane.adapters.local import LocalConfig, LocalDeployer
from control_plane.adapters.notify import MultiNotifier, WebhookConfig, WebhookNotifier
from control_plane.adapters.prometheus import PrometheusConfig, PrometheusSource
from control_plane.adapters.scrape import ScrapeSource
from control_plane.analysis import Policy, PolicyError
from control_plane.demo import DemoConfig, run_demo
from control_plane.errors import SitsError
from control_plane.lifecycle import shutdown
from control_plane.rollout import Command
from control_plane.spec import DeploySpec
from control_plane.store import Store, rollout_to_dict
from control_plane.worker import Worker, WorkerConfig

DEFAULT_STORE = os.environ.get("SITS_STORE", "sits.db")
log = logging.getLogger(__name__)


class CLIError(Exception):
    """Bad user input: printed as one line, exit code 2."""


def _open_store(path: str, must_exist: bool = True) -> Store:
    if must_exist and path != ":memory:" and not Path(path).exists():
        raise CLIError(f"no store at {path} (give --store PATH or set SITS_STORE)")
    return Store(path)


def _load_policy(path: str | None) -> Policy:
    if path is None:
        return Policy()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CLIError(f"cannot read policy file {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        return Policy.from_dict(data)
    except PolicyError as e:
        raise CLIError(f"policy {path}: {e}") from None
    except (ValueError, yaml.YAMLError) as e:
        raise CLIError(f"policy {path} is not valid JSON/YAML: {e}") from None


# ---- commands ---------------------------------------------------------------------------------------------------
def cmd_rollout_start(a) -> int:
    spec = DeploySpec(model=a.model, replicas=a.replicas, production_args=tuple(a.production_args or ()),
                      canary_args=tuple(a.args or ()), production_image=a.production_image, canary_image=a.image,
                      gpus=a.gpus)
    policy = _load_policy(a.policy)
    with _open_store(a.store, must_exist=False) as store:
        r = service.start_rollout(store, a.service, a.kernels, a.production_kernels, policy, spec, actor=a.by)
    print(f"rollout {r.id} created for service {r.service}: canary {r.canary_kernels} vs production "
          f"{r.production_kernels}; a running `sits-control worker --store {a.store}` takes it from here")
    return 0


def cmd_rollout_list(a) -> int:
    with _open_store(a.store) as store:
        print("\n".join(fmt.rollout_table(store.list(active=True if a.active else None))))
    return 0


def cmd_rollout_show(a) -> int:
    with _open_store(a.store) as store:
        if a.json:
            r = store.get(a.id)
            print(json.dumps({"rollout": rollout_to_dict(r), "checks": store.checks(a.id),
                              "events": store.events(a.id), "actions": store.actions(a.id),
                              "notifications": store.deliveries(a.id)}, indent=1))
        else:
            print("\n".join(fmt.rollout_report(store, a.id)))
    return 0


def cmd_rollout_command(a) -> int:
    with _open_store(a.store) as store:
        service.send_command(store, a.id, a.command, a.by)
        r = store.get(a.id)
    print(f"{a.command} queued for rollout {a.id} (phase {r.phase.value}); the worker applies it at its next pass")
    return 0


def build_worker(a) -> Worker:
    """The worker for `sits-control worker`: deployer, metrics source and notifiers from the flags."""
    if a.deployer == "kubernetes":
        deployer = KubernetesDeployer(KubernetesConfig(namespace=a.namespace, kubeconfig=a.kubeconfig))
    else:
        deployer = LocalDeployer(LocalConfig(workdir=a.workdir, cpu_threads=a.cpu_threads))
    if a.metrics == "prometheus":
        if not a.prometheus_url:
            raise CLIError("--metrics prometheus needs --prometheus-url")
        token = a.prometheus_token or os.environ.get("SITS_PROMETHEUS_TOKEN")
        basic = None
        if a.prometheus_user:
            basic = (a.prometheus_user, a.prometheus_password or os.environ.get("SITS_PROMETHEUS_PASSWORD", ""))
        source = PrometheusSource(PrometheusConfig(a.prometheus_url, bearer_token=token, basic_auth=basic))
    else:
        if a.deployer == "kubernetes":
            log.warning("direct scrape on Kubernetes reaches one pod per Service endpoint per scrape: use --metrics "
                        "prometheus there")
        source = ScrapeSource()
    store = _open_store(a.store, must_exist=False)
    # the webhook queues live in the store: notifications outlive a worker restart
    hooks = [WebhookNotifier(WebhookConfig(u, format="json"), journal=store) for u in a.webhook or ()]
    hooks += [WebhookNotifier(WebhookConfig(u, format="slack"), journal=store) for u in a.slack_webhook or ()]
    config = WorkerConfig(interval_s=a.interval, lease_ttl_s=max(30.0, 3 * a.interval))
    return Worker(store, deployer, source, MultiNotifier(hooks), config)


def cmd_worker(a) -> int:
    try:
        worker = build_worker(a)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if a.metrics_port:
        start_http_server(a.metrics_port, a.metrics_host, registry=worker.metrics.registry)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"worker: store {worker.store.path}, every {worker.config.interval_s:g} s, metrics from "
          f"{worker.source.name}; Ctrl-C to stop", flush=True)
    worker.start()
    stop.wait()
    shutdown(worker.deployer, worker=worker, notifier=worker.notifier, source=worker.source)
    worker.store.close()
    return 0


def cmd_demo(a) -> int:
    try:
        cfg = DemoConfig(workdir=a.workdir, rate=a.rate, slow_ms=a.slow_ms, kernels=a.kernels, metrics=a.metrics)
    except ValueError as e:
        raise CLIError(str(e)) from None
    try:
        return 0 if run_demo(cfg).ok else 1
    except DeployError as e:   # an engine did not start: its log tail is in the message
        print(f"sits-control demo: a variant could not be deployed: {e}", file=sys.stderr)
        return 1
    except ValueError as e:   # e.g. no prometheus binary
        print(f"sits-control demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sits-control demo: interrupted (every variant was stopped)", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sits-control", description="SITS control plane: gray releases of kernel sets.")
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"],
                   help="default: info for `worker`, warning otherwise")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="run two real rollouts locally (CPU, tiny model): one rolls back, one is promoted")
    d.add_argument("--workdir", default=None, help="where the store and variant logs go (default: a new temp dir)")
    d.add_argument("--rate", type=float, default=40.0, help="load through the router, requests/s")
    d.add_argument("--slow-ms", type=float, default=250.0, help="latency injected into the bad canary (ms)")
    d.add_argument("--kernels", default="torch", help="kernel set of every variant (a CPU-capable one)")
    d.add_argument("--metrics", choices=["scrape", "prometheus"], default="scrape",
                   help="metrics source: direct scrape (default) or a local Prometheus (needs the binary)")
    d.set_defaults(fn=cmd_demo)

    w = sub.add_parser("worker", help="run the control loop")
    w.add_argument("--store", default=DEFAULT_STORE)
    w.add_argument("--interval", type=float, default=5.0, help="seconds between passes over the rollouts")
    w.add_argument("--deployer", choices=["local", "kubernetes"], default="local")
    w.add_argument("--workdir", default=None, help="local deployer: variant logs")
    w.add_argument("--cpu-threads", type=int, default=None, help="local deployer: threads per engine process")
    w.add_argument("--namespace", default="default")
    w.add_argument("--kubeconfig", default=None)
    w.add_argument("--metrics", choices=["scrape", "prometheus"], default="scrape")
    w.add_argument("--prometheus-url", default=os.environ.get("SITS_PROMETHEUS_URL"))
    w.add_argument("--prometheus-token", default=None, help="bearer token (or $SITS_PROMETHEUS_TOKEN)")
    w.add_argument("--prometheus-user", default=None, help="basic auth user (password: $SITS_PROMETHEUS_PASSWORD)")
    w.add_argument("--prometheus-password", default=None)
    w.add_argument("--webhook", action="append", help="generic JSON webhook URL (repeatable)")
    w.add_argument("--slack-webhook", action="append", help="Slack incoming-webhook URL (repeatable)")
    w.add_argument("--metrics-port", type=int, default=None, help="serve the worker's own /metrics on this port")
    w.add_argument("--metrics-host", default="127.0.0.1")
    w.set_defaults(fn=cmd_worker)

    r = sub.add_parser("rollout", help="start, list, show and steer rollouts").add_subparsers(dest="rcmd",
                                                                                              required=True)
    s = r.add_parser("start", help="create a rollout of a kernel set (the worker deploys and analyses it)")
    s.add_argument("--service", required=True)
    s.add_argument("--kernels", required=True, help="the canary's kernel set")
    s.add_argument("--production-kernels", default="torch", help="the kernel set production runs now")
    s.add_argument("--policy", default=None, help="policy file (JSON or YAML; fields of Policy)")
    s.add_argument("--model", default="tiny")
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--image", default=None, help="Kubernetes: the canary's image (default: the deployer's)")
    s.add_argument("--production-image", default=None, help="Kubernetes: production's and the baseline's image")
    s.add_argument("--gpus", type=int, default=0, help="GPUs per replica (Kubernetes)")
    s.add_argument("--production-args", nargs=argparse.REMAINDER, default=None,
                   help="extra `sits-engine serve` args of production and baseline (must come last)")
    s.add_argument("--args", nargs=argparse.REMAINDER, default=None,
                   help="extra `sits-engine serve` args of the canary (must come last)")
    s.add_argument("--by", default=os.environ.get("USER", ""), help="who (kept in the events)")
    s.add_argument("--store", default=DEFAULT_STORE)
    s.set_defaults(fn=cmd_rollout_start)
    ls = r.add_parser("list", help="list rollouts")
    ls.add_argument("--active", action="store_true")
    ls.add_argument("--store", default=DEFAULT_STORE)
    ls.set_defaults(fn=cmd_rollout_list)
    sh = r.add_parser("show", help="a rollout with its events and every check's evidence")
    sh.add_argument("id")
    sh.add_argument("--json", action="store_true", help="everything stored, as JSON")
    sh.add_argument("--store", default=DEFAULT_STORE)
    sh.set_defaults(fn=cmd_rollout_show)
    for c in Command:
        x = r.add_parser(c.value, help=f"{c.value} a rollout (applied by the worker at its next pass)")
        x.add_argument("id")
        x.add_argument("--by", default=os.environ.get("USER", ""), help="who (kept in the events)")
        x.add_argument("--store", default=DEFAULT_STORE)
        x.set_defaults(fn=cmd_rollout_command, command=c.value)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    level = a.log_level or ("info" if a.cmd == "worker" else "warning")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3"):   # one line per readiness probe otherwise
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return a.fn(a)
    except (CLIError, SitsError) as e:
        print(f"sits-control: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
