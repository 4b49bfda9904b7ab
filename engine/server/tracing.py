"""OpenTelemetry tracing for the engine server: one span per request, continuing an incoming W3C `traceparent`.

Exporter: "none" (default: no provider, spans are non-recording and cost ~nothing), "console" (JSON lines on stdout),
or "otlp" (OTLP/HTTP protobuf to `otlp_endpoint`, e.g. http://collector:4318): `TracingConfig` and
`build_tracer_provider`, shared with the control plane (sits/wire/tracing.py, which imports neither side).
The server never installs a global provider, so several servers (or tests) in one process keep their spans apart.
"""

from __future__ import annotations

import time
from typing import Mapping

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from sits.wire.tracing import PROPAGATOR


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
        context = PROPAGATOR.extract(carrier=carrier)
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
