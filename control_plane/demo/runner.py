"""`sits-control demo`: the whole product on one machine. The control-plane service (web UI + JSON API with a fresh
login token, the worker beside it), a production engine behind the weighted router, chat-like Poisson load through it
(control_plane/demo/loadgen.py), then real canaries of real kernel sets, one after the other:

    slow   torch-slow-attn   correct but genuinely slower (unfused per-head attention): rolled back by P90/P99 deltas
    wrong  torch-wrong-rope  as fast, numerically wrong (RoPE without the llama3 scaling): rolled back by the
                             correctness gate
    good   torch             the production kernels themselves: promoted

No sleeps or injected faults: the regressions are the kernel sets' own (kernels/sets.py). Runs on a machine with no
GPU and no cluster: tiny model, every variant a local `sits-engine serve` process. The policy is a demo policy (short
steps and intervals); `Policy()` defaults are for production.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import waitress

from control_plane.adapters.deploy import VariantSpec
from control_plane.adapters.kernel_catalog import KernelCatalog
from control_plane.adapters.local_config import LocalConfig
from control_plane.adapters.local import LocalDeployer
from control_plane.adapters.prometheus import PrometheusConfig, PrometheusSource
from control_plane.adapters.scrape import ScrapeSource
from control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, LowTrafficPolicy, MetricCheck, Policy
from control_plane.web import create_app
from control_plane.demo.prometheus import LocalPrometheus
from control_plane.service.format import format_check
from control_plane.worker.lifecycle import shutdown
from control_plane.demo.loadgen import LengthDist, LoadGenerator, TrafficMix
from control_plane.rollout import Command, Decision, EventKind, Phase
from control_plane.service.rollouts import start_rollout
from control_plane.adapters.spec import DeploySpec
from control_plane.store.db import Store
from control_plane.tracing import Tracing
from control_plane.web.users import Users, token_sha256
from control_plane.worker.loop import Worker
from control_plane.worker.config import WorkerConfig


@dataclass(slots=True, frozen=True)
class Scenario:
    name: str
    kernels: str
    expected: Phase
    what: str


SCENARIOS = {s.name: s for s in (
    Scenario("slow", "torch-slow-attn", Phase.ROLLED_BACK,
             "a genuinely SLOWER kernel set (correct, unfused per-head attention): the P90/P99 deltas must roll it back"),
    Scenario("wrong", "torch-wrong-rope", Phase.ROLLED_BACK,
             "a WRONG kernel set (as fast, RoPE without the llama3 scaling): the correctness gate must roll it back"),
    Scenario("good", "torch", Phase.SUCCEEDED,
             "a GOOD release (production's own kernels, an equivalent set): it must be promoted"))}


def demo_policy() -> Policy:
    """Short steps for a few-minute demo on 2 CPU cores. The gates are loose (P99 +50 %, P90 +25 %): two identical
    engine processes sharing 2 busy cores differ by ~20 % at P99 and up to ~17 % at P90 for minutes at a time; the
    slow set is ~1.7x slower in decode and ~2.7x in prefill, far beyond them. One checked step at 50 %: a P99 needs
    ~700 requests per variant before its interval is narrow enough to pass, ~1 min at 12 req/s each. min_samples 1200:
    P90 may not decide before P99 can (the slow set's P99 is ~+80-240 % here; its lower bound clears +50 % from ~1000
    requests on, in about half the runs: BENCHMARKS.md "Low-traffic mode"). Low-traffic mode is on: at a thin live rate
    (--rate 0.5) replayed requests supply the samples (4 in flight per variant: more only queue behind the slow set
    and widen both tails); a pass still needs 200 live canary requests."""
    return Policy(steps=(50, 100), check_interval_s=5.0, warmup_s=3.0,
                  checks=(MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.50),
                          MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.25),
                          MetricCheck(ERROR_RATE, max_abs_delta=0.02)),
                  min_samples=1200, min_tail_samples=2, failure_limit=2, inconclusive_limit=40,
                  on_inconclusive="rollback", max_duration_s=600.0, ready_timeout_s=300.0, min_error_samples=100,
                  low_traffic=LowTrafficPolicy(enabled=True, max_rps=30.0, max_requests_per_step=4000,
                                               max_requests_per_rollout=8000, concurrency=4, min_live_requests=200))


# chat-like traffic for the tiny model: prompts ~64 tokens (long tail to 400), answers ~6 (to 32), 40 % streamed;
# all on /v1/completions (each route's percentiles are compared on their own: a second route halves the samples)
DEMO_MIX = TrafficMix(LengthDist(64, 0.6, 16, 400), LengthDist(6, 0.6, 1, 32), stream_fraction=0.4,
                      chat_fraction=0.0)


@dataclass(slots=True)
class DemoConfig:
    workdir: str | None = None       # store, auth file, variant logs; a new temp dir when None
    scenarios: tuple[str, ...] = ("slow", "wrong", "good")
    rate: float = 25.0               # requests/s through the router (Poisson)
    threads: int = 12
    production_kernels: str = "torch"
    service: str = "demo"
    host: str = "127.0.0.1"
    port: int = 0                    # the UI/API port; 0: a free one
    interval_s: float = 2.0          # worker pass interval (each pass scrapes every variant's /metrics)
    rollout_timeout_s: float = 480.0
    metrics: str = "scrape"          # "scrape" (direct, the default) | "prometheus" (a local Prometheus)
    keep_running: bool = False       # leave the UI up after the summary, until Ctrl-C
    policy: Policy = field(default_factory=demo_policy)

    def __post_init__(self) -> None:
        if self.metrics not in ("scrape", "prometheus"):
            raise ValueError(f"metrics must be 'scrape' or 'prometheus', got {self.metrics!r}")
        if not self.rate > 0 or self.threads < 1:
            raise ValueError("rate must be > 0 and threads >= 1")
        self.scenarios = tuple(self.scenarios)
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown or not self.scenarios:
            raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)} or all")

    def check_kernels(self, catalog: KernelCatalog) -> None:
        """ValueError unless every kernel set the demo runs is one the engine here has, and runs on CPU."""
        for name in {self.production_kernels, *(SCENARIOS[s].kernels for s in self.scenarios)}:
            info = catalog.get(name)
            if info is None:
                raise ValueError(f"kernel set {name} is not registered here (known: {', '.join(catalog.names())})")
            if "cpu" not in info.devices:
                raise ValueError(f"kernel set {name} does not run on CPU")


@dataclass(slots=True)
class DemoResult:
    store_path: str
    url: str = ""
    rollouts: list[tuple[str, Scenario, str]] = field(default_factory=list)   # (id, scenario, final phase)
    seconds: float = 0.0
    wanted: int = 0

    @property
    def ok(self) -> bool:
        return len(self.rollouts) == self.wanted and all(p == s.expected.value for _, s, p in self.rollouts)


def _printer(t0: float) -> Callable[[str], None]:
    lock = threading.Lock()

    def out(line: str = "") -> None:
        with lock:
            print(f"[{time.monotonic() - t0:6.1f}s] {line}" if line else "", flush=True)
    return out


def _auth_file(workdir: Path) -> tuple[Path, str]:
    """A fresh random admin token; only its SHA-256 goes to the file (mode 600)."""
    token = secrets.token_urlsafe(24)
    path = workdir / "auth.json"
    path.write_text(json.dumps({"users": [{"name": "demo", "role": "admin", "token_sha256": token_sha256(token)}]}))
    os.chmod(path, 0o600)
    return path, token


def run_demo(cfg: DemoConfig | None = None) -> DemoResult:
    cfg = cfg or DemoConfig()
    catalog = KernelCatalog.discover()
    cfg.check_kernels(catalog)
    t0 = time.monotonic()
    out = _printer(t0)
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="sits-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "sits-demo.db"
    for p in (store_path, Path(f"{store_path}-wal"), Path(f"{store_path}-shm")):
        p.unlink(missing_ok=True)
    result = DemoResult(str(store_path), wanted=len(cfg.scenarios))
    out(f"SITS demo: canaries of real kernel sets on this machine (CPU, tiny model); work dir {workdir}")
    deployer = LocalDeployer(LocalConfig(workdir=str(workdir / "variants"), cpu_threads=1))
    store = Store(str(store_path))
    load = worker = prom = server = None
    source = ScrapeSource()
    tracing = Tracing.from_flags()
    try:
        if cfg.metrics == "prometheus":
            prom = LocalPrometheus(workdir, deployer, cfg.service)
            source = PrometheusSource(PrometheusConfig(prom.url, lag_s=1.0))
            out(f"      Prometheus at {prom.url} scrapes every variant")
        # traces by the environment (OTEL_TRACES_EXPORTER=otlp, OTEL_EXPORTER_OTLP_ENDPOINT=...): the load
        # generator's request spans are continued by the engines through the router (docs/observability.md)
        worker = Worker(store, deployer, source, config=WorkerConfig(interval_s=cfg.interval_s), tracing=tracing)
        auth_path, token = _auth_file(workdir)
        app = create_app({"STORE": store, "SITS_USERS": Users.load(str(auth_path)), "WORKER": worker,
                          "REPLICA_LIMIT": dataclasses.asdict(deployer.replica_limit()),
                          "SECRET_KEY": secrets.token_hex(32), "KERNEL_CATALOG": catalog})
        server = waitress.create_server(app, host=cfg.host, port=cfg.port, threads=8, ident="sits")
        threading.Thread(target=server.run, name="sits-demo-ui", daemon=True).start()
        result.url = f"http://{cfg.host}:{server.effective_port}/"
        out(f"[1/4] control plane up: UI {result.url}  (log in with token {token})")
        out(f"      API reference {result.url}api (OpenAPI {result.url}api/v1/openapi.json; calls send "
            f"Authorization: Bearer <token>), metrics {result.url}metrics; auth file {auth_path} keeps only its SHA-256")
        ks = catalog.require(cfg.production_kernels, "production_kernels")
        out(f"[2/4] production: `sits-engine serve --model tiny --kernels {ks.name}` ({ks.version}) behind the "
            "weighted router ...")
        deployer.deploy(VariantSpec(cfg.service, "production", cfg.production_kernels))
        router = deployer.router_url(cfg.service)
        r = httpx.post(router + "/v1/completions", json={"model": "tiny", "prompt": "The canary sang",
                                                          "max_tokens": 12, "temperature": 0}, timeout=60,
                       trust_env=False)
        r.raise_for_status()
        out(f"      router {router}: POST /v1/completions -> {r.status_code} from {r.headers.get('x-sits-variant')}"
            f" (random tiny weights): {r.json()['choices'][0]['text']!r}")
        m = DEMO_MIX
        out(f"[3/4] load: Poisson {cfg.rate:g} req/s, prompts ~{m.prompt_tokens.median:g} tokens and answers "
            f"~{m.output_tokens.median:g} (lognormal), {m.stream_fraction:.0%} streamed, every token verified")
        load = LoadGenerator(router, cfg.rate, cfg.threads, mix=DEMO_MIX, seed=2026, tracing=tracing).start()
        worker.start()
        p = cfg.policy
        out(f"      worker every {cfg.interval_s:g} s; demo policy: steps {list(p.steps)} %, a check every "
            f"{p.check_interval_s:g} s, " + ", ".join(_gate(c) for c in p.checks)
            + f" vs {p.compare_to}, rollback after {p.failure_limit} failed checks; correctness gate on")
        for i, name in enumerate(cfg.scenarios):
            sc = SCENARIOS[name]
            out("")
            out(f"[4/4] canary {i + 1}/{len(cfg.scenarios)} ({name}): {sc.kernels} - {sc.what}")
            ro = start_rollout(store, cfg.service, sc.kernels, cfg.production_kernels, p, DeploySpec(), actor="demo",
                               kernel_sets=catalog)
            out(f"      rollout {ro.id}: {result.url}rollouts/{ro.id}")
            phase = _follow(store, ro.id, load, cfg, out)
            result.rollouts.append((ro.id, sc, phase))
            verdict = "as expected" if phase == sc.expected.value else "NOT the expected " + sc.expected.value
            out(f"      => {phase.replace('_', ' ').upper()} ({verdict})")
        result.seconds = time.monotonic() - t0
        _summary(result, store, load, out, worker.metrics.replayed)
        if cfg.keep_running:
            out(f"UI still up at {result.url} (token above); Ctrl-C to stop")
            threading.Event().wait()
    finally:
        if load is not None:
            load.stop(20)
        shutdown(deployer, worker=worker, source=source)   # every variant stops here
        if server is not None:
            server.close()
        if prom is not None:
            prom.stop()
        tracing.shutdown()
        store.close()
    return result


def _gate(c: MetricCheck) -> str:
    if c.max_rel_delta is not None:
        return f"{c.name} <= +{c.max_rel_delta * 100:g} %"
    return f"{c.name} <= +{c.max_abs_delta * 100:g} pt"


def _pick(results: list[dict], suffix: str) -> dict | None:
    rows = [r for r in results if r["check"].endswith(suffix)]
    return next((r for r in rows if '"/v1/completions"' in r.get("series", "")), rows[0] if rows else None)


def _pct(x) -> str:
    return "-" if x is None or isinstance(x, str) else f"{x * 100:+.1f}"


def progress_line(ev: dict, steps: int) -> str:
    """One check in one line: step, weight, P99 and P90 deltas with their intervals, verdict and decision."""
    v = ev["verdict"]
    head = f"check {ev['seq']:>2} · step {ev['step'] + 1}/{steps} at {ev['weight']:>3} %"
    if v.get("correctness") is not None:
        return f"{head} · correctness gate: {v['correctness']['outcome'].upper()} -> {ev['decision']}"
    parts = []
    for q in ("p99", "p90"):
        r = _pick(v["results"], f":{q}")
        if r is not None and not isinstance(r.get("delta_rel"), (int, float)):
            parts.append(f"{q.upper()} not yet (too few requests)")
        elif r is not None:
            parts.append(f"{q.upper()} {_pct(r.get('delta_rel'))} % [{_pct(r.get('ci_low'))}, "
                         f"{_pct(r.get('ci_high'))}] (<= +{r['threshold'] * 100:g} %)")
    c = ev.get("variants", {}).get("canary", {})
    n, rep = c.get("requests", 0), c.get("replayed", 0)
    return (f"{head} · {' · '.join(parts)} · {n:.0f} canary req ({rep:.0f} replayed) · {v['outcome'].upper()} -> "
            f"{ev['decision']}")


def _follow(store: Store, rollout_id: str, load: LoadGenerator, cfg: DemoConfig, out) -> str:
    """Print phase changes and one line per check as they are stored (the full evidence at the deciding check)."""
    seen_event, seen_check, last_load = 0, 0, time.monotonic()
    deadline, aborted = time.monotonic() + cfg.rollout_timeout_s, False
    steps = len(cfg.policy.steps)
    while True:
        r = store.get(rollout_id)
        for e in store.events(rollout_id, since_id=seen_event):
            seen_event = e["id"]
            if e["kind"] in (EventKind.PHASE, EventKind.COMMAND):
                out(f"      {e['message']}")
        for ev in store.checks(rollout_id, since_seq=seen_check):
            seen_check = ev["seq"]
            out("      " + progress_line(ev, steps))
            if ev["decision"] in (Decision.ROLLBACK, Decision.PROMOTE):
                for line in format_check(ev, cfg.policy.steps)[1:]:
                    out("        " + line)
        if not r.active and not store.pending_actions(rollout_id):
            return r.phase.value
        if r.phase is Phase.PROGRESSING and time.monotonic() - last_load >= 10:
            last_load = time.monotonic()
            s = load.summary(10.0)
            parts = [f"{v} {x['share'] * 100:.0f} % p90 {x['p90_ms']:.0f} ms" for v, x in s["variants"].items()]
            out(f"      load {s['rate']:.1f} req/s, {s['errors']} failed: " + ", ".join(parts) + " (client side)")
        if time.monotonic() > deadline and not aborted:
            out(f"      rollout did not finish within {cfg.rollout_timeout_s:g} s: aborting it")
            store.commands.add(rollout_id, Command.ABORT, "demo timeout")
            aborted, deadline = True, time.monotonic() + 120
        elif time.monotonic() > deadline:
            return r.phase.value
        time.sleep(0.5)


def _summary(result: DemoResult, store: Store, load: LoadGenerator, out, replayed) -> None:
    out("")
    out(f"Summary ({result.seconds / 60:.1f} min):")
    for i, (rid, sc, phase) in enumerate(result.rollouts):
        r = store.get(rid)
        ok = "OK" if phase == sc.expected.value else f"UNEXPECTED (wanted {sc.expected.value})"
        out(f"  {i + 1}. {sc.name:5s} {sc.kernels:16s} {phase:11s} after {r.checks} checks, "
            f"{r.phase_since - r.created_at:.0f} s - {ok}")
        out(f"     why: {r.reason}")
        if r.replayed_requests:
            out(f"     low-traffic mode replayed {r.replayed_requests:.0f} requests to the canary (and as many to the "
                "baseline) next to the live ones")
    counts = load.counts()
    out("  load: " + "; ".join(f"{v} {c['answered']} answered / {c['failed']} failed" for v, c in counts.items())
        + f" ({load.sent} sent, every token verified)")
    total = {s.labels["variant"]: s.value for m in replayed.collect() for s in m.samples if s.name.endswith("_total")}
    out("  replayed (low-traffic mode, sits_replayed_requests_total): " + (", ".join(
        f"{v} {n:.0f}" for v, n in sorted(total.items())) or "none"))
    out(f"  UI {result.url} · store {result.store_path}")
    out("demo " + ("passed" if result.ok else "FAILED"))
    sys.stdout.flush()
