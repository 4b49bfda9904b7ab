"""The application layer shared by the CLI, the web API and the demo: start a rollout, steer it with a command,
say which commands its phase allows. Validates input once (typed errors naming the field) and writes through the
store; the worker does the rest."""
from __future__ import annotations

import os
import time
import uuid
from typing import Any, Collection, Mapping

from sits.control_plane import validation
from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.analysis import Policy
from sits.control_plane.errors import ConflictError, NotFoundError, ValidationError
from sits.control_plane.rollout import Command, Event, EventKind, Phase, Rollout, allowed_commands
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.db import Store
from sits.wire.models import PRESET_NAMES

__all__ = ["allowed_commands", "retry_target", "retryable", "send_command", "start_rollout"]


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


def _model_here(spec: DeploySpec) -> None:
    """The local deployer's engines run on this machine: a checkpoint path must be a directory here (presets load
    from no file)."""
    if spec.model not in PRESET_NAMES and not os.path.isdir(spec.model):
        raise ValidationError(f"model {spec.model[:200]!r}: no checkpoint directory at that path on this machine "
                              "(the local deployer's engines load it from here)", "model")


def retryable(r: Rollout) -> str | None:
    """Why `r` cannot be retried (in the operator's words), or None: a rollout that ended without promoting its
    canary (rolled back, aborted, failed) can be started again as a new rollout linked to it."""
    if r.active:
        return f"rollout {r.id} is still {r.phase.value}: only an ended rollout can be retried"
    if r.phase is Phase.SUCCEEDED:
        return f"rollout {r.id} succeeded: its canary is production now; start a new canary instead"
    return None


def retry_target(store: Store, rollout_id: object) -> Rollout:
    """The rollout a retry names; ValidationError (field "retry_of") when there is none or it cannot be retried."""
    if not isinstance(rollout_id, str) or not rollout_id:
        raise ValidationError("retry_of must name a rollout (its id)", "retry_of")
    try:
        old = store.get(rollout_id)
    except NotFoundError:
        raise ValidationError(f"retry_of: no rollout {rollout_id!r}", "retry_of") from None
    why = retryable(old)
    if why:
        raise ValidationError(f"retry_of: {why}", "retry_of")
    return old


def _retry_of(store: Store, rollout_id: object, service: str) -> Rollout:
    old = retry_target(store, rollout_id)
    if old.service != service:
        raise ValidationError(f"a retry of {old.id} releases to its service {old.service!r}, not {service!r}",
                              "service")
    return old


def production_after(r: Rollout, spec: DeploySpec | None) -> tuple[str, list[str]]:
    """(kernel set, engine flags) the service's production runs after rollout `r` (with its spec, None if lost): the
    canary's if `r` succeeded (was promoted), else the production it was compared with."""
    promoted = r.phase is Phase.SUCCEEDED
    args = (spec.canary_args if promoted else spec.production_args) if spec else ()
    return (r.canary_kernels if promoted else r.production_kernels), list(args)


def current_production(store: Store, service: str) -> tuple[str, list[str]]:
    """(kernel set, engine flags) the service's production runs now, after its latest rollout; ("torch", []) for a
    new service. What a new rollout gets for the production (and canary) it does not name, so that a canary changes
    only what it names (the API's POST /rollouts and the local `rollout start`)."""
    latest = store.list_summaries(service=service, limit=1)
    if not latest:
        return "torch", []
    try:
        spec = store.spec(latest[0].id)
    except KeyError:
        spec = None
    return production_after(latest[0], spec)


def start_rollout(store: Store, service: str, canary_kernels: str, production_kernels: str,
                  policy: Policy | Mapping[str, Any] | None = None, spec: DeploySpec | Mapping[str, Any] | None = None,
                  *, now: float | None = None,
                  rollout_id: str | None = None, actor: str = "",
                  kernel_sets: Collection[str] | None = None, retry_of: str | None = None,
                  local_models: bool = False) -> Rollout:
    """Create a PENDING rollout with its spec (the worker takes it from there). `policy` and `spec` may be objects
    or dicts of their fields (API bodies). ValidationError (field "service", "kernels", "production_kernels",
    "policy", or the spec's own: "model", "replicas", "args", ...) for bad input; ConflictError (StoreConflictError)
    if the service already has an active rollout. `kernel_sets`: the names that exist (a KernelCatalog;
    default: the built-in sets). `retry_of`: the id of the ended rollout this one retries (ValidationError, field
    "retry_of", unless it exists, ended and did not succeed; field "service" for another service).
    `local_models`: the engines run on this machine (the local deployer), so a checkpoint path must be a directory
    here (field "model"); elsewhere (Kubernetes: the pod's filesystem) a well-formed absolute path is all that
    can be checked."""
    known = KernelCatalog.shipped() if kernel_sets is None else kernel_sets
    validation.service_name(service)
    _kernel_set(canary_kernels, "kernels", known)
    _kernel_set(production_kernels, "production_kernels", known)
    policy, spec = _policy(policy), _spec(spec)
    if isinstance(known, KernelCatalog):   # a rollout whose engines could not start fails here, not after a deploy
        for kernels, args, field in ((canary_kernels, spec.canary_args, "args"),
                                     (production_kernels, spec.production_args, "production_args")):
            if why := known.kv_cache_dtype_problem(kernels, args, field):
                raise ValidationError(why, field)
    if local_models:
        _model_here(spec)
    if retry_of is not None:
        _retry_of(store, retry_of, service)
    now = time.time() if now is None else now
    rid = rollout_id or f"{service}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"
    text = (f"created by {actor}" if actor else "created") + (f" as a retry of {retry_of}" if retry_of else "")
    created = Event(now, EventKind.CREATED, text, Phase.PENDING, actor)
    return store.create_rollout(Rollout(rid, service, canary_kernels, production_kernels, policy, created_at=now,
                                        phase_since=now, retry_of=retry_of, new_events=(created,)), spec)


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
