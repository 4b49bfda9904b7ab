"""The `Deployer` protocol: put production / baseline / canary variants of the engine into the world and split traffic.

Two implementations: `local.deployer.LocalDeployer` (subprocesses behind a weighted router, the embedded default) and
`kubernetes.deployer.KubernetesDeployer` (Deployments + Services, optionally a Gateway API HTTPRoute). Every call is
idempotent: repeating it after a crash converges to the same state. What a rollout asks of them: `spec.DeploySpec`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, runtime_checkable

from sits.control_plane import validation as v
from sits.control_plane.errors import ValidationError
from sits.control_plane.rollout import ROLES, traffic_split


class DeployError(Exception):
    """A deployer operation failed; the message says what and why. `status`: the HTTP status the Kubernetes API
    answered with, where it answered (None otherwise)."""

    status: int | None = None


class DeployNotFoundError(DeployError):
    """The service or variant does not exist (or its namespace/cluster object is missing)."""


class DeployConflictError(DeployError):
    """A concurrent writer kept changing the same object; retries were exhausted."""


class NotReadyError(DeployError):
    """A variant's replica never answered /readyz: still starting when its readiness deadline passed
    (`exit_code` None), or exited first. `last_line` is the last line its engine logged. Not retried: the deadline
    was the whole budget the rollout gave it."""

    def __init__(self, message: str, *, waited_s: float, last_line: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.waited_s, self.last_line, self.exit_code = waited_s, last_line, exit_code


class DeployCancelled(DeployError):
    """deploy() stopped because cancel()/close() was called (SIGTERM/SIGINT): what it started is stopped again, and
    the caller leaves the action pending for the next worker instead of counting a failure."""


class DeployInterrupted(DeployError):
    """deploy() stopped waiting because its `interrupted()` callback said so (the worker: an abort is queued for the
    rollout): what it started is stopped again; the action is superseded, not failed, and the abort applies."""


class InvalidVariantError(DeployError, ValidationError):
    """A VariantSpec field is invalid (the deployer refuses it before touching anything)."""


@dataclass(slots=True, frozen=True)
class VariantSpec:
    service: str
    role: str
    kernels: str
    model: str = "tiny"
    replicas: int = 1
    image: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 0
    device: str | None = None                # `--device` of every replica; None: the engine's choice
    ready_timeout_s: float | None = None     # how long a new replica may take to get ready; None: the deployer's
    tensor_parallel_size: int = 1            # GPUs one engine spans (`--tensor-parallel-size`, given when > 1)

    def __post_init__(self) -> None:
        try:
            v.service_name(self.service)
            if self.role not in ROLES:
                raise ValidationError(f"role {self.role!r} must be one of {', '.join(ROLES)}", "role")
            v.kernel_set_name(self.kernels)
            v.model(self.model)
            v.integer(self.replicas, "replicas", 0, v.MAX_REPLICAS)
            v.integer(self.gpus, "gpus", 0, v.MAX_GPUS)
            object.__setattr__(self, "args", v.strings(self.args, "args"))
            object.__setattr__(self, "env", v.string_map(self.env, "env"))
            v.device(self.device)
            object.__setattr__(self, "ready_timeout_s", v.optional_seconds(self.ready_timeout_s, "ready_timeout_s"))
            v.tensor_parallel_size(self.tensor_parallel_size)
            v.gpus_hold_tensor_parallel(self.gpus, self.tensor_parallel_size)
        except ValidationError as e:
            raise InvalidVariantError(str(e), e.field) from None

    def engine_args(self, *, port: int, host: str | None = None) -> list[str]:
        """`sits-engine serve ...` arguments (without the program) for this variant; env label = role. The
        deployer's flags and the device field come last, so they win over any args list (a `--device` in args too).
        `--tensor-parallel-size` only when it is more than 1: a one-GPU engine's argv is what it always was."""
        argv = ["serve", *self.args, *(("--device", self.device) if self.device else ()),
                "--model", self.model, "--kernels", self.kernels,
                *(("--tensor-parallel-size", str(self.tensor_parallel_size)) if self.tensor_parallel_size > 1 else ()),
                "--env", self.role, "--service", self.service, "--port", str(port)]
        return argv + (["--host", host] if host is not None else [])

    def engine_device(self) -> str | None:
        """The `--device` the engine gets: the field, else the last one in args (argparse keeps the last), else None
        (the engine's choice: a GPU where one is visible)."""
        if self.device:
            return self.device
        found = None
        for i, a in enumerate(self.args):
            if a == "--device" and i + 1 < len(self.args):
                found = self.args[i + 1]
            elif a.startswith("--device="):
                found = a.partition("=")[2]
        return None if found in (None, "auto") else found

    @property
    def gpus_per_engine(self) -> int:
        """GPUs one replica gets where it runs on GPUs: `gpus` when given, else tensor_parallel_size (>= 1)."""
        return max(self.gpus, self.tensor_parallel_size)

    def gpu_request(self) -> int:
        """GPUs a replica asks the cluster for (Kubernetes' nvidia.com/gpu limit): none on the CPU (`--device cpu`);
        else gpus_per_engine when it is sure to run on CUDA -- `gpus` given, `--device cuda[:N]`, or an engine
        spanning more than one GPU -- and none when the device is left to the engine with one GPU asked of nobody
        (what every such pod always got)."""
        device = self.engine_device()
        if device == "cpu":
            return 0
        on_cuda = self.gpus > 0 or self.tensor_parallel_size > 1 or (device or "").startswith("cuda")
        return self.gpus_per_engine if on_cuda else 0

    def to_dict(self) -> dict:
        return {"service": self.service, "role": self.role, "kernels": self.kernels, "model": self.model,
                "replicas": self.replicas, "image": self.image, "args": list(self.args), "env": dict(self.env),
                "gpus": self.gpus, "device": self.device, "ready_timeout_s": self.ready_timeout_s,
                "tensor_parallel_size": self.tensor_parallel_size}

    @classmethod
    def from_dict(cls, d: Mapping) -> "VariantSpec":
        return cls(service=d["service"], role=d["role"], kernels=d["kernels"], model=d.get("model", "tiny"),
                   replicas=d.get("replicas", 1), image=d.get("image"), args=tuple(d.get("args", ())),
                   env=dict(d.get("env", {})), gpus=d.get("gpus", 0), device=d.get("device"),
                   ready_timeout_s=d.get("ready_timeout_s"), tensor_parallel_size=d.get("tensor_parallel_size", 1))


