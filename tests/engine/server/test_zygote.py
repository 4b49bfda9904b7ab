"""The engine zygote (engine/core/zygote.py): an API server started with SITS_ENGINE_ZYGOTE gets its engine core
forked from a process that has already imported torch; the core serves exactly what a spawned one does, reports how
it ended, and ends with its API server; an environment the zygote cannot give, or no zygote at all, means a spawned
core, as before."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sits.engine.core.zygote import import_time_differences
from sits.wire.zygote import ZYGOTE_ENV, ZYGOTE_READY_LINE
from tests.engine.server.harness import http
from tests.engine.server.processes import ServeProcess, alive, children
from tests.waiting import wait_for

BODY = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 2}


@pytest.fixture
def zygote(tmp_path_factory):
    folder = tmp_path_factory.mktemp("z")
    log = folder / "zygote.log"
    sock = f"/tmp/sits-test-zygote-{os.getpid()}-{folder.name}.sock"   # AF_UNIX paths are short
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sits.engine.core.zygote", "--socket", sock], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_for("the zygote to listen", lambda: ZYGOTE_READY_LINE in log.read_text(), 60, proc=proc)
        yield proc, sock
    finally:
        proc.terminate()
        proc.wait(30)
    assert not os.path.exists(sock)   # it removes its socket when it stops


def _answer(server: ServeProcess) -> dict:
    r = httpx.post(server.url + "/v1/completions", json=BODY, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"]["token_logprobs"]}


def test_a_forked_core_answers_as_a_spawned_one_and_ends_with_its_api_server(tmp_path, zygote, monkeypatch):
    proc, sock = zygote
    for d in ("spawned", "forked"):
        (tmp_path / d).mkdir()
    spawned = ServeProcess(tmp_path / "spawned", "--no-warmup")
    try:
        expected = _answer(spawned.wait_ready())
    finally:
        spawned.stop()
    monkeypatch.setenv(ZYGOTE_ENV, sock)
    server = ServeProcess(tmp_path / "forked", "--no-warmup").wait_ready()
    try:
        (core,) = children(proc.pid)
        assert Path(f"/proc/{core}/comm").read_text().strip() == "sits-core"
        assert not any(b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes() for p in children(server.proc.pid))
        assert f"engine core (pid {core}) forked by the engine zygote" in server.logs()
        assert _answer(server) == expected   # the same tokens and logprobs as the spawned core's
        # its own process: the API server's directory, not the zygote's
        assert os.path.realpath(f"/proc/{core}/cwd") == os.path.realpath(f"/proc/{server.proc.pid}/cwd")
        server.proc.kill()   # SIGKILL: no Shutdown reaches the core; it follows its API server all the same
        server.proc.wait(30)
        wait_for("the forked core to end with its API server", lambda: not alive(core), 10)
        wait_for("the zygote to reap it", lambda: children(proc.pid) == [], 10)
        assert proc.poll() is None   # and lives on
    finally:
        server.stop()


def test_a_killed_forked_core_is_reported_with_its_exit_code(tmp_path, zygote, monkeypatch):
    proc, sock = zygote
    monkeypatch.setenv(ZYGOTE_ENV, sock)
    server = ServeProcess(tmp_path, "--no-warmup").wait_ready()
    try:
        (core,) = children(proc.pid)
        os.kill(core, signal.SIGKILL)
        assert server.proc.wait(30) == 1, server.logs()
    finally:
        server.stop()
    assert "engine core process exited with code -9" in server.logs()


def test_an_environment_the_zygote_cannot_give_spawns_the_core(tmp_path, zygote, monkeypatch):
    proc, sock = zygote
    monkeypatch.setenv(ZYGOTE_ENV, sock)
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")   # read by torch when it loads: the zygote's is unset
    server = ServeProcess(tmp_path, "--no-warmup").wait_ready()
    try:
        assert server.core_pid() and children(proc.pid) == []
        assert http("GET", server.url + "/readyz")[0] == 200
    finally:
        server.stop()
    assert "the engine zygote refused: the environment differs from the zygote's in what is read at start-up: " \
           "TORCH_SHOW_CPP_STACKTRACES; spawning the engine core" in server.logs()


def test_no_zygote_at_the_address_spawns_the_core(tmp_path, monkeypatch):
    monkeypatch.setenv(ZYGOTE_ENV, str(tmp_path / "nobody.sock"))
    server = ServeProcess(tmp_path, "--no-warmup").wait_ready()
    try:
        assert server.core_pid()
    finally:
        server.stop()
    assert "the engine zygote at " in server.logs() and "is unavailable (FileNotFoundError" in server.logs()


@pytest.mark.parametrize("zygote_env,env,differ", [
    ({"PATH": "/a", "OMP_NUM_THREADS": "4"}, {"PATH": "/b", "OMP_NUM_THREADS": "1"}, []),   # applied in the core
    ({"PYTHONPATH": "/x"}, {"PYTHONPATH": "/y", "SITS_KERNEL_PLUGINS": "mine"}, []),
    ({"LD_PRELOAD": "a.so"}, {}, ["LD_PRELOAD"]),
    ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "MKL_CBWR": "AVX2"},
     ["MKL_CBWR", "PYTORCH_CUDA_ALLOC_CONF"]),
    ({"PYTHONHASHSEED": "0"}, {"PYTHONHASHSEED": "1"}, ["PYTHONHASHSEED"]),
])
def test_import_time_differences(zygote_env, env, differ):
    assert import_time_differences(zygote_env, env) == differ
