"""The LocalDeployer's settings and the machine's bounds: which environment an engine replica gets, how many replicas
this machine holds, and LocalConfig (deployer.py uses them)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

from sits.control_plane.adapters.deploy import DeployError
from sits.control_plane.router.config import MIN_PIN_TOKEN_CHARS

# engine replicas get an explicit environment: these of ours (exact names, then prefixes), LocalConfig.env and the
# spec's env. Nothing else: the worker's own secrets (SITS_PROMETHEUS_TOKEN, ..._PASSWORD, API tokens) stay here.
# SITS_KERNEL_PLUGINS with PYTHONPATH: the kernel-set plugins this environment lists are the ones its engines load.
ENV_PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "HF_HOME",
              "XDG_CACHE_HOME", "SITS_BUILD", "SITS_OTEL_EXPORTER", "SITS_KERNEL_PLUGINS", "OTEL_TRACES_EXPORTER",
              "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
ENV_PASSED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TRITON_", "TORCHINDUCTOR_", "OMP_", "MKL_")
ENGINE_MEMORY_BYTES = 1 << 30   # what one local engine replica is budgeted (the tiny model needs ~0.4 GB RSS)


def engine_environment(parent: Mapping[str, str], *extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in parent.items() if k in ENV_PASSED or k.startswith(ENV_PASSED_PREFIXES)}
    if env.get("PYTHONPATH"):   # engines run in their own work dir: "." and other relative entries mean ours
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else os.getcwd()
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    for e in extra:
        env.update(e)
    return env


def default_max_replicas(cpus: int | None = None, memory_bytes: int | None = None) -> int:
    """How many engine replicas this machine holds at once: 2 per core, and one per ENGINE_MEMORY_BYTES of the
    memory available now (never below 1)."""
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    memory_bytes = memory_bytes if memory_bytes is not None else _available_memory()
    return max(1, min(2 * cpus, memory_bytes // ENGINE_MEMORY_BYTES))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(slots=True)
class LocalConfig:
    host: str = "127.0.0.1"
    workdir: str | None = None                  # replica logs; a temp dir when None
    engine_command: tuple[str, ...] = (sys.executable, "-m", "sits.engine.cli")
    ready_timeout_s: float = 180.0
    stop_timeout_s: float = 10.0
    drain_timeout_s: float = 30.0
    probe_timeout_s: float = 2.0                # per /readyz probe (status() and start-up)
    cpu_threads: int | None = None              # OMP/MKL/torch threads per replica (None: library default)
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every replica
    # X-SITS-Pin-Token that lets a caller pin a variant (load generators, correctness probes); None: a random one per
    # deployer, read it from LocalDeployer.pin_token. pin_sources: networks that may pin without it.
    pin_token: str | None = field(default=None, repr=False)
    pin_sources: tuple[str, ...] = ()
    max_replicas: int | None = None             # engines of all services at once; None: default_max_replicas()
    start_batch: int | None = None              # replicas started together, then waited for; None: one per core
    router_state: str | None = None             # file remembering each service's router port (router/ports.py)
    # the GPUs engines are placed on (CUDA_VISIBLE_DEVICES entries, gpus.py); None: gpus.visible_gpus() -- this
    # process's CUDA_VISIBLE_DEVICES, else nvidia-smi's list -- read at the first deploy that may use a GPU
    gpu_devices: tuple[str, ...] | None = None
    # engines placed on no GPU fork their engine cores from one process that has imported torch (zygote.py)
    engine_zygote: bool = True

    def __post_init__(self) -> None:
        if not self.engine_command:
            raise DeployError("engine_command must not be empty")
        self.engine_command = tuple(self.engine_command)
        if self.ready_timeout_s <= 0 or self.stop_timeout_s <= 0 or self.drain_timeout_s < 0 \
                or self.probe_timeout_s <= 0:
            raise DeployError("timeouts must be positive")
        if self.pin_token is not None and len(self.pin_token) < MIN_PIN_TOKEN_CHARS:   # checked once, at start
            raise DeployError(f"the pin token ($SITS_PIN_TOKEN or --pin-token-file) must be at least "
                              f"{MIN_PIN_TOKEN_CHARS} characters, got {len(self.pin_token)}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise DeployError(f"cpu_threads must be >= 1, got {self.cpu_threads}")
        if self.gpu_devices is not None:
            self.gpu_devices = tuple(self.gpu_devices)
            if not all(isinstance(g, str) and g and g.isprintable() and "," not in g and not g.startswith("-")
                       for g in self.gpu_devices) or len(set(self.gpu_devices)) != len(self.gpu_devices):
                raise DeployError(f"gpu_devices must be distinct GPU indices or UUIDs, got {self.gpu_devices!r}")
        for name in ("max_replicas", "start_batch"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise DeployError(f"{name} must be an integer >= 1, got {v!r}")
