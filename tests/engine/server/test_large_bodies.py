"""Large request bodies are parsed off the event loop: /healthz and /readyz answer at once while several ~16 MB
bodies are received and parsed, the bodies still get their answers (200, or the same 400 a small body would), and the
number waiting for the parser is bounded."""

import asyncio
import json
import threading
import time

import pytest

from sits.wire.http_limits import MAX_BODY_BYTES
from sits.engine.server.body_parser import BodyParser
from sits.engine.server.errors import APIError
from tests.engine.server.harness import http
from tests.waiting import wait_for

PROBE_LIMIT_S = 1.5   # parsed on the loop, four such bodies kept /healthz waiting 10 s on this machine


def _padded(prefix: str, size: int = MAX_BODY_BYTES - 1024) -> bytes:
    # a valid request with an unknown field holding millions of numbers: json.loads and the value checks take about
    # a second per body, and the answer is still 200
    head = prefix + ', "padding": ['
    count = (size - len(head) - 2) // 2
    return (head + "1," * (count - 1) + "1]}").encode()


def test_probes_answer_at_once_while_large_bodies_are_parsed(server):
    body = _padded('{"model": "tiny", "prompt": "hi", "max_tokens": 2')
    assert len(body) > 15 * 1024 * 1024
    answers: list[int] = []

    def post() -> None:
        answers.append(http("POST", server.url + "/v1/completions", body, timeout=120)[0])

    posts = [threading.Thread(target=post) for _ in range(4)]
    for t in posts:
        t.start()
    probes: list[tuple[str, int, float]] = []

    def probe_until_answered() -> bool:
        for path in ("/healthz", "/readyz"):
            start = time.perf_counter()
            status = http("GET", server.url + path, timeout=30)[0]
            probes.append((path, status, time.perf_counter() - start))
        return not any(t.is_alive() for t in posts)

    wait_for("the four large bodies to be answered", probe_until_answered, timeout=120)
    assert answers == [200] * 4
    assert len(probes) >= 4 and all(status == 200 for _, status, _ in probes), probes
    slowest = max(probes, key=lambda p: p[2])
    assert slowest[2] < PROBE_LIMIT_S, f"{slowest[0]} took {slowest[2]:.2f} s while large bodies were parsed"


@pytest.mark.parametrize("prefix,param,message", [
    ('{"model": "tiny", "prompt": "a\\ud800b"', None, "lone UTF-16 surrogate"),
    ('{"model": "tiny", "prompt": "hi", "stop_token_ids": [1, 2, 3]', None, None),
    ('{"model": "tiny", "prompt": "hi", "temperature": 9', "temperature", "'temperature' must be in"),
], ids=["surrogate", "valid", "temperature out of range"])
def test_a_large_body_gets_the_answer_a_small_one_would(server, prefix, param, message):
    status, _, payload = http("POST", server.url + "/v1/completions", _padded(prefix, 256 * 1024), timeout=60)
    if message is None:
        assert status == 200, payload[:300]
        return
    err = json.loads(payload)["error"]
    assert status == 400 and err["param"] == param and message in err["message"], err


def test_bodies_waiting_for_the_parser_are_bounded():
    parser = BodyParser(on_loop_bytes=1024, max_waiting=1)
    body = _padded('{"model": "tiny", "prompt": "hi"', 512 * 1024)

    async def two_at_once():
        return await asyncio.gather(parser.parse(body, "completion"), parser.parse(body, "completion"),
                                    return_exceptions=True)

    try:
        first, second = asyncio.run(two_at_once())
        assert first.prompt == "hi"
        assert isinstance(second, APIError) and second.status == 429 and second.code == "too_many_large_bodies"
        assert asyncio.run(parser.parse(body, "completion")).prompt == "hi"   # the bound counts waiting bodies only
    finally:
        parser.shutdown()
