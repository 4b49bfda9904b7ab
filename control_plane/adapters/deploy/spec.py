"""`DeploySpec`: how a rollout's variants run besides their kernel sets (model, replicas, args, env, images, GPUs,
GPUs per engine).
The baseline is a fresh copy of production. Validated once, here and in `VariantSpec`, by the shared field checks of
control_plane/validation.py; bad input raises ValidationError naming the field. Engine flags and environment pass
the allow-list of engine_args.py (the deployer's own flags, tracing and fault injection are refused);
`canary_faults` (fault-injection flags for the canary) is for tests and benchmarks: no API or CLI field sets it."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from sits.control_plane import validation as v
from sits.control_plane.adapters.deploy import engine_args
from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.errors import ValidationError

log = logging.getLogger(__name__)
_WARNED: set[str] = set()


@dataclass(slots=True, frozen=True)
class DeploySpec:
    model: str = "tiny"
    replicas: int = 1
    production_args: tuple[str, ...] = ()
    canary_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    production_image: str | None = None      # Kubernetes: None = the deployer's default image
    canary_image: str | None = None
    gpus: int = 0
    canary_faults: tuple[str, ...] = ()
    device: str | None = None               # `sits-engine serve --device` of every variant; None: the engine's choice
    ready_timeout_s: float | None = None    # readiness deadline of each deploy; None: the policy's ready_timeout_s
    tensor_parallel_size: int = 1           # GPUs each engine spans (`sits-engine serve --tensor-parallel-size`)

    def __post_init__(self) -> None:
        v.model(self.model)
        v.integer(self.replicas, "replicas", 1, v.MAX_REPLICAS)
        object.__setattr__(self, "production_args", engine_args.check_args(self.production_args, "production_args"))
        object.__setattr__(self, "canary_args", engine_args.check_args(self.canary_args, "args"))
        object.__setattr__(self, "canary_faults", engine_args.check_args(self.canary_faults, "canary_faults",
                                                                         engine_args.FAULT_FLAGS))
        object.__setattr__(self, "env", engine_args.check_env(v.string_map(self.env, "env")))
        v.optional_string(self.production_image, "production_image")
        v.optional_string(self.canary_image, "image")
        v.integer(self.gpus, "gpus", 0, v.MAX_GPUS)
        v.device(self.device)
        object.__setattr__(self, "ready_timeout_s", v.optional_seconds(self.ready_timeout_s, "ready_timeout_s"))
        v.tensor_parallel_size(self.tensor_parallel_size)
        v.gpus_hold_tensor_parallel(self.gpus, self.tensor_parallel_size)

    def changed_flags(self) -> list[str]:
        """The engine flags the canary changes from production's (engine_args.flag_changes): what a release of flags
        on production's own kernel set releases."""
        return engine_args.flag_changes(self.production_args, self.canary_args)

    def variant(self, service: str, role: str, kernels: str, *, ready_timeout_s: float | None = None) -> VariantSpec:
        """The variant of `role`; `ready_timeout_s` when the spec sets none (the worker passes the policy's)."""
        canary = role == "canary"
        return VariantSpec(service=service, role=role, kernels=kernels, model=self.model, replicas=self.replicas,
                           image=self.canary_image if canary else self.production_image,
                           args=self.canary_args + self.canary_faults if canary else self.production_args,
                           env=self.env, gpus=self.gpus, device=self.device,
                           ready_timeout_s=self.ready_timeout_s or ready_timeout_s,
                           tensor_parallel_size=self.tensor_parallel_size)

    def to_dict(self) -> dict:
        return {"model": self.model, "replicas": self.replicas, "production_args": list(self.production_args),
                "canary_args": list(self.canary_args), "env": dict(self.env),
                "production_image": self.production_image, "canary_image": self.canary_image, "gpus": self.gpus,
                "canary_faults": list(self.canary_faults), "device": self.device,
                "ready_timeout_s": self.ready_timeout_s, "tensor_parallel_size": self.tensor_parallel_size}

    @classmethod
    def from_stored(cls, d: Mapping[str, Any]) -> "DeploySpec":
        """A spec as the store holds it, including one stored before engine flags were allow-listed: fault flags
        of the canary move to canary_faults (the behaviour it was started with); any other flag the allow-list
        refuses now is dropped, with a warning (it never reaches an engine); a model the checks refuse now is kept as
        stored (shown as it is; the engine refuses to load it), with a warning."""
        d = dict(d)
        faults = list(d.get("canary_faults") or ())
        for key, field_name in (("canary_args", "args"), ("production_args", "production_args")):
            kept, dropped = engine_args.split_stored(d.get(key) or (), faults if key == "canary_args" else None)
            if dropped and (why := f"{field_name} {' '.join(dropped)[:300]}") not in _WARNED:
                _WARNED.add(why)   # once per process, not once per pass
                log.warning("stored spec: %s dropped (not allowed since issue 26)", why)
            d[key] = kept
        d["canary_faults"] = faults
        try:
            v.model(d.get("model", "tiny"))
        except ValidationError as e:   # stored before models were checked (issue 39): kept as it is, to be shown
            if (why := f"model {str(d['model'])[:80]!r}") not in _WARNED:
                _WARNED.add(why)
                log.warning("stored spec: %s would be refused now (%s); kept as stored", why, e)
            spec = cls.from_dict({**d, "model": "tiny"})
            object.__setattr__(spec, "model", d["model"])
            return spec
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DeploySpec":
        if not isinstance(d, Mapping):
            raise ValidationError("spec must be an object", "spec")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValidationError(f"unknown spec field(s) {unknown}", unknown[0])
        return cls(**d)
