"""One OpenTelemetry SERVER span per API/UI request of the Flask app (sits/wire/tracing.py has the tracer)."""
from __future__ import annotations

from flask import Flask, g, request
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from sits.wire.tracing import PROPAGATOR, Tracing


def instrument_flask(app: Flask, tracing: Tracing) -> None:
    """One SERVER span per request, continuing an incoming traceparent: named `METHOD /route/<template>`, with
    http.request.method, http.route and http.response.status_code."""
    if not tracing.enabled:
        return

    @app.before_request
    def _start_span():
        carrier = {k: request.headers[k] for k in ("traceparent", "tracestate") if k in request.headers}
        route = request.url_rule.rule if request.url_rule is not None else None
        span = tracing.start_span(f"{request.method} {route}" if route else request.method, kind=SpanKind.SERVER,
                                  context=PROPAGATOR.extract(carrier),
                                  attributes={"http.request.method": request.method, "http.route": route,
                                              "url.path": request.path})
        g.sits_span = span
        g.sits_span_token = otel_context.attach(trace.set_span_in_context(span))

    @app.after_request
    def _status(resp):
        span = g.get("sits_span")
        if span is not None:
            span.set_attribute("http.response.status_code", resp.status_code)
            if resp.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
        return resp

    @app.teardown_request
    def _end_span(exc):
        span = g.pop("sits_span", None)
        if span is None:
            return
        if exc is not None:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.end()
        otel_context.detach(g.pop("sits_span_token"))
