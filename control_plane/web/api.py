"""The JSON API under /api/v1/ (ARCHITECTURE.md "Control-plane service"). Thin views over the store and
control_plane.service; the worker does the rest."""
from __future__ import annotations

import dataclasses
import time

from flask import Blueprint, current_app, jsonify, request, url_for

from sits.control_plane.service import rollouts as service
from sits.control_plane.analysis import Policy
from sits.control_plane.errors import ValidationError
from sits.control_plane.rollout import Command, Phase
from sits.control_plane.web import catalog, present, validate
from sits.control_plane.web.auth import current_user, require
from sits.control_plane.web.common import API_PREFIX, error_response, int_arg, json_body, nonfinite_to_null
from sits.control_plane.web.distribution import distributions
from sits.control_plane.web.openapi import openapi_spec
from sits.control_plane.web.series import series_of

bp = Blueprint("api", __name__, url_prefix=API_PREFIX)


def store():
    return current_app.extensions["sits_store"]


def _summary(r) -> dict:
    last = current_app.extensions["sits_headlines"].get(store(), r.id, r.checks)
    ended = current_app.extensions["sits_headlines"].ending(store(), r, last)
    # a FAILED rollout's traffic is where its last weight change left it (the outbox says): rare, read then only
    actions = store().actions(r.id) if r.phase is Phase.FAILED else None
    return present.rollout_summary(r, last, service.allowed_commands(r), ended, actions)


def spec_or_none(rollout_id: str):
    try:
        return store().spec(rollout_id)
    except KeyError:
        return None


def detail(r) -> dict:
    s = store()
    spec = spec_or_none(r.id)
    out = _summary(r)
    last = s.checks(r.id, since_seq=r.checks - 1, limit=1) if r.checks else []
    lease = s.leases.get(r.id)
    actions = s.actions(r.id)
    out.update(
        policy=r.policy.to_dict(), paused_from=r.paused_from.value if r.paused_from else None,
        variants=present.variants_of(r, spec.replicas if spec else None, actions),
        spec=None if spec is None else {**dataclasses.asdict(spec), "env": sorted(spec.env)},
        flags=spec.changed_flags() if spec else [],
        steps_timeline=present.step_timeline(r, actions, current_app.config.get("CLOCK", time.time)()),
        last_verdict=present.check_compact(last[0]) if last else None,
        correctness=present.correctness_of(s, r), low_traffic=present.low_traffic_of(r),
        pending_commands=s.commands.pending(r.id),
        lease=None if lease is None else {"owner": lease[0], "expires_at": lease[1]},
        source=r.source, warmup_until=r.warmup_until, observed_until=r.observed_until,
        retried_as=s.retries_of(r.id), retryable=service.retryable(r) is None)
    return out


# ---- rollouts ----------------------------------------------------------------------------------------------------
@bp.get("/rollouts")
@require("viewer")
def list_rollouts():
    svc = request.args.get("service") or None
    phase = request.args.get("phase") or None
    if phase is not None and phase not in {p.value for p in Phase}:
        raise ValidationError(f"phase must be one of {', '.join(p.value for p in Phase)}", field="phase")
    active = {"true": True, "1": True, "false": False, "0": False, None: None, "": None}.get(
        request.args.get("active"), "bad")
    if active == "bad":
        raise ValidationError("active must be true or false", field="active")
    limit, offset = int_arg("limit", 50, 1, 500), int_arg("offset", 0)
    rs = store().list_summaries(active=active, service=svc, phase=phase, limit=limit, offset=offset)
    total = store().count(active=active, service=svc, phase=phase)
    specs = store().specs([r.id for r in rs])   # the engine flags each canary changes (a release of flags)
    out = [{**_summary(r), "flags": specs[r.id].changed_flags() if r.id in specs else []} for r in rs]
    return jsonify({"rollouts": out, "total": total, "limit": limit, "offset": offset})


@bp.post("/rollouts")
@require("operator")
def create_rollout():
    body, kept = json_body(), {}
    if isinstance(body, dict) and body.get("retry_of") is not None:   # the old rollout's spec and policy under it
        old = service.retry_target(store(), body["retry_of"])
        old_spec = store().spec(old.id).to_dict()
        body = validate.retry_body(body, old, old_spec)
        kept = {k: old_spec[k] for k in validate.RETRY_KEEPS}   # what a body cannot say: as the old rollout had it
    body = validate.create_body(body)
    policy = validate.policy(body.get("policy"), current_app.config["POLICY_DEFAULTS"])
    # what the body leaves out is what the service's production runs now (its kernel set and engine flags, those of
    # the last promoted canary), so a canary changes only what it names; the canary's args default to production's
    current = None   # (kernels, args) of the service's production, read only when the body leaves one out
    if not body.get("production_kernels") or body.get("production_args") is None:
        current = service.current_production(store(), body["service"])
    production = body.get("production_kernels") or current[0]
    production_args = body["production_args"] if body.get("production_args") is not None else current[1]
    spec = {"model": body.get("model") or "tiny", "production_args": production_args,
            "canary_args": body["args"] if body.get("args") is not None else production_args}
    spec.update({k: body[k] for k in ("replicas", "gpus", "device", "ready_timeout_s", "tensor_parallel_size")
                 if body.get(k) is not None})
    spec.update(kept)
    r = service.start_rollout(store(), body["service"], body["kernels"], production, policy, spec,
                              actor=current_user().name, kernel_sets=current_app.config["KERNEL_CATALOG"],
                              retry_of=body.get("retry_of"), local_models=current_app.config["LOCAL_MODELS"])
    resp = jsonify(detail(r))
    resp.status_code = 201
    resp.headers["Location"] = url_for("api.get_rollout", rollout_id=r.id)
    return resp


