"""The control plane's own metrics, computed from the store at scrape time (so every process on one store reports the
same numbers, and a restart loses nothing), plus the worker's registry (sits_reconcile_duration_seconds)."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from sits.control_plane.rollout import Phase

DURATION_BUCKETS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)


class StoreCollector(Collector):
    """sits_rollout_phase, sits_canary_weight_percent, sits_rollout_checks_total, sits_rollbacks_total,
    sits_rollout_duration_seconds. Phase and weight are reported for active rollouts and each service's latest."""

    def __init__(self, store) -> None:
        self.store = store
        self._durations: dict[str, tuple[str, float]] = {}   # finished rollout id -> (outcome, seconds)

    def collect(self):
        phase = GaugeMetricFamily("sits_rollout_phase", "1 for the rollout's current phase, 0 for the others.",
                                  labels=["service", "rollout", "phase"])
        weight = GaugeMetricFamily("sits_canary_weight_percent", "Traffic share of the canary, percent.",
                                   labels=["service", "rollout"])
        rows = self.store.rollout_index()   # newest first: the first row of a service is its latest rollout
        seen: set[str] = set()
        shown = []
        for r in rows:
            if r["active"] or r["service"] not in seen:
                seen.add(r["service"])
                shown.append(r)
        ended = [r for r in rows if not r["active"]]
        progress = self.store.progress([r["id"] for r in shown]
                                       + [r["id"] for r in ended if r["id"] not in self._durations])
        for r in shown:
            for p in Phase:
                phase.add_metric([r["service"], r["id"], p.value], 1.0 if r["phase"] == p.value else 0.0)
            weight.add_metric([r["service"], r["id"]], float(progress[r["id"]][0]) if r["active"] else 0.0)
        for r in ended:   # a finished rollout never changes: its duration is read once
            if r["id"] not in self._durations and r["id"] in progress:
                self._durations[r["id"]] = (r["phase"], max(0.0, progress[r["id"]][1] - r["created_at"]))
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
        yield self._duration_histogram()

    def _duration_histogram(self):
        h = HistogramMetricFamily("sits_rollout_duration_seconds", "From creation to the final phase, by outcome.",
                                  labels=["outcome"])
        by: dict[str, list[float]] = {}
        for outcome, seconds in self._durations.values():
            by.setdefault(outcome, []).append(seconds)
        for outcome, xs in sorted(by.items()):
            buckets = [(str(float(b)), float(sum(1 for x in xs if x <= b))) for b in DURATION_BUCKETS]
            buckets.append(("+Inf", float(len(xs))))
            h.add_metric([outcome], buckets, sum_value=sum(xs))
        return h
