"""The router as an adversarial client meets it: request targets (SSRF), pins, headers, bodies, slow clients."""
import socket
import tracemalloc

import httpx
import pytest

from sits.control_plane.router import RouterError
from sits.control_plane.router.config import RouterConfig
from sits.control_plane.router.proxy import WeightedRouter
from sits.wire.http_limits import MAX_BODY_BYTES
from tests.control_plane.router.test_router import router_counts

TOKEN = "test-pin-token-0123456789"
PIN = {"X-SITS-Pin-Token": TOKEN}
LIMIT = 4 * 1024 * 1024


@pytest.fixture
def make_router(upstreams):
    routers = []

    def make(**overrides) -> WeightedRouter:
        r = WeightedRouter(RouterConfig(**{"service": "chat", "pin_token": TOKEN, "public_paths": ("/",), **overrides}))
        for role, url in upstreams.items():
            r.set_backends(role, [url])
        r.set_weights({"production": 100})
        r.start()
        routers.append(r)
        return r

    yield make
    for r in routers:
        r.stop()


@pytest.fixture
def router(make_router):
    return make_router(max_body_bytes=LIMIT, header_timeout_s=0.5, body_timeout_s=0.5)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.settimeout(10)   # a safety net only: the server answers or closes first
    return s


def raw_request(url: str, data: bytes) -> tuple[int, dict[str, list[str]], bytes]:
    with _connect(url) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers.setdefault(k.strip().lower(), []).append(v.strip())
    return int(lines[0].split(" ")[1]), headers, body


def _get(target: str, extra: str = "") -> bytes:
    return (f"GET {target} HTTP/1.1\r\nHost: router\r\nX-SITS-Variant: production\r\nX-SITS-Pin-Token: {TOKEN}\r\n"
            f"Connection: close\r\n{extra}\r\n").encode("latin-1")


# ---- 1. SSRF: only origin-form targets, the upstream URL built from parts ----

def _targets(port: int) -> list[str]:
    return [f"@127.0.0.1:{port}/echo", f"@127.0.0.1:{port}", f"http://127.0.0.1:{port}/echo",
            f"https://127.0.0.1:{port}/echo", "*", f"127.0.0.1:{port}", f":{port}/echo", f":{port}",
            f"user:pw@127.0.0.1:{port}/echo", f"%2F%2F127.0.0.1:{port}/echo", "echo", "/ech%zz", "/ech%",
            "/a\\b", f"\\\\127.0.0.1:{port}/echo", f"/echo?x=1#@127.0.0.1:{port}"]


def test_non_origin_form_targets_are_400_and_reach_no_backend(router, upstreams):
    canary_port = int(upstreams["canary"].rsplit(":", 1)[1])
    before = router_counts(router)
    for target in _targets(canary_port):
        status, headers, body = raw_request(router.url, _get(target))
        assert status == 400, (target, status, body[:200])
        assert b"canary" not in body and "x-sits-variant" not in headers, target
    assert router_counts(router) == before   # nothing was proxied anywhere
    assert httpx.get(router.url + "/_sits/healthz").status_code == 200


@pytest.mark.parametrize("target", ["/echo", "//127.0.0.1:{port}/echo", "/echo@127.0.0.1:{port}",
                                    "/echo?next=http://127.0.0.1:{port}/echo&u=@127.0.0.1:{port}",
                                    "/echo;p=1?q=[1]|x"])
def test_origin_form_targets_reach_the_pinned_variant_only(router, upstreams, target):
    canary_port = int(upstreams["canary"].rsplit(":", 1)[1])
    status, headers, body = raw_request(router.url, _get(target.format(port=canary_port)))
    assert headers["x-sits-variant"] == ["production"] and status < 500, (status, body[:200])
    assert b'"name":"canary"' not in body
    if status == 200:
        echo = httpx.Response(200, content=body).json()
        assert echo["name"] == "production"
        assert not [k for k, _ in echo["headers"] if k.lower() == "authorization"]   # no base address leaked


def test_client_authorization_is_passed_on_unchanged(router):
    r = httpx.get(router.url + "/echo", headers={"Authorization": "Bearer user-token"})
    assert [v for k, v in r.json()["headers"] if k == "authorization"] == ["Bearer user-token"]


