"""The kernel-set catalogue and the services' productions, as the API and the UI show them."""
from __future__ import annotations

from flask import current_app

from control_plane.rollout import Phase
from control_plane.web.present import weights_of


def kernel_catalog() -> list[dict]:
    """Every kernel set the engines have (the app's KernelCatalog) in registration order, with its parent and the
    ops it overrides."""
    return [e.to_dict() for e in current_app.config["KERNEL_CATALOG"].entries()]


def services(store, spec_of) -> list[dict]:
    """Each service seen in the store with what production runs now, from its latest rollout: the canary's kernel
    set if that rollout succeeded, else the production it was compared with. Readiness is the production variant's
    as the worker last observed it, and where its traffic enters as the worker last deployed it (views never ask the
deployer)."""
    routers = store.services.routers()
    latest: dict[str, object] = {}
    for r in store.list_summaries(limit=10000):   # newest first
        latest.setdefault(r.service, r)
    out = []
    for name in sorted(latest):
        r = latest[name]
        spec = spec_of(r.id)
        ready = _production_ready(store, r)
        out.append({"service": name, "production_kernels": r.canary_kernels if r.phase is Phase.SUCCEEDED
                    else r.production_kernels, "model": spec.model if spec else None,
                    "replicas": spec.replicas if spec else None,
                    "ready": ready,
                    "latest_rollout": {"id": r.id, "phase": r.phase.value, "kernels": r.canary_kernels,
                                       "created_at": r.created_at},
                    "active_rollout": r.id if r.active else None, "production_weight": weights_of(r)["production"],
                    "router_url": routers.get(name)})
    return out


def _production_ready(store, r) -> bool | None:
    """As the worker last saw it: the step's data, else the last check's evidence; None when never observed or the
    rollout is over (the worker stops looking)."""
    if not r.active:
        return None
    prod = store.get(r.id).data.get("production")   # the summaries carry no step data
    if prod is not None:
        return prod.ready
    if r.checks:
        seen = store.check(r.id, r.checks).get("variants", {}).get("production")
        return None if seen is None else bool(seen.get("ready"))
    return None
