"""The kernel-set catalogue and the services' productions, as the API and the UI show them."""
from __future__ import annotations

import kernels
from control_plane.adapters.deploy import DeployNotFoundError
from control_plane.rollout import Phase

from control_plane.web.present import weights_of


def _impl(fn) -> str:
    """Which implementation an op is: module.qualname (two sets share an op exactly when they share this)."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def kernel_catalog() -> list[dict]:
    """Every registered set in registration order, with its parent (the earlier set it shares the most ops with:
    `derive` copies every op it does not replace) and the ops it overrides relative to that parent."""
    sets = [kernels.get_kernel_set(n) for n in kernels.list_kernel_sets()]
    impls = {ks.name: {op: _impl(fn) for op, fn in ks.ops().items()} for ks in sets}
    out = []
    for i, ks in enumerate(sets):
        mine = impls[ks.name]
        parent, shared = None, 0
        for other in sets[:i]:
            n = sum(1 for op, f in impls[other.name].items() if mine[op] == f)
            if n > shared:   # ties go to the later (the more derived) set
                parent, shared = other.name, n
            elif n == shared and n > 0:
                parent = other.name
        overrides = [op for op in kernels.OP_NAMES if parent is None or impls[parent][op] != mine[op]]
        out.append({"name": ks.name, "version": ks.version, "devices": list(ks.devices),
                    "cuda_graphs": ks.graph_safe, "description": ks.description, "parent": parent,
                    "overrides": overrides if parent is not None else [], "ops": mine})
    return out


def services(store, spec_of, router_of=None) -> list[dict]:
    """Each service seen in the store with what production runs now, from its latest rollout: the canary's kernel
    set if that rollout succeeded, else the production it was compared with. Readiness is the production variant's
    as the worker last observed it (views never ask the deployer for status). `router_of(service)`: where its traffic
goes, from the deployer in this process (a lookup, no I/O), or None."""
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
                    "router_url": _router(router_of, name)})
    return out


def _router(router_of, service: str) -> str | None:
    if router_of is None:
        return None
    try:
        return router_of(service)
    except DeployNotFoundError:   # nothing deployed for it by this process's worker (yet)
        return None


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
