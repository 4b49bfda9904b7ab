"""The SSE generator on its own: outputs that piled up while the event loop was busy go out as one chunk."""

import asyncio
import json
import time
from types import SimpleNamespace

from sits.engine.server.metrics import EngineMetrics, MetricLabels
from sits.engine.outputs import RequestOutput
from sits.engine.server.handlers import Tracker, _stream
from sits.engine.server.protocol import parse_completion
from sits.engine.core.runner import Output, Rejected
from sits.engine.server.tracing import RequestTracer


def _state():
    return SimpleNamespace(metrics=EngineMetrics(MetricLabels("t", "s", "1.0.0")),
                           tracer=RequestTracer(None, kernel_version="1.0.0", kernel_set="torch", model="tiny"),
                           system_fingerprint="torch-1.0.0")


def _out(text, n, finished=False):
    return Output(RequestOutput("r", [65], text, finished, "length" if finished else None, 3, n, 0, None, "default"),
                  time.perf_counter())


async def _events(items, *, fill_first: bool):
    state = _state()
    greq = parse_completion({"model": "tiny", "prompt": "x", "stream": True,
                             "stream_options": {"include_usage": True}})
    tracker = Tracker(state, state.tracer.start_request("t", {}, tenant="a", priority=0, request_id="r"),
                      time.perf_counter(), 3)
    q: asyncio.Queue = asyncio.Queue()
    if fill_first:
        for item in items:
            q.put_nowait(item)
    else:
        async def feed():
            for item in items:
                q.put_nowait(item)
                await asyncio.sleep(0.01)
        asyncio.ensure_future(feed())
    return [e async for e in _stream(greq, "r", 0, q, tracker, state)], tracker


def _texts(events):
    msgs = [json.loads(e[6:]) for e in events if e.startswith(b"data: {")]
    return [m["choices"][0]["text"] for m in msgs if m.get("choices")]


def test_piled_up_outputs_are_coalesced():
    items = [_out("a", 1), _out("b", 2), _out("c", 3, finished=True)]
    events, tracker = asyncio.run(_events(items, fill_first=True))
    assert _texts(events) == ["abc"]
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 3 and events[-1] == b"data: [DONE]\n\n"
    assert tracker.closed and tracker.finish_reason == "length"


def test_outputs_arriving_one_by_one_are_sent_one_by_one():
    items = [_out("a", 1), _out("b", 2), _out("c", 3, finished=True)]
    events, _ = asyncio.run(_events(items, fill_first=False))
    assert _texts(events) == ["a", "b", "c"]


def test_engine_failure_mid_stream_ends_with_an_error_event():
    events, tracker = asyncio.run(_events([_out("a", 1), Rejected(RuntimeError("server shutting down"))],
                                          fill_first=True))
    assert _texts(events) == ["a"] and json.loads(events[-1][6:])["error"]["type"] == "service_unavailable"
    assert tracker.closed and b"[DONE]" not in events[-1]
