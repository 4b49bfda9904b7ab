"""Real engine servers on loopback: uvicorn in a thread of the test process, on a free port."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sits.control_plane.adapters.deploy.local.process import listening_socket
from sits.engine.server.main import ServerConfig, build_app, uvicorn_config
from tests.waiting import wait_for

BASE = ServerConfig(model="tiny", kernels="torch", env="test", service="engine-under-test", device="cpu",
                    max_num_seqs=64, log_level="warning", access_log=False)


def http(method: str, url: str, body: dict | bytes | None = None, headers: dict | None = None,
         timeout: float = 60) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class RunningServer:
    def __init__(self, config: ServerConfig, *, memory_exporter: bool = True, engine_factory=None):
        """memory_exporter: spans go to `self.exporter` (in memory) instead of the exporter `config` names."""
        import uvicorn

        self.config = config
        self.exporter = InMemorySpanExporter() if memory_exporter else None
        self.app = build_app(config, span_exporter=self.exporter, engine_factory=engine_factory)
        self.sock = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn_config(self.app, config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    @property
    def state(self):
        return self.app.state.sits

    def wait_ready(self, timeout: float = 120) -> "RunningServer":
        def ready() -> bool:
            if not self.thread.is_alive():
                raise RuntimeError("server thread exited")
            return http("GET", self.url + "/readyz", timeout=2)[0] == 200
        wait_for("server ready", ready, timeout, error=TimeoutError, retry_on=(OSError,))
        return self

    def metrics(self) -> dict[str, list]:
        """{family name: [samples]} from /metrics."""
        status, _, body = http("GET", self.url + "/metrics")
        assert status == 200
        return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def sample(metrics: dict, family: str, name: str | None = None, **labels) -> float:
    """Sum of the samples of `family` (sample name `name`, default the family) whose labels include `labels`."""
    name = name or family
    return sum(s.value for s in metrics.get(family, []) if s.name == name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def wait_idle(server, timeout: float = 30) -> dict:
    """Poll `server.metrics()` until nothing runs or waits and every KV block is free again; returns those metrics.
    Fails (naming the counts) if that takes longer than `timeout` seconds."""
    state: tuple = ()

    def idle() -> dict | None:
        nonlocal state
        m = server.metrics()
        state = (sample(m, "sits_num_requests_running"), sample(m, "sits_num_requests_waiting"),
                 sample(m, "sits_kv_cache_free_blocks"), sample(m, "sits_kv_cache_total_blocks"))
        return m if state[0] == 0 and state[1] == 0 and state[2] == state[3] else None
    return wait_for(lambda: f"idle (running, waiting, free, total = {state})", idle, timeout)
