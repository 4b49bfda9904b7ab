"""One trace across the control plane and a real engine: the correctness gate's replay requests and the load
generator's requests (through the weighted router) carry the control plane's traceparent, and the engine's request
spans continue it."""
import threading

import pytest

from sits.control_plane.router.config import RouterConfig
from sits.control_plane.router.proxy import WeightedRouter
from sits.control_plane.analysis import Policy
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from tests.control_plane.test_otel_spans import memory_tracing, named
from tests.control_plane.worker.support import CannedSource, FixedEndpointDeployer
from tests.engine.server.harness import BASE, RunningServer


@pytest.fixture(scope="module")
def engine():
    s = RunningServer(BASE).wait_ready()
    yield s
    s.stop()


def test_correctness_replay_spans_join_the_reconcile_trace(tmp_path, engine):
    tracing, exporter = memory_tracing()
    policy = Policy(steps=(10, 100), check_interval_s=10, warmup_s=0,
                    correctness={"prompt_set": ["The canary", "A kernel"], "max_tokens": 3, "compare_tokens": 2,
                                 "concurrency": 2})
    t = [0.0]
    engine.exporter.clear()
    with Store(str(tmp_path / "s.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", policy, now=0.0, rollout_id="r1")
        w = Worker(s, FixedEndpointDeployer(engine.url), CannedSource(), clock=lambda: t[0], tracing=tracing)
        for _ in range(6):
            t[0] += 5
            w.reconcile_rollout("r1")
            if s.checks("r1"):
                break
        assert s.checks("r1")[0]["source"] == "correctness"
    (gate,) = named(exporter.get_finished_spans(), "sits.correctness")
    assert gate.attributes["sits.correctness.verdict"] == "pass"
    assert gate.attributes["sits.correctness.requests"] == 8   # 4 per prompt
    engine_spans = [sp for sp in engine.exporter.get_finished_spans() if sp.name == "POST /v1/completions"]
    assert len(engine_spans) == 8
    assert {sp.context.trace_id for sp in engine_spans} == {gate.context.trace_id}
    assert {sp.parent.span_id for sp in engine_spans} == {gate.context.span_id}
    (check,) = named(exporter.get_finished_spans(), "sits.check")
    assert check.attributes["sits.check.source"] == "correctness"
    assert check.attributes["sits.correctness.verdict"] == "pass"
    assert check.attributes["sits.correctness.prompts"] == 2


def test_load_generator_requests_through_the_router_join_their_client_spans(engine):
    tracing, exporter = memory_tracing()
    router = WeightedRouter(RouterConfig(service="chat"))
    router.set_backends("production", [engine.url])
    router.set_weights({"production": 100})
    router.start()
    engine.exporter.clear()
    try:
        load = LoadGenerator(router.url, rate=50, threads=1, max_tokens=2, tracing=tracing).start()
        tick = threading.Event()
        for _ in range(600):   # at most ~30 s
            if load.finished >= 3:
                break
            tick.wait(0.05)
        load.stop()
    finally:
        router.stop()
    clients = {sp.context.span_id: sp for sp in exporter.get_finished_spans() if sp.name == "POST /v1/completions"}
    assert len(clients) >= 3 and all(sp.attributes["http.response.status_code"] == 200 for sp in clients.values())
    served = [sp for sp in engine.exporter.get_finished_spans() if sp.name == "POST /v1/completions"]
    assert len(served) == len(clients)
    for sp in served:
        parent = clients[sp.parent.span_id]   # KeyError: the engine did not continue the load generator's span
        assert sp.context.trace_id == parent.context.trace_id
