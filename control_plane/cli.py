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
import math
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from control_plane import service
from control_plane.correctness_format import format_correctness
from control_plane.errors import SitsError
from control_plane.rollout import Command
from control_plane.spec import DeploySpec

DEFAULT_STORE = os.environ.get("SITS_STORE", "sits.db")


class CLIError(Exception):
    """Bad user input: printed as one line, exit code 2."""


# ---- evidence formatting (also used by the demo) ---------------------------------------------------------------------
def _ms(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x) * 1000:.1f} ms"


def _pct(x, signed=True) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):   # "+Inf" / "-Inf" from the store's JSON
        return "+inf" if x.startswith("+") else "-inf"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %"


def _pt(x) -> str:
    return "-" if x is None else f"{float(x) * 100:+.2f} pt"


def _series_label(result: dict) -> str:
    name, series = result["check"], result["series"]
    metric, _, q = name.partition(":p")
    route = series.split('route="', 1)[1].split('"', 1)[0] if 'route="' in series else ""
    if metric == "error_rate":
        return "error rate"
    short = {"http_request_duration_seconds": "request latency", "sits_time_to_first_token_seconds": "TTFT",
             "sits_inter_token_latency_seconds": "inter-token", "sits_e2e_request_latency_seconds": "e2e"}
    return f"{short.get(metric, metric)} p{q.replace('_', '.')} {route}".strip()


