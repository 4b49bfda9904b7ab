"""The application layer shared by the CLI, the web API and the demo: start a rollout, steer it with a command,
say which commands its phase allows. Validates input once (typed errors naming the field) and writes through the
store; the worker does the rest."""
from __future__ import annotations

import time
import uuid
from typing import Any, Collection, Mapping

from sits.control_plane import validation
from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.analysis import Policy
from sits.control_plane.errors import ConflictError, ValidationError
from sits.control_plane.rollout import Command, Event, EventKind, Phase, Rollout, allowed_commands
from sits.control_plane.adapters.spec import DeploySpec
from sits.control_plane.store.db import Store

__all__ = ["allowed_commands", "send_command", "start_rollout"]


def _kernel_set(name: object, field: str, known: Collection[str]) -> str:
    if isinstance(name, str) and name not in known:
        validation.kernel_set_name(name, field)   # '../../etc': say why no kernel set can have that name
    if not isinstance(name, str) or name not in known:
        raise ValidationError(f"{field}: unknown kernel set {name!r}; known: {', '.join(sorted(known))}", field)
    return name


def _policy(policy: Policy | Mapping[str, Any] | None) -> Policy:
    return validation.policy(policy)


def _spec(spec: DeploySpec | Mapping[str, Any] | None) -> DeploySpec:
    if spec is None or isinstance(spec, DeploySpec):
        return spec or DeploySpec()
    return DeploySpec.from_dict(spec)


def start_rollout(store: Store, service: str, canary_kernels: str, production_kernels: str,
                  policy: Policy | Mapping[str, Any] | None = None, spec: DeploySpec | Mapping[str, Any] | None = None,
                  *, now: float | None = None,
                  rollout_id: str | None = None, actor: str = "",
                  kernel_sets: Collection[str] | None = None) -> Rollout:
    """Create a PENDING rollout with its spec (the worker takes it from there). `policy` and `spec` may be objects
    or dicts of their fields (API bodies). ValidationError (field "service", "kernels", "production_kernels",
    "policy", or the spec's own: "model", "replicas", "args", ...) for bad input; ConflictError (StoreConflictError)
    if the service already has an active rollout. `kernel_sets`: the names that exist (a KernelCatalog;
    default: the built-in sets)."""
    known = KernelCatalog.shipped() if kernel_sets is None else kernel_sets
    validation.service_name(service)
    _kernel_set(canary_kernels, "kernels", known)
    _kernel_set(production_kernels, "production_kernels", known)
    policy, spec = _policy(policy), _spec(spec)
    now = time.time() if now is None else now
    rid = rollout_id or f"{service}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"
    created = Event(now, EventKind.CREATED, f"created by {actor}" if actor else "created", Phase.PENDING, actor)
    return store.create_rollout(Rollout(rid, service, canary_kernels, production_kernels, policy, created_at=now,
                                        phase_since=now, new_events=(created,)), spec)


def send_command(store: Store, rollout_id: str, command: Command | str, actor: str) -> int:
    """Queue a manual command for the worker; returns its id. NotFoundError (RolloutNotFoundError) if there is no
    such rollout; ValidationError (field "command") for an unknown command; ConflictError if the rollout's phase does
    not allow it. Idempotent: the same command already queued and not yet consumed returns that one's id."""
    try:
        cmd = Command(command)
    except ValueError:
        raise ValidationError(f"unknown command {command!r}; use one of {', '.join(c.value for c in Command)}",
                              "command") from None
    r = store.get(rollout_id)
    if r.phase.terminal:
        raise ConflictError(f"rollout {rollout_id} is already {r.phase.value}")
    if cmd not in allowed_commands(r):
        allowed = ", ".join(sorted(c.value for c in allowed_commands(r))) or "none"
        raise ConflictError(f"{cmd.value} is not allowed while rollout {rollout_id} is {r.phase.value}"
                            + (" (awaiting promotion)" if r.awaiting_promotion else "") + f"; allowed: {allowed}")
    return store.commands.add(rollout_id, cmd, actor, reuse_pending=True)
