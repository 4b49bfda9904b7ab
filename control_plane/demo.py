"""`sits-control demo`: production behind the weighted router, a load generator, and two real rollouts run by the
real worker with direct scrape and the real analysis core: a canary with injected latency (a SIMULATED regression,
via the engine's --fault-latency-ms flag) that must roll back on its own, then a good canary that must be promoted.

Runs on a machine with no GPU and no cluster: tiny model, `torch` kernels, every variant a local `sits-engine serve`
process. The policy is a demo policy (short steps and intervals); `Policy()` defaults are for production.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import httpx

import kernels
from control_plane.adapters import process
from control_plane.adapters.deploy import Deployer, VariantSpec
from control_plane.adapters.local import LocalConfig, LocalDeployer
from control_plane.adapters.notify import WebhookConfig, WebhookNotifier
from control_plane.adapters.prometheus import PrometheusConfig, PrometheusSource
from control_plane.adapters.scrape import ScrapeSource
from control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck, Policy
from control_plane.format import format_check, format_deltas
from control_plane.lifecycle import shutdown
from control_plane.loadgen import LoadGenerator
from control_plane.rollout import Command, Decision, EventKind, Phase
from control_plane.service import start_rollout
from control_plane.spec import DeploySpec
from control_plane.store import Store
from control_plane.worker import Worker, WorkerConfig


def demo_policy() -> Policy:
    """Short steps for a few-minute demo on 2 CPU cores (the defaults are for production traffic). The gates are
    loose (P99 +50 %, P90 +25 %): two identical engine processes sharing 2 busy cores differ by ~20 % at P99 and up
    to ~17 % at P90 for minutes at a time, and the demo must promote a good canary within its time budget."""
    return Policy(steps=(25, 50, 100), check_interval_s=5.0, warmup_s=3.0,
                  checks=(MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.50),
                          MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.25),
                          MetricCheck(ERROR_RATE, max_abs_delta=0.02)),
                  min_samples=100, min_tail_samples=2, failure_limit=2, inconclusive_limit=24,
                  on_inconclusive="rollback", max_duration_s=600.0, ready_timeout_s=300.0, min_error_samples=100)


class LocalPrometheus:
    """A real Prometheus (the Debian package's binary) scraping the demo's variants every 500 ms. It finds them
    through a file_sd file that follows the deployer's status (what Kubernetes service discovery does in a cluster)."""

    def __init__(self, workdir: Path, deployer: Deployer, service: str) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            raise ValueError("--metrics prometheus needs the prometheus binary (Debian: apt-get install prometheus)")
        self.deployer, self.service, self.sd = deployer, service, workdir / "prometheus-targets.json"
        self._write_targets()
        cfg = workdir / "prometheus.yml"
        cfg.write_text(json.dumps({"global": {"scrape_interval": "500ms", "scrape_timeout": "500ms"},
                                   "scrape_configs": [{"job_name": "sits", "file_sd_configs": [
                                       {"files": [str(self.sd)], "refresh_interval": "1s"}]}]}))
        port = process.free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = process.spawn([binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'prom-data'}",
                                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                  log_path=workdir / "prometheus.log")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise ValueError(f"prometheus did not start; see {workdir / 'prometheus.log'}")
            time.sleep(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sits-demo-sd", daemon=True)
        self._thread.start()

    def _write_targets(self) -> None:
        try:
            st = self.deployer.status(self.service)
        except Exception:
            return
        text = json.dumps([{"targets": sorted(u.removeprefix("http://") for v in st.values() for u in v.endpoints),
                            "labels": {}}])
        if not self.sd.exists() or self.sd.read_text() != text:
            tmp = self.sd.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.sd)

    def _follow(self) -> None:
        while not self._stop.wait(0.5):
            self._write_targets()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        process.stop(self.proc, 10)


@dataclass(slots=True)
class DemoConfig:
    workdir: str | None = None       # store + variant logs; a new temp dir when None
    rate: float = 40.0               # requests/s through the router
    threads: int = 16
    max_tokens: int = 2
    slow_ms: float = 250.0           # latency injected into the bad canary, before its first token
    kernels: str = "torch"
    service: str = "demo"
    interval_s: float = 2.0          # worker pass interval (each pass scrapes every variant's /metrics)
    rollout_timeout_s: float = 420.0
    metrics: str = "scrape"          # "scrape" (direct, the default) | "prometheus" (a local Prometheus)
    policy: Policy = field(default_factory=demo_policy)

    def __post_init__(self) -> None:
        if self.metrics not in ("scrape", "prometheus"):
            raise ValueError(f"metrics must be 'scrape' or 'prometheus', got {self.metrics!r}")

        if not self.rate > 0 or self.threads < 1 or self.max_tokens < 1:
            raise ValueError("rate must be > 0, threads and max_tokens >= 1")
        if not self.slow_ms > 0:
            raise ValueError("slow_ms must be > 0 (the bad canary's injected latency)")
        try:
            ks = kernels.get_kernel_set(self.kernels)
        except KeyError as e:
            raise ValueError(str(e)) from None
        if "cpu" not in ks.devices:
            raise ValueError(f"kernel set {self.kernels} does not run on CPU (devices: {', '.join(ks.devices)})")


@dataclass(slots=True)
class DemoResult:
    store_path: str
    rollouts: list[tuple[str, str, str, str]] = field(default_factory=list)   # (id, label, phase, expected)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return len(self.rollouts) == 2 and all(p == e for _, _, p, e in self.rollouts)


class WebhookReceiver:
    """A local HTTP endpoint that receives the worker's JSON webhooks and prints them (so the demo shows the
    notification path working end to end)."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                outer.received.append(body)
                out(f"  webhook <- {body.get('event')}: {body.get('message')}")
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/sits"
        threading.Thread(target=self.server.serve_forever, name="sits-demo-webhook", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _printer(t0: float) -> Callable[[str], None]:
    lock = threading.Lock()

    def out(line: str = "") -> None:
        with lock:
            print(f"[{time.monotonic() - t0:6.1f}s] {line}" if line else "", flush=True)
    return out


def run_demo(cfg: DemoConfig | None = None) -> DemoResult:
    cfg = cfg or DemoConfig()
    t0 = time.monotonic()
    out = _printer(t0)
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="sits-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "sits-demo.db"
    if store_path.exists():
        store_path.unlink()
    ks = kernels.get_kernel_set(cfg.kernels)
    result = DemoResult(str(store_path))
    out(f"SITS demo: gray releases of kernel sets on this machine (CPU, tiny model, kernel set {ks.name} "
        f"{ks.version}); work dir {workdir}")
    deployer = LocalDeployer(LocalConfig(workdir=str(workdir / "variants"), cpu_threads=1))
    receiver = WebhookReceiver(out)
    store = Store(str(store_path))
    notifier = WebhookNotifier(WebhookConfig(receiver.url, format="json"), journal=store)
    load = worker = prom = None
    source = ScrapeSource()
    try:
        if cfg.metrics == "prometheus":
            prom = LocalPrometheus(workdir, deployer, cfg.service)
            source = PrometheusSource(PrometheusConfig(prom.url, lag_s=1.0))
            out(f"      Prometheus at {prom.url} scrapes every variant (file_sd from the deployer's status)")
        out(f"[1/5] starting production: `sits-engine serve --model tiny --kernels {ks.name}` behind the weighted "
            "router ...")
        deployer.deploy(VariantSpec(cfg.service, "production", cfg.kernels))
        router = deployer.router_url(cfg.service)
        out(f"      production ready; router at {router}")
        out("[2/5] one request through the router:")
        r = httpx.post(router + "/v1/completions", json={"model": "tiny", "prompt": "The canary sang",
                                                          "max_tokens": 12, "temperature": 0}, timeout=60,
                       trust_env=False)
        r.raise_for_status()
        body = r.json()
        out(f"      POST /v1/completions -> {r.status_code} from {r.headers.get('x-sits-variant')} "
            f"({body['usage']['completion_tokens']} tokens, random tiny weights): {body['choices'][0]['text']!r}")
        out(f"[3/5] load generator: {cfg.rate:g} requests/s through the router (max_tokens {cfg.max_tokens})")
        load = LoadGenerator(router, cfg.rate, cfg.threads, cfg.max_tokens).start()
        worker = Worker(store, deployer, source, notifier, WorkerConfig(interval_s=cfg.interval_s)).start()
        p = cfg.policy
        how = ("direct scrape of each variant's /metrics" if prom is None else
               "PromQL bucket increases from the local Prometheus")
        out(f"      worker started ({how} every {cfg.interval_s:g} s); demo policy: "
            f"steps {list(p.steps)} %, a check every {p.check_interval_s:g} s after {p.warmup_s:g} s warm-up, "
            + ", ".join(f"{c.name} <= +{(c.max_rel_delta or c.max_abs_delta) * 100:g}"
                        + (" %" if c.max_rel_delta else " pt") for c in p.checks)
            + f" vs {p.compare_to}, rollback after {p.failure_limit} failed checks")
        runs = [(f"canary {ks.name} + {cfg.slow_ms:g} ms injected before the first token (SIMULATED regression via "
                 f"--fault-latency-ms; no kernel here is really slower)", ("--fault-latency-ms", f"{cfg.slow_ms:g}"),
                 "rolled_back"),
                (f"canary {ks.name}, unchanged (a good release)", (), "succeeded")]
        for i, (label, args, expected) in enumerate(runs):
            out(f"[{4 + i}/5] rollout {i + 1}: {label}")
            ro = start_rollout(store, cfg.service, cfg.kernels, cfg.kernels, p, DeploySpec(canary_args=args),
                               actor="demo")
            out(f"      rollout {ro.id} created (expected outcome: {expected.replace('_', ' ')})")
            phase = _follow(store, ro.id, load, cfg, out)
            result.rollouts.append((ro.id, label, phase, expected))
            out(f"      => {phase.replace('_', ' ').upper()} "
                f"({'as expected' if phase == expected else 'NOT the expected ' + expected})")
        notifier.flush(5)
    finally:
        if load is not None:
            load.stop()
        if prom is not None:
            prom.stop()
        shutdown(deployer, worker=worker, notifier=notifier, source=source)   # every variant stops here
        receiver.close()
        store.close()
    result.seconds = time.monotonic() - t0
    _summary(result, out)
    return result


def _follow(store: Store, rollout_id: str, load: LoadGenerator, cfg: DemoConfig, out) -> str:
    """Print the rollout's events and every check's evidence as they are stored, until it ends."""
    seen_event, seen_check, last_load = 0, 0, time.monotonic()
    deadline, aborted = time.monotonic() + cfg.rollout_timeout_s, False
    while True:
        r = store.get(rollout_id)
        for e in store.events(rollout_id, since_id=seen_event):
            seen_event = e["id"]
            if e["kind"] in (EventKind.PHASE, EventKind.COMMAND, EventKind.METRICS):
                out(f"      {e['message']}")
        for ev in store.checks(rollout_id, since_seq=seen_check):
            seen_check = ev["seq"]
            for line in format_check(ev, r.policy.steps):
                out("      " + line)
            if ev["decision"] in (Decision.ROLLBACK, Decision.PROMOTE):
                out("          every measured percentile at this check (shown, not all decided on):")
                for line in format_deltas(ev):
                    out("      " + line)
        if not r.active and not store.pending_actions(rollout_id):
            return r.phase.value
        if r.phase is Phase.PROGRESSING and time.monotonic() - last_load >= 5:
            last_load = time.monotonic()
            s = load.summary(5.0)
            parts = [f"{v} {x['share'] * 100:.0f} % p90 {x['p90_ms']:.0f} ms" for v, x in s["variants"].items()]
            out(f"      load {s['rate']:.1f} req/s ({s['errors']} errors): " + ", ".join(parts)
                + " (client side, last 5 s)")
        if time.monotonic() > deadline and not aborted:
            out(f"      rollout did not finish within {cfg.rollout_timeout_s:g} s: aborting it")
            store.add_command(rollout_id, Command.ABORT, "demo timeout")
            aborted, deadline = True, time.monotonic() + 120
        elif time.monotonic() > deadline:
            return r.phase.value
        time.sleep(0.5)


def _summary(result: DemoResult, out) -> None:
    out("")
    out(f"Summary ({result.seconds / 60:.1f} min):")
    with Store(result.store_path) as store:
        for i, (rid, label, phase, expected) in enumerate(result.rollouts):
            r = store.get(rid)
            ok = "OK" if phase == expected else f"UNEXPECTED (wanted {expected})"
            out(f"  {i + 1}. {label}")
            out(f"     {rid}: {phase} after {r.checks} checks, {r.phase_since - r.created_at:.0f} s - {ok}")
    out(f"Store with every check's evidence: {result.store_path}")
    if result.rollouts:
        out(f"Inspect: .venv/bin/python -m control_plane.cli rollout show {result.rollouts[0][0]} "
            f"--store {result.store_path}")
    out("demo " + ("passed" if result.ok else "FAILED"))
