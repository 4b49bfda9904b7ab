"""The engine core in its own process (engine/core/): metrics that cross the process boundary, a crash that is
reported (503, readyz 503, exit non-zero) and never hangs a client, SIGTERM that drains, admission errors as before."""

import json
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from sits.wire.models import LOAD_FAILED
from tests.engine.server.harness import http, sample, wait_idle
from tests.waiting import wait_for
from tests.engine.server.processes import CRASH_TOKEN, CrashOnMarkedPrompt, ServeProcess, alive

LONG = {"model": "tiny", "prompt": "keep going", "max_tokens": 3000, "ignore_eos": True}


def test_the_engine_runs_in_another_process_and_its_metrics_reach_metrics(serve):
    s = serve(engine_process="on")
    core_pid = s.state.runner.engine.pid
    assert core_pid != os.getpid() and alive(core_pid)
    kv = s.state.runner.engine.kernel_set.version
    before = s.metrics()
    for n, stream in ((5, False), (7, True)):
        body = {"model": "tiny", "prompt": f"across {n}", "max_tokens": n, "ignore_eos": True, "stream": stream}
        assert http("POST", s.url + "/v1/completions", body)[0] == 200
    after = wait_idle(s)

    def delta(family, name=None, **labels):
        return sample(after, family, name, **labels) - sample(before, family, name, **labels)

    lbl = {"env": "test", "service": "engine-under-test", "kernel_version": kv}
    # counted in the core, shipped with its outputs
    assert delta("sits_generation_tokens", "sits_generation_tokens_total", **lbl) == 12
    assert delta("sits_prompt_tokens", "sits_prompt_tokens_total", **lbl) > 0
    steps = delta("sits_engine_step_seconds", "sits_engine_step_seconds_count", **lbl)
    assert steps >= 7
    assert sample(after, "sits_kv_cache_total_blocks", **lbl) > 0
    assert sample(after, "sits_kv_cache_free_blocks", **lbl) == sample(after, "sits_kv_cache_total_blocks", **lbl)
    assert delta("sits_thread_cpu_seconds", "sits_thread_cpu_seconds_total", thread="engine") > 0
    # observed on the front, as always
    assert delta("sits_time_to_first_token_seconds", "sits_time_to_first_token_seconds_count", **lbl) == 2
    assert delta("sits_inter_token_latency_seconds", "sits_inter_token_latency_seconds_count", **lbl) == 4 + 6
    assert delta("sits_request_success", "sits_request_success_total", finished_reason="length", **lbl) == 2
    assert delta("http_request_duration_seconds", "http_request_duration_seconds_count",
                 route="/v1/completions", status="200") == 2


def test_admission_errors_come_from_the_core_before_the_response_starts(serve):
    s = serve(engine_process="on", max_num_seqs=1, max_waiting=1, max_model_len=128, fault_token_latency_ms=20)
    status, _, body = http("POST", s.url + "/v1/completions", {"model": "tiny", "prompt": [5] * 100,
                                                                "max_tokens": 60})
    assert status == 400 and json.loads(body)["error"]["code"] == "context_length_exceeded"
    slow = {**LONG, "max_tokens": 100}   # 100 steps of >= 20 ms: still running while the others arrive
    with httpx.Client(base_url=s.url, timeout=60) as c, c.stream("POST", "/v1/completions",
                                                                  json={**slow, "stream": True}) as first:
        lines = first.iter_lines()   # kept: a dropped line iterator closes the stream
        assert next(lines).startswith("data: ")   # running: the one sequence slot is taken
        waiting = threading.Thread(target=http, args=("POST", s.url + "/v1/completions", {**LONG, "max_tokens": 8}))
        waiting.start()
        wait_for("one request waiting", lambda: sample(s.metrics(), "sits_num_requests_waiting") == 1)
        r = c.post("/v1/completions", json={**LONG, "max_tokens": 8})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full" and r.headers["retry-after"]
    waiting.join(60)
    wait_idle(s)


