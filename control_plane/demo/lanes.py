"""`sits-control demo --parallel K`: the scenarios dealt round-robin to K lanes, each its own service -- a production
engine behind its own weighted router, its own load generator at the demo's rate -- running its scenarios in turn while
the other lanes run theirs. The store, the worker, the UI and Prometheus are shared (runner.py). More decisions per
GPU-minute for an A/A campaign, and harsher sharing: the engines of every lane contend for the one GPU (or cores)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Sequence

import httpx

from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.deploy.engine_args import flag_changes, with_flags
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.demo import narrate
from sits.control_plane.demo.gpu_memory import GpuMemorySampler
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.demo.model import DemoModel
from sits.control_plane.demo.profiles import Scenario
from sits.control_plane.errors import ValidationError
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.wire.tracing import Tracing

if TYPE_CHECKING:
    from sits.control_plane.demo.runner import DemoConfig

# engines one lane runs at once: production, baseline, canary, and a promotion's new production before the old stops
ENGINES_PER_LANE = 4
LOAD_SEED = 2026   # lane i's load generator draws its schedule from LOAD_SEED + i: the lanes' arrivals differ


def deal(scenarios: Sequence[str], lanes: int) -> list[tuple[str, ...]]:
    """Scenario i to lane i mod `lanes`, each lane keeping their order; ValueError unless 1 <= lanes <= scenarios."""
    if not 1 <= lanes <= len(scenarios):
        raise ValueError(f"parallel lanes (--parallel) must be from 1 to the number of scenarios "
                         f"({len(scenarios)}), got {lanes}")
    return [tuple(scenarios[i::lanes]) for i in range(lanes)]


def lane_services(service: str, lanes: int) -> list[str]:
    """One lane: `service` itself (the demo as it always was); more: `service-1` ... `service-K`."""
    return [service] if lanes == 1 else [f"{service}-{i + 1}" for i in range(lanes)]


def tagged(out: Callable[[str], None], tag: str) -> Callable[[str], None]:
    """`out` with every non-empty line starting `[tag] ` (interleaved lanes stay readable); `out` itself for ''."""
    if not tag:
        return out

    def lane_out(line: str = "") -> None:
        out(f"[{tag}] {line}" if line else "")
    return lane_out


class Lane:
    """One service of the demo: `start()` deploys its production engine behind its router and starts its load;
    `run()` runs its scenarios in turn, each a rollout followed to its end (`rollouts`: id, scenario, final phase)."""

    def __init__(self, cfg: DemoConfig, index: int, scenarios: tuple[str, ...], out: Callable[[str], None], *,
                 deployer: LocalDeployer, store: Store, catalog: KernelCatalog, spec: DeploySpec,
                 tracing: Tracing) -> None:
        self.cfg, self.index, self.scenarios = cfg, index, scenarios
        self.service = lane_services(cfg.service, cfg.parallel)[index]
        self.tag = self.service if cfg.parallel > 1 else ""
        self.out = tagged(out, self.tag)
        self.deployer, self.store, self.catalog, self.spec, self.tracing = deployer, store, catalog, spec, tracing
        self.load: LoadGenerator | None = None
        self.gpu_memory: GpuMemorySampler | None = None
        self.rollouts: list[tuple[str, Scenario, str]] = []
        # what production runs: the configured set and every engine's flags, then each promoted canary's (a later
        # scenario is compared with it, as a later rollout through the API would be)
        self.production_kernels: str = cfg.production_kernels
        self.production_args: tuple[str, ...] = spec.production_args

    def start(self, model: DemoModel) -> None:
        cfg, prof, out = self.cfg, self.cfg.profile, self.out
        ks = self.catalog.require(cfg.production_kernels, "production_kernels")
        flags = f" --device {prof.device} {' '.join(cfg.engine_args)}" if prof.device != "cpu" else ""
        out(f"[2/4] production: `sits-engine serve --model {'tiny' if model.path == 'tiny' else model.path}"
            f"{flags} --kernels {ks.name}` ({ks.version}) behind the weighted router ...")
        self.deployer.deploy(self.spec.variant(self.service, "production", cfg.production_kernels,
                                               ready_timeout_s=cfg.policy.ready_timeout_s if prof.device != "cpu"
                                               else None))
        router = self.deployer.router_url(self.service)
        for note in sorted({e.gpu_note for e in self.deployer.replicas(self.service) if e.role == "production"} - {""}):
            out(f"      production's engine: {note}")
        served = "tiny" if prof.device == "cpu" else _served_model(router)
        r = httpx.post(router + "/v1/completions", json={"model": served, "prompt": "The canary sang",
                                                          "max_tokens": 12, "temperature": 0}, timeout=60,
                       headers={"X-SITS-Pin-Token": self.deployer.pin_token}, trust_env=False)
        r.raise_for_status()
        weights = "random tiny weights" if model.path == "tiny" else model.label.split(" (")[0]
        out(f"      router {router}: POST /v1/completions -> {r.status_code} from {r.headers.get('x-sits-variant')}"
            f" ({weights}): {r.json()['choices'][0]['text']!r}")
        m = prof.mix
        out(f"[3/4] load: Poisson {cfg.rate:g} req/s, prompts ~{m.prompt_tokens.median:g} tokens and answers "
            f"~{m.output_tokens.median:g} (lognormal), {m.stream_fraction:.0%} streamed, every token verified")
        self.load = LoadGenerator(router, cfg.rate, cfg.threads, mix=m, seed=LOAD_SEED + self.index,
                                  tracing=self.tracing, model=served, pin_token=self.deployer.pin_token).start()
        if prof.device != "cpu":
            self.gpu_memory = GpuMemorySampler(self.deployer, self.service).start()

    def run(self, ui_url: str) -> None:
        cfg, out, load = self.cfg, self.out, self.load
        assert load is not None, "start() first"
        for i, name in enumerate(self.scenarios):
            sc = cfg.scenario(name)
            production = self.production_kernels
            out("")
            out(f"[4/4] canary {i + 1}/{len(self.scenarios)} ({name}): {sc.canary(production)} - {sc.what}")
            spec = dataclasses.replace(self.spec, production_args=self.production_args,
                                       canary_args=with_flags(self.production_args, sc.canary_args))
            if (production, self.production_args) != (cfg.production_kernels, self.spec.production_args):
                changed = flag_changes(self.spec.production_args, self.production_args)
                out(f"      production now runs {production}" + (f" with {', '.join(changed)}" if changed else "")
                    + " (promoted earlier in this lane): the canary is compared with that")
            try:
                ro = start_rollout(self.store, self.service, sc.canary_kernels(production), production, cfg.policy,
                                   spec, actor="demo", kernel_sets=self.catalog, local_models=True)
            except ValidationError as e:   # e.g. a set that cannot read the FP8 pages a promoted release left
                out(f"      => NOT RUN: the product refuses this rollout: {e}")
                continue
            out(f"      rollout {ro.id}: {ui_url}rollouts/{ro.id}")
            before = load.counts()
            phase = narrate.follow(self.store, ro.id, load, cfg.policy, cfg.rollout_timeout_s, out)
            self.rollouts.append((ro.id, sc, phase))
            if phase == Phase.SUCCEEDED.value:   # the deployer made the canary production
                self.production_kernels, self.production_args = ro.canary_kernels, spec.canary_args
            if cfg.profile.device != "cpu":
                narrate.scenario_load(load, before, out, self.gpu_memory.take() if self.gpu_memory else None)
            verdict = "as expected" if phase == sc.expected.value else "NOT the expected " + sc.expected.value
            out(f"      => {phase.replace('_', ' ').upper()} ({verdict})")

    def stop(self) -> None:
        if self.gpu_memory is not None:
            self.gpu_memory.stop()
        if self.load is not None:
            self.load.stop(20)


def _served_model(router: str) -> str:
    r = httpx.get(router + "/v1/models", timeout=30, trust_env=False)
    r.raise_for_status()
    return r.json()["data"][0]["id"]
