"""Direct scrape (the embedded default `MetricsSource`): GET each replica's /metrics, diff against an earlier scrape.

Every call scrapes every endpoint of every ready target in parallel and remembers the cumulative counts per endpoint
(a short history per service). The window is the difference to the remembered scrape taken at `start` (the end of the
last window the caller counted), so a caller that failed to count a window (crash, error) gets one spanning both next
time instead of losing or double counting data. Counter resets (a replica restarted) are handled per series as
Prometheus' increase() does; an endpoint first seen in this scrape contributes from the next window on (its earlier
counts cannot be placed in time). Replicas of a variant are summed.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import requests
from prometheus_client.parser import text_string_to_metric_families

from sits.control_plane.adapters.sessions import thread_session
from sits.control_plane.adapters.metrics import INFERENCE_ROUTES, MetricsQueryError, MetricsWindow, NoDataError, Target
from sits.control_plane.analysis import REQUEST_LATENCY, HistogramError, HistogramSnapshot, VariantData
from sits.control_plane.analysis.promql import series_key, status_class
from sits.wire.metrics import INFERENCE_REQUESTS, ORIGIN, ORIGIN_REPLAY

_EPS = 1e-6


@dataclass(slots=True)
class ScrapeConfig:
    timeout_s: float = 3.0
    routes: tuple[str, ...] = INFERENCE_ROUTES
    history: int = 32            # scrapes remembered per service
    max_workers: int = 8

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("scrape timeout_s must be > 0")
        if not self.routes:
            raise ValueError("scrape routes must name at least one route, e.g. /v1/completions")
        self.routes = tuple(self.routes)
        if self.history < 2 or self.max_workers < 1:
            raise ValueError("scrape history must be >= 2 and max_workers >= 1")


@dataclass(slots=True)
class Cumulative:
    """One endpoint's counters at one scrape: histograms by series key, inference requests and 5xx errors, replayed
    requests and live streamed ones."""
    histograms: dict[str, HistogramSnapshot] = field(default_factory=dict)
    requests: float = 0.0
    errors: float = 0.0
    replayed: float = 0.0
    streamed: float = 0.0


def parse_exposition(text: str, service: str | None, metrics: Sequence[str],
                     routes: Sequence[str] = INFERENCE_ROUTES) -> Cumulative:
    """Cumulative histograms of `metrics` (+ request/error counts from http_request_duration_seconds) in one
    Prometheus text exposition. Series of another `service` label are ignored. Request latency is keyed per route
    and summed over the answered requests' status codes; server errors are counted, not timed, and client errors
    neither (promql.status_class: the same rule as the PromQL templates); other histograms are summed into one
    series."""
    wanted = set(metrics) | {REQUEST_LATENCY, INFERENCE_REQUESTS, INFERENCE_REQUESTS + "_total"}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    out = Cumulative()
    try:
        families = list(text_string_to_metric_families(_prefilter(text, wanted, routes)))
    except Exception as e:  # the parser raises ValueError/TypeError/IndexError on malformed text
        raise MetricsQueryError(f"unparsable /metrics text: {e}") from None
    for fam in families:
        if fam.type == "counter" and fam.name == INFERENCE_REQUESTS:
            _count_origins(fam, service, routes, out)
            continue
        if fam.type != "histogram" or fam.name not in wanted:
            continue
        for s in fam.samples:
            labels = s.labels
            if service is not None and labels.get("service", service) != service:
                continue
            route = None
            if fam.name == REQUEST_LATENCY:
                route = labels.get("route")
                if route not in routes:
                    continue
                kind = status_class(labels.get("status", ""))
                if s.name.endswith("_count") and kind != "client":
                    out.requests += s.value
                    if kind == "error":
                        out.errors += s.value
                if kind != "timed" or fam.name not in metrics:
                    continue
            key = series_key(fam.name, {"route": route} if route is not None else None)
            if s.name.endswith("_bucket"):
                b = buckets.setdefault(key, {})
                le = float(labels["le"])
                b[le] = b.get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                sums[key] = sums.get(key, 0.0) + s.value
            elif s.name.endswith("_count"):
                counts[key] = counts.get(key, 0.0) + s.value
    for key, b in buckets.items():
        try:
            out.histograms[key] = HistogramSnapshot.from_buckets(b.items(), sums.get(key, 0.0), counts.get(key))
        except HistogramError as e:
            raise MetricsQueryError(f"{key}: {e}") from None
    return out


def _count_origins(fam, service: str | None, routes: Sequence[str], out: Cumulative) -> None:
    """sits_inference_requests_total: replayed requests, and live ones that streamed (low-traffic mode)."""
    for s in fam.samples:
        labels = s.labels
        if not s.name.endswith("_total") or labels.get("route") not in routes \
                or (service is not None and labels.get("service", service) != service):
            continue
        if labels.get(ORIGIN) == ORIGIN_REPLAY:
            out.replayed += s.value
        elif labels.get("stream") == "true":
            out.streamed += s.value


def _prefilter(text: str, wanted: set[str], routes: Sequence[str]) -> str:
    """Only the lines of the wanted families (and of the inference routes): an engine exposes ~180 KB, mostly
    buckets nobody asked for, and prometheus_client's parser is slow (~100 ms for all of it on a busy core)."""
    prefixes = tuple(wanted)
    marks = tuple(f'route="{r}"' for r in routes)
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[2] in wanted:
                keep.append(line)
        elif line.startswith(prefixes) and (not line.startswith(REQUEST_LATENCY) or any(m in line for m in marks)):
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


