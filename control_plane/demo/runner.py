"""`sits-control demo`: the whole product on one machine. The control-plane service (web UI + JSON API with a fresh
login token, the worker beside it), a production engine behind the weighted router, chat-like Poisson load through it
(control_plane/demo/loadgen.py), then real canaries of real kernel sets, one after the other:

    slow   torch-slow-attn   correct but genuinely slower (unfused per-head attention): rolled back by P90/P99 deltas
    wrong  torch-wrong-rope  as fast, numerically wrong (RoPE without the llama3 scaling): rolled back by the
                             correctness gate
    good   torch             the production kernels themselves: promoted
    kvfp8  torch + --kv-cache-dtype fp8 on the canary alone (an engine-flag release; not in `all`): promoted

No sleeps or injected faults: the regressions are the kernel sets' own (kernels/sets.py). Runs on a machine with no
GPU and no cluster: tiny model, every variant a local `sits-engine serve` process. The policy is a demo policy (short
steps and intervals); `Policy()` defaults are for production.

`--device cuda` (control_plane/demo/profiles.py GPU): the same on the machine's GPUs, each variant on one of its own
where there are enough, else sharing them (each engine takes GPU_MEMORY_SHARE of a GPU's memory), with Triton sets
-- triton-v1 in production, triton-v1-unsplit (slow), triton-v1-floor-pages (wrong), triton-v1.1 (good), and `aa`
runs of triton-v1 against itself -- on a tiny model trained on the device first (control_plane/demo/model.py)
unless --model names another. What it prints (a line per check, the evidence, the summary) is
control_plane/demo/narrate.py.

`--parallel K` deals the scenarios to K lanes that run side by side, each its own service with its own production
engine, router and load (control_plane/demo/lanes.py); the store, worker, UI and Prometheus are shared.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import waitress

from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.adapters.deploy.engine_args import check_args
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.deploy.local.config import LocalConfig, default_max_replicas
from sits.control_plane.adapters.deploy.local.gpus import visible_gpus
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig, PrometheusSource
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis import Policy
from sits.control_plane.demo import narrate
from sits.control_plane.demo.lanes import ENGINES_PER_LANE, Lane, deal, lane_services
from sits.control_plane.demo.model import resolve_model
from sits.control_plane.demo.profiles import PROFILES, Scenario, mps_running
from sits.control_plane.demo.prometheus import LocalPrometheus
from sits.control_plane.store.db import Store
from sits.control_plane.validation import service_name
from sits.control_plane.web import create_app
from sits.control_plane.web.users import Users, token_sha256
from sits.control_plane.worker.actions import in_parallel
from sits.control_plane.worker.config import WorkerConfig
from sits.control_plane.worker.lifecycle import shutdown
from sits.control_plane.worker.loop import Worker
from sits.wire.tracing import Tracing


@dataclass(slots=True)
class DemoConfig:
    workdir: str | None = None       # store, auth file, variant logs; a new temp dir when None
    scenarios: tuple[str, ...] = ("slow", "wrong", "good")   # in turn; a name may repeat (aa x 5)
    device: str = "cpu"              # "cpu" | "cuda": the profile (control_plane/demo/profiles.py)
    rate: float | None = None        # requests/s through the router (Poisson); None: the profile's
    threads: int | None = None       # load senders; None: the profile's
    production_kernels: str | None = None   # None: the profile's (torch on CPU, triton-v1 on the GPU)
    model: str | None = None         # None: the profile's (tiny; on the GPU a tiny model trained there first)
    service: str = "demo"
    host: str = "127.0.0.1"
    port: int = 0                    # the UI/API port; 0: a free one
    interval_s: float = 2.0          # worker pass interval (each pass scrapes every variant's /metrics)
    rollout_timeout_s: float = 480.0
    metrics: str = "scrape"          # "scrape" (direct, the default) | "prometheus" (a local Prometheus)
    keep_running: bool = False       # leave the UI up after the summary, until Ctrl-C
    policy: Policy | None = None     # None: the profile's demo policy
    gpu_memory_share: float | None = None   # --device cuda: each engine's share of GPU memory; None: the profile's
    parallel: int = 1                # lanes side by side, each its own service (control_plane/demo/lanes.py)
    engine_extra: tuple[str, ...] = ()   # every engine's extra `sits-engine serve` flags (as a rollout's args)

    def __post_init__(self) -> None:
        if self.metrics not in ("scrape", "prometheus"):
            raise ValueError(f"metrics must be 'scrape' or 'prometheus', got {self.metrics!r}")
        if self.device not in PROFILES:
            raise ValueError(f"device must be one of {', '.join(PROFILES)}, got {self.device!r}")
        prof = PROFILES[self.device]
        self.rate = prof.rate if self.rate is None else self.rate
        self.threads = prof.threads if self.threads is None else self.threads
        self.production_kernels = self.production_kernels or prof.production_kernels
        self.model = self.model or prof.model
        self.policy = self.policy or prof.policy(self.rate)
        if not self.rate > 0 or self.threads < 1:
            raise ValueError("rate must be > 0 and threads >= 1")
        if self.gpu_memory_share is None and self.parallel > 1 and "--gpu-memory-utilization" in prof.engine_args:
            # the lanes' engines split what one lane's would take
            share = float(prof.engine_args[prof.engine_args.index("--gpu-memory-utilization") + 1])
            self.gpu_memory_share = round(share / self.parallel, 4)
        if self.gpu_memory_share is not None and not 0.01 <= self.gpu_memory_share <= 0.95:
            raise ValueError(f"gpu memory share must be from 0.01 to 0.95, got {self.gpu_memory_share:g}")
        self.scenarios = tuple(self.scenarios)
        unknown = [s for s in self.scenarios if s not in prof.scenarios]
        if unknown or not self.scenarios:
            raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(prof.scenarios)} or all")
        deal(self.scenarios, self.parallel)   # ValueError unless 1 <= parallel <= len(scenarios)
        self.engine_extra = check_args(self.engine_extra, "--engine-arg")   # ValidationError (a ValueError)
        for sc in {prof.scenarios[s] for s in self.scenarios}:
            both = [a for a in sc.canary_args if a.startswith("--") and
                    any(x.partition("=")[0] == a for x in self.engine_extra)]
            if both:
                raise ValueError(f"scenario {sc.name} releases {' '.join(sc.canary_args)} on the canary alone; "
                                 f"--engine-arg already gives every engine {', '.join(both)}: its canary would "
                                 "change nothing")
        for name in lane_services(self.service, self.parallel):
            service_name(name, "service")

    @property
    def profile(self):
        return PROFILES[self.device]

    @property
    def engine_args(self) -> tuple[str, ...]:
        """Every engine's extra flags: the profile's, with --gpu-memory-utilization at gpu_memory_share if set, then
        engine_extra."""
        args = list(self.profile.engine_args)
        if self.gpu_memory_share is not None and "--gpu-memory-utilization" in args:
            args[args.index("--gpu-memory-utilization") + 1] = f"{self.gpu_memory_share:g}"
        return (*args, *self.engine_extra)

    @property
    def lanes(self) -> list[tuple[str, ...]]:
        """Each lane's scenarios, in turn (lanes.deal)."""
        return deal(self.scenarios, self.parallel)

    def scenario(self, name: str) -> Scenario:
        return self.profile.scenarios[name]

    def check_kernels(self, catalog: KernelCatalog) -> None:
        """ValueError unless every kernel set the demo runs is one the engine here has, runs on the device and reads
        the KV pages its engine is given (a scenario's canary flags on top of every engine's)."""
        runs = {("production", self.production_kernels, self.engine_args)}
        for sc in map(self.scenario, self.scenarios):
            runs.add((f"scenario {sc.name}", sc.canary_kernels(self.production_kernels),
                      (*self.engine_args, *sc.canary_args)))
        for what, name, args in sorted(runs):
            info = catalog.get(name)
            if info is None:
                raise ValueError(f"kernel set {name} is not registered here (known: {', '.join(catalog.names())})")
            if self.device not in info.devices:
                raise ValueError(f"kernel set {name} does not run on {self.device.upper()}")
            if why := catalog.kv_cache_dtype_problem(name, args, what):
                raise ValueError(why)


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
    out = narrate.printer(t0)
    workdir = Path(cfg.workdir or tempfile.mkdtemp(prefix="sits-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_path = workdir / "sits-demo.db"
    for p in (store_path, Path(f"{store_path}-wal"), Path(f"{store_path}-shm")):
        p.unlink(missing_ok=True)
    result = DemoResult(str(store_path), wanted=len(cfg.scenarios))
    prof = cfg.profile
    if prof.device == "cpu":
        out(f"SITS demo: canaries of real kernel sets on this machine (CPU, tiny model); work dir {workdir}")
        model = resolve_model(cfg.model, "cpu", out)
        spec = DeploySpec(production_args=cfg.engine_args, canary_args=cfg.engine_args)
        if cfg.engine_extra:
            out(f"      every engine with {' '.join(cfg.engine_extra)}")
    else:
        out(f"SITS demo: canaries of Triton kernel sets on this machine's GPU ({gpu_summary()}); work dir {workdir}")
        model = resolve_model(cfg.model, prof.device, out)
        spec = DeploySpec(model=model.path, device=prof.device, production_args=cfg.engine_args,
                          canary_args=cfg.engine_args)
        out(f"      every scenario runs model {model.label}; production, baseline and canary are three "
            f"`sits-engine serve --device {prof.device}` processes "
            f"{gpu_placement(len(visible_gpus()), 3 * cfg.parallel)}, each with {' '.join(cfg.engine_args)} (a promotion starts a fourth, on the canary's GPU, before the "
            "old production stops)")
    services = lane_services(cfg.service, cfg.parallel)
    if cfg.parallel > 1:
        out(f"      {cfg.parallel} lanes side by side, each its own service ({', '.join(services)}) with its own "
            f"production engine, weighted router and load at {cfg.rate:g} req/s, its scenarios in turn; they share "
            f"the store, the worker, the UI{' and Prometheus' if cfg.metrics == 'prometheus' else ''} and the "
            "machine: the engines of all lanes share "
            + ("its CPU cores" if prof.device == "cpu" else "the GPUs, placed as above"))
    deployer = LocalDeployer(LocalConfig(workdir=str(workdir / "variants"), cpu_threads=1 if prof.device == "cpu"
                                         else 2, max_replicas=None if cfg.parallel == 1 else
                                         max(default_max_replicas(), ENGINES_PER_LANE * cfg.parallel)))
    store = Store(str(store_path))
    worker = prom = server = None
    lanes: list[Lane] = []
    source = ScrapeSource()
    tracing = Tracing.from_flags()
    try:
        if cfg.metrics == "prometheus":
            prom = LocalPrometheus(workdir, deployer, services)
            source = PrometheusSource(PrometheusConfig(prom.url, lag_s=1.0))
            out(f"      Prometheus at {prom.url} scrapes every variant")
        # traces by the environment (OTEL_TRACES_EXPORTER=otlp, OTEL_EXPORTER_OTLP_ENDPOINT=...): the load
        # generator's request spans are continued by the engines through the router (docs/observability.md)
        worker = Worker(store, deployer, source, config=WorkerConfig(interval_s=cfg.interval_s), tracing=tracing)
        auth_path, token = _auth_file(workdir)
        app = create_app({"STORE": store, "SITS_USERS": Users.load(str(auth_path)), "WORKER": worker,
                          "REPLICA_LIMIT": dataclasses.asdict(deployer.replica_limit()),
                          "SECRET_KEY": secrets.token_hex(32), "KERNEL_CATALOG": catalog, "LOCAL_MODELS": True})
        server = waitress.create_server(app, host=cfg.host, port=cfg.port, threads=8, ident="sits")
        threading.Thread(target=server.run, name="sits-demo-ui", daemon=True).start()
        result.url = f"http://{cfg.host}:{server.effective_port}/"
        out(f"[1/4] control plane up: UI {result.url}  (log in with token {token})")
        out(f"      API reference {result.url}api (OpenAPI {result.url}api/v1/openapi.json; calls send "
            f"Authorization: Bearer <token>), metrics {result.url}metrics; auth file {auth_path} keeps only its SHA-256")
        lanes = [Lane(cfg, i, scenarios, out, deployer=deployer, store=store, catalog=catalog, spec=spec,
                      tracing=tracing) for i, scenarios in enumerate(cfg.lanes)]
        in_parallel(lambda lane: lane.start(model), [(lane,) for lane in lanes], daemon=True)
        worker.start()
        p = cfg.policy
        out(f"      worker every {cfg.interval_s:g} s; demo policy: steps {list(p.steps)} %, a check every "
            f"{p.check_interval_s:g} s, " + ", ".join(narrate.gate(c) for c in p.checks)
            + f" vs {p.compare_to}, rollback after {p.failure_limit} failed checks; correctness gate on")
        in_parallel(lambda lane: lane.run(result.url), [(lane,) for lane in lanes], daemon=True)
        result.rollouts = [r for lane in lanes for r in lane.rollouts]
        result.seconds = time.monotonic() - t0
        narrate.summary(result, store, [(lane.tag, lane.load) for lane in lanes], out, worker.metrics.replayed)
        if cfg.keep_running:
            out(f"UI still up at {result.url} (token above); Ctrl-C to stop")
            while True:   # naps, not one blocking wait: a Ctrl-C taken by another thread still ends it
                time.sleep(1.0)
    finally:
        in_parallel(Lane.stop, [(lane,) for lane in lanes])
        shutdown(deployer, worker=worker, source=source)   # every variant stops here
        if server is not None:
            server.close()
        if prom is not None:
            prom.stop()
        tracing.shutdown()
        store.close()
    return result


def gpu_summary() -> str:
    """The GPU's name and memory as nvidia-smi says (the control plane does not import torch)."""
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else "no nvidia-smi"
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"


def gpu_placement(gpus: int, variants: int) -> str:
    """Where the local deployer puts `variants` one-GPU engines on `gpus` GPUs (adapters/deploy/local/gpus.py)."""
    if gpus >= variants:
        return f"each on a GPU of its own ({gpus} listed)"
    if gpus <= 1:
        return f"sharing one GPU by {gpu_sharing()}"
    return f"each on a GPU of its own while one of the {gpus} is free, the others sharing them by {gpu_sharing()}"


def gpu_sharing() -> str:
    """How the engines share the GPU: CUDA MPS when its control daemon runs (profiles.mps_running), else time-slicing."""
    return "CUDA MPS (their kernels run side by side)" if mps_running() else "time-slicing (no MPS daemon)"