def test_a_crash_in_the_core_loop_fails_requests_and_readiness(serve):
    s = serve(engine_process="on", engine_factory=CrashOnMarkedPrompt)
    fatal = threading.Event()
    s.state.runner.on_fatal = lambda loading: fatal.set()
    core_pid = s.state.runner.engine.pid
    with httpx.Client(base_url=s.url, timeout=30) as c, c.stream("POST", "/v1/completions",
                                                                  json={**LONG, "stream": True}) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: {")
        r = c.post("/v1/completions", json={"model": "tiny", "prompt": [CRASH_TOKEN] * 5, "max_tokens": 4})
        assert r.status_code == 503 and "crashed" in r.json()["error"]["message"]
        events = [line for line in lines if line.startswith("data: ")]
    err = json.loads(events[-1][6:])["error"]
    assert err["type"] == "service_unavailable" and "illegal memory access" in err["message"]
    assert fatal.wait(10)
    status, _, body = http("GET", s.url + "/readyz")
    assert status == 503 and json.loads(body)["status"] == "failed"
    assert http("GET", s.url + "/healthz")[0] == 503
    assert http("POST", s.url + "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2})[0] == 503
    wait_for("the core to exit", lambda: not alive(core_pid))


def test_a_killed_core_is_reported_then_the_server_exits_non_zero(tmp_path):
    server = ServeProcess(tmp_path, "--no-warmup").wait_ready()
    try:
        core = server.core_pid()
        # the API front labels with the kernel set's name and version but loads no kernel and no torch (measured:
        # 1.8 -> 0.5 s of CPU to start, 310 -> 39 MB resident): only the core does
        assert "libtorch" not in Path(f"/proc/{server.proc.pid}/maps").read_text()
        assert "libtorch" in Path(f"/proc/{core}/maps").read_text()
        with httpx.Client(base_url=server.url, timeout=30) as c, c.stream("POST", "/v1/completions",
                                                                          json={**LONG, "stream": True}) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: {")
            os.kill(core, signal.SIGKILL)
            events = [line for line in lines if line.startswith("data: ")]   # ends: the client is not left hanging
        assert "error" in json.loads(events[-1][6:]), events[-1]
        status, _, body = http("GET", server.url + "/readyz")
        assert status == 503 and "exited with code -9" in json.loads(body)["error"]
        assert http("POST", server.url + "/v1/completions", {**LONG, "max_tokens": 2})[0] == 503
        assert server.proc.wait(30) == 1, server.logs()
    finally:
        server.stop()
    assert "engine core process exited with code -9" in server.logs()


def test_sigterm_drains_in_flight_requests_then_stops_the_core(tmp_path):
    server = ServeProcess(tmp_path, "--no-warmup", "--fault-token-latency-ms", "5").wait_ready()
    try:
        core = server.core_pid()
        results = {}

        def complete(name: str, n: int, stream: bool) -> None:
            body = {**LONG, "max_tokens": n, "stream": stream, "stream_options": {"include_usage": True}}
            results[name] = http("POST", server.url + "/v1/completions", body, timeout=60)

        clients = [threading.Thread(target=complete, args=(f"c{i}", 60, i % 2 == 1)) for i in range(4)]
        for t in clients:
            t.start()
        wait_for("four requests running", lambda: sample(_metrics(server.url), "sits_num_requests_running") == 4)
        server.proc.send_signal(signal.SIGTERM)
        for t in clients:
            t.join(60)
        assert server.proc.wait(30) == 0, server.logs()
    finally:
        server.stop()
    # the core stopped on its Shutdown message: no false "did not stop" (the loop's exit watcher had reaped it, and
    # is_alive() read the second waitpid's ECHILD as alive) and no kill of an already reaped pid
    assert "did not stop" not in server.logs(), server.logs()
    for name, (status, _, body) in sorted(results.items()):
        assert status == 200, (name, body[:300])
        if b"data: " in body:
            usage = json.loads(body.split(b"data: ")[-2])["usage"]
        else:
            usage = json.loads(body)["usage"]
        assert usage["completion_tokens"] == 60, (name, usage)
    wait_for("the core to exit", lambda: not alive(core))


def _metrics(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f.samples for f in text_string_to_metric_families(http("GET", url + "/metrics")[2].decode())}


def test_both_modes_give_the_same_answers(serve):
    """--engine-process on (text decoded in the server) and off (decoded in the engine thread): the same greedy
    tokens and text, streamed or not, with a stop string (decoded in the core) and with logprobs."""
    answers = {}
    stop = None
    for mode in ("on", "off"):
        s = serve(engine_process=mode)

        def complete(**body):
            body = {"model": "tiny", "temperature": 0, "ignore_eos": True, "return_token_ids": True, **body}
            status, _, raw = http("POST", s.url + "/v1/completions", body)
            assert status == 200, raw
            if body.get("stream"):
                chunks = [json.loads(event[6:]) for event in raw.decode().split("\n\n") if event.startswith("data: {")]
                return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            choice = json.loads(raw)["choices"][0]
            return choice["text"], choice["token_ids"], choice["finish_reason"], choice["logprobs"]

        free = complete(prompt="naïve café ☃ — ünïcödé", max_tokens=40)
        stop = stop or free[0][10:12]   # a piece of the answer: the stopped request must end just before it
        answers[mode] = [free, complete(prompt="naïve café ☃ — ünïcödé", max_tokens=40, stream=True),
                         complete(prompt="naïve café ☃ — ünïcödé", max_tokens=40, stop=[stop]),
                         complete(prompt="with logprobs", max_tokens=12, logprobs=2)]
    assert answers["on"] == answers["off"]
    free, streamed, stopped, _ = answers["on"]
    assert streamed == free[0] and stopped[2] == "stop" and free[0].startswith(stopped[0] + stop)


def test_a_broken_channel_from_the_core_is_a_crash_not_a_hang(serve):
    """Bytes on the outputs socket that are no message: open requests fail (503), readiness fails, the core is
    stopped -- nothing waits forever for outputs that will not be read."""
    import zmq

    s = serve(engine_process="on")
    runner = s.state.runner
    core_pid = runner.engine.pid
    with httpx.Client(base_url=s.url, timeout=30) as c, c.stream("POST", "/v1/completions",
                                                                  json={**LONG, "stream": True}) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: {")
        ctx = zmq.Context()
        intruder = ctx.socket(zmq.PUSH)
        intruder.connect(f"ipc://{runner._tmp.name}/out")
        intruder.send(b"\xc1 not msgpack")
        events = [line for line in lines if line.startswith("data: ")]
        intruder.close(linger=1000)
        ctx.term()
    assert "lost the engine core's outputs" in json.loads(events[-1][6:])["error"]["message"]
    assert runner.failed and http("GET", s.url + "/readyz")[0] == 503
    wait_for("the core to exit", lambda: not alive(core_pid))


@pytest.mark.parametrize("mode", ["on", "off"])
def test_an_engine_that_cannot_load_exits_non_zero_at_once_with_its_error_last(tmp_path, mode):
    """No waiting for a readiness deadline: the process ends with code 1 as soon as the load fails, and its last
    line is the load error (what the deployers show as the reason), whichever process the engine ran in."""
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    # argparse keeps the last --model: this one, not ServeProcess's tiny
    server = ServeProcess(tmp_path, "--no-warmup", "--engine-process", mode, "--model", str(empty))
    try:
        assert server.proc.wait(60) == 1, server.logs()
    finally:
        server.stop()
    last = server.logs().strip().splitlines()[-1]
    assert last.startswith(LOAD_FAILED) and "has no config.json" in last, server.logs()