@dataclass(slots=True, frozen=True)
class VariantStatus:
    role: str
    ready: bool
    replicas: int
    ready_replicas: int
    endpoint: str | None
    message: str = ""
    endpoints: tuple[str, ...] = ()   # every replica's URL where they are reachable one by one (local deployer)
    crashing: bool = False            # a replica exited (local) or crash-loops (Kubernetes), as the deployer sees it


# ReplicaStatus.gpu_placement: GPUs no other variant is given, or every GPU, seen by every engine that shares them
GPU_OWN, GPU_SHARED = "own", "shared"


@dataclass(slots=True, frozen=True)
class ReplicaStatus:
    """One engine of a variant as the deployer sees it now: a local process or a Kubernetes pod."""
    role: str
    name: str                  # local: "canary-0"; Kubernetes: the pod's name
    ready: bool                # local: answers /readyz; Kubernetes: the pod's Ready condition
    restarts: int              # local: 0 (an exited engine stays exited); Kubernetes: the engine's restartCount
    state: str                 # "running", "exited 2", "CrashLoopBackOff", "pending", ...: the runtime's word
    last_log_line: str = ""    # what the engine logged last: one printable line, redacted, at most 200 characters
    log_error: str = ""        # why the log could not be read (e.g. "403: grant get on pods/log"); "" when it was
    address: str | None = None  # local: its URL; Kubernetes: the pod IP
    # where it runs on GPUs: "own" (GPUs no other engine runs on), "shared" (it sees every GPU, as the others do, or
    # holds GPUs that engines placed "shared" run on too),
    # "" (none: the CPU, or not known); `gpus` the ones it sees (local: its CUDA_VISIBLE_DEVICES), `gpu_note` in words
    gpu_placement: str = ""
    gpus: tuple[str, ...] = ()
    gpu_note: str = ""

    def to_dict(self) -> dict:
        return {k: list(x) if isinstance(x := getattr(self, k), tuple) else x for k in self.__slots__}


@runtime_checkable
class Deployer(Protocol):
    # `interrupted`: asked every second or so while the deploy waits for its engines; True makes it stop them and
    # raise DeployInterrupted (a deployer that never waits may ignore it)
    def deploy(self, spec: VariantSpec, interrupted: Callable[[], bool] | None = None) -> None: ...

    def set_weights(self, service: str, weights: Mapping[str, int]) -> None: ...

    def status(self, service: str) -> dict[str, VariantStatus]: ...

    # every engine of every variant (processes or pods) with readiness, restarts and its last log line, by role
    def replicas(self, service: str) -> list[ReplicaStatus]: ...

    def promote(self, service: str) -> None: ...

    def rollback(self, service: str) -> None: ...

    def delete(self, service: str, role: str | None = None) -> None: ...

    # deploys in progress stop waiting and raise DeployCancelled (shutdown: before the worker's passes are joined)
    def cancel(self) -> None: ...

    # where the service's traffic enters, if this deployer knows (local: its router; Kubernetes: the Service)
    def router_url(self, service: str) -> str | None: ...

    # how many replicas per variant a rollout may ask for here, from the deployer's settings (no I/O): what the UI's
    # form offers
    def replica_limit(self) -> "ReplicaLimit": ...

    # release what the deployer holds (local: every variant stops; Kubernetes: its API client, the cluster stays)
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplicaLimit:
    per_variant: int
    why: str


def normalize_weights(weights: Mapping[str, int | float]) -> dict[str, int]:
    """Validate a traffic split {role: percent} (`rollout.traffic_split`): known roles, integers 0..100 summing to
    100; missing roles get 0. DeployError when it is not one."""
    try:
        return traffic_split(weights)
    except ValueError as e:
        raise DeployError(str(e)) from None


def check_role(role: str | None) -> None:
    if role is not None and role not in ROLES:
        raise DeployError(f"role {role!r} must be one of {', '.join(ROLES)}")
