"""One span per request, continuing an incoming traceparent; the OTLP/HTTP exporter on the wire."""

from dataclasses import replace

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from sits.wire.tracing import TracingConfig
from tests.engine.server.harness import BASE, RunningServer, http
from tests.fixtures.otlp import OTLPReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _spans_for(server, rid_prefix):
    return [s for s in server.exporter.get_finished_spans()
            if str(s.attributes.get("sits.request_id", "")).startswith(rid_prefix)]


def test_span_continues_traceparent_with_request_attributes(server):
    server.exporter.clear()
    status, _, _ = http("POST", server.url + "/v1/completions",
                        {"model": "tiny", "prompt": "trace me", "max_tokens": 5, "ignore_eos": True},
                        headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-SITS-Tenant": "team-blue",
                                 "X-SITS-Priority": "2"})
    assert status == 200
    (span,) = _spans_for(server, "cmpl-")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
    assert span.kind is SpanKind.SERVER and span.name == "POST /v1/completions"
    a = span.attributes
    assert a["gen_ai.usage.output_tokens"] == 5 and a["gen_ai.usage.input_tokens"] == len("trace me") + 1
    assert a["sits.tenant"] == "team-blue" and a["sits.priority"] == 2
    assert a["sits.kernel_version"] == server.state.runner.engine.kernel_set.version
    assert 0 < a["sits.ttft_s"] < (span.end_time - span.start_time) / 1e9
    assert a["sits.finish_reason"] == "length"


def test_span_without_traceparent_starts_a_new_trace_and_marks_aborts(server):
    server.exporter.clear()
    http("POST", server.url + "/v1/chat/completions",
         {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    (span,) = _spans_for(server, "chatcmpl-")
    assert span.parent is None and span.attributes["sits.tenant"] == "default"
    assert span.status.status_code is not StatusCode.ERROR


def test_otlp_exporter_sends_spans_over_http():
    receiver = OTLPReceiver()
    endpoint = receiver.endpoint  # a base URL: /v1/traces is appended
    s = RunningServer(replace(BASE, otel_exporter="otlp", otlp_endpoint=endpoint), memory_exporter=False)
    try:
        s.wait_ready()
        assert http("POST", s.url + "/v1/completions", {"model": "tiny", "prompt": "wire", "max_tokens": 2},
                    headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})[0] == 200
        s.state.tracer.provider.force_flush()
        path, ctype, req = receiver.received[-1]
        assert path == "/v1/traces" and ctype == "application/x-protobuf"
        spans = [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        assert [sp.trace_id.hex() for sp in spans] == [TRACE_ID]
        assert spans[0].parent_span_id.hex() == PARENT_ID
    finally:
        s.stop()
        receiver.close()


@pytest.mark.parametrize("kwargs,ok", [({"exporter": "none"}, True), ({"exporter": "console"}, True),
                                       ({"exporter": "otlp"}, False), ({"exporter": "jaeger"}, False),
                                       ({"exporter": "otlp", "otlp_endpoint": "collector:4318"}, False)])
def test_tracing_config_validation(kwargs, ok):
    if ok:
        TracingConfig(**kwargs)
    else:
        with pytest.raises(ValueError):
            TracingConfig(**kwargs)