def test_backend_urls_with_credentials_or_queries_are_refused():
    r = WeightedRouter(RouterConfig(service="chat"))
    for bad in ("http://u:p@127.0.0.1:1", "ftp://127.0.0.1:1", "http://127.0.0.1:1/?x=1", "127.0.0.1:1"):
        with pytest.raises(RouterError):
            r.set_backends("canary", [bad])


# ---- 3. the pin is honoured only from trusted callers ----

@pytest.mark.parametrize("headers", [{}, {"X-SITS-Pin-Token": "wrong-token-0123456789"},
                                     {"X-SITS-Pin-Token": TOKEN[:-1]}, {"X-SITS-Pin-Token": TOKEN + "x"},
                                     {"X-SITS-Pin-Token": ""}])
def test_untrusted_pins_are_refused(router, headers):
    before = router_counts(router)
    r = httpx.get(router.url + "/echo", headers={"X-SITS-Variant": "canary", **headers})
    assert r.status_code == 403 and "x-sits-variant" not in r.headers
    assert "pin" in r.json()["error"].lower()
    assert router_counts(router) == before


def test_trusted_pins_work_and_the_token_is_not_forwarded(router, make_router):
    r = httpx.get(router.url + "/echo", headers={"X-SITS-Variant": "canary", **PIN})
    assert r.status_code == 200 and r.json()["name"] == "canary"
    names = {k.lower() for k, _ in r.json()["headers"]}
    assert "x-sits-pin-token" not in names and "x-sits-variant" not in names
    # two token headers are not a token
    dup = raw_request(router.url, _get("/echo", f"X-SITS-Pin-Token: {TOKEN}\r\n"))
    assert dup[0] == 403
    # an allow-listed source may pin without the token; a router without token or sources honours no pin
    by_source = make_router(pin_token=None, pin_sources=("127.0.0.0/8",))
    assert httpx.get(by_source.url + "/echo", headers={"X-SITS-Variant": "canary"}).json()["name"] == "canary"
    closed = make_router(pin_token=None)
    assert httpx.get(closed.url + "/echo", headers={"X-SITS-Variant": "canary", **PIN}).status_code == 403
    assert TOKEN not in repr(router.config)


def test_pin_token_and_networks_are_validated():
    with pytest.raises(RouterError, match="16 characters"):
        RouterConfig(service="chat", pin_token="short")
    with pytest.raises(RouterError, match="pin_sources"):
        RouterConfig(service="chat", pin_sources=("not-a-network",))


# ---- 8. HTTP hygiene ----

def test_one_date_and_server_header_and_hop_by_hop_headers_stripped(router):
    r = httpx.get(router.url + "/hop")
    assert r.status_code == 200 and r.text == "hop"
    assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) == 1
    assert "x-hop-secret" not in r.headers and r.headers["x-end-to-end"] == "kept"
    sent = {"Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "secret", "Keep-Alive": "timeout=5",
            "Proxy-Connection": "keep-alive", "TE": "trailers", "Upgrade": "h2c", "X-Keep": "kept"}
    echo = httpx.get(router.url + "/echo", headers=sent).json()
    names = [k.lower() for k, _ in echo["headers"]]
    assert "x-keep" in names
    for hop in ("x-drop-me", "keep-alive", "proxy-connection", "te", "upgrade"):
        assert hop not in names, hop


def test_client_x_forwarded_for_is_replaced_unless_the_client_is_a_trusted_proxy(router, make_router):
    spoof = {"X-Forwarded-For": "6.6.6.6", "Forwarded": "for=6.6.6.6", "X-Real-IP": "6.6.6.6"}
    echo = httpx.get(router.url + "/echo", headers=spoof).json()
    xff = [v for k, v in echo["headers"] if k == "x-forwarded-for"]
    assert xff == ["127.0.0.1"]
    assert not [k for k, _ in echo["headers"] if k in ("forwarded", "x-real-ip")]
    proxied = make_router(trusted_proxies=("127.0.0.1/32",))
    echo = httpx.get(proxied.url + "/echo", headers=spoof).json()
    assert [v for k, v in echo["headers"] if k == "x-forwarded-for"] == ["6.6.6.6, 127.0.0.1"]


# ---- 5. request bodies stream through, with the engine's limit ----

def test_router_limit_matches_the_engine():
    assert RouterConfig(service="chat").max_body_bytes == MAX_BODY_BYTES


def _chunks(total: int, size: int = 64 * 1024):
    block = b"x" * size
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        yield block if n == size else block[:n]
        sent += n