def diff(new: Cumulative, old: Cumulative) -> Cumulative:
    """new - old per series; a series that went down was reset (its new value is the increase)."""
    out = Cumulative()
    for key, h in new.histograms.items():
        prev = old.histograms.get(key)
        try:
            out.histograms[key] = h if prev is None else h.delta(prev)
        except HistogramError:   # the layout changed: a different build restarted on this endpoint
            out.histograms[key] = h
    reset = new.requests < old.requests
    out.requests = new.requests if reset else new.requests - old.requests
    for name in ("errors", "replayed", "streamed"):
        a, b = getattr(new, name), getattr(old, name)
        setattr(out, name, a if reset or a < b else a - b)
    return out


class ScrapeSource:
    name = "scrape"

    def __init__(self, config: ScrapeConfig | None = None) -> None:
        self.config = config or ScrapeConfig()
        self._history: dict[str, deque[tuple[float, dict[str, Cumulative]]]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(self.config.max_workers, thread_name_prefix="sits-scrape")

    def _session(self) -> requests.Session:
        return thread_session(self._local)

    def scrape(self, url: str, service: str | None, metrics: Sequence[str]) -> Cumulative:
        try:
            r = self._session().get(url.rstrip("/") + "/metrics", timeout=self.config.timeout_s, allow_redirects=False)
        except requests.RequestException as e:
            raise MetricsQueryError(f"GET {url}/metrics failed: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise MetricsQueryError(f"GET {url}/metrics answered {r.status_code}")   # no body: no echo, no redirect
        return parse_exposition(r.text, service, metrics, self.config.routes)

    def window(self, service: str | None, targets: Mapping[str, Target], start: float | None, end: float,
               metrics: Sequence[str] = (REQUEST_LATENCY,), required: Sequence[str] = (), *,
               history_key: str | None = None) -> MetricsWindow:
        """`service` None: every series counts (no `service` label filter); `history_key`: where the scrapes are
        remembered (default: the service; the judge keys them by its URLs)."""
        key = history_key if history_key is not None else service
        urls = {role: t.endpoints for role, t in targets.items() if t.ready and t.endpoints}
        missing = [r for r in required if r not in urls]
        if missing:
            raise NoDataError(f"nothing to scrape for {', '.join(missing)} (not deployed or not ready)")
        queries = {role: " ".join(f"GET {u.rstrip('/')}/metrics" for u in eps) for role, eps in urls.items()}
        flat = [(role, u) for role, eps in urls.items() for u in eps]
        futures = [self._pool.submit(self.scrape, u, service, tuple(metrics)) for _, u in flat]
        now: dict[str, Cumulative] = {}
        errors = []
        for (role, u), f in zip(flat, futures):
            try:
                now[u] = f.result()
            except MetricsQueryError as e:
                errors.append(f"{role}: {e}")
        if errors:  # nothing recorded: the next window diffs against the last complete scrape
            raise MetricsQueryError("; ".join(errors))
        base = self._remember(key, start, end, now)
        if base is None:
            return MetricsWindow(None, end, {}, self.name, queries)
        t0, old = base
        variants = {}
        for role, eps in urls.items():
            parts = [diff(now[u], old[u]) for u in eps if u in old]
            hists: dict[str, HistogramSnapshot] = {}
            for p in parts:
                for key, h in p.histograms.items():
                    hists[key] = hists[key].merge(h) if key in hists else h
            variants[role] = VariantData(hists, sum(p.requests for p in parts), sum(p.errors for p in parts),
                                         replayed=sum(p.replayed for p in parts),
                                         streamed=sum(p.streamed for p in parts))
        return MetricsWindow(t0, end, variants, self.name, queries)

    def _remember(self, service: str, start: float | None, end: float,
                  now: dict[str, Cumulative]) -> tuple[float, dict[str, Cumulative]] | None:
        """Record this scrape; return the one to diff against: taken at `start` (or the first after it), else the
        latest (start None); None when there is none."""
        with self._lock:
            hist = self._history.setdefault(service, deque(maxlen=self.config.history))
            base = None
            if start is None:
                base = hist[-1] if hist else None
            else:
                base = next((e for e in hist if e[0] >= start - _EPS and e[0] < end), None)
            if not hist or end > hist[-1][0]:
                hist.append((end, now))
            return base

    def forget(self, service: str) -> None:
        with self._lock:
            self._history.pop(service, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
