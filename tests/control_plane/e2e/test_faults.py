"""Faults under steady mixed load (Poisson, streaming and plain, every token verified) with real engines behind the
LocalDeployer's router and the real worker: a canary that crashes mid-rollout is rolled back within 30 s while
production keeps serving; Prometheus stopped mid-rollout makes checks inconclusive (traffic held, never promoted
blind) until it returns; and through weight changes, a rollback and a promotion no request is lost."""
import os
import signal
import time

import pytest

from sits.control_plane.adapters.deploy import VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig, PrometheusSource
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane.analysis import Policy
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.demo.traffic import LengthDist, TrafficMix
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig
from tests.fixtures.prometheus import DeployerDiscovery

from tests.waiting import wait_for

from .support import FAST, SLOW, engine_pids

SVC = "faults"
MIX = TrafficMix(LengthDist(32, 0.7, 4, 160), LengthDist(2, 0.5, 1, 8), stream_fraction=0.4, chat_fraction=0.3)

@pytest.fixture(scope="module")
def deployer(tmp_path_factory):
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path_factory.mktemp("variants")), cpu_threads=1,
                                  ready_timeout_s=240))
    d.deploy(VariantSpec(SVC, "production", "torch"))
    yield d
    d.close()
    assert not engine_pids(SVC)

def load(d, seed, rate=25.0):
    # the pin token: the router names the variant that answered (counted per variant below) only to trusted callers
    return LoadGenerator(d.router_url(SVC), rate=rate, threads=10, mix=MIX, seed=seed, pin_token=d.pin_token).start()

def finish(store, rid, timeout=180.0):
    def done():
        r = store.get(rid)
        return r if not r.active and not store.pending_actions(rid) else None
    try:
        return wait_for(f"rollout {rid} to end", done, timeout)
    except AssertionError as e:   # say where it stood: the phase and the newest events, not only "not after N s"
        r = store.get(rid)
        tail = "\n".join(f"  {ev['kind']}: {ev['message']}" for ev in store.events(rid)[-12:])
        raise AssertionError(f"{e}\nphase {r.phase.value}, weight {r.weight}, checks {r.checks}; newest events:\n"
                             f"{tail}") from None

@pytest.mark.slow
def test_a_canary_that_crashes_is_rolled_back_within_30s_while_production_serves(deployer, tmp_path):
    # many steps and many samples needed: the canary cannot pass before it is killed
    policy = Policy.from_dict({**FAST.to_dict(), "steps": [10, 25, 50], "min_samples": 400})
    store = Store(str(tmp_path / "c.db"))
    worker = Worker(store, deployer, ScrapeSource(), config=WorkerConfig(interval_s=1.0)).start()
    gen = load(deployer, seed=1)
    try:
        r = start_rollout(store, SVC, "torch", "torch", policy, DeploySpec())
        wait_for("the first check", lambda: store.get(r.id).checks >= 1, 120)
        (pid,) = engine_pids(SVC, "canary")
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)                                   # the canary crashes
        got = finish(store, r.id, 60)
    finally:
        gen.stop()
        worker.stop()
    assert got.phase is Phase.ROLLED_BACK and "canary" in got.reason, got.reason
    rolled_back = next(e["at"] for e in store.events(r.id) if "-> rolled_back:" in e["message"])
    assert rolled_back - killed_at < 30                               # the rollout's own record of it
    counts = gen.counts()
    assert counts["production"]["failed"] == 0 and counts["production"]["answered"] > 50   # production never stopped
    assert counts["baseline"]["failed"] == 0
    assert set(deployer.status(SVC)) == {"production"}
    store.close()


