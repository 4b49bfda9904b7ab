"""Field checks shared by every spec that carries them (DeploySpec, VariantSpec, the API) and the one policy
parser: each raises ValidationError naming its field. Pure."""
from __future__ import annotations

import re
from typing import Any, Mapping

from sits.control_plane.analysis.policy import Policy
from sits.control_plane.analysis.policy_error import PolicyError
from sits.control_plane.errors import ValidationError
from sits.wire.models import MAX_MODEL_PATH, PRESET_NAMES

# DNS-1035 label: the service name becomes part of Kubernetes object names (`<service>-<role>`) and of label values
_SERVICE_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


def service_name(v: Any, field: str = "service") -> str:
    if not isinstance(v, str) or not _SERVICE_RE.match(v):
        raise ValidationError(f"service {v!r} must be a DNS label: lower-case letters, digits and '-', starting "
                              "with a letter, at most 40 characters", field)
    return v


# the kernel registry's name pattern (kernels/registry.py _NAME; a test keeps the two equal): no paths, no spaces
_KERNEL_SET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def kernel_set_name(v: Any, field: str = "kernels") -> str:
    if not isinstance(v, str) or not _KERNEL_SET_RE.match(v) or ".." in v:
        raise ValidationError(f"{field}: kernel set name {str(v)[:80]!r} must be 1-64 letters, digits and ._- "
                              "(starting with a letter or digit, no '..')", field)
    return v


_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_PRESETS = ", ".join(PRESET_NAMES)


def model(v: Any, field: str = "model") -> str:
    """A preset name (sits.wire.models.PRESET_NAMES) or a well-formed checkpoint path: absolute, no '..'
    component, no control character, at most MAX_MODEL_PATH characters. URLs are refused: the engine loads a
    preset or a local directory, nothing else. Whether the directory exists is the caller's check (only the
    local deployer sees the engines' filesystem: service.rollouts)."""
    if not isinstance(v, str) or not v:
        raise ValidationError(f"{field} must be a preset ({_PRESETS}) or an absolute checkpoint directory path",
                              field)
    if v in PRESET_NAMES:
        return v
    shown = repr(v[:80]) + ("..." if len(v) > 80 else "")
    if len(v) > MAX_MODEL_PATH:
        raise ValidationError(f"{field}: a checkpoint path of {len(v)} characters; at most {MAX_MODEL_PATH}", field)
    if any(not ch.isprintable() for ch in v):
        raise ValidationError(f"{field} {shown} contains control characters", field)
    if _URL_SCHEME.match(v):
        raise ValidationError(f"{field} {shown}: URLs are not supported (the engine loads a preset, {_PRESETS}, "
                              "or a checkpoint directory on its own filesystem); download the checkpoint and give "
                              "its absolute path", field)
    if v.startswith("-"):
        raise ValidationError(f"{field} {shown} must not start with '-' (the engine would read it as a flag)", field)
    if not v.startswith("/"):
        raise ValidationError(f"{field} {shown} is neither a preset ({_PRESETS}) nor an absolute checkpoint path "
                              "(one starting with /)", field)
    if ".." in v.split("/"):
        raise ValidationError(f"{field} {shown}: a checkpoint path must not contain '..' components", field)
    return v


# where an engine runs (`sits-engine serve --device`); None: the engine's own choice (a GPU where one is visible)
DEVICES = ("cpu", "cuda")
MAX_READY_TIMEOUT_S = 86400.0


def device(v: Any, field: str = "device") -> str | None:
    if v is not None and v not in DEVICES:
        raise ValidationError(f"{field} must be one of {', '.join(DEVICES)} or null (the engine's choice), got "
                              f"{str(v)[:40]!r}", field)
    return v


def optional_seconds(v: Any, field: str, maximum: float = MAX_READY_TIMEOUT_S) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= maximum:
        raise ValidationError(f"{field} must be a number of seconds > 0 and <= {maximum:g}, or null, got "
                              f"{str(v)[:40]}", field)
    return float(v)


# a rollout asks for at most this many replicas per variant (deployers bound them further: local by the machine,
# Kubernetes by KubernetesConfig.max_replicas); `--replicas 100000` is a typo, not a plan
MAX_REPLICAS = 256
MAX_GPUS = 16
# GPUs one engine spans (`sits-engine serve --tensor-parallel-size`): one host's NVLink domain, 8 GPUs at most
MAX_TENSOR_PARALLEL = 8


def integer(v: Any, field: str, minimum: int, maximum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or (maximum is not None and v > maximum):
        bound = f">= {minimum}" if maximum is None else f">= {minimum} and <= {maximum}"
        raise ValidationError(f"{field} must be an integer {bound}, got {str(v)[:40]}", field)
    return v


def tensor_parallel_size(v: Any, field: str = "tensor_parallel_size") -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TENSOR_PARALLEL:
        raise ValidationError(f"{field} (GPUs per engine) must be an integer from 1 to {MAX_TENSOR_PARALLEL}, got "
                              f"{str(v)[:40]}", field)
    return v


def gpus_hold_tensor_parallel(gpus: int, tp: int) -> None:
    """GPUs per replica (`gpus`, 0: as many as the engine spans) must hold one engine of `tp` GPUs."""
    if 0 < gpus < tp:
        raise ValidationError(f"gpus: {gpus} per replica cannot hold an engine of tensor_parallel_size {tp} (one "
                              f"engine per replica spans {tp} GPUs); give gpus 0 (as many as the engine spans) or at "
                              f"least {tp}", "gpus")


def strings(v: Any, field: str) -> tuple[str, ...]:
    if isinstance(v, (str, bytes)) or not all(isinstance(a, str) for a in v):
        raise ValidationError(f"{field} must be a list of strings", field)
    return tuple(v)


def string_map(v: Any, field: str) -> dict[str, str]:
    if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise ValidationError(f"{field} must map strings to strings", field)
    return dict(v)


def optional_string(v: Any, field: str) -> str | None:
    if v is not None and (not isinstance(v, str) or not v):
        raise ValidationError(f"{field} must be a non-empty string or null", field)
    return v


def policy(v: Any, field: str = "policy", defaults: Mapping | None = None) -> Policy:
    """The one way a policy from outside (an API body, a judge request, the service layer) becomes a Policy: its
    fields over `defaults`; ValidationError whose field is the exact path (`policy.checks[1].max_rel_delta`) and
    whose message gives the value and what is allowed, in the units the UI uses."""
    if isinstance(v, Policy):
        return v
    if v is not None and not isinstance(v, Mapping):
        raise ValidationError(f"{field} must be an object of Policy fields", field)
    try:
        return Policy.from_dict({**(defaults or {}), **(v or {})})
    except PolicyError as e:
        where = f"{field}.{e.field}" if e.field else field
        raise ValidationError(f"{where} {e.problem}" if e.field else f"{field}: {e.problem}", where) from None
