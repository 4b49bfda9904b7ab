"""OpenTelemetry set-up shared by the engine and the control plane: exporter selection, the tracer provider, the W3C
`traceparent` propagator, and the control plane's tracer. The control plane spans each reconcile pass, check, deploy
action and API request and sends `traceparent` on its requests to engines (correctness probes, replays, the demo's
load generator), so the engine's request spans (engine/server/tracing.py) continue the same trace; the router forwards
the header untouched.

Exporter selection (`TracingConfig`, `build_tracer_provider`): "none" (default: non-recording spans, nothing
exported, no traceparent sent), "console" or "otlp" (OTLP/HTTP protobuf). `sits-engine serve` and `sits-control
worker|serve` take `--otel-exporter/--otlp-endpoint`, else SITS_OTEL_EXPORTER / OTEL_TRACES_EXPORTER and
OTEL_EXPORTER_OTLP_ENDPOINT. No global provider is installed: several servers, workers or apps in one process (tests)
keep their spans apart.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Iterator, Mapping
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["EXPORTERS", "PROPAGATOR", "SpanKind", "Tracing", "TracingConfig", "build_tracer_provider",
           "clean_attributes", "inject", "set_attributes"]
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
        attrs = clean_attributes(attributes) if attributes and self.provider is not None else None
        with self._tracer.start_as_current_span(name, kind=kind, attributes=attrs,
                                                record_exception=True, set_status_on_exception=True) as s:
            yield s

    def start_span(self, name: str, *, kind: SpanKind, context=None,
                   attributes: Mapping[str, object] | None = None) -> trace.Span:
        attrs = clean_attributes(attributes) if attributes and self.provider is not None else None
        return self._tracer.start_span(name, context=context, kind=kind, attributes=attrs)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def set_attributes(span: trace.Span, attributes: Mapping[str, object]) -> None:
    if span.is_recording():
        span.set_attributes(clean_attributes(attributes))


def clean_attributes(attributes: Mapping[str, object]) -> dict:
    """OTel attribute values are str/bool/int/float: None and NaN are left out, enums give their value."""
    out = {}
    for k, v in attributes.items():
        v = getattr(v, "value", v)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        out[k] = v if isinstance(v, (str, bool, int, float)) else str(v)
    return out


def inject(headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """`headers` plus the current span's `traceparent` (and `tracestate`); unchanged when no span records."""
    out = dict(headers or {})
    PROPAGATOR.inject(out)
    return out
