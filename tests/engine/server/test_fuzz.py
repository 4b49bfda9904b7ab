"""A bounded, seeded fuzz test: random and malformed requests at the engine server and at the router in front of it.

Every request, however broken (framing, target, headers, JSON), gets a 2xx or 4xx; afterwards both servers still
serve, no 5xx was counted anywhere, and every KV block is free again. Requests are written by hand over sockets so
that the malformed ones reach the servers as they are.
"""
import json
import random
import socket
from dataclasses import replace

import pytest

from sits.control_plane.router.config import RouterConfig
from sits.control_plane.router.proxy import WeightedRouter
from tests.engine.server.harness import BASE, RunningServer, http, wait_idle

SEED = 20261201
N_REQUESTS = 250   # per target
TOKEN = "fuzz-pin-token-0123456789"
ROUTES = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/version", "/metrics"]


@pytest.fixture(scope="module")
def targets():
    engine = RunningServer(replace(BASE, max_num_seqs=16, header_timeout_s=1.0, body_timeout_s=1.0)).wait_ready()
    router = WeightedRouter(RouterConfig(service="fuzz", pin_token=TOKEN, header_timeout_s=1.0, body_timeout_s=1.0))
    for role in ("production", "baseline", "canary"):
        router.set_backends(role, [engine.url])
    router.set_weights({"production": 80, "canary": 20})
    router.start()
    yield engine, router
    router.stop()
    engine.stop()


# ---- the generator ----

