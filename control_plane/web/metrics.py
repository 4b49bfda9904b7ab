"""The control plane's own metrics, computed from the store at scrape time (so every process on one store reports the
same numbers, and a restart loses nothing), plus the worker's registry (sits_reconcile_duration_seconds)."""
from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from control_plane.rollout import Phase

DURATION_BUCKETS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)


class StoreCollector(Collector):
    """sits_rollout_phase, sits_canary_weight_percent, sits_rollout_checks_total, sits_rollbacks_total,
    sits_rollout_duration_seconds. Phase and weight are reported for active rollouts and each service's latest."""

    def __init__(self, store, clock=time.time) -> None:
        self.store, self.clock = store, clock

    def collect(self):
        phase = GaugeMetricFamily("sits_rollout_phase", "1 for the rollout's current phase, 0 for the others.",
                                  labels=["service", "rollout", "phase"])
        weight = GaugeMetricFamily("sits_canary_weight_percent", "Traffic share of the canary, percent.",
                                   labels=["service", "rollout"])
        rows = self.store.rollout_index()   # newest first: the first row of a service is its latest rollout
        seen: set[str] = set()
        for r in rows:
            if r["active"] or r["service"] not in seen:
                seen.add(r["service"])
                for p in Phase:
                    phase.add_metric([r["service"], r["id"], p.value], 1.0 if r["phase"] == p.value else 0.0)
                weight.add_metric([r["service"], r["id"]], float(r["weight"] or 0) if r["active"] else 0.0)
        yield phase
        yield weight
        checks = CounterMetricFamily("sits_rollout_checks", "Checks stored, by service and verdict outcome.",
                                     labels=["service", "outcome"])
        for (service, outcome), n in sorted(self.store.check_outcome_counts().items()):
            checks.add_metric([service, outcome], float(n))
        yield checks
        rollbacks = CounterMetricFamily("sits_rollbacks", "Rollouts that ended rolled back, by service and reason.",
                                        labels=["service", "reason"])
        for (service, reason), n in sorted(self.store.rollback_reasons().items()):
            rollbacks.add_metric([service, reason], float(n))
        yield rollbacks
        yield self._durations(rows)

    def _durations(self, rows: list[dict]):
        h = HistogramMetricFamily("sits_rollout_duration_seconds", "From creation to the final phase, by outcome.",
                                  labels=["outcome"])
        by: dict[str, list[float]] = {}
        for r in rows:
            if not r["active"]:
                by.setdefault(r["phase"], []).append(max(0.0, float(r["phase_since"]) - r["created_at"]))
        for outcome, xs in sorted(by.items()):
            buckets = [(str(float(b)), float(sum(1 for x in xs if x <= b))) for b in DURATION_BUCKETS]
            buckets.append(("+Inf", float(len(xs))))
            h.add_metric([outcome], buckets, sum_value=sum(xs))
        return h
