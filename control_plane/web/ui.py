"""The web UI: server-rendered pages; the live parts (rollout rows, the detail page's header, charts, checks and
events) are drawn by small scripts from the same JSON API, polled every 1.5 s."""
from __future__ import annotations

from urllib.parse import urlencode

from flask import Blueprint, current_app, render_template, request

from sits.control_plane.errors import NotFoundError, ValidationError
from sits.control_plane.service import rollouts as service
from sits.control_plane.validation import MAX_TENSOR_PARALLEL
from sits.control_plane.web import catalog
from sits.control_plane.web.api import detail, policy_defaults, spec_or_none, store
from sits.control_plane.web.auth import current_user, require

bp = Blueprint("ui", __name__)


@bp.app_context_processor
def _ui_globals() -> dict:
    return {"worker_here": current_app.config["WORKER"] is not None}


@bp.get("/")
@require("viewer")
def rollouts():
    return render_template("rollouts.html", services=sorted({s["service"] for s in _services()}))


@bp.get("/rollouts/new")
@require("viewer")
def new_rollout():
    sets = catalog.kernel_catalog()
    return render_template("new.html", kernels=sets, services=_services(), default_canary=default_canary(sets),
                           defaults=policy_defaults().to_dict(), can_start=current_user().can("operator"),
                           replica_limit=catalog.replica_limit(current_app.config),
                           max_tensor_parallel=MAX_TENSOR_PARALLEL,
                           retry=retry_prefill(request.args.get("retry_of")))


def retry_prefill(rollout_id: str | None) -> dict | None:
    """What the form fills in for ?retry_of=ID: the old rollout's service, canary kernel set, spec and policy; or,
    when it cannot be retried, only why (the form then starts empty)."""
    if not rollout_id:
        return None
    try:
        old = service.retry_target(store(), rollout_id)
    except ValidationError as e:
        return {"id": rollout_id, "error": str(e).removeprefix("retry_of: ")}
    spec = store().spec(old.id)
    return {"id": old.id, "service": old.service, "kernels": old.canary_kernels, "phase": old.phase.value,
            "reason": old.reason, "policy": old.policy.to_dict(), "model": spec.model, "replicas": spec.replicas,
            "tensor_parallel_size": spec.tensor_parallel_size, "args": list(spec.canary_args)}


@bp.get("/rollouts/<rollout_id>")
@require("viewer")
def rollout(rollout_id: str):
    r = store().get(rollout_id)
    sets = {k["name"]: k for k in catalog.kernel_catalog()}
    return render_template("detail.html", r=detail(r), kernels=sets, can_act=current_user().can("operator"),
                           grafana=grafana_links(current_app.config.get("GRAFANA_URL"), r))


def default_canary(sets: list[dict]) -> str | None:
    """The form's preselected canary: the newest set that is not an example regression (a set bad on purpose) and
    not the default production (the first)."""
    good = [k["name"] for k in sets[1:] if not k.get("regression")]
    return good[-1] if good else (sets[0]["name"] if sets else None)


# the generated dashboards (dashboards/*.dashboard.py) by uid; tests/control_plane/web/test_ui.py checks the uids
DASHBOARDS = (("Canary", "sits-canary"), ("Engine", "sits-engine"), ("Control plane", "sits-control-plane"))


def grafana_links(base: str | None, r) -> list[dict]:
    """Links to the dashboards with the rollout's service and time range (a minute either side; "now" while it
    runs) filled in; none without `--grafana-url`."""
    if not base:
        return []
    q = urlencode({"var-service": r.service, "from": int(r.created_at * 1000) - 60_000,
                   "to": "now" if r.active else int(r.phase_since * 1000) + 60_000})
    return [{"title": title, "uid": uid, "url": f"{base.rstrip('/')}/d/{uid}?{q}"} for title, uid in DASHBOARDS]


@bp.get("/kernels")
@require("viewer")
def kernels():
    return render_template("kernels.html", kernels=catalog.kernel_catalog())


@bp.get("/services")
@require("viewer")
def services():
    return render_template("services.html", services=_services())


@bp.get("/services/<name>")
@require("viewer")
def service_history(name: str):
    rows = catalog.history(store(), name)
    if not rows:
        raise NotFoundError(f"no rollouts of service {name!r}")
    current = next((s for s in _services() if s["service"] == name), None)
    return render_template("history.html", name=name, rows=rows, versions=catalog.versions(rows), current=current,
                           can_start=current_user().can("operator"))


@bp.get("/api")
@require("viewer")
def api_reference():
    return render_template("api.html")


def _services() -> list[dict]:
    return catalog.services(current_app.extensions["sits_store"], spec_or_none)
