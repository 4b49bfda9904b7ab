import asyncio
import collections
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.router import RouterError
from sits.control_plane.router.config import RouterConfig
from sits.control_plane.router.proxy import WeightedRouter
from tests.waiting import wait_for


PIN_TOKEN = "test-pin-token-0123456789"
PIN = {"X-SITS-Pin-Token": PIN_TOKEN}


@pytest.fixture
def router(upstreams):
    # the upstream test server answers on any path (/echo ...): forward every path, as public_paths=("/v1/",) does /v1/*
    r = WeightedRouter(RouterConfig(service="chat", pin_token=PIN_TOKEN, public_paths=("/",)))
    for role, url in upstreams.items():
        r.set_backends(role, [url])
    r.start()
    yield r
    r.stop()


def router_counts(r: WeightedRouter) -> dict:
    text = httpx.get(r.url + "/_sits/metrics", headers=PIN).text
    out = collections.Counter()
    for fam in text_string_to_metric_families(text):
        if fam.name == "sits_router_requests":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["variant"], s.labels["routing"], s.labels["code"])] += s.value
    return out


async def fire(url: str, n: int, concurrency: int = 16, path: str = "/echo", **kw) -> list[httpx.Response]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30) as c:
        async def one(i):
            async with sem:
                return await c.post(url + path, content=f"req-{i}", **kw)
        return await asyncio.gather(*(one(i) for i in range(n)))


def test_split_follows_weights_and_metrics_count_it(router):
    router.set_weights({"production": 80, "baseline": 10, "canary": 10})
    resps = asyncio.run(fire(router.url, 1000, headers=PIN))   # weighted, and told the variant (a trusted caller)
    assert all(r.status_code == 200 for r in resps)
    seen = collections.Counter(r.json()["name"] for r in resps)
    assert seen == {"production": 800, "baseline": 100, "canary": 100}  # smooth WRR: exact over full cycles
    assert all(r.headers["x-sits-variant"] == r.json()["name"] for r in resps)
    assert [r.json()["body"] for r in resps[:3]] == ["req-0", "req-1", "req-2"]
    counts = router_counts(router)
    assert counts[("production", "weighted", "200")] == 800
    assert counts[("canary", "weighted", "200")] == 100
    assert json.loads(httpx.get(router.url + "/_sits/weights", headers=PIN).text)["weights"]["canary"] == 10
    assert "x-sits-variant" not in httpx.post(router.url + "/echo", content="anyone").headers


def test_uneven_weights_interleave(router):
    router.set_weights({"production": 97, "canary": 3})
    with httpx.Client(base_url=router.url) as c:
        names = [c.get("/echo").json()["name"] for _ in range(100)]
    assert names.count("canary") == 3
    # interleaved, not bunched: the canary requests are spread over the cycle
    idx = [i for i, n in enumerate(names) if n == "canary"]
    assert max(idx) - min(idx) >= 30


def test_pin_header_traceparent_and_query(router):
    router.set_weights({"production": 100})
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = httpx.get(router.url + "/echo?a=1&b=2", headers={"X-SITS-Variant": "canary", "traceparent": tp, **PIN})
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == "canary" and body["traceparent"] == tp and body["query"] == "a=1&b=2"
    assert body["x_forwarded_for"] == "127.0.0.1"
    assert httpx.get(router.url + "/echo").json()["name"] == "production"
    bad = httpx.get(router.url + "/echo", headers={"X-SITS-Variant": "gray", **PIN})
    assert bad.status_code == 400 and "gray" in bad.json()["error"]
    router.set_backends("baseline", None)
    gone = httpx.get(router.url + "/echo", headers={"X-SITS-Variant": "baseline", **PIN})
    assert gone.status_code == 503 and "not deployed" in gone.json()["error"]
    assert router_counts(router)[("canary", "pinned", "200")] == 1


def test_no_traffic_is_503_and_bad_weights_rejected(router):
    assert httpx.get(router.url + "/echo").status_code == 503
    with pytest.raises(RouterError, match="sum to 100"):
        router.set_weights({"production": 90, "canary": 5})
    with pytest.raises(RouterError, match="unknown role"):
        router.set_weights({"production": 90, "gray": 10})
    with pytest.raises(RouterError, match="integer percent"):
        router.set_weights({"production": 100.5, "canary": -0.5})


def test_streaming_passes_chunks_through_as_they_come(router):
    router.set_weights({"canary": 100})
    t0 = time.monotonic()
    arrivals, chunks = [], []
    with httpx.stream("GET", router.url + "/stream?n=4&delay=0.3", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - t0)
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]" and [json.loads(c)["i"] for c in chunks[:-1]] == [0, 1, 2, 3]
    # events 0.3 s apart upstream arrive spread out, not buffered into one burst at the end
    assert arrivals[-1] - arrivals[0] > 0.9


def test_weight_change_under_load_loses_no_request(router):
    router.set_weights({"production": 100})

    async def scenario():
        async def until(what, cond):   # polled on this loop, so the clients keep sending meanwhile
            for _ in range(3000):
                if cond():
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"not within 30 s: {what}")

        async def switch():
            # each switch happens with requests in flight, whatever the machine's speed
            await until("production busy", lambda: router.in_flight("production") > 0)
            router.set_weights({"production": 50, "canary": 50})
            await until("canary busy", lambda: router.in_flight("canary") > 0)
            router.set_weights({"canary": 100})
        t = asyncio.create_task(switch())  # the router runs on its own thread and loop
        resps = await fire(router.url, 300, concurrency=32, path="/echo?delay=0.05")
        await t
        return resps
    resps = asyncio.run(scenario())
    assert [r.status_code for r in resps].count(200) == 300
    names = [r.json()["name"] for r in resps]
    assert names[0] == "production" and names[-1] == "canary"
    assert {"production", "canary"} <= set(names) and "baseline" not in names
    # the router's bookkeeping ends a moment after the client has the last byte
    assert process.wait_until(lambda: router.in_flight("production") == router.in_flight("canary") == 0, 5)


def test_unreachable_variant_is_502_and_counted(router):
    router.set_backends("canary", ["http://127.0.0.1:9"])  # discard port: nothing listens
    router.set_weights({"canary": 100})
    r = httpx.get(router.url + "/echo", headers=PIN)
    assert r.status_code == 502 and "canary" in r.json()["error"]
    anyone = httpx.get(router.url + "/echo")   # a client is not told which variant, nor where it runs
    assert anyone.status_code == 502 and "canary" not in anyone.text and "127.0.0.1" not in anyone.text
    assert router_counts(router)[("canary", "weighted", "502")] == 2


def test_client_disconnect_mid_stream_releases_the_request(router):
    router.set_weights({"baseline": 100})
    with httpx.stream("GET", router.url + "/stream?n=50&delay=0.1", timeout=10) as r:
        lines = r.iter_lines()  # keep a reference: a discarded line iterator closes the response
        next(lines)
        assert router.in_flight("baseline") == 1
    wait_for("the request to be released", lambda: router.in_flight("baseline") == 0, timeout=5)
    assert router_counts(router)[("baseline", "weighted", "499")] == 1


def test_replicas_of_a_variant_share_its_traffic(router, upstreams):
    # two "replicas" of production (here: the production and baseline upstream processes)
    router.set_backends("production", [upstreams["production"], upstreams["baseline"]])
    router.set_weights({"production": 100})
    with httpx.Client(base_url=router.url) as c:
        seen = collections.Counter(c.get("/echo").json()["name"] for _ in range(10))
    assert seen == {"production": 5, "baseline": 5}
    assert router_counts(router)[("production", "weighted", "200")] == 10
