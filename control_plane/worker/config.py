"""The worker's settings (`WorkerConfig`, validated when made), its Prometheus metrics (`WorkerMetrics`) and its
default lease identity; control_plane/worker/loop.py uses them."""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass(slots=True)
class WorkerConfig:
    interval_s: float = 5.0          # how often every active rollout is reconciled
    action_retries: int = 2          # deployer action attempts after the first
    action_backoff_s: float = 1.0    # doubled per attempt
    join_timeout_s: float = 30.0     # stop(): how long to wait for rollout threads
    lease_ttl_s: float = 30.0        # a rollout's lease lasts this long after each renewal (every round, every action)
    max_pass_s: float = 3600.0       # a pass still running this long is given up: its lease is no longer renewed

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or self.action_backoff_s < 0 or self.join_timeout_s < 0:
            raise ValueError("interval_s must be > 0; action_backoff_s and join_timeout_s >= 0")
        if not self.lease_ttl_s > self.interval_s:
            raise ValueError(f"lease_ttl_s ({self.lease_ttl_s}) must exceed interval_s ({self.interval_s}): the "
                             "holder renews once per round")
        if not self.max_pass_s > 0:
            raise ValueError(f"max_pass_s must be > 0, got {self.max_pass_s}")
        if isinstance(self.action_retries, bool) or not isinstance(self.action_retries, int) or self.action_retries < 0:
            raise ValueError("action_retries must be an integer >= 0")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.stage = Histogram("sits_control_reconcile_seconds", "Time per stage of one rollout pass (observe, "
                               "reconcile, persist, actions).", ["service", "stage"], buckets=_STAGE_BUCKETS,
                               registry=self.registry)
        self.errors = Counter("sits_control_pass_errors", "Rollout passes that raised.", ["service"],
                              registry=self.registry)
        self.store_errors = Counter("sits_control_store_write_errors", "Passes stopped because the store could not "
                                    "be written (disk full or read-only).", registry=self.registry)
        self.action_failures = Counter("sits_control_action_failures", "Actions that failed for good.",
                                       ["service", "kind"], registry=self.registry)
        self.active = Gauge("sits_control_active_rollouts", "Active rollouts.", registry=self.registry)
        self.busy = Gauge("sits_control_busy_rollouts", "Rollouts whose pass is still running.",
                          registry=self.registry)
        self.replayed = Counter("sits_replayed_requests", "Requests low-traffic mode replayed to a variant (canary "
                                "or baseline) straight to its engines.", ["service", "variant"],
                                registry=self.registry)
        self.reconcile = Histogram("sits_reconcile_duration_seconds", "Time of one rollout pass that reconciled "
                                   "(observe + reconcile + persist + actions).", buckets=_STAGE_BUCKETS,
                                   registry=self.registry)


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
