"""The local deployer's readiness deadline: a replica that never answers /readyz within the spec's deadline (else
LocalConfig.ready_timeout_s), or exits first, is stopped and reported as NotReadyError with its last log line."""
import pytest

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy import DeployInterrupted, InvalidVariantError, NotReadyError, VariantSpec
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.deploy.local.replicas import last_line
from sits.control_plane.adapters.deploy.local.config import LocalConfig


def e_pid(tmp_path) -> int:
    """The pid the engine script wrote first thing (`echo $$`: sh execs sleep in the same process)."""
    log = next(tmp_path.glob("*.log")).read_text().splitlines()
    return int(next(x for x in log if x.startswith("pid ")).split()[1])


def _deployer(tmp_path, script: str) -> LocalDeployer:
    # an "engine" that logs like one and then never serves (or exits): the deployer's wait is what is tested
    return LocalDeployer(LocalConfig(workdir=str(tmp_path), engine_command=("sh", "-c", script, "engine"),
                                     ready_timeout_s=180.0, stop_timeout_s=5))


def test_a_replica_not_ready_by_the_spec_deadline_is_stopped_and_reported_with_its_last_log_line(tmp_path):
    d = _deployer(tmp_path, 'echo "pid $$"; echo "loading llama3-8b"; echo "capturing CUDA graphs 12/35"; echo; exec sleep 300')
    try:
        with pytest.raises(NotReadyError) as ei:
            d.deploy(VariantSpec(service="slow", role="canary", kernels="torch", ready_timeout_s=1.5))
        e = ei.value
        assert e.exit_code is None and e.waited_s >= 1.5
        assert e.last_line == "capturing CUDA graphs 12/35"
        first = str(e).splitlines()[0]
        assert first == "slow/canary: engine not ready after 1.5 s; its last log line: capturing CUDA graphs 12/35"
        assert d.status("slow") == {}   # nothing half-deployed is left behind
        assert not process.pid_alive(e_pid(tmp_path))   # and the engine was stopped
    finally:
        d.close()


def test_a_replica_that_exits_before_it_is_ready_is_reported_with_its_exit_code(tmp_path):
    d = _deployer(tmp_path, 'echo "torch.OutOfMemoryError: CUDA out of memory" >&2; exit 3')
    try:
        with pytest.raises(NotReadyError) as ei:
            d.deploy(VariantSpec(service="oom", role="canary", kernels="torch", ready_timeout_s=60))
        assert ei.value.exit_code == 3 and ei.value.last_line == "torch.OutOfMemoryError: CUDA out of memory"
        assert str(ei.value).startswith("oom/canary: engine exited with code 3 before it was ready; its last log line")
    finally:
        d.close()


def test_last_line_skips_blank_lines_and_bounds_its_length(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("first\n" + "y" * 500 + "\n\n  \n")
    assert last_line(p) == "y" * 300
    assert last_line(tmp_path / "missing.log") == ""
    p.write_text("")
    assert last_line(p) == ""


def test_spec_deadline_is_validated():
    for bad in (0, -1, True, "10", 10 ** 9):
        with pytest.raises(InvalidVariantError, match="ready_timeout_s"):
            VariantSpec(service="x", role="canary", kernels="torch", ready_timeout_s=bad)


ENGINE_FAILED_TO_LOAD = r'''
import http.server, json, socket, sys
fd = int(sys.argv[sys.argv.index("--listen-fd") + 1])   # the socket the deployer bound and handed over
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "failed", "error": "ValueError: unknown model 'llama3-70b'"}).encode()
        self.send_response(503); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
print("engine failed to load", flush=True)
server = http.server.HTTPServer(("127.0.0.1", 0), H, bind_and_activate=False)
server.socket = socket.socket(fileno=fd)
server.serve_forever()
'''


def test_an_engine_that_failed_to_load_is_reported_at_once_by_what_its_readyz_says(tmp_path):
    """It stays up answering 503 and logging probes: the deploy fails as soon as /readyz says "failed" (not at the
    readiness deadline, 600 s here), and the error's first line is the engine's own load error, not a log line."""
    import sys
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path), engine_command=(sys.executable, "-c", ENGINE_FAILED_TO_LOAD),
                                  ready_timeout_s=600.0, stop_timeout_s=5))
    try:
        with pytest.raises(NotReadyError) as ei:
            d.deploy(VariantSpec(service="llm", role="canary", kernels="torch", ready_timeout_s=600))
        lines = str(ei.value).splitlines()
        assert lines[0] == "llm/canary: engine failed to load: ValueError: unknown model 'llama3-70b'"
        assert lines[1].startswith("its last log line: ")
        assert ei.value.waited_s < 120   # the first probe that could answer, not the 600 s deadline
    finally:
        d.close()


