"""Open-loop load through a router (the demo's traffic, and the end-to-end tests'): requests per variant and status,
client-side latency summaries."""
from __future__ import annotations

import threading
import time
from collections import deque

import httpx


class LoadGenerator:
    """Open-loop load through the router: `rate` requests/s spread over `threads` senders (a sender that falls
    behind sends at once). Counts answers per variant (the router's x-sits-variant header) and status."""

    def __init__(self, url: str, rate: float = 20.0, threads: int = 16, max_tokens: int = 4,
                 prompt: str = "Once upon a time") -> None:
        if not rate > 0 or threads < 1:
            raise ValueError("load rate must be > 0 and threads >= 1")
        self.url, self.rate, self.threads = url.rstrip("/"), rate, threads
        self.body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        self.sent = 0
        self.recent: deque[tuple[float, str, int, float]] = deque(maxlen=20000)   # (t, variant, status, seconds)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []

    def start(self) -> "LoadGenerator":
        t0 = time.monotonic()
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(t0 + i / self.rate,), name=f"sits-load-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(30)

    def _run(self, next_at: float) -> None:
        period = self.threads / self.rate
        with httpx.Client(timeout=60, trust_env=False) as c:
            while not self._stop.is_set():
                delay = next_at - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
                next_at = max(next_at + period, time.monotonic() - period)
                start = time.monotonic()
                try:
                    r = c.post(self.url + "/v1/completions", json=self.body)
                    variant, status = r.headers.get("x-sits-variant", "?"), r.status_code
                except httpx.HTTPError:
                    variant, status = "?", 0
                with self._lock:
                    self.sent += 1
                    self.recent.append((time.monotonic(), variant, status, time.monotonic() - start))

    def summary(self, last_s: float = 10.0) -> dict:
        """Requests/s, share and p90 client latency per variant over the last `last_s` seconds."""
        cut = time.monotonic() - last_s
        with self._lock:
            rows = [x for x in self.recent if x[0] >= cut]
        out = {"rate": len(rows) / last_s, "errors": sum(1 for r in rows if r[2] != 200), "variants": {}}
        for v in sorted({r[1] for r in rows}):
            lat = sorted(r[3] for r in rows if r[1] == v)
            out["variants"][v] = {"share": len(lat) / len(rows), "p90_ms": 1000 * lat[int(0.9 * (len(lat) - 1))]}
        return out