def _random_text(rng: random.Random) -> str:
    alphabet = ["a", "Z", " ", "\n", "\"", "\\", "\u00e9", "\u4e2d", "\U0001F600", "\x00", "\x7f", "{", "%"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([0, 1, -1, 2 ** 31, 2 ** 63, 2 ** 64, 2 ** 70, -(2 ** 70), 10 ** 30])
    if kind == 1:
        return rng.choice([0.5, -0.0, 1e308, -1e308, 3.14, 1e-320])
    if kind == 2:
        return _random_text(rng)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return ""
    if kind == 5:
        return rng.randint(-5, 5)
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 7:
        return {_random_text(rng): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return json.loads("[" * 20 + "1" + "]" * 20)   # past the nesting limit


def _base_body(rng: random.Random, chat: bool) -> dict:
    body = {"model": "tiny", "max_tokens": rng.randint(1, 4), "temperature": rng.choice([0, 0.7, 1.0])}
    if chat:
        body["messages"] = [{"role": "user", "content": _random_text(rng) or "hi"}]
    else:
        body["prompt"] = rng.choice([_random_text(rng) or "hello", [1, 2, 3]])
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.2:
        body["logprobs"] = True if chat else rng.randint(0, 3)
    return body


_FIELDS = ["model", "prompt", "messages", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
           "ignore_eos", "stream", "stream_options", "logprobs", "top_logprobs", "n", "logit_bias", "tools",
           "response_format", "max_completion_tokens"]
_SMALL_MAX = ["x", -1, 0, 1, 3, 2 ** 70, 1.5, None, [], {}]


def _body_bytes(rng: random.Random, chat: bool) -> bytes:
    body = _base_body(rng, chat)
    for _ in range(rng.randint(0, 3)):
        op = rng.randrange(4)
        if op == 0:
            body[rng.choice(_FIELDS)] = _random_json(rng)
        elif op == 1:
            body.pop(rng.choice([f for f in body if f != "max_tokens"] or ["model"]), None)
        elif op == 2:
            body["max_tokens"] = rng.choice(_SMALL_MAX)
        else:
            body[_random_text(rng)] = _random_json(rng)
    if body.get("max_completion_tokens") not in _SMALL_MAX[:5] and chat:   # keep generation short: tiny on CPU
        body.pop("max_completion_tokens", None)
    if not (isinstance(body.get("max_tokens"), int) and body["max_tokens"] <= 4) and rng.random() < 0.5:
        body["max_tokens"] = 2
    raw = json.dumps(body).encode()
    mode = rng.randrange(10)
    if mode == 0:                       # truncated
        raw = raw[:rng.randrange(len(raw))]
    elif mode == 1:                     # random bytes flipped
        b = bytearray(raw)
        for _ in range(rng.randint(1, 5)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        raw = bytes(b)
    elif mode == 2:                     # lone surrogates, huge integers, deep nesting spliced in
        raw = raw[:-1] + rng.choice([b', "x": "\\ud800"}', b', "x": ' + b"9" * 5000 + b"}",
                                     b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", b', "x": NaN}'])
    elif mode == 3:                     # not JSON at all
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
    return raw


def _target(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        return rng.choice(ROUTES)
    if r < 0.75:
        return rng.choice(ROUTES) + "?" + rng.choice(["a=1", "x=%zz", "q=[1]|\"", "=&&=", "a=" + "b" * 3000])
    return rng.choice(["*", "@127.0.0.1:1/x", "http://127.0.0.1:1/x", ":80", "//x/v1/models", "/%00", "/%2e%2e/etc",
                       "/" + "a" * 5000, "/v1/../v1/models", "/ v1", "/\x7f", "127.0.0.1:1", "/v1/completions/",
                       "/_sits/weights", "/_sits/nothing", "/\u00e9".encode().decode("latin-1")])


def _headers(rng: random.Random) -> list[tuple[str, str]]:
    out = [("Host", "fuzz")]
    pool = [("X-SITS-Priority", rng.choice(["0", "3", "4", "-1", "9" * 5000, "\u00b2", " 1", "1.0", ""])),
            ("X-SITS-Tenant", rng.choice(["a", "", "a/b", "x" * 65, "t:1@x", "\u00e9"])),
            ("X-SITS-Variant", rng.choice(["canary", "baseline", "production", "gray", ""])),
            ("X-SITS-Pin-Token", rng.choice([TOKEN, "wrong", ""])),
            ("Content-Type", rng.choice(["application/json", "text/plain", "", "application/json; charset=latin-1"])),
            ("traceparent", rng.choice(["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "garbage",
                                        "ff-" + "0" * 50])),
            ("X-Forwarded-For", rng.choice(["6.6.6.6", "not an ip", ""])),
            ("Connection", rng.choice(["keep-alive, x-a", "x-sits-variant", "upgrade"])),
            ("Expect", "100-continue"), ("Transfer-Encoding", rng.choice(["gzip", "identity"])),
            ("X-" + "h" * rng.randint(1, 40), "v" * rng.randint(0, 200))]
    out += rng.sample(pool, rng.randint(0, 5))
    return out


def _request(rng: random.Random) -> bytes:
    target = _target(rng)
    usual = "POST" if target.startswith("/v1/c") else "GET"
    method = usual if rng.random() < 0.85 else rng.choice(["POST", "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "FOO"])
    chat = "chat" in target
    body = _body_bytes(rng, chat) if method in ("POST", "PUT") or rng.random() < 0.05 else b""
    headers = [h for h in _headers(rng) if h[0] != "Transfer-Encoding" or not body]
    framing = rng.randrange(10)
    if framing == 0 and body:   # a short Content-Length: the rest reaches the server as garbage
        headers.append(("Content-Length", str(rng.randrange(len(body)))))
    elif framing == 1:          # chunked
        headers.append(("Transfer-Encoding", "chunked"))
        body = (b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"
    elif body or method in ("POST", "PUT"):
        headers.append(("Content-Length", str(len(body))))
    headers.append(("Connection", "close"))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("latin-1", "replace") + body


def _send(url: str, data: bytes) -> int | None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server answered (400/413) and closed before reading everything: its answer is still there
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    while out.startswith(b"HTTP/1.1 1"):   # interim 100 Continue: the final answer follows
        out = out.partition(b"\r\n\r\n")[2]
    if not out.startswith(b"HTTP/1.1 "):
        return None
    return int(out[9:12])


@pytest.mark.parametrize("via", ["engine", "router"])
def test_fuzzed_requests_get_2xx_or_4xx_and_leak_nothing(targets, via):
    engine, router = targets
    url = engine.url if via == "engine" else router.url
    rng = random.Random(f"{SEED}-{via}")
    seen: dict[int, int] = {}
    for i in range(N_REQUESTS):
        data = _request(rng)
        status = _send(url, data)
        assert status is not None and (200 <= status < 300 or 400 <= status < 500), \
            f"request {i} (seed {SEED}-{via}) got {status}: {data[:300]!r}"
        seen[status] = seen.get(status, 0) + 1
    assert sum(v for k, v in seen.items() if k < 300) >= N_REQUESTS // 10, seen   # the fuzz also reaches the engine
    assert {400, 404} <= set(seen), seen
    m = wait_idle(engine, timeout=60)
    engine_500s = sum(s.value for s in m["http_request_duration_seconds"]   # (/readyz was 503 while loading)
                      if s.name.endswith("_count") and s.labels["status"].startswith("5") and s.labels["route"]
                      != "/readyz")
    assert engine_500s == 0
    stats = engine.state.runner.stats()   # the engine's own numbers (reported from the core process)
    assert stats.num_free_blocks == stats.num_total_blocks
    assert http("POST", engine.url + "/v1/completions", {"model": "tiny", "prompt": "still up", "max_tokens": 2})[0] \
        == 200
    status, _, body = http("GET", router.url + "/_sits/metrics", headers={"X-SITS-Pin-Token": TOKEN})
    assert status == 200 and b'code="5' not in body
