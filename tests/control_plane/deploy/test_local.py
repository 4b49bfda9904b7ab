"""LocalDeployer against real `sits-engine serve` processes (tiny model, CPU) behind the weighted router."""
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy import Deployer, DeployError, DeployNotFoundError, VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer

SVC = "chat"
BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "temperature": 0}
CANARY_ARGS = ("--seed", "7", "--fault-token-latency-ms", "10")  # a distinct spec; slow enough to be caught in flight


def spec(role, **kw):
    return VariantSpec(service=SVC, role=role, kernels="torch", **kw)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path_factory.mktemp("local")), cpu_threads=1,
                                  ready_timeout_s=240))
    # the three variants start in parallel (one lock per role)
    specs = [spec("production"), spec("baseline"), spec("canary", args=CANARY_ARGS)]
    errors = []
    threads = [threading.Thread(target=lambda s=s: _catch(errors, d.deploy, s)) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        d.close()
        raise errors[0]
    yield d
    d.close()


def _catch(errors, fn, *a):
    try:
        fn(*a)
    except BaseException as e:
        errors.append(e)


def engine_requests(url: str) -> float:
    """Completions counted by the engine itself (http_request_duration_seconds_count, route /v1/completions)."""
    n = 0.0
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name == "http_request_duration_seconds_count" and s.labels.get("route") == "/v1/completions":
                n += s.value
    return n


async def fire(url: str, n: int, concurrency: int = 12, during=None, headers=None) -> list[httpx.Response]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as c:
        async def one(i):
            async with sem:
                return await c.post(url + "/v1/completions", json=BODY, headers=headers)
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        if during is not None:
            await during()
        return await asyncio.gather(*tasks)


def trusted(local: LocalDeployer) -> dict:
    return {"X-SITS-Pin-Token": local.pin_token}


def test_is_a_deployer_and_reports_ready_variants(local):
    assert isinstance(local, Deployer)
    st = local.status(SVC)
    assert set(st) == {"production", "baseline", "canary"}
    for role, s in st.items():
        assert s.ready and s.replicas == 1 and s.ready_replicas == 1, s.message
        assert s.endpoints == (s.endpoint,)
        # each variant runs with its own --env/--service labels
        text = httpx.get(s.endpoint + "/metrics").text
        assert f'env="{role}"' in text and f'service="{SVC}"' in text
    assert "weight 100%" in st["production"].message and "weight 0%" in st["canary"].message
    assert local.status("nope") == {}


def test_measured_split_matches_weights_over_1000_requests(local):
    local.set_weights(SVC, {"production": 80, "baseline": 10, "canary": 10})
    st = local.status(SVC)
    before = {r: engine_requests(s.endpoint) for r, s in st.items()}
    # the pin token (no pin): routed by weight, and told the variant (X-SITS-Variant), as the control plane's load is
    resps = asyncio.run(fire(local.router_url(SVC), 1000, headers=trusted(local)))
    assert [r.status_code for r in resps].count(200) == 1000
    by_header = collections.Counter(r.headers["x-sits-variant"] for r in resps)
    served = {r: engine_requests(s.endpoint) - before[r] for r, s in st.items()}
    print("split by router header:", dict(by_header), "by engine metrics:", served)
    for role, want in (("production", 800), ("baseline", 100), ("canary", 100)):
        assert abs(served[role] - want) <= 0.02 * 1000, served   # what each engine itself counted
        assert by_header[role] == served[role]


def test_weight_change_under_load_loses_no_request(local):
    local.set_weights(SVC, {"production": 100})

    async def shift():
        for w in (10, 30, 50, 0):
            await asyncio.sleep(0.4)
            await asyncio.to_thread(local.set_weights, SVC, {"production": 100 - w, "canary": w})
    resps = asyncio.run(fire(local.router_url(SVC), 400, concurrency=16, during=shift, headers=trusted(local)))
    codes = collections.Counter(r.status_code for r in resps)
    assert codes == {200: 400}, codes
    variants = collections.Counter(r.headers["x-sits-variant"] for r in resps)
    assert variants["canary"] > 0 and variants["production"] > 0 and "baseline" not in variants


def test_pin_header_and_traceparent_reach_the_engine(local):
    local.set_weights(SVC, {"production": 100})
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = httpx.post(local.router_url(SVC) + "/v1/completions", json=BODY, timeout=30,
                   headers={"X-SITS-Variant": "baseline", "X-SITS-Pin-Token": local.pin_token, "traceparent": tp})
    assert r.status_code == 200 and r.headers["x-sits-variant"] == "baseline"
    assert r.json()["choices"][0]["finish_reason"] == "length"
    # without the deployer's pin token nobody may steer requests onto a variant
    assert httpx.post(local.router_url(SVC) + "/v1/completions", json=BODY, timeout=30,
                      headers={"X-SITS-Variant": "canary"}).status_code == 403


def test_streaming_through_the_router(local):
    local.set_weights(SVC, {"canary": 100})
    events = []
    with httpx.stream("POST", local.router_url(SVC) + "/v1/completions", timeout=30, headers=trusted(local),
                      json={**BODY, "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["x-sits-variant"] == "canary"
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3


def test_set_weights_validation(local):
    with pytest.raises(DeployError, match="sum to 100"):
        local.set_weights(SVC, {"production": 50})
    with pytest.raises(DeployNotFoundError):
        local.set_weights("other", {"production": 100})


def test_redeploy_same_spec_is_a_noop(local):
    pid = local._services[SVC].variants["baseline"].replicas[0].proc.pid
    local.deploy(spec("baseline"))
    assert local._services[SVC].variants["baseline"].replicas[0].proc.pid == pid


def test_crash_shows_as_not_ready_until_redeployed(local):
    local.set_weights(SVC, {"production": 90, "baseline": 10})
    victim = local._services[SVC].variants["baseline"].replicas[0].proc
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)                                   # reaped: status() reads the exit code from the same process
    st = local.status(SVC)["baseline"]
    assert not st.ready and st.ready_replicas == 0 and st.crashing and "exited with code -9" in st.message
    assert local.status(SVC)["baseline"].ready is False  # nothing restarted it behind our back
    local.deploy(spec("baseline"))  # an explicit deploy converges again
    st = local.status(SVC)["baseline"]
    assert st.ready, st.message


def test_rollback_drains_in_flight_canary_requests_then_removes_it(local):
    local.set_weights(SVC, {"production": 80, "baseline": 10, "canary": 10})
    canary = local._services[SVC].variants["canary"].replicas[0].proc
    baseline = local._services[SVC].variants["baseline"].replicas[0].proc
    router = local._services[SVC].router
    got = {}

    def long_canary_stream():
        with httpx.stream("POST", local.router_url(SVC) + "/v1/completions", timeout=60,
                          headers={"X-SITS-Variant": "canary", "X-SITS-Pin-Token": local.pin_token},
                          json={**BODY, "max_tokens": 60, "ignore_eos": True, "stream": True}) as r:
            got["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]
    t = threading.Thread(target=long_canary_stream)
    t.start()
    assert process.wait_until(lambda: router.in_flight("canary") == 1, 30)
    local.rollback(SVC)
    t.join(60)
    # the request that was running on the canary ran to its 60 tokens there before the canary stopped
    assert got["events"][-1] == "data: [DONE]"
    assert json.loads(got["events"][-2][6:])["choices"][0]["finish_reason"] == "length"
    assert not process.pid_alive(canary.pid) and not process.pid_alive(baseline.pid)
    st = local.status(SVC)
    assert set(st) == {"production"} and "weight 100%" in st["production"].message
    assert router.weights() == {"production": 100, "baseline": 0, "canary": 0}
    local.rollback(SVC)  # idempotent
    assert set(local.status(SVC)) == {"production"}


def test_promote_moves_the_canary_spec_into_production(local):
    local.deploy(spec("canary", args=CANARY_ARGS))
    local.set_weights(SVC, {"production": 90, "canary": 10})
    canary_proc = local._services[SVC].variants["canary"].replicas[0].proc
    old_prod = local._services[SVC].variants["production"].replicas[0].proc
    local.promote(SVC)
    st = local.status(SVC)
    assert set(st) == {"production"} and st["production"].ready
    assert "weight 100%" in st["production"].message
    new_prod = local._services[SVC].variants["production"]
    assert new_prod.spec == spec("production", args=CANARY_ARGS)
    argv = open(f"/proc/{new_prod.replicas[0].proc.pid}/cmdline").read().split("\0")
    assert argv[argv.index("--env") + 1] == "production" and argv[argv.index("--seed") + 1] == "7"
    for p in (old_prod, canary_proc):
        assert p.poll() is not None and not process.pid_alive(p.pid)
    r = httpx.post(local.router_url(SVC) + "/v1/completions", json=BODY, timeout=30, headers=trusted(local))
    assert r.status_code == 200 and r.headers["x-sits-variant"] == "production"
    local.promote(SVC)  # idempotent: nothing left to promote, production stays
    assert set(local.status(SVC)) == {"production"}


def test_deleting_a_weighted_variant_hands_its_share_over_and_close_stops_all(local):
    local.deploy(spec("canary", args=CANARY_ARGS))
    router = local._services[SVC].router
    procs = [v.replicas[0].proc for v in local._services[SVC].variants.values()]
    local.set_weights(SVC, {"production": 30, "canary": 70})
    local.delete(SVC, "production")  # production's 30% goes to the canary, the only variant left
    assert router.weights() == {"production": 0, "baseline": 0, "canary": 100}
    r = httpx.post(local.router_url(SVC) + "/v1/completions", json=BODY, timeout=30, headers=trusted(local))
    assert r.status_code == 200 and r.headers["x-sits-variant"] == "canary"
    local.close()  # the last weighted variant goes too: no error, nothing left running
    assert local.status(SVC) == {} and not any(process.pid_alive(p.pid) for p in procs)
    with pytest.raises(httpx.ConnectError):
        httpx.get(router.url + "/_sits/healthz")


def test_bad_kernel_set_fails_deploy_with_the_engine_message(tmp_path):
    with LocalDeployer(LocalConfig(workdir=str(tmp_path), cpu_threads=1)) as d:
        with pytest.raises(DeployError, match="exited with code 2") as e:
            d.deploy(VariantSpec(service="bad", role="production", kernels="no-such-kernels"))
        assert "no-such-kernels" in str(e.value)
        assert d.status("bad") == {}


PARENT = textwrap.dedent("""
    import json, sys, time
    from sits.control_plane.adapters.deploy import VariantSpec
    from sits.control_plane.adapters.deploy.local.deployer import LocalConfig, LocalDeployer
    d = LocalDeployer(LocalConfig(workdir=sys.argv[1], cpu_threads=1, ready_timeout_s=240))
    d.deploy(VariantSpec(service="orphan", role="production", kernels="torch"))
    v = d._services["orphan"].variants["production"].replicas[0]
    print(json.dumps({"pid": v.proc.pid, "url": v.url, "router": d.router_url("orphan")}), flush=True)
    time.sleep(600)
""")


def _refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def test_no_orphans_when_the_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    try:
        info = json.loads(parent.stdout.readline())
        assert process.pid_alive(info["pid"])
        assert httpx.get(info["url"] + "/readyz").status_code == 200
        parent.kill()  # SIGKILL: no atexit, no cleanup code runs in the parent
        parent.wait(10)
        assert process.wait_until(lambda: not process.pid_alive(info["pid"]), 15), "engine outlived its parent"
        # its leader thread is a zombie now; the port closes when the last of its threads is gone (until then a
        # connection may be reset): nothing may listen there for good
        assert process.wait_until(lambda: _refused(info["url"] + "/readyz"), 15), "the engine's port still listens"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_local_config_validation():
    for bad in ({"engine_command": ()}, {"ready_timeout_s": 0}, {"probe_timeout_s": -1}, {"cpu_threads": 0}):
        with pytest.raises(DeployError):
            LocalConfig(**bad)
    with LocalDeployer(LocalConfig(cpu_threads=1)) as d:
        with pytest.raises(DeployNotFoundError, match="not deployed"):
            d.promote("nothing")
        d.delete("nothing")  # idempotent on an unknown service
        assert d.status("nothing") == {}
