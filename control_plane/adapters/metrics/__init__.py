"""The `MetricsSource` protocol: the histograms of each variant of a service over a time window.

Two implementations: `scrape.ScrapeSource` (GET each variant's /metrics, the embedded default) and
`prometheus.PrometheusSource` (PromQL over Prometheus' HTTP API). Both return WINDOW DELTAS (not cumulative counts)
per role, replicas summed, counter resets handled, as `VariantData` of the analysis core.

Errors are a few named exceptions; the worker turns any `MetricsError` into an inconclusive window (no data is never a
pass): `NoDataError` (a variant the analysis needs has no series), `MultipleSeriesError` (a query that must return one
series per label set returned more), `MetricsQueryError` (transport, HTTP or parse failures).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, runtime_checkable

from sits.control_plane.analysis import REQUEST_LATENCY, VariantData

# The inference routes whose latency and errors are compared (health checks and scrapes would dilute them).
INFERENCE_ROUTES = ("/v1/completions", "/v1/chat/completions")


class MetricsError(Exception):
    """The metrics source could not produce this window; the message says which variant/query and why."""


class NoDataError(MetricsError):
    """A variant (or a query) that the analysis needs returned no series at all."""


class MultipleSeriesError(MetricsError):
    """A query returned several series where one per label set was expected (labels collide, e.g. two jobs)."""


class MetricsQueryError(MetricsError):
    """Transport, HTTP, authentication or parse failure (after retries)."""


@dataclass(slots=True, frozen=True)
class Target:
    """Where one variant can be measured: its replicas' base URLs (direct scrape) and readiness."""
    role: str
    endpoints: tuple[str, ...] = ()
    ready: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(self.endpoints))


@dataclass(slots=True, frozen=True)
class MetricsWindow:
    """What each variant did in [start, end]. start is None when the source has nothing to diff against yet (first
    scrape after a (re)start): `variants` is then empty and the window only sets a baseline."""
    start: float | None
    end: float
    variants: Mapping[str, VariantData] = field(default_factory=dict)
    source: str = ""
    queries: Mapping[str, str] = field(default_factory=dict)   # evidence: what was asked of whom


@runtime_checkable
class MetricsSource(Protocol):
    name: str

    def window(self, service: str, targets: Mapping[str, Target], start: float | None, end: float,
               metrics: Sequence[str] = (REQUEST_LATENCY,), required: Sequence[str] = ()) -> MetricsWindow:
        """Window deltas per role since `start` (the end of the last window the caller counted) until `end`.
        `required`: roles whose absence of data is a `NoDataError`."""
        ...

    def close(self) -> None: ...

