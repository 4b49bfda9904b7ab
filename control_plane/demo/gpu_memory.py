"""GPU memory per engine while a GPU demo scenario runs: every few seconds, each variant's /metrics gauge
`sits_device_memory_reserved_bytes` (what the engine's CUDA caching allocator holds: weights, KV cache, activations;
the CUDA context not counted), the peak kept per role. nvidia-smi cannot say which process is which
role under MPS or inside a container, the engines can."""
from __future__ import annotations

import logging
import threading

import httpx

from sits.control_plane.adapters.deploy import Deployer
from sits.wire.metrics import DEVICE_MEMORY

log = logging.getLogger(__name__)


def gauge_value(text: str) -> float | None:
    """The gauge's value in a Prometheus text exposition, None when the engine does not export it (CPU)."""
    for line in text.splitlines():
        if line.startswith(DEVICE_MEMORY + "{") or line.startswith(DEVICE_MEMORY + " "):
            try:
                return float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                return None
    return None


class GpuMemorySampler:
    """Samples every variant of `service` on a thread of its own; `take()` returns and resets the peaks."""

    def __init__(self, deployer: Deployer, service: str, interval_s: float = 5.0) -> None:
        self._deployer, self._service, self._interval = deployer, service, interval_s
        self._peaks: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sits-demo-gpu-memory", daemon=True)
        self._http = httpx.Client(timeout=5.0, trust_env=False)

    def start(self) -> GpuMemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._http.close()

    def sample(self) -> None:
        try:
            variants = self._deployer.status(self._service)
        except Exception as e:   # a deploy in progress; the next pass reads it
            log.debug("gpu memory: status failed: %r", e)
            return
        for role, st in variants.items():
            for url in st.endpoints or ((st.endpoint,) if st.endpoint else ()):
                try:
                    value = gauge_value(self._http.get(url.rstrip("/") + "/metrics").text)
                except httpx.HTTPError:
                    continue
                if value is not None:
                    with self._lock:
                        self._peaks[role] = max(self._peaks.get(role, 0.0), value)

    def take(self) -> dict[str, float]:
        with self._lock:
            peaks, self._peaks = self._peaks, {}
        return peaks

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()
