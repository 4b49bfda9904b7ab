"""The status label of http_request_duration_seconds says what happened: a stream the client cut mid-way is 499 (not
the 200 its status line said), and a body that missed its deadline is 408 (what the client was sent), not the 400 the
handler made of the cut-off body."""
import json
import socket
from dataclasses import replace

import pytest

from tests.engine.server.harness import BASE, RunningServer, sample
from tests.waiting import wait_for

ROUTE = "/v1/completions"


@pytest.fixture(scope="module")
def server():
    s = RunningServer(replace(BASE, body_timeout_s=0.5)).wait_ready()
    yield s
    s.stop()


def _count(server, status: str) -> float:
    return sample(server.metrics(), "http_request_duration_seconds", "http_request_duration_seconds_count",
                  route=ROUTE, status=status)


def _connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.settimeout(30)   # a safety net only
    return s


def test_a_stream_cut_mid_way_is_recorded_as_499(server):
    before = {s: _count(server, s) for s in ("200", "499")}
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 400, "ignore_eos": True,
                       "stream": True}).encode()
    with _connect(server) as c:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while got.count(b"data: ") < 2:   # the status line and the first tokens: then the client goes away
            got += c.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ")
    wait_for("the cut stream to be recorded", lambda: _count(server, "499") == before["499"] + 1, 30)
    assert _count(server, "200") == before["200"]


def test_a_body_past_its_deadline_is_recorded_as_408(server):
    before = {s: _count(server, s) for s in ("400", "408")}
    with _connect(server) as c:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"model\"")
        answer = b""
        while chunk := c.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ")
    wait_for("the timed-out body to be recorded", lambda: _count(server, "408") == before["408"] + 1, 30)
    assert _count(server, "400") == before["400"]


def test_a_complete_stream_is_still_200(server):
    before = _count(server, "200")
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 3, "stream": True}).encode()
    with _connect(server) as c:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
        answer = b""
        while chunk := c.recv(65536):
            answer += chunk
    assert b"data: [DONE]" in answer
    wait_for("the stream to be recorded", lambda: _count(server, "200") == before + 1, 30)
