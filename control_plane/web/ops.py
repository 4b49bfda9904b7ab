"""/healthz (the process answers), /readyz (the store answers, and the worker is alive unless --no-worker),
/metrics (Prometheus text). Unauthenticated, like every probe and scrape endpoint."""
from __future__ import annotations

import sqlite3

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sits.control_plane.store.schema import StoreError
from sits.control_plane.web.metrics import StoreCollector

bp = Blueprint("ops", __name__)


def _registry() -> CollectorRegistry:
    reg = current_app.extensions.get("sits_metrics")
    if reg is None:
        reg = CollectorRegistry(auto_describe=False)
        reg.register(StoreCollector(current_app.extensions["sits_store"]))
        current_app.extensions["sits_metrics"] = reg
    return reg


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    problems = []
    store = current_app.extensions["sits_store"]
    try:
        store.count()
    except StoreError as e:   # damaged (the store says so, and why): the message names the fix
        problems.append(f"store: {e}")
    except (sqlite3.Error, OSError) as e:
        problems.append(f"store: {type(e).__name__}: {e}")
    if store.damage is not None and not problems:   # found at start (quick_check) or by an earlier statement
        problems.append(f"store: damaged ({store.damage}); restore it from a backup "
                        "(docs/security.md#backup-and-restore)")
    worker = current_app.config["WORKER"]
    if worker is not None and not worker.alive:
        problems.append("worker: its loop is not running")
    if worker is not None and worker.store_error and f"store: {worker.store_error}" not in problems:
        problems.append(f"store: {worker.store_error}")   # reads may work while writes fail (disk full, read-only)
    body = {"status": "ok" if not problems else "unavailable", "worker": worker is not None, "problems": problems}
    return jsonify(body), 200 if not problems else 503


@bp.get("/metrics")
def metrics():
    text = generate_latest(_registry())
    worker = current_app.config["WORKER"]
    if worker is not None:
        text += generate_latest(worker.metrics.registry)
    return Response(text, mimetype=CONTENT_TYPE_LATEST)
