"""OpenTelemetry tracing for the engine server: one span per request, continuing an incoming W3C `traceparent`.

Exporter: "none" (default: no provider, spans are non-recording and cost ~nothing), "console" (JSON lines on stdout),
or "otlp" (OTLP/HTTP protobuf to `otlp_endpoint`, e.g. http://collector:4318). The server never installs a global
provider, so several servers (or tests) in one process keep their spans apart.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXPORTERS = ("none", "console", "otlp")
_PROPAGATOR = TraceContextTextMapPropagator()


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


class RequestTracer:
    """Starts one SERVER span per request; the handler fills in token counts, TTFT and the outcome."""

    def __init__(self, provider: TracerProvider | None, *, kernel_version: str, kernel_set: str, model: str) -> None:
        self.provider = provider
        self._tracer = (provider or trace.NoOpTracerProvider()).get_tracer("sits.engine.server")
        self._static = {"sits.kernel_version": kernel_version, "sits.kernel_set": kernel_set,
                        "gen_ai.request.model": model}

    def start_request(self, name: str, headers: Mapping[str, str], *, tenant: str, priority: int,
                      request_id: str) -> trace.Span:
        # headers: a case-insensitive mapping (starlette Headers); only traceparent/tracestate are read
        carrier = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
        context = _PROPAGATOR.extract(carrier=carrier)
        attrs = {**self._static, "sits.tenant": tenant, "sits.priority": priority, "sits.request_id": request_id}
        return self._tracer.start_span(name, context=context, kind=SpanKind.SERVER, attributes=attrs,
                                       start_time=time.time_ns())

    @staticmethod
    def finish(span: trace.Span, *, prompt_tokens: int, output_tokens: int, ttft_s: float | None,
               finish_reason: str | None, error: str | None = None) -> None:
        if span.is_recording():
            span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            if ttft_s is not None:
                span.set_attribute("sits.ttft_s", ttft_s)
            if finish_reason is not None:
                span.set_attribute("sits.finish_reason", finish_reason)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