@pytest.mark.slow
def test_prometheus_stopped_holds_the_canary_until_it_returns(deployer, tmp_path, prometheus_factory):
    prom = prometheus_factory()
    sd = tmp_path / "targets.json"
    disco = DeployerDiscovery(deployer, SVC, sd)
    # every second, a second to answer: an engine renders ~750 histogram lines per scrape (~18 ms of CPU idle); CI at
    # 08e5e1d saw a variant without series for 13 s after the restart (a 500 ms timeout passed under load is one
    # explanation: the failure message now lists each target's health)
    prom.scrape_file_sd(sd, interval="1s")
    # a wide p90 limit: the test is about the outage, and identical engines on 2 busy cores can differ by ~30 % for
    # minutes (a CI run at e9fe50b paused after 40 inconclusive checks at the fixed +35 %)
    checks = [dict(c, max_rel_delta=1.0) if c.get("quantile") == 0.9 else c for c in FAST.to_dict()["checks"]]
    policy = Policy.from_dict({**FAST.to_dict(), "checks": checks, "min_samples": 150, "on_inconclusive": "pause"})
    store = Store(str(tmp_path / "p.db"))
    source = PrometheusSource(PrometheusConfig(prom.url, lag_s=1.0, timeout_s=1.0, retries=0))
    worker = Worker(store, deployer, source, config=WorkerConfig(interval_s=1.0)).start()
    gen = load(deployer, seed=2)
    try:
        r = start_rollout(store, SVC, "torch", "torch", policy, DeploySpec())
        wait_for("progressing", lambda: store.get(r.id).phase is Phase.PROGRESSING, 120)
        os.kill(prom.proc.pid, signal.SIGSTOP)                         # Prometheus stops answering
        stopped_at = store.get(r.id).checks
        wait_for("three checks without Prometheus", lambda: store.get(r.id).checks >= stopped_at + 3, 60)
        during = store.check_summaries(r.id, since_seq=stopped_at)
        held = store.get(r.id)
        os.kill(prom.proc.pid, signal.SIGCONT)                         # ... and is back
        try:
            got = finish(store, r.id, 120)
        except AssertionError as e:   # where the data went: Prometheus' view of each engine, and the traffic sent
            raise AssertionError(f"{e}\nscrape targets:\n{prom.targets_health()}\nload: {gen.counts()}; "
                                 f"last 10 s: {gen.summary()}") from None
    finally:
        os.kill(prom.proc.pid, signal.SIGCONT)
        gen.stop()
        worker.stop()
        disco.stop()
        source.close()
    assert all(c["outcome"] == "inconclusive" and c["decision"] == "hold" for c in during[1:]), \
        [(c["seq"], c["outcome"], c["decision"]) for c in during]
    assert held.phase is Phase.PROGRESSING and held.weight == 50                # traffic held where it was
    assert any(e["kind"] == "metrics" and "prometheus" in e["message"] for e in store.events(r.id))
    assert got.phase is Phase.SUCCEEDED, got.reason                            # resumed once it answered again
    last = store.checks(r.id)[-1]
    p90 = next(x for x in last["verdict"]["results"]
               if x["check"].endswith(":p90") and 'route="/v1/completions"' in x["series"])
    assert last["decision"] == "promote" and p90["outcome"] == "pass" and p90["n_canary"] >= policy.min_samples
    assert gen.counts()["production"]["failed"] == 0
    store.close()

@pytest.mark.slow
def test_no_request_lost_through_weight_changes_rollback_and_promotion(deployer, tmp_path):
    store = Store(str(tmp_path / "n.db"))
    worker = Worker(store, deployer, ScrapeSource(), config=WorkerConfig(interval_s=1.0)).start()
    gen = load(deployer, seed=3)
    try:
        bad = finish(store, start_rollout(store, SVC, "torch", "torch", FAST, DeploySpec(canary_faults=SLOW)).id)
        good = finish(store, start_rollout(store, SVC, "torch", "torch", FAST, DeploySpec()).id)
    finally:
        gen.stop()
        worker.stop()
    assert bad.phase is Phase.ROLLED_BACK and good.phase is Phase.SUCCEEDED, (bad.reason, good.reason)
    counts = gen.counts()
    assert set(counts) == {"production", "baseline", "canary"}
    for variant, c in counts.items():
        assert c["failed"] == 0 and c["answered"] > 0, (variant, c)          # answered, every token verified
    assert gen.sent == gen.finished == sum(c["answered"] for c in counts.values())
    kinds = {k for (_, k, _) in gen.tally.requests}
    assert {"completion", "completion+stream", "chat", "chat+stream"} <= kinds
    store.close()
