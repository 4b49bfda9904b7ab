"""The `Deployer` protocol: put production / baseline / canary variants of the engine into the world and split traffic.

Two implementations: `control_plane.adapters.local.LocalDeployer` (subprocesses behind a weighted router, the embedded
default) and `control_plane.adapters.kubernetes.KubernetesDeployer` (Deployments + Services, optionally a Gateway API
HTTPRoute). Every call is idempotent: repeating it after a crash converges to the same state.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

ROLES = ("production", "baseline", "canary")

# DNS-1035 label: the service name becomes part of Kubernetes object names (`<service>-<role>`) and of label values
_SERVICE_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


class DeployError(Exception):
    """A deployer operation failed; the message says what and why."""


class DeployNotFoundError(DeployError):
    """The service or variant does not exist (or its namespace/cluster object is missing)."""


class DeployConflictError(DeployError):
    """A concurrent writer kept changing the same object; retries were exhausted."""


class DeployCancelled(DeployError):
    """deploy() stopped because cancel()/close() was called (SIGTERM/SIGINT): what it started is stopped again, and
    the caller leaves the action pending for the next worker instead of counting a failure."""


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

    def __post_init__(self) -> None:
        if not isinstance(self.service, str) or not _SERVICE_RE.match(self.service):
            raise DeployError(
                f"service {self.service!r} must be a DNS label: lower-case letters, digits and '-', "
                "starting with a letter, at most 40 characters")
        if self.role not in ROLES:
            raise DeployError(f"role {self.role!r} must be one of {', '.join(ROLES)}")
        if not isinstance(self.kernels, str) or not self.kernels:
            raise DeployError("kernels must name a kernel set, e.g. 'torch' or 'triton-v1'")
        if not isinstance(self.model, str) or not self.model:
            raise DeployError("model must be 'tiny', 'llama3-8b' or a checkpoint path")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise DeployError(f"replicas must be an integer >= 0, got {self.replicas!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise DeployError(f"gpus must be an integer >= 0, got {self.gpus!r}")
        if isinstance(self.args, str) or not all(isinstance(a, str) for a in self.args):
            raise DeployError("args must be a sequence of strings")
        object.__setattr__(self, "args", tuple(self.args))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(self.env).items()):
            raise DeployError("env must map strings to strings")
        object.__setattr__(self, "env", dict(self.env))

    def engine_args(self, *, port: int, host: str | None = None) -> list[str]:
        """`sits-engine serve ...` arguments (without the program) for this variant; env label = role."""
        argv = ["serve", "--model", self.model, "--kernels", self.kernels,
                "--env", self.role, "--service", self.service, "--port", str(port)]
        if host is not None:
            argv += ["--host", host]
        return argv + list(self.args)

    def to_dict(self) -> dict:
        return {"service": self.service, "role": self.role, "kernels": self.kernels, "model": self.model,
                "replicas": self.replicas, "image": self.image, "args": list(self.args), "env": dict(self.env),
                "gpus": self.gpus}

    @classmethod
    def from_dict(cls, d: Mapping) -> "VariantSpec":
        return cls(service=d["service"], role=d["role"], kernels=d["kernels"], model=d.get("model", "tiny"),
                   replicas=d.get("replicas", 1), image=d.get("image"), args=tuple(d.get("args", ())),
                   env=dict(d.get("env", {})), gpus=d.get("gpus", 0))


@dataclass(slots=True, frozen=True)
class VariantStatus:
    role: str
    ready: bool
    replicas: int
    ready_replicas: int
    endpoint: str | None
    message: str = ""
    endpoints: tuple[str, ...] = ()   # every replica's URL where they are reachable one by one (local deployer)


@runtime_checkable
class Deployer(Protocol):
    def deploy(self, spec: VariantSpec) -> None: ...

    def set_weights(self, service: str, weights: Mapping[str, int]) -> None: ...

    def status(self, service: str) -> dict[str, VariantStatus]: ...

    def promote(self, service: str) -> None: ...

    def rollback(self, service: str) -> None: ...

    def delete(self, service: str, role: str | None = None) -> None: ...

    # deploys in progress stop waiting and raise DeployCancelled (shutdown: before the worker's passes are joined)
    def cancel(self) -> None: ...


def normalize_weights(weights: Mapping[str, int | float]) -> dict[str, int]:
    """Validate a traffic split {role: percent}: known roles, integers 0..100 summing to 100; missing roles get 0."""
    if not isinstance(weights, Mapping) or not weights:
        raise DeployError("weights must be a non-empty mapping {role: percent}")
    out = {r: 0 for r in ROLES}
    for role, w in weights.items():
        if role not in ROLES:
            raise DeployError(f"unknown role {role!r} in weights; roles are {', '.join(ROLES)}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w != int(w) or not 0 <= w <= 100:
            raise DeployError(f"weight of {role} must be an integer percent 0..100, got {w!r}")
        out[role] = int(w)
    if sum(out.values()) != 100:
        raise DeployError(f"weights must sum to 100, got {sum(out.values())} ({out})")
    return out


def check_role(role: str | None) -> None:
    if role is not None and role not in ROLES:
        raise DeployError(f"role {role!r} must be one of {', '.join(ROLES)}")