def _peak_during(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bodies_stream_through_without_buffering(router):
    import hashlib

    want = hashlib.sha256(b"x" * (LIMIT - 10)).hexdigest()
    with httpx.Client(timeout=30) as c:
        assert c.post(router.url + "/digest", content=b"warm").status_code == 200   # lazy set-up outside the peak
        r, peak = _peak_during(lambda: c.post(router.url + "/digest", content=_chunks(LIMIT - 10)))
    assert r.status_code == 200 and r.json() == {"name": "production", "bytes": LIMIT - 10, "sha256": want}
    assert peak < LIMIT / 2, f"peak {peak} bytes allocated while proxying a {LIMIT} byte body"


def test_bodies_over_the_limit_are_413(router):
    with httpx.Client(timeout=30) as c:
        assert c.post(router.url + "/digest", content=b"warm").status_code == 200
        declared = c.post(router.url + "/digest", content=b"x" * (LIMIT + 1))
        assert declared.status_code == 413 and "x-sits-variant" not in declared.headers
        chunked, peak = _peak_during(lambda: c.post(router.url + "/digest", content=_chunks(LIMIT + 1)))
    assert chunked.status_code == 413 and "limit" in chunked.json()["error"]
    assert peak < LIMIT / 2
    assert httpx.post(router.url + "/digest", content=b"ok").json()["bytes"] == 2


# ---- 10. slow clients ----

@pytest.mark.parametrize("sent", [b"", b"POST /echo HTTP/1.1\r\nhost: x\r\n",
                                  b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\nabc"])
def test_slow_clients_are_disconnected(router, sent):
    conns = [_connect(router.url) for _ in range(20)]
    for c in conns:
        c.sendall(sent)
    for c in conns:
        with c:
            out = b""
            while chunk := c.recv(65536):   # EOF: the router closed it (without the deadline: socket.timeout)
                out += chunk
            assert out.startswith(b"HTTP/1.1 408 "), out[:100]
    assert httpx.get(router.url + "/echo").status_code == 200


# ---- issue 26 row 8: internal headers pass only from trusted callers ----

INTERNAL = {"X-SITS-Probe": "1", "X-SITS-Priority": "3", "X-SITS-Tenant": "someone-else", "X-SITS-Future": "x"}


def test_internal_headers_from_untrusted_clients_are_stripped(router, make_router):
    echo = httpx.get(router.url + "/echo", headers=INTERNAL).json()
    assert not [k for k, _ in echo["headers"] if k.lower().startswith("x-sits-")], echo["headers"]
    # with the pin token (load generators, the correctness probe) they pass; the token itself never does
    echo = httpx.get(router.url + "/echo", headers={**INTERNAL, **PIN}).json()
    got = {k.lower(): v for k, v in echo["headers"] if k.lower().startswith("x-sits-")}
    assert got == {k.lower(): v for k, v in INTERNAL.items()}
    # and from an allow-listed source network
    by_source = make_router(pin_token=None, pin_sources=("127.0.0.0/8",))
    echo = httpx.get(by_source.url + "/echo", headers=INTERNAL).json()
    assert {k.lower() for k, _ in echo["headers"]} >= {k.lower() for k in INTERNAL}
    # a wrong token is no token
    echo = httpx.get(router.url + "/echo", headers={**INTERNAL, "X-SITS-Pin-Token": "wrong-token-0123456789"})
    assert not [k for k, _ in echo.json()["headers"] if k.lower().startswith("x-sits-")]


# ---- issue 26 row 11: Content-Length with Transfer-Encoding is a 400, never a 500 ----

@pytest.mark.parametrize("order,length", [("cl-te", 5), ("te-cl", 5), ("cl-te", 100), ("te-cl", 1)])
def test_content_length_with_transfer_encoding_is_400(router, order, length):
    before = router_counts(router)
    cl, te = f"Content-Length: {length}\r\n", "Transfer-Encoding: chunked\r\n"
    head = (cl + te) if order == "cl-te" else (te + cl)
    status, _, body = raw_request(router.url, (f"POST /echo HTTP/1.1\r\nHost: router\r\n{head}Connection: close\r\n"
                                               "\r\n5\r\nhello\r\n0\r\n\r\n").encode())
    assert status == 400, body
    assert router_counts(router) == before                     # nothing reached a variant
    assert httpx.get(router.url + "/echo").status_code == 200   # and the router still serves
