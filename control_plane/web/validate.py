"""The body of `POST /api/v1/rollouts`, checked before anything is written: every problem is a ValidationError whose
`field` names the offending key (`policy.checks[1].max_rel_delta`, `replicas`, ...)."""
from __future__ import annotations

from typing import Any, Mapping

from sits.control_plane import validation
from sits.control_plane.analysis import Policy
from sits.control_plane.errors import ValidationError

FIELDS = {"service": str, "kernels": str, "production_kernels": str, "model": str, "replicas": int,
          "policy": dict, "args": list, "production_args": list, "gpus": int, "device": str,
          "ready_timeout_s": float, "tensor_parallel_size": int, "retry_of": str}
REQUIRED = ("service", "kernels")


def create_body(body: Any) -> dict:
    """Types and presence of the top-level fields; the values are checked by Policy, DeploySpec, start_rollout."""
    if not isinstance(body, Mapping):
        raise ValidationError("the body must be a JSON object", field=None)
    for key in body:
        if key not in FIELDS:
            raise ValidationError(f"unknown field {key!r}; fields are {', '.join(FIELDS)}", field=key)
    for key in REQUIRED:
        if body.get(key) in (None, ""):
            raise ValidationError(f"{key} is required", field=key)
    for key, typ in FIELDS.items():
        v = body.get(key)
        if v is None:
            continue
        if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValidationError(f"{key} must be an integer", field=key)
        if typ is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValidationError(f"{key} must be a number", field=key)
        if typ not in (int, float) and not isinstance(v, typ):
            name = {str: "a string", dict: "an object", list: "a list of strings"}[typ]
            raise ValidationError(f"{key} must be {name}", field=key)
        if typ is list and not all(isinstance(a, str) for a in v):
            raise ValidationError(f"{key} must be a list of strings", field=key)
    return dict(body)


# what a retry takes from the rollout it retries when the body does not say (the spec's fields, by their body names)
# and the spec fields no body names (images, environment, injected faults), taken as they are
RETRY_KEEPS = ("env", "production_image", "canary_image", "canary_faults")
RETRY_SPEC = {"model": "model", "args": "canary_args", "production_args": "production_args", "replicas": "replicas",
              "gpus": "gpus", "device": "device", "ready_timeout_s": "ready_timeout_s",
              "tensor_parallel_size": "tensor_parallel_size"}


def retry_body(body: Mapping, old, old_spec: Mapping) -> dict:
    """A retry's body: the old rollout's service, canary kernel set, spec and policy under what the body gives (a
    policy key given replaces the old one's; `correctness` merges one level down). Production stays unsaid: it is
    what the service runs now, as for any new rollout."""
    out = {"service": old.service, "kernels": old.canary_kernels,
           **{k: old_spec[f] for k, f in RETRY_SPEC.items() if old_spec.get(f) not in (None, [], ())}}
    out.update({k: v for k, v in body.items() if v is not None})
    given = body.get("policy")
    if given is None or isinstance(given, Mapping):
        p = {**old.policy.to_dict(), **(given or {})}
        if isinstance((given or {}).get("correctness"), Mapping):
            p["correctness"] = {**old.policy.to_dict().get("correctness", {}), **given["correctness"]}
        out["policy"] = p
    return out


def policy(d: Mapping | None, defaults: Mapping | None = None) -> Policy:
    """The body's policy fields over the service's defaults (`serve --policy-defaults`; Policy() without)."""
    return validation.policy(d, "policy", defaults)
