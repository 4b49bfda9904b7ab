"""Shutting a control loop down, the same way from `sits-control worker` and the demo: deploys in progress are
cancelled first (a SIGTERM does not wait for engines to load; the cancelled actions stay pending), then the worker's
passes (their outbox rows stay for the next worker), then the notifier (delivering what it can; a journal keeps the rest),
the metrics source, and last the deployer (the local one moves traffic to production and stops every variant; the
Kubernetes one only closes its client: the cluster keeps running)."""
from __future__ import annotations

import logging

from sits.control_plane.adapters.deploy import Deployer
from sits.control_plane.adapters.metrics import MetricsSource
from sits.control_plane.adapters.notify import Notifier
from sits.control_plane.worker.loop import Worker

log = logging.getLogger(__name__)


def shutdown(deployer: Deployer, *, worker: Worker | None = None, notifier: Notifier | None = None,
             source: MetricsSource | None = None) -> None:
    """Stop each part given, in order; a part that fails to stop is logged and the rest still stop."""
    steps = [("deploys in progress", deployer.cancel), ("worker", worker.stop if worker else None), ("notifier", notifier.close if notifier else None),
             ("metrics source", source.close if source else None), ("deployer", deployer.close)]
    for name, stop in steps:
        if stop is None:
            continue
        try:
            stop()
        except Exception as e:
            log.warning("closing the %s: %s", name, e)
