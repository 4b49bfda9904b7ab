"""The local deployer's replicas(): every engine process of a service with readiness (/readyz), state, restarts and
the last line its log holds, one printable line with URL credentials masked. Engines here are small Python HTTP
servers on the socket the deployer hands over (as sits-engine serves), so no model loads."""
import sys

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy import ReplicaStatus, VariantSpec
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from sits.control_plane.adapters.deploy.local.config import LocalConfig

# an engine that logs a line quoting a URL with credentials and a progress bar redrawn after \r, then serves /readyz
ENGINE = r'''
import http.server, socket, sys
fd = int(sys.argv[sys.argv.index("--listen-fd") + 1])
role = sys.argv[sys.argv.index("--env") + 1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
print(f"fetching weights from https://bot:hunter2@hub.example/{role}?token=s3cret", flush=True)
print("loading 1/2\rloading 2/2 \x1b[32mdone\x1b[0m " + "x" * 400, flush=True)
server = http.server.HTTPServer(("127.0.0.1", 0), H, bind_and_activate=False)
server.socket = socket.socket(fileno=fd)
server.serve_forever()
'''


def test_replicas_lists_each_engine_with_readiness_state_and_its_last_log_line(tmp_path):
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path), engine_command=(sys.executable, "-c", ENGINE, "engine"),
                                  ready_timeout_s=60.0, stop_timeout_s=5, max_replicas=4))
    try:
        assert d.replicas("chat") == []   # nothing deployed yet
        d.deploy(VariantSpec(service="chat", role="production", kernels="torch", replicas=2))
        d.deploy(VariantSpec(service="chat", role="canary", kernels="triton-v1", replicas=1))
        reps = d.replicas("chat")
        assert [(r.role, r.name) for r in reps] == [("production", "production-0"), ("production", "production-1"),
                                                    ("canary", "canary-0")]
        assert all(isinstance(r, ReplicaStatus) and r.ready and r.state == "running" and r.restarts == 0
                   for r in reps)
        line = reps[-1].last_log_line
        assert line.startswith("loading 2/2 done xxx") and len(line) == 200 and line.endswith("…")
        assert reps[0].address.startswith("http://127.0.0.1:")

        # the engine that quoted credentials last: masked before the line is cut
        victim = d._services["chat"].variants["canary"].replicas[0]
        victim.log_path.write_text("fetching weights from https://bot:hunter2@hub.example/canary?token=s3cret\n")
        process.stop(victim.proc, 5)
        canary = d.replicas("chat")[-1]
        assert not canary.ready and canary.state.startswith("exited ")
        assert canary.last_log_line == "fetching weights from https://***@hub.example/canary?token=***"
        assert "hunter2" not in str(d.replicas("chat")) and "s3cret" not in str(d.replicas("chat"))
    finally:
        d.close()