def policy_defaults() -> Policy:
    """What a new rollout gets for the policy fields it does not give."""
    return Policy.from_dict(current_app.config["POLICY_DEFAULTS"] or {})


@bp.get("/rollouts/<rollout_id>")
@require("viewer")
def get_rollout(rollout_id: str):
    return jsonify(detail(store().get(rollout_id)))


@bp.get("/rollouts/<rollout_id>/checks")
@require("viewer")
def rollout_checks(rollout_id: str):
    store().get(rollout_id)   # 404 for an unknown rollout
    since, limit, last = int_arg("since_seq", 0), int_arg("limit", 1000, 1, 5000), int_arg("last", 0, 0, 5000)
    if last:   # the newest `last` checks (the UI's first load)
        since = max(since, store().get(rollout_id).checks - last)
    if request.args.get("view") == "compact":
        checks = [present.check_compact(c) for c in store().checks_without_buckets(rollout_id, since_seq=since,
                                                                                    limit=limit)]
    else:
        checks = store().checks(rollout_id, since_seq=since, limit=limit)
    return jsonify({"checks": nonfinite_to_null(checks)})


@bp.get("/rollouts/<rollout_id>/checks/<int:seq>")
@require("viewer")
def rollout_check(rollout_id: str, seq: int):
    return jsonify(nonfinite_to_null(store().check(rollout_id, seq)))


@bp.get("/rollouts/<rollout_id>/checks/<int:seq>/distribution")
@require("viewer")
def rollout_check_distribution(rollout_id: str, seq: int):
    """The check's latency histograms, canary against its comparison target (web/distribution.py)."""
    return jsonify(nonfinite_to_null(distributions(store().check(rollout_id, seq))))


@bp.get("/rollouts/<rollout_id>/events")
@require("viewer")
def rollout_events(rollout_id: str):
    store().get(rollout_id)
    since = int_arg("since_id", 0)
    events = store().events(rollout_id, since_id=since, limit=int_arg("limit", 5000, 1, 20000))
    return jsonify({"events": events, "actions": [present.action_row(a) for a in store().actions(rollout_id)],
                    "notifications": store().deliveries.of_rollout(rollout_id)})


@bp.get("/rollouts/<rollout_id>/engines")
@require("viewer")
def rollout_engines(rollout_id: str):
    """Each variant's engines (processes or pods) as the worker last listed them (the deployer's replicas())."""
    store().get(rollout_id)
    seen = store().engines.get(rollout_id)
    return jsonify({"engines": seen[0] if seen else [], "observed_at": seen[1] if seen else None})


@bp.get("/rollouts/<rollout_id>/series")
@require("viewer")
def rollout_series(rollout_id: str):
    r = store().get(rollout_id)
    return jsonify(series_of(store(), rollout_id, r.policy.compare_to, int_arg("since_seq", 0),
                             current_app.config["SERIES_MAX_POINTS"], current_app.extensions["sits_points"]))


@bp.post("/rollouts/<rollout_id>/<any(promote, pause, resume, abort):command>")
@require("operator")
def rollout_command(rollout_id: str, command: str):
    cid = service.send_command(store(), rollout_id, Command(command), current_user().name)
    return jsonify({"command_id": cid, "command": command, "actor": current_user().name,
                    "rollout": _summary(store().get(rollout_id))}), 202


# ---- catalogue -----------------------------------------------------------------------------------------------------
@bp.get("/kernels")
@require("viewer")
def kernels():
    return jsonify({"kernels": catalog.kernel_catalog()})


@bp.get("/services")
@require("viewer")
def services():
    return jsonify({"services": catalog.services(store(), spec_or_none)})


@bp.get("/config")
@require("admin")
def config():
    users = current_app.config["SITS_USERS"]
    worker = current_app.config["WORKER"]
    return jsonify({"policy_defaults": policy_defaults().to_dict(), "store": store().path,
                    "auth": {"enabled": users is not None,
                             "users": [{"name": u.name, "role": u.role} for u in (users.users if users else [])]},
                    "worker": None if worker is None else {"interval_s": worker.config.interval_s,
                                                           "lease_ttl_s": worker.config.lease_ttl_s,
                                                           "owner": worker.owner,
                                                           "metrics_source": worker.source.name}})


@bp.get("/me")
@require("viewer")
def me():
    u = current_user()
    return jsonify({"name": u.name, "role": u.role})


@bp.get("/")
def index():
    """Where a person or a script that opens /api/v1/ (the URL the service prints) goes next; names only, no data."""
    return jsonify({"api": "sits-control", "version": "v1", "openapi": f"{API_PREFIX}/openapi.json",
                    "reference": "/api", "resources": {name: f"{API_PREFIX}/{name}" for name in
                                                       ("rollouts", "kernels", "services", "me")}})


@bp.get("/openapi.json")
def openapi():
    return jsonify(openapi_spec())


@bp.route("/<path:anything>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def unknown(anything: str):
    return error_response(404, "not_found", f"no API route /{anything}")