ENGINE_LOADING_FOREVER = r'''
import http.server, socket, sys
fd = int(sys.argv[sys.argv.index("--listen-fd") + 1])
class H(http.server.BaseHTTPRequestHandler):   # answers /readyz 503 "loading" and logs each probe as uvicorn does
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b'{"status": "loading"}'
        self.send_response(503); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
        print(f'INFO:     127.0.0.1:{self.client_address[1]} - "GET /readyz HTTP/1.1" 503 Service Unavailable',
              flush=True)
    def log_message(self, *a):
        pass
print(f"pid {__import__('os').getpid()}", flush=True)
print("loading weights 3/7", flush=True)
server = http.server.HTTPServer(("127.0.0.1", 0), H, bind_and_activate=False)
server.socket = socket.socket(fileno=fd)
server.serve_forever()
'''


def _loading_deployer(tmp_path) -> LocalDeployer:
    import sys
    return LocalDeployer(LocalConfig(workdir=str(tmp_path), stop_timeout_s=5, ready_timeout_s=600.0,
                                     engine_command=(sys.executable, "-c", ENGINE_LOADING_FOREVER)))


def test_a_deploy_stops_waiting_as_soon_as_interrupted_says_so_and_stops_its_engine(tmp_path):
    """The worker's callback (an abort is queued) is asked while the engine loads: the deploy gives up within a
    second or two of it saying so, not at the 600 s deadline, and leaves nothing running."""
    d, asked = _loading_deployer(tmp_path), []

    def interrupted() -> bool:
        asked.append(1)
        return len(asked) >= 2   # the abort arrives while the deploy waits

    try:
        with pytest.raises(DeployInterrupted, match=r"^llm/canary: deploy interrupted after \d+ s"):
            d.deploy(VariantSpec(service="llm", role="canary", kernels="torch", ready_timeout_s=600), interrupted)
        assert len(asked) == 2 and d.status("llm") == {}
        assert not process.pid_alive(e_pid(tmp_path))
    finally:
        d.close()


def test_a_deploy_that_times_out_names_the_engines_own_line_not_a_probe_and_its_log_tail_stays_short(tmp_path):
    """An engine that access-logs every /readyz probe: the error's last log line is what the engine said (not
    `"GET /readyz HTTP/1.1" 503`), the tail collapses the repeated probe lines into one, and probes slow down while
    it loads (0.1 s apart at first, then 1 s), so its log does not fill up with them."""
    d = _loading_deployer(tmp_path)
    try:
        with pytest.raises(NotReadyError) as ei:
            d.deploy(VariantSpec(service="llm", role="canary", kernels="torch", ready_timeout_s=4))
        e, text = ei.value, str(ei.value)
        assert text.splitlines()[0] == "llm/canary: engine not ready after 4 s; its last log line: loading weights 3/7"
        assert e.last_line == "loading weights 3/7"
        log = next(tmp_path.glob("*.log")).read_text().splitlines()   # its first line: the command (the script)
        probes = sum(x.startswith("INFO: ") for x in log)
        assert 3 <= probes <= 12, probes   # 40 at a steady 0.1 s
        tail = text.split(f"log {tmp_path}", 1)[1].splitlines()[1:]
        assert tail[-1] == f"  (the line above {probes - 1} more times)" and "loading weights 3/7" in tail
        assert tail[-2].startswith("INFO: ") and tail[-2] in log and sum(x.startswith("INFO: ") for x in tail) == 1
    finally:
        d.close()


def test_a_real_engine_that_cannot_load_its_model_fails_the_deploy_at_once_with_its_load_error(tmp_path):
    """sits-engine serve with a checkpoint directory that has no config.json: the deploy stops as soon as /readyz
    says failed (not at the 600 s deadline) and its first line is the engine's own load error."""
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path / "w"), ready_timeout_s=600.0, stop_timeout_s=5, cpu_threads=1))
    try:
        with pytest.raises(NotReadyError) as ei:
            d.deploy(VariantSpec(service="llm", role="canary", kernels="torch", model=str(empty), device="cpu",
                                 ready_timeout_s=600))
        first = str(ei.value).splitlines()[0]
        assert first.startswith("llm/canary: engine failed to load: ") and "has no config.json" in first, first
        assert ei.value.waited_s < 300 and "GET /readyz" not in ei.value.last_line
        assert d.status("llm") == {}
    finally:
        d.close()
