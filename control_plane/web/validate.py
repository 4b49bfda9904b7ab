"""The body of `POST /api/v1/rollouts`, checked before anything is written: every problem is a ValidationError whose
`field` names the offending key (`policy.checks[1].max_rel_delta`, `replicas`, ...)."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from control_plane.analysis import ERROR_RATE, CorrectnessPolicy, MetricCheck, Policy, PolicyError
from control_plane.errors import ValidationError

FIELDS = {"service": str, "kernels": str, "production_kernels": str, "model": str, "replicas": int,
          "policy": dict, "args": list, "production_args": list, "gpus": int}
REQUIRED = ("service", "kernels")
_BAD = (PolicyError, TypeError, ValueError)


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
        if typ is not int and not isinstance(v, typ):
            name = {str: "a string", dict: "an object", list: "a list of strings"}[typ]
            raise ValidationError(f"{key} must be {name}", field=key)
        if typ is list and not all(isinstance(a, str) for a in v):
            raise ValidationError(f"{key} must be a list of strings", field=key)
    return dict(body)


def policy(d: Mapping | None, defaults: Mapping | None = None) -> Policy:
    """The body's policy fields over the service's defaults (`serve --policy-defaults`; Policy() without)."""
    try:
        return Policy.from_dict({**(defaults or {}), **(d or {})})
    except _BAD as e:
        raise ValidationError(f"policy: {e}", field=_policy_field(dict(d or {}))) from None


def _policy_field(d: dict) -> str:
    known = {f.name for f in fields(Policy)}
    for key in d:
        if key not in known:
            return f"policy.{key}"
    if "checks" in d:
        checks = d["checks"]
        if not isinstance(checks, list) or not checks:
            return "policy.checks"
        for i, c in enumerate(checks):
            if not isinstance(c, Mapping):
                return f"policy.checks[{i}]"
            try:
                MetricCheck(**c)
            except TypeError:
                return f"policy.checks[{i}]"
            except PolicyError:
                return f"policy.checks[{i}].{_check_key(c)}"
    if isinstance(d.get("correctness"), Mapping):   # the gate's own keys: policy.correctness.enabled, ...
        for key, value in d["correctness"].items():
            try:
                CorrectnessPolicy.from_dict({key: value})
            except _BAD:
                return f"policy.correctness.{key}"
    for key, value in d.items():   # each field alone: the one that fails on its own is the culprit
        if key == "checks":
            continue
        try:
            Policy.from_dict({key: value})
        except _BAD:
            return f"policy.{key}"
    return "policy"


def _check_key(c: Mapping) -> str:
    """Which key of a MetricCheck is wrong, probed in the order MetricCheck validates them."""
    metric = c.get("metric")
    if not isinstance(metric, str) or not metric:
        return "metric"
    if metric == ERROR_RATE:
        if c.get("quantile") is not None:
            return "quantile"
        return "max_rel_delta" if c.get("max_rel_delta") is not None else "max_abs_delta"
    try:
        MetricCheck(metric, quantile=c.get("quantile"), max_rel_delta=0.1)
    except PolicyError:
        return "quantile"
    return "max_abs_delta" if c.get("max_abs_delta") is not None else "max_rel_delta"
