"""OpenTelemetry in the control plane: the worker's span tree (reconcile pass > checks, correctness replay, deployer
calls) and their attributes, one span per API request, and the real OTLP/HTTP exporter against a local receiver."""

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from sits.control_plane.web import create_app
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.wire.tracing import Tracing, TracingConfig
from tests.control_plane.helpers import latency_policy
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer
from tests.fixtures.otlp import OTLPReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
POLICY = latency_policy(steps=(10, 100), check_interval_s=10, warmup_s=0)


def memory_tracing():
    exporter = InMemorySpanExporter()
    return Tracing.from_config(TracingConfig(), exporter=exporter), exporter


def drive(store, worker, until=(Phase.SUCCEEDED, Phase.ROLLED_BACK, Phase.FAILED), clock=None, ticks=40):
    for _ in range(ticks):
        clock[0] += 5
        r = worker.reconcile_rollout("r1")
        if r.phase in until:
            return r
    raise AssertionError(f"rollout still {r.phase} after {ticks} passes")


def named(spans, name):
    return [s for s in spans if s.name == name]


@pytest.mark.parametrize("scale,final,last_action", [(1.0, Phase.SUCCEEDED, "promote"),
                                                     (1.6, Phase.ROLLED_BACK, "rollback")])
def test_worker_span_tree_and_attributes(tmp_path, scale, final, last_action):
    tracing, exporter = memory_tracing()
    t = [0.0]
    with Store(str(tmp_path / "s.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w = Worker(s, InMemoryDeployer(), CannedSource(scale={"chat": scale}), clock=lambda: t[0], tracing=tracing)
        assert drive(s, w, clock=t).phase is final
        spans = exporter.get_finished_spans()
        passes = {p.context.span_id: p for p in named(spans, "sits.reconcile")}
        assert passes and all(p.parent is None and p.attributes["sits.rollout_id"] == "r1" for p in passes.values())
        assert list(passes.values())[-1].attributes["sits.phase"] == final.value
        # every check, deployer call: a child of the pass that made it
        children = [sp for sp in spans if sp.name == "sits.check" or sp.name.startswith("sits.deploy.")]
        assert children and all(c.parent.span_id in passes for c in children)
        assert len({c.context.trace_id for c in children}) == len({c.parent.span_id for c in children})
        deploys = named(spans, "sits.deploy.deploy")
        assert sorted(d.attributes["sits.variant"] for d in deploys) == ["baseline", "canary", "production"]
        canary = next(d for d in deploys if d.attributes["sits.variant"] == "canary")
        assert canary.attributes["sits.kernels"] == "triton-v1" and canary.attributes["sits.result"] == "ok"
        weights = [sp.attributes["sits.weight.canary"] for sp in named(spans, "sits.deploy.set_weights")]
        assert weights[0] == 10
        assert named(spans, f"sits.deploy.{last_action}")[0].attributes["sits.result"] == "ok"
        checks = named(spans, "sits.check")
        assert [c.attributes["sits.check.seq"] for c in checks] == [c["seq"] for c in s.checks("r1")]
        stored = s.checks("r1")[-1]
        last = checks[-1].attributes
        assert last["sits.verdict"] == stored["verdict"]["outcome"] == ("pass" if scale == 1.0 else "fail")
        assert last["sits.decision"] == stored["decision"]
        want = next(r for r in stored["verdict"]["results"] if r["check"].endswith(":p99"))
        key = f"sits.test.{want['check']}.{want['series']}"
        assert f"{key}.delta_rel" in last, sorted(last)
        assert last[f"{key}.delta_rel"] == pytest.approx(want["delta_rel"])
        assert last[f"{key}.ci_low"] <= last[f"{key}.delta_rel"] <= last[f"{key}.ci_high"]
        assert (last[f"{key}.delta_rel"] > 0.4) == (scale > 1)
        p90 = [k for k in last if k.startswith("sits.delta.p90.") and k.endswith(".vs_baseline_rel")]
        assert p90 and all((last[k] > 0.4) == (scale > 1) for k in p90)


def test_a_failing_deploy_marks_its_span(tmp_path):
    tracing, exporter = memory_tracing()
    deployer, t = InMemoryDeployer(), [0.0]
    deployer.fail.add(("chat", "canary"))
    with Store(str(tmp_path / "s.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w = Worker(s, deployer, CannedSource(), clock=lambda: t[0], tracing=tracing)
        w.config.action_backoff_s = 0
        w.reconcile_rollout("r1")
    failed = [sp for sp in named(exporter.get_finished_spans(), "sits.deploy.deploy")
              if sp.attributes["sits.variant"] == "canary"]
    assert len(failed) == 1 + w.config.action_retries
    assert all(sp.attributes["sits.result"] == "DeployError" and sp.status.status_code is StatusCode.ERROR
               for sp in failed)


def test_api_requests_are_server_spans_continuing_traceparent(tmp_path):
    tracing, exporter = memory_tracing()
    with Store(str(tmp_path / "s.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        client = create_app({"TESTING": True, "STORE": s, "TRACING": tracing}).test_client()
        assert client.get("/api/v1/rollouts/r1", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
                          ).status_code == 200
        assert client.get("/api/v1/rollouts/nope").status_code == 404
        assert client.post("/api/v1/rollouts", json={"service": "Bad Name", "kernels": "x"}).status_code == 422
    ok, missing, invalid = exporter.get_finished_spans()
    assert ok.name == "GET /api/v1/rollouts/<rollout_id>" and ok.kind is SpanKind.SERVER
    assert format(ok.context.trace_id, "032x") == TRACE_ID and format(ok.parent.span_id, "016x") == PARENT_ID
    assert ok.attributes["http.route"] == "/api/v1/rollouts/<rollout_id>"
    assert ok.attributes["http.request.method"] == "GET" and ok.attributes["http.response.status_code"] == 200
    assert missing.parent is None and missing.attributes["http.response.status_code"] == 404
    assert invalid.name == "POST /api/v1/rollouts" and invalid.attributes["http.response.status_code"] == 422


def test_tracing_off_by_default_records_nothing(tmp_path):
    t = [0.0]
    with Store(str(tmp_path / "s.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w = Worker(s, InMemoryDeployer(), CannedSource(), clock=lambda: t[0])
        assert not w.tracing.enabled and w.tracing.provider is None
        with w.tracing.span("x") as span:
            assert not span.is_recording()
        w.reconcile_rollout("r1")


def test_otlp_http_exporter_sends_the_worker_spans(tmp_path, monkeypatch):
    receiver = OTLPReceiver()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")   # chosen by the standard variables, as in a Deployment
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    tracing = Tracing.from_flags()
    t = [0.0]
    try:
        with Store(str(tmp_path / "s.db")) as s:
            start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
            w = Worker(s, InMemoryDeployer(), CannedSource(), clock=lambda: t[0], tracing=tracing)
            passes = 0
            while not s.checks("r1") and passes < 20:
                t[0] += 5
                w.reconcile_rollout("r1")
                passes += 1
        assert tracing.provider.force_flush(10_000)
        assert {p for p, _, _ in receiver.received} == {"/v1/traces"}
        assert {c for _, c, _ in receiver.received} == {"application/x-protobuf"}
        resources = [rs for _, _, req in receiver.received for rs in req.resource_spans]
        names = {a.value.string_value for rs in resources for a in rs.resource.attributes if a.key == "service.name"}
        assert names == {"sits-control"}
        spans = [sp for rs in resources for ss in rs.scope_spans for sp in ss.spans]
        by_name = {}
        for sp in spans:
            by_name.setdefault(sp.name, []).append(sp)
        assert len(by_name["sits.reconcile"]) == passes and "sits.check" in by_name and "sits.deploy.deploy" in by_name
        roots = {sp.span_id for sp in by_name["sits.reconcile"]}
        assert all(sp.parent_span_id in roots for sp in by_name["sits.check"] + by_name["sits.deploy.deploy"])
        check_attrs = {a.key: a.value for a in by_name["sits.check"][0].attributes}
        assert check_attrs["sits.verdict"].string_value in ("pass", "inconclusive", "fail")
    finally:
        tracing.shutdown()
        receiver.close()


@pytest.mark.parametrize("kwargs", [{"exporter": "otlp"}, {"exporter": "zipkin"},
                                    {"exporter": "otlp", "otlp_endpoint": "collector:4318"}])
def test_bad_exporter_flags_are_refused(kwargs, monkeypatch):
    for var in ("SITS_OTEL_EXPORTER", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError):
        Tracing.from_flags(kwargs["exporter"], kwargs.get("otlp_endpoint"))


@pytest.mark.parametrize("argv", [["worker"], ["serve", "--no-worker"], ["serve"]])
def test_cli_refuses_an_otlp_exporter_without_endpoint_in_one_line(tmp_path, capsys, monkeypatch, argv):
    from sits.control_plane.cli.main import main

    for var in ("SITS_OTEL_EXPORTER", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    rc = main([*argv, "--store", str(tmp_path / "s.db"), "--otel-exporter", "otlp"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "needs an endpoint" in err, err
