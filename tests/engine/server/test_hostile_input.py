"""Client-triggered failures: inputs json.loads or int() accept but nothing downstream can use get a 4xx (never a 500,
which the canary's error-rate check would count), one log line each, and slow clients cannot hold connections."""

import json
import logging
import socket
import time

import pytest

from tests.engine.server.harness import BASE, RunningServer, http, sample

OK = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
HEADER_TIMEOUT, BODY_TIMEOUT = 0.5, 0.5


@pytest.fixture(scope="module")
def server():
    from dataclasses import replace

    s = RunningServer(replace(BASE, header_timeout_s=HEADER_TIMEOUT, body_timeout_s=BODY_TIMEOUT)).wait_ready()
    yield s
    s.stop()


def _raw(body: dict) -> bytes:
    return json.dumps(body).encode()


def _nested(depth: int) -> bytes:
    return b'{"model": "tiny", "prompt": "x", "logit_bias": ' + b"[" * depth + b"]" * depth + b"}"


BIG = "9" * 4301
CASES = [
    # (name, path, raw body, headers, param)
    ("lone high surrogate in prompt", "/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b"}', {}, None),
    ("lone low surrogate in prompt", "/v1/completions", b'{"model": "tiny", "prompt": "\\udfff"}', {}, None),
    ("surrogate in chat content", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d"}]}', {}, None),
    ("surrogate in a text part", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}', {},
     None),
    ("surrogate in stop", "/v1/completions", b'{"model": "tiny", "prompt": "x", "stop": ["\\ud800"]}', {}, None),
    ("surrogate in a key", "/v1/completions", b'{"model": "tiny", "prompt": "x", "\\ud800": 1}', {}, None),
    ("surrogate in model", "/v1/completions", b'{"model": "\\ud800", "prompt": "x"}', {}, None),
    ("100k-deep arrays", "/v1/completions", _nested(100_000), {}, None),
    ("100k-deep objects", "/v1/completions", b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, {}, None),
    ("just past the depth limit", "/v1/completions", _nested(17), {}, None),
    ("4301-digit max_tokens", "/v1/completions", f'{{"model": "tiny", "prompt": "x", "max_tokens": {BIG}}}'.encode(),
     {}, None),
    ("4301-digit token id", "/v1/completions", f'{{"model": "tiny", "prompt": [1, {BIG}]}}'.encode(), {}, None),
    ("4301-digit negative seed", "/v1/completions", f'{{"model": "tiny", "prompt": "x", "seed": -{BIG}}}'.encode(),
     {}, None),
    ("65-bit seed", "/v1/completions", _raw({**OK, "seed": 2 ** 65}), {}, None),
    ("65-bit token id", "/v1/completions", _raw({**OK, "prompt": [1, 2 ** 65]}), {}, None),
    ("4301-digit priority", "/v1/completions", _raw(OK), {"X-SITS-Priority": BIG}, "X-SITS-Priority"),
    ("superscript-digit priority", "/v1/completions", _raw(OK), {"X-SITS-Priority": "\u00b2"}, "X-SITS-Priority"),
    ("negative priority", "/v1/completions", _raw(OK), {"X-SITS-Priority": "-1"}, "X-SITS-Priority"),
    ("priority with spaces inside", "/v1/chat/completions", _raw(CHAT), {"X-SITS-Priority": "1 2"},
     "X-SITS-Priority"),
    ("4301-digit content-length", "/v1/completions", None, {"Content-Length": BIG}, None),
]


def _errors_500(server) -> float:
    m = server.metrics()
    return sample(m, "http_request_duration_seconds", "http_request_duration_seconds_count", status="500")


