"""OpenTelemetry in the control plane: spans for each reconcile pass, check, deploy action and API request, and the
W3C `traceparent` on the requests the control plane sends (correctness replays, the demo's load generator), so the
engine's request spans (engine/tracing.py) continue the same trace; the router forwards the header untouched.

Exporter selection (`TracingConfig`, `build_tracer_provider`, shared with the engine): "none" (default:
non-recording spans, nothing exported, no traceparent sent), "console" or "otlp" (OTLP/HTTP protobuf). `sits-control worker|serve
--otel-exporter/--otlp-endpoint`, else SITS_OTEL_EXPORTER / OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP_ENDPOINT.
No global provider is installed: several workers or apps in one process (tests) keep their spans apart.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Mapping
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from sits.control_plane.rollout import Check

__all__ = ["EXPORTERS", "PROPAGATOR", "SpanKind", "Tracing", "TracingConfig", "check_attributes", "inject",
           "set_attributes"]
PROPAGATOR = TraceContextTextMapPropagator()
EXPORTERS = ("none", "console", "otlp")


@dataclass(slots=True)
class TracingConfig:
    exporter: str = "none"
    otlp_endpoint: str | None = None
    service_name: str = "sits-engine"

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(f"unknown OpenTelemetry exporter {self.exporter!r}; choose one of {', '.join(EXPORTERS)}")
        if self.exporter == "otlp":
            if not self.otlp_endpoint:
                raise ValueError("the otlp exporter needs an endpoint (--otlp-endpoint or OTEL_EXPORTER_OTLP_ENDPOINT)")
            if urlsplit(self.otlp_endpoint).scheme not in ("http", "https"):
                raise ValueError(f"OTLP endpoint must be an http(s) URL, got {self.otlp_endpoint!r}")

    @classmethod
    def from_env(cls, exporter: str | None = None, otlp_endpoint: str | None = None,
                 service_name: str = "sits-engine") -> "TracingConfig":
        """Flags win over SITS_OTEL_EXPORTER / OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT."""
        exporter = exporter or os.environ.get("SITS_OTEL_EXPORTER") or os.environ.get("OTEL_TRACES_EXPORTER") or "none"
        otlp_endpoint = (otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                         or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
        return cls(exporter=exporter, otlp_endpoint=otlp_endpoint, service_name=service_name)


def _otlp_traces_url(endpoint: str) -> str:
    # OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the signal path is appended when none is given.
    parts = urlsplit(endpoint)
    return endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


def build_tracer_provider(config: TracingConfig, *, resource_attrs: Mapping[str, str] | None = None,
                          exporter: SpanExporter | None = None) -> TracerProvider | None:
    """A provider for `config`, or None for exporter "none". `exporter` (e.g. an in-memory one) overrides config."""
    if exporter is None and config.exporter == "none":
        return None
    resource = Resource.create({"service.name": config.service_name, **(resource_attrs or {})})
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif config.exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=_otlp_traces_url(config.otlp_endpoint))))
    return provider




class Tracing:
    """The control plane's tracer: `Tracing.from_config(TracingConfig.from_env(...))`, or `Tracing()` (off)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self._tracer = (provider or trace.NoOpTracerProvider()).get_tracer("sits.control_plane")

    @classmethod
    def from_config(cls, config: TracingConfig, *, exporter: SpanExporter | None = None) -> "Tracing":
        """`exporter` (e.g. the SDK's InMemorySpanExporter) overrides the one `config` names."""
        return cls(build_tracer_provider(config, exporter=exporter))

    @classmethod
    def from_flags(cls, exporter: str | None = None, otlp_endpoint: str | None = None) -> "Tracing":
        """`--otel-exporter` / `--otlp-endpoint` over the environment (ValueError for a bad combination)."""
        return cls.from_config(TracingConfig.from_env(exporter, otlp_endpoint, service_name="sits-control"))

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    @contextlib.contextmanager
    def span(self, name: str, *, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, object] | None = None) -> Iterator[trace.Span]:
        """A span that is current inside the block (children and `inject()` see it); an exception marks it ERROR
        and is re-raised."""
        # no provider (exporter "none"): non-recording spans, so the attributes are not even cleaned
        attrs = _clean(attributes) if attributes and self.provider is not None else None
        with self._tracer.start_as_current_span(name, kind=kind, attributes=attrs,
                                                record_exception=True, set_status_on_exception=True) as s:
            yield s

    def start_span(self, name: str, *, kind: SpanKind, context=None,
                   attributes: Mapping[str, object] | None = None) -> trace.Span:
        attrs = _clean(attributes) if attributes and self.provider is not None else None
        return self._tracer.start_span(name, context=context, kind=kind, attributes=attrs)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def set_attributes(span: trace.Span, attributes: Mapping[str, object]) -> None:
    if span.is_recording():
        span.set_attributes(_clean(attributes))


def _clean(attributes: Mapping[str, object]) -> dict:
    """OTel attribute values are str/bool/int/float: None and NaN are left out, enums give their value."""
    out = {}
    for k, v in attributes.items():
        v = getattr(v, "value", v)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out[k] = v if isinstance(v, (str, bool, int, float)) else str(v)
    return out


def check_attributes(check: "Check") -> dict[str, object]:
    """A check's verdict as span attributes: outcome, decision, reason; per test (check name and series) the
    relative delta with its interval; the shown P90/P99 deltas vs baseline and production; the correctness gate's
    verdict and figures when the check is the gate's."""
    v = check.verdict
    out: dict[str, object] = {"sits.check.seq": check.seq, "sits.check.source": check.source,
                              "sits.step": check.step, "sits.weight": check.weight, "sits.verdict": v.outcome,
                              "sits.decision": check.decision, "sits.reason": v.reason[:500],
                              "sits.compare_to": v.compare_to, "sits.guard": v.guard, "sits.need_more": v.need_more}
    for t in v.results:
        key = f"sits.test.{t.check}.{t.series}"
        out.update({f"{key}.outcome": t.outcome, f"{key}.delta_rel": t.delta_rel, f"{key}.ci_low": t.ci_low,
                    f"{key}.ci_high": t.ci_high, f"{key}.n_canary": t.n_canary})
    for d in v.deltas:
        if d.quantile in (0.9, 0.99):
            key = f"sits.delta.p{d.quantile * 100:g}.{d.series}"
            out.update({f"{key}.vs_baseline_rel": d.vs_baseline_rel, f"{key}.vs_production_rel": d.vs_production_rel})
    c = v.correctness
    if c is not None:
        out.update({"sits.correctness.verdict": c.outcome, "sits.correctness.reason": c.reason[:500],
                    "sits.correctness.prompts": c.prompts, "sits.correctness.identical_fraction":
                    c.identical_fraction, "sits.correctness.top1_agreement": c.top1_agreement,
                    "sits.correctness.drift_max": c.drift_max})
    return _clean(out)


def inject(headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """`headers` plus the current span's `traceparent` (and `tracestate`); unchanged when no span records."""
    out = dict(headers or {})
    PROPAGATOR.inject(out)
    return out
