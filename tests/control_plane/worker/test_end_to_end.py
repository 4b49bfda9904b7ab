"""End to end on this machine: the real LocalDeployer (engine processes behind the weighted router), load through the
router, the real worker, store and analysis. A kernel version with injected latency rolls back on its own and a good
one is promoted: with direct scrape, and with the Prometheus source against a real Prometheus scraping the variants."""

import pytest

from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.notify import WebhookConfig, WebhookNotifier
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig, PrometheusSource
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck, Policy
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig
from sits.control_plane.service.rollouts import start_rollout
from tests.fixtures.prometheus import DeployerDiscovery
from tests.waiting import wait_for

from .test_notify import Receiver

SVC = "e2e"
# as short as the statistics allow: one step at 50 %, a check every 3 s, P90 and the error rate
FAST = Policy(steps=(50,), check_interval_s=3.0, warmup_s=1.0,
              checks=(MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.35),
                      MetricCheck(ERROR_RATE, max_abs_delta=0.02)),
              min_samples=60, min_tail_samples=2, failure_limit=2, inconclusive_limit=40,
              on_inconclusive="rollback", max_duration_s=240.0, ready_timeout_s=240.0, min_error_samples=60,
              correctness={"enabled": False},   # latency only here; the gate: test_correctness_end_to_end.py
              statistics="fixed")   # the wiring is tested here (per-look: seconds); sequential: the demo's test
SLOW = ("--fault-latency-ms", "300")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Production of service e2e behind the router, with 30 requests/s of load through it."""
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path_factory.mktemp("variants")), cpu_threads=1,
                                  ready_timeout_s=240))
    d.deploy(VariantSpec(SVC, "production", "torch"))
    load = LoadGenerator(d.router_url(SVC), rate=30, threads=12, max_tokens=2).start()
    yield d, load
    load.stop()
    d.close()


def run(store, worker, args, timeout=180.0):
    r = start_rollout(store, SVC, "torch", "torch", FAST, DeploySpec(canary_faults=args))
    worker.start()

    def ended():
        got = store.get(r.id)
        return got if not got.active and not store.pending_actions(r.id) else None
    try:
        return wait_for(lambda: f"rollout to end, still {store.get(r.id).phase.value}: "
                                f"{[e['message'] for e in store.events(r.id)]}", ended, timeout, interval=0.25)
    finally:
        worker.stop()


def assert_evidence(store, r, final):
    checks = store.checks(r.id)
    assert [c["seq"] for c in checks] == list(range(1, r.checks + 1))
    last = checks[-1]
    p90 = next(x for x in last["verdict"]["results"] if x["check"] == "http_request_duration_seconds:p90")
    n_canary = last["variants"]["canary"]["requests"]
    assert p90["n_canary"] >= FAST.min_samples and n_canary >= p90["n_canary"]
    assert sum(last["variants"]["canary"]["histograms"][p90["series"]]["counts"][-1:]) == p90["n_canary"]
    if final is Phase.ROLLED_BACK:
        assert last["decision"] == "rollback" and p90["outcome"] == "fail"
        assert p90["canary"] > p90["target"] + 0.2 and p90["ci_low"] > 0.35   # 300 ms injected, seen with confidence
    else:
        assert last["decision"] == "promote" and p90["outcome"] == "pass" and p90["ci_high"] <= 0.35
    return last


def assert_deployed(deployer, final):
    st = deployer.status(SVC)
    assert set(st) == {"production"} and st["production"].ready     # canary and baseline gone either way
    assert "kernels torch" in st["production"].message and "weight 100%" in st["production"].message


def test_scrape_bad_canary_rolls_back_good_one_is_promoted(world, tmp_path):
    deployer, load = world
    store, source, rx = Store(str(tmp_path / "s.db")), ScrapeSource(), Receiver()
    hook = WebhookNotifier(WebhookConfig(rx.url, format="json"))
    mk = lambda: Worker(store, deployer, source, hook, config=WorkerConfig(interval_s=1.0))   # noqa: E731
    bad = run(store, mk(), SLOW)
    assert bad.phase is Phase.ROLLED_BACK, bad.reason
    last = assert_evidence(store, bad, Phase.ROLLED_BACK)
    assert last["source"] == "scrape" and last["queries"]["canary"].startswith("GET http://127.0.0.1:")
    assert_deployed(deployer, Phase.ROLLED_BACK)
    good = run(store, mk(), ())
    assert good.phase is Phase.SUCCEEDED, good.reason
    assert_evidence(store, good, Phase.SUCCEEDED)
    assert_deployed(deployer, Phase.SUCCEEDED)
    assert load.summary(3.0)["errors"] == 0
    assert hook.flush(10)
    events = {r: [b["event"] for b in rx.bodies if b["rollout_id"] == r] for r in (bad.id, good.id)}
    assert events[bad.id] == ["started", "step", "rolling_back", "rolled_back"]
    assert events[good.id] == ["started", "step", "promoting", "promoted"]
    hook.close()
    rx.close()
    source.close()
    store.close()


def test_prometheus_bad_canary_rolls_back_good_one_is_promoted(world, tmp_path, prometheus_factory):
    deployer, _ = world
    prom = prometheus_factory()
    sd = tmp_path / "targets.json"
    disco = DeployerDiscovery(deployer, SVC, sd)
    prom.scrape_file_sd(sd)
    prom.wait_for('up{job="sits"}', lambda r: len(r) == 1 and r[0]["value"][1] == "1", timeout=30)
    store = Store(str(tmp_path / "p.db"))
    source = PrometheusSource(PrometheusConfig(prom.url, lag_s=1.0))
    mk = lambda: Worker(store, deployer, source, config=WorkerConfig(interval_s=2.0))   # noqa: E731
    try:
        bad = run(store, mk(), SLOW)
        assert bad.phase is Phase.ROLLED_BACK, bad.reason
        last = assert_evidence(store, bad, Phase.ROLLED_BACK)
        assert last["source"] == "prometheus" and "increase(" in last["queries"]["canary:" + REQUEST_LATENCY]
        assert_deployed(deployer, Phase.ROLLED_BACK)
        good = run(store, mk(), ())
        assert good.phase is Phase.SUCCEEDED, good.reason
        assert_evidence(store, good, Phase.SUCCEEDED)
        assert_deployed(deployer, Phase.SUCCEEDED)
    finally:
        disco.stop()
        source.close()
        store.close()
