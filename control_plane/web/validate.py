"""The body of `POST /api/v1/rollouts`, checked before anything is written: every problem is a ValidationError whose
`field` names the offending key (`policy.checks[1].max_rel_delta`, `replicas`, ...)."""
from __future__ import annotations

from typing import Any, Mapping

from sits.control_plane import validation
from sits.control_plane.analysis import Policy
from sits.control_plane.errors import ValidationError

FIELDS = {"service": str, "kernels": str, "production_kernels": str, "model": str, "replicas": int,
          "policy": dict, "args": list, "production_args": list, "gpus": int, "device": str,
          "ready_timeout_s": float}
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


def policy(d: Mapping | None, defaults: Mapping | None = None) -> Policy:
    """The body's policy fields over the service's defaults (`serve --policy-defaults`; Policy() without)."""
    return validation.policy(d, "policy", defaults)