@pytest.mark.parametrize("name,path,body,headers,param", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_is_4xx_with_one_log_line(server, caplog, name, path, body, headers, param):
    before = _errors_500(server)
    caplog.set_level(logging.INFO, logger="sits.engine.server")
    caplog.set_level(logging.INFO, logger="uvicorn.error")
    if name == "4301-digit content-length":   # urllib refuses to send it: write the request by hand
        status = _raw_status(server, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: " + BIG.encode()
                             + b"\r\ncontent-type: application/json\r\n\r\n{}")
        payload = b"{}"
    else:
        hdrs = {k: v.encode("latin-1").decode("latin-1") for k, v in headers.items()}
        status, resp_headers, payload = http("POST", server.url + path, body, hdrs)
        err = json.loads(payload)["error"]
        assert err["param"] == param and err["message"]
    assert 400 <= status < 500, payload[:300]
    assert b"Traceback" not in payload
    ours = [r for r in caplog.records if r.name in ("sits.engine.server", "uvicorn.error")]
    assert len(ours) == 1, [r.getMessage()[:200] for r in ours]
    assert ours[0].exc_info is None and "\n" not in ours[0].getMessage() and len(ours[0].getMessage()) < 600
    assert _errors_500(server) == before   # nothing for the canary's error-rate check to count


def test_valid_astral_text_still_works(server):
    # a surrogate *pair* is one valid character (U+1F600): only lone surrogates are refused
    status, _, payload = http("POST", server.url + "/v1/completions",
                              b'{"model": "tiny", "prompt": "smile \\ud83d\\ude00", "max_tokens": 2}')
    assert status == 200, payload
    status, _, _ = http("POST", server.url + "/v1/completions", _raw(OK), {"X-SITS-Priority": "3"})
    assert status == 200


def _raw_status(server, data: bytes) -> int:
    with _connect(server) as s:
        s.sendall(data)
        head = _read_all(s)
    return int(head.split(b" ", 2)[1])


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.settimeout(10)   # a safety net only: the server must close first
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


@pytest.mark.parametrize("sent", [
    b"",                                                                   # connects, says nothing
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n",                       # head never finished
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"model\"",  # body never finished
])
def test_slow_clients_get_408_and_are_disconnected(server, sent):
    conns = [_connect(server) for _ in range(20)]
    for c in conns:
        c.sendall(sent)
    for c in conns:
        with c:
            answer = _read_all(c)   # EOF: the server closed it (without the deadline: socket.timeout)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
    assert http("POST", server.url + "/v1/completions", OK)[0] == 200


def test_trickled_head_does_not_extend_the_deadline(server):
    head = b"GET /healthz HTTP/1.1\r\n" + b"".join(b"x-pad-%d: y\r\n" % i for i in range(400)) + b"\r\n"
    with _connect(server) as c:
        sent = 0
        try:
            for i in range(len(head)):
                c.sendall(head[i:i + 1])   # one byte every 10 ms: 100x slower than the deadline allows
                sent += 1
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < len(head)
    assert http("GET", server.url + "/healthz")[0] == 200


def test_keep_alive_idle_is_not_cut_by_the_head_deadline(server):
    import http.client

    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() and True
    time.sleep(HEADER_TIMEOUT * 2)   # idle between requests: governed by the 30 s keep-alive timeout
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()
    stats = server.state.runner.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.parametrize("ids,message", [
    (list(range(65)), "'stop_token_ids' has 65 ids; at most 64 are allowed"),
    ([7] * 2_000_000, "'stop_token_ids' has 2000000 ids; at most 64 are allowed"),   # the 16 MB flood
    ([1, 2, 100_000], "stop_token_ids [100000] are outside the model's vocabulary of 512"),
    ([1, -2], "'stop_token_ids' must be a list of non-negative integer token ids"),
], ids=["65 ids", "2M ids", "outside the vocabulary", "negative"])
def test_stop_token_ids_are_bounded_and_checked_against_the_vocabulary(server, ids, message):
    status, _, payload = http("POST", server.url + "/v1/completions", {**OK, "stop_token_ids": ids})
    err = json.loads(payload)["error"]
    assert status == 400 and err["param"] == "stop_token_ids" and err["message"] == message


def test_stop_token_ids_within_the_limit_still_stop(server):
    status, _, payload = http("POST", server.url + "/v1/completions",
                              {**OK, "max_tokens": 8, "temperature": 0, "stop_token_ids": list(range(64))})
    assert status == 200, payload[:300]


def test_offline_sampling_params_bound_and_dedupe_stop_token_ids():
    from sits.engine import SamplingParams
    from sits.engine.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="at most 64"):
        SamplingParams(stop_token_ids=list(range(65)))
    assert SamplingParams(stop_token_ids=[5, 3, 5, 3]).stop_token_ids == [5, 3]
