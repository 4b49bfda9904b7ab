"""Bad input gets a 4xx OpenAI-style error body (never a stack trace); a full waiting queue gets 429 + Retry-After."""

import json
import re
import socket
import threading

import httpx
import openai
import pytest

from sits.engine.errors import ContextLengthError
from tests.engine.server.harness import http, sample
from tests.waiting import wait_for

OK = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
LONG = "x" * 5000  # > the tiny model's 4096-token context with the byte tokenizer

CASES = [
    # (name, method, path, body, headers, status, param)
    ("malformed json", "POST", "/v1/completions", b'{"model": "tiny", "prompt": ', {}, 400, None),
    ("json array", "POST", "/v1/completions", b"[1, 2]", {}, 400, None),
    ("empty body", "POST", "/v1/completions", b"", {}, 400, None),
    ("missing prompt", "POST", "/v1/completions", {"model": "tiny"}, {}, 400, "prompt"),
    ("missing model", "POST", "/v1/completions", {"prompt": "x"}, {}, 400, "model"),
    ("ill-typed prompt", "POST", "/v1/completions", {"model": "tiny", "prompt": {"a": 1}}, {}, 400, "prompt"),
    ("ill-typed max_tokens", "POST", "/v1/completions", {**OK, "max_tokens": "5"}, {}, 400, "max_tokens"),
    ("max_tokens zero", "POST", "/v1/completions", {**OK, "max_tokens": 0}, {}, 400, "max_tokens"),
    ("max_tokens negative", "POST", "/v1/completions", {**OK, "max_tokens": -1}, {}, 400, "max_tokens"),
    ("max_tokens above context", "POST", "/v1/completions", {**OK, "max_tokens": 5000}, {}, 400, "max_tokens"),
    ("prompt longer than context", "POST", "/v1/completions", {**OK, "prompt": LONG}, {}, 400, "prompt"),
    ("token id out of vocab", "POST", "/v1/completions", {**OK, "prompt": [1, 99999]}, {}, 400, "prompt"),
    ("unknown model", "POST", "/v1/completions", {**OK, "model": "gpt-9"}, {}, 404, "model"),
    ("n > 1", "POST", "/v1/completions", {**OK, "n": 2}, {}, 400, "n"),
    ("temperature out of range", "POST", "/v1/completions", {**OK, "temperature": 3}, {}, 400, "temperature"),
    ("bad priority header", "POST", "/v1/completions", OK, {"X-SITS-Priority": "9"}, 400, "X-SITS-Priority"),
    ("bad tenant header", "POST", "/v1/completions", OK, {"X-SITS-Tenant": "a/b"}, 400, "X-SITS-Tenant"),
    ("chat missing messages", "POST", "/v1/chat/completions", {"model": "tiny"}, {}, 400, "messages"),
    ("chat bad role", "POST", "/v1/chat/completions",
     {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, {}, 400, "messages"),
    ("chat too long", "POST", "/v1/chat/completions",
     {"model": "tiny", "messages": [{"role": "user", "content": LONG}]}, {}, 400, "messages"),
    ("chat tools unsupported", "POST", "/v1/chat/completions",
     {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, {}, 400,
     "tools"),
    ("wrong method", "GET", "/v1/completions", None, {}, 405, None),
    ("unknown route", "GET", "/v2/nothing", None, {}, 404, None),
]


@pytest.mark.parametrize("name,method,path,body,headers,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_table(server, name, method, path, body, headers, status, param):
    got, resp_headers, payload = http(method, server.url + path, body, headers)
    assert got == status, payload
    assert resp_headers["content-type"].startswith("application/json")
    err = json.loads(payload)["error"]
    assert isinstance(err["message"], str) and err["message"] and err["type"]
    assert err["param"] == param
    assert b"Traceback" not in payload and b'File "' not in payload


@pytest.mark.parametrize("body,param", [({"prompt": [1, 2, 3], "max_tokens": 5000}, "max_tokens"),
                                        ({"prompt": [1] * 4096, "max_tokens": 1}, "prompt")])
def test_context_length_is_one_typed_error_with_the_engines_message(server, body, param):
    got, _, payload = http("POST", server.url + "/v1/completions", {"model": "tiny", **body}, {})
    err = json.loads(payload)["error"]
    want = ContextLengthError(len(body["prompt"]), body["max_tokens"], 4096)   # what LLMEngine.add_request raises
    assert got == 400 and err["code"] == "context_length_exceeded" and err["param"] == param == want.param
    assert err["message"] == str(want)


def test_oversized_body_is_refused_before_it_is_read(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 999999999\r\n\r\n{")
        head, body = _read_response(sock)
    assert head.split()[1] == b"413" and json.loads(body)["error"]["message"].startswith("request body of")


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
        if sep and length and len(body) >= int(length.group(1)):
            return head, body
    raise AssertionError(f"incomplete response: {data!r}")


def test_openai_client_raises_typed_errors(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x")


def test_full_waiting_queue_gets_429_with_retry_after(serve):
    # 20 ms per engine step: the hog (2000 tokens) cannot finish, and free its slot, while the test runs
    s = serve(max_num_seqs=1, max_waiting=2, fault_token_latency_ms=20)
    hog = {"model": "tiny", "prompt": "hog", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    results: list[int] = []
    with httpx.Client(timeout=60) as c, c.stream("POST", s.url + "/v1/completions", json=hog) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # keep a reference: a dropped iterator closes the connection
        next(lines)  # the hog holds the only running slot now
        waiters = [threading.Thread(target=lambda: results.append(
            http("POST", s.url + "/v1/completions", {**OK, "max_tokens": 1})[0])) for _ in range(2)]
        for t in waiters:
            t.start()
        wait_for("the two waiters to queue", lambda: sample(s.metrics(), "sits_num_requests_waiting") >= 2,
                 timeout=20, interval=0.02)
        status, headers, payload = http("POST", s.url + "/v1/completions", OK)
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert json.loads(payload)["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0).completions.create(**OK)
    # closing the stream aborted the hog; the queued requests are then served
    for t in waiters:
        t.join(30)
    assert results == [200, 200]


def test_engine_that_fails_to_load_is_never_ready(serve, tmp_path):
    from tests.engine.server.harness import BASE, RunningServer
    from dataclasses import replace

    s = RunningServer(replace(BASE, model=str(tmp_path / "no-such-checkpoint")))
    try:
        def failed() -> bool:
            status, _, body = http("GET", s.url + "/readyz", timeout=5) if _up(s) else (None, None, b"")
            return status == 503 and json.loads(body)["status"] == "failed"
        wait_for("/readyz to say the engine failed", failed, timeout=30, retry_on=())
        assert http("GET", s.url + "/healthz")[0] == 503
        status, headers, body = http("POST", s.url + "/v1/completions", OK)
        assert status == 503 and "retry-after" in {k.lower() for k in headers}
        assert json.loads(body)["error"]["type"] == "service_unavailable"
    finally:
        s.stop()


def _up(s) -> bool:
    try:
        http("GET", s.url + "/healthz", timeout=2)
        return True
    except OSError:
        return False


def test_engine_crash_fails_in_flight_streams_and_readiness(tmp_path):
    from dataclasses import replace

    from sits.engine import LLMEngine
    from tests.engine.server.harness import BASE, RunningServer

    class CrashingEngine(LLMEngine):
        """A real engine whose step() fails once `armed` (stands in for a kernel that faults mid-run)."""

        armed = False

        def step(self):
            if CrashingEngine.armed:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().step()

    # in-process (a thread): the test arms the class attribute in this process; the core process has its own test
    s = RunningServer(replace(BASE, engine_process="off"), engine_factory=CrashingEngine).wait_ready()
    try:
        body = {"model": "tiny", "prompt": "doomed", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30) as c, c.stream("POST", s.url + "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            CrashingEngine.armed = True
            events = [line for line in lines if line.startswith("data: ")]
        err = json.loads(events[-1][6:])["error"]
        assert err["type"] == "service_unavailable" and "crashed" in err["message"]
        status, _, body_ = http("GET", s.url + "/readyz")
        assert status == 503 and json.loads(body_)["status"] == "failed"
        assert http("POST", s.url + "/v1/completions", OK)[0] == 503
        assert http("GET", s.url + "/healthz")[0] == 503  # liveness fails: only a restart helps
        # the in-band stream error and the refused request
        assert sample(s.metrics(), "sits_request_errors", "sits_request_errors_total", code="503") == 2
    finally:
        s.stop()