def format_check(ev: dict, steps: Sequence[int] = ()) -> list[str]:
    """One check's evidence: per metric the canary and target values, delta, CI of the delta, threshold, verdict."""
    if ev["verdict"].get("correctness") is not None:
        return format_correctness(ev, len(steps))
    v, target = ev["verdict"], ev["verdict"]["compare_to"]
    window = ""
    if ev.get("window_start") is not None and ev.get("window_end") is not None:
        window = f", {float(ev['window_end']) - float(ev['window_start']):.1f} s of data"
    var = ev.get("variants", {})
    n = " / ".join(f"{r} {var[r]['requests']:.0f}" for r in ("canary", target) if r in var)
    step = f"step {ev['step'] + 1}/{len(steps)}" if steps else f"step {ev['step'] + 1}"
    lines = [f"check {ev['seq']} · {step} · canary at {ev['weight']} %{window} · requests {n or '-'}"
             f" · {v['outcome'].upper()} -> {ev['decision']}"]
    rows = [("metric", "canary", target, "delta", "CI of delta", "threshold", "verdict")]
    for r in v["results"]:
        if r["check"] == "error_rate":
            vals = (f"{r['canary'] * 100:.2f} %" if r["canary"] is not None else "-",
                    f"{r['target'] * 100:.2f} %" if r["target"] is not None else "-", _pt(r["delta_abs"]),
                    f"[{_pt(r['ci_low'])}, {_pt(r['ci_high'])}]", f"<= {_pt(r['threshold'])}")
        else:
            vals = (_ms(r["canary"]), _ms(r["target"]), _pct(r["delta_rel"]),
                    f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]", f"<= {_pct(r['threshold'])}")
        rows.append((_series_label(r), *vals, r["outcome"].upper()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.append(f"    reason: {v['reason']}")
    return lines


def _delta_label(series: str, q) -> str:
    if series == "error_rate":
        return "error rate"
    metric = series.split("{", 1)[0]
    return _series_label({"check": f"{metric}:p{round(q * 100):d}" if q is not None else metric, "series": series})


def format_deltas(ev: dict) -> list[str]:
    """What was measured but not necessarily decided on: P90/P99 of every series (request latency per route, TTFT,
    inter-token, e2e) for canary, baseline and production, and the canary's relative deltas against both."""
    deltas = ev["verdict"].get("deltas") or []
    if not deltas:
        return []
    rows = [("series", "canary", "baseline", "production", "vs baseline", "vs production")]
    for d in deltas:
        if d["series"] == "error_rate":
            fmt = lambda x: "-" if x is None else f"{float(x) * 100:.2f} %"  # noqa: E731
            rows.append(("error rate", fmt(d["canary"]), fmt(d["baseline"]), fmt(d["production"]),
                         _pt(d["vs_baseline_abs"]), _pt(d["vs_production_abs"])))
        else:
            rows.append((_delta_label(d["series"], d["quantile"]), _ms(d["canary"]), _ms(d["baseline"]),
                         _ms(d["production"]), _pct(d["vs_baseline_rel"]), _pct(d["vs_production_rel"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["    " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# ---- commands ----------------------------------------------------------------------------------------------------------
def _open_store(path: str, must_exist: bool = True):
    from control_plane.store import Store

    if must_exist and path != ":memory:" and not Path(path).exists():
        raise CLIError(f"no store at {path} (give --store PATH or set SITS_STORE)")
    return Store(path)


def _load_policy(path: str | None):
    from control_plane.analysis import Policy, PolicyError

    if path is None:
        return Policy()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CLIError(f"cannot read policy file {path}: {e.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else __import__("yaml").safe_load(text)
        return Policy.from_dict(data)
    except PolicyError as e:
        raise CLIError(f"policy {path}: {e}") from None
    except ValueError as e:
        raise CLIError(f"policy {path} is not valid JSON/YAML: {e}") from None


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
        rs = store.list(active=True if a.active else None)
    if not rs:
        print("no rollouts")
        return 0
    print(f"{'ID':40} {'SERVICE':12} {'PHASE':13} {'STEP':6} {'WEIGHT':6} {'CHECKS':6} CREATED")
    for r in rs:
        step = f"{r.step + 1}/{len(r.policy.steps)}" if r.step >= 0 else "-"
        print(f"{r.id:40} {r.service:12} {r.phase.value:13} {step:6} {r.weight:>5}% {r.checks:>6} "
              f"{_when(r.created_at)}")
    return 0


def show(store, rollout_id: str, out=print) -> None:
    r = store.get(rollout_id)
    out(f"rollout {r.id}  service {r.service}  canary {r.canary_kernels}  production {r.production_kernels}")
    out(f"phase {r.phase.value} ({r.reason or '-'}); step {r.step + 1}/{len(r.policy.steps)} at {r.weight} %; "
        f"{r.checks} checks; source {r.source or '-'}")
    out("events:")
    for e in store.events(r.id):
        if e["kind"] != "check":
            out(f"  {_when(e['at'])}  [{e['phase']}] {e['message']}")
    out("checks:")
    checks = store.checks(r.id)
    for ev in checks:
        for line in format_check(ev, r.policy.steps):
            out("  " + line)
    if checks and format_deltas(checks[-1]):
        out(f"all measured percentiles at the last check (#{checks[-1]['seq']}), canary against baseline and production:")
        for line in format_deltas(checks[-1]):
            out("  " + line)
    if r.queries:
        out("queries of the last window:")
        for k, q in r.queries.items():
            out(f"  {k}: {q}")
    notes = store.deliveries(r.id)
    if notes:
        out("notifications (webhook deliveries):")
        for d in notes:
            tail = f" ({d['attempts']} attempts{': ' + d['error'] if d['error'] else ''})" if d["attempts"] != 1 \
                else ""
            out(f"  {_when(d['at'])}  {d['event']:12} webhook {d['webhook']}  {d['status']}{tail}")


def cmd_rollout_show(a) -> int:
    from control_plane.store import RolloutNotFoundError, rollout_to_dict

    with _open_store(a.store) as store:
        try:
            if a.json:
                r = store.get(a.id)
                print(json.dumps({"rollout": rollout_to_dict(r), "checks": store.checks(a.id),
                                  "events": store.events(a.id), "actions": store.actions(a.id),
                                  "notifications": store.deliveries(a.id)}, indent=1))
            else:
                show(store, a.id)
        except RolloutNotFoundError as e:
            raise CLIError(str(e.args[0])) from None
    return 0


def cmd_rollout_command(a) -> int:
    with _open_store(a.store) as store:
        service.send_command(store, a.id, a.command, a.by)
        r = store.get(a.id)
    print(f"{a.command} queued for rollout {a.id} (phase {r.phase.value}); the worker applies it at its next pass")
    return 0


def build_worker(a):
    """The worker for `sits-control worker`: deployer, metrics source and notifiers from the flags."""
    from control_plane.adapters.notify import MultiNotifier, WebhookConfig, WebhookNotifier
    from control_plane.worker import Worker, WorkerConfig

    if a.deployer == "kubernetes":
        from control_plane.adapters.kubernetes import KubernetesConfig, KubernetesDeployer

        deployer = KubernetesDeployer(KubernetesConfig(namespace=a.namespace, kubeconfig=a.kubeconfig))
    else:
        from control_plane.adapters.local import LocalConfig, LocalDeployer

        deployer = LocalDeployer(LocalConfig(workdir=a.workdir, cpu_threads=a.cpu_threads))
    if a.metrics == "prometheus":
        from control_plane.adapters.prometheus import PrometheusConfig, PrometheusSource

        if not a.prometheus_url:
            raise CLIError("--metrics prometheus needs --prometheus-url")
        token = a.prometheus_token or os.environ.get("SITS_PROMETHEUS_TOKEN")
        basic = None
        if a.prometheus_user:
            basic = (a.prometheus_user, a.prometheus_password or os.environ.get("SITS_PROMETHEUS_PASSWORD", ""))
        source = PrometheusSource(PrometheusConfig(a.prometheus_url, bearer_token=token, basic_auth=basic))
    else:
        from control_plane.adapters.scrape import ScrapeSource

        if a.deployer == "kubernetes":
            logging.getLogger(__name__).warning(
                "direct scrape on Kubernetes reaches one pod per Service endpoint per scrape: use --metrics "
                "prometheus there")
        source = ScrapeSource()
    store = _open_store(a.store, must_exist=False)
    # the webhook queues live in the store's file: notifications outlive a worker restart
    hooks = [WebhookNotifier(WebhookConfig(u, format="json"), journal=store) for u in a.webhook or ()]
    hooks += [WebhookNotifier(WebhookConfig(u, format="slack"), journal=store) for u in a.slack_webhook or ()]
    return Worker(store, deployer, source, MultiNotifier(hooks), WorkerConfig(interval_s=a.interval))


def cmd_worker(a) -> int:
    try:
        worker = build_worker(a)
    except ValueError as e:
        raise CLIError(str(e)) from None
    if a.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(a.metrics_port, a.metrics_host, registry=worker.metrics.registry)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"worker: store {worker.store.path}, every {worker.config.interval_s:g} s, metrics from "
          f"{worker.source.name}; Ctrl-C to stop", flush=True)
    worker.start()
    stop.wait()
    worker.stop()
    worker.notifier.close()
    worker.source.close()
    close = getattr(worker.deployer, "close", None)
    if close is not None:   # local deployer: every variant stops with this process
        for svc in {r.service for r in worker.store.list(limit=1000)}:
            try:   # all traffic to production first (LocalDeployer.close() refuses a split it cannot keep)
                worker.deployer.set_weights(svc, {"production": 100})
            except Exception:
                pass
        try:
            close()
        except Exception as e:
            logging.getLogger(__name__).warning("closing the deployer: %s", e)
    return 0


def cmd_demo(a) -> int:
    from control_plane.demo import DemoConfig, run_demo

    from control_plane.adapters.deploy import DeployError

    try:
        cfg = DemoConfig(workdir=a.workdir, rate=a.rate, slow_ms=a.slow_ms, kernels=a.kernels, metrics=a.metrics)
    except ValueError as e:
        raise CLIError(str(e)) from None
    try:
        return 0 if run_demo(cfg).ok else 1
    except ValueError as e:   # e.g. no prometheus binary
        print(f"sits-control demo: {e}", file=sys.stderr)
        return 1
    except DeployError as e:   # an engine did not start: its log tail is in the message
        print(f"sits-control demo: a variant could not be deployed: {e}", file=sys.stderr)
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

    r = sub.add_parser("rollout", help="start, list, show and steer rollouts").add_subparsers(dest="rcmd", required=True)
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
