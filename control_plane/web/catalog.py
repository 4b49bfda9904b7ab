"""The kernel-set catalogue and the services' productions, as the API and the UI show them."""
from __future__ import annotations

from flask import current_app

from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import production_after
from sits.control_plane.validation import MAX_REPLICAS
from sits.control_plane.web.present import weights_of


def kernel_catalog() -> list[dict]:
    """Every kernel set the engines have (the app's KernelCatalog) in registration order, with its parent and the
    ops it overrides."""
    return [e.to_dict() for e in current_app.config["KERNEL_CATALOG"].entries()]


def replica_limit(config) -> dict:
    """How many replicas per variant a rollout may ask for here, and why: `REPLICA_LIMIT` in the app's config, set
    by whoever built the app from its deployer's own settings (web/serve.py, the demo); without one, the API's
    bound."""
    if config.get("REPLICA_LIMIT"):
        return dict(config["REPLICA_LIMIT"])
    return {"per_variant": MAX_REPLICAS, "why": "the API's limit (the worker's deployer may allow fewer)"}


def services(store, spec_of) -> list[dict]:
    """Each service seen in the store with what production runs now, from its latest rollout: the canary's kernel
    set and engine flags if that rollout succeeded, else the production it was compared with. Readiness is the production variant's
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
        ready, seen_at = _production_ready(store, r)
        kernels, args = production_after(r, spec)
        out.append({"service": name, "production_kernels": kernels, "production_args": args,
                    "model": spec.model if spec else None,
                    "replicas": spec.replicas if spec else None,
                    "ready": ready, "ready_seen_at": seen_at, "watched": r.active,
                    "latest_rollout": {"id": r.id, "phase": r.phase.value, "kernels": r.canary_kernels,
                                       "created_at": r.created_at},
                    "active_rollout": r.id if r.active else None, "production_weight": weights_of(r)["production"],
                    "router_url": routers.get(name)})
    return out


def _production_ready(store, r) -> tuple[bool | None, float | None]:
    """As the worker last saw it, and when: the step's data while the rollout runs, else the last check's evidence
    (an ended rollout's last look: the worker watches a service only while one of its rollouts is active); (None,
    None) when never observed."""
    if r.active:
        prod = store.get(r.id).data.get("production")   # the summaries carry no step data
        if prod is not None:
            return prod.ready, r.observed_until
    if r.checks:
        ev = store.check(r.id, r.checks)
        seen = ev.get("variants", {}).get("production")
        if seen is not None:
            return bool(seen.get("ready")), ev.get("window_end") or ev["at"]
    return None, None


def history(store, service: str, limit: int = 500) -> list[dict]:
    """Every rollout of `service`, newest first, with which kernel set production ran during it and after it: a
    succeeded rollout's canary became production at its end, every other left production as it was. `ran_until`:
    when production stopped running that set (the next succeeded rollout's end), None while it still does."""
    rows = store.list_summaries(service=service, limit=limit)
    out, until = [], None
    for r in rows:   # newest first: a promotion ends the previous production's time
        ended = None if r.active else r.phase_since
        promoted = r.phase is Phase.SUCCEEDED
        out.append({"id": r.id, "kernels": r.canary_kernels, "production_kernels": r.production_kernels,
                    "phase": r.phase.value, "active": r.active, "reason": r.reason, "created_at": r.created_at,
                    "started_at": r.started_at, "ended_at": ended,
                    "seconds": None if ended is None else max(0.0, ended - r.created_at), "checks": r.checks,
                    "promoted": promoted, "production_until": until if promoted else None})
        if promoted:
            until = ended
    return out


def versions(rows: list[dict]) -> list[dict]:
    """The kernel sets production ran, oldest first, from history(): each with when it started (the promotion's
    end; None for the first production, which SITS did not deploy) and for how long (None: still running)."""
    out: list[dict] = []
    for h in reversed(rows):
        if not out:
            out.append({"kernels": h["production_kernels"], "since": None, "until": None, "rollout": None})
        if h["promoted"]:
            out[-1]["until"] = h["ended_at"]
            out.append({"kernels": h["kernels"], "since": h["ended_at"], "until": None, "rollout": h["id"]})
    for v in out:
        v["seconds"] = None if v["since"] is None or v["until"] is None else v["until"] - v["since"]
    return out
