"""What the server needs of an engine (`Runner`, and the `Output` / `Rejected` items its queues yield), and the engine
loop in a thread of the server, bridged to asyncio (`EngineRunner`, `--engine-process off`; the default runs the
engine in its own process instead, engine/core/client.py, behind the same surface).

Handlers call the engine's thread-safe `add_request`/`abort_request` directly (they only take the engine's short
inbox lock, so admission errors such as QueueFullError are raised synchronously, before any response starts) and
wake the engine thread. That thread alone calls `LLMEngine.step()` and hands each step's outputs back to per-request
asyncio queues with ONE `loop.call_soon_threadsafe` per step, so a step never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from sits.engine.core.heap import freeze_startup_heap

log = logging.getLogger("sits.engine.server")


@dataclass(slots=True)
class Rejected:
    """The request can no longer be served (engine crashed or server shutting down)."""

    error: Exception


@dataclass(slots=True)
class Output:
    out: Any             # engine RequestOutput
    step_start: float    # perf_counter() when the step that produced it began


class Runner(Protocol):
    """What the server needs of an engine: EngineRunner (a thread here) or EngineCoreClient (another process)."""

    ready: threading.Event
    load_error: str | None
    failed: bool                        # the engine died after it was ready: the server must exit non-zero
    on_fatal: Callable[[], None] | None
    engine: Any                         # .tokenizer, .max_model_len, .kernel_set, .dtype, .model_name
    started_at: float
    steps: int
    step_seconds: float

    def start(self, loop: asyncio.AbstractEventLoop) -> None: ...
    def shutdown(self, timeout: float = 10.0) -> None: ...
    async def submit(self, request_id: str, prompt: Any, params: Any, *, tenant: str,
                     priority: int) -> asyncio.Queue: ...
    def abort(self, request_id: str) -> None: ...
    def stats(self) -> Any: ...         # the engine's EngineStats (as of its last step), None before it loaded


class EngineRunner:
    def __init__(self, engine_factory: Callable[[], Any], *, metrics: Any = None, warmup: bool = True,
                 fault_token_latency_s: float = 0.0) -> None:
        self._factory = engine_factory
        self._metrics = metrics
        self._warmup = warmup
        self._fault_token_latency_s = fault_token_latency_s
        self.engine: Any = None
        self.ready = threading.Event()
        self.load_error: str | None = None
        # set when the engine failed to load: the server says so (/readyz 503 "failed") and exits non-zero at once.
        # An in-process loop crash after it was ready keeps the process up, reporting it (readyz/healthz 503); only
        # the engine-core process mode exits on a crash
        self.failed = False
        self.on_fatal: Callable[[bool], None] | None = None   # on the event loop; True: it never loaded
        self._cv = threading.Condition()
        self._stop = False
        self._queues: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # accounting for bench/serving.py and /metrics
        self.started_at = time.time()
        self.steps = 0
        self.step_seconds = 0.0

    # ---- lifecycle (event-loop side) ----
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="sits-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- requests (event-loop side) ----
    async def submit(self, request_id: str, prompt: Any, params: Any, *, tenant: str,
                     priority: int) -> asyncio.Queue:
        """Admit a request (raises the engine's InvalidRequestError/QueueFullError); the queue yields Output items,
        or one Rejected if the engine stops first."""
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        try:
            self.engine.add_request(request_id, prompt, params, tenant=tenant, priority=priority)
        except BaseException:
            self._queues.pop(request_id, None)
            raise
        with self._cv:
            self._cv.notify()
        return queue

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone); a no-op once it finished. Its queue gets no further items."""
        if self._queues.pop(request_id, None) is None:
            return
        self.engine.abort_request(request_id)
        with self._cv:
            self._cv.notify()

    def stats(self) -> Any:
        return self.engine.stats() if self.ready.is_set() else None

    # ---- engine thread ----
    def _run(self) -> None:
        if self._metrics is not None:
            self._metrics.track_thread("engine", threading.get_native_id())
        try:
            self.engine = self._factory()
            if self._warmup:
                self._warm_up()
            if self._metrics is not None:
                self._metrics.set_stats_source(self.engine.stats)
        except Exception as e:  # /readyz says so while the server shuts down; it exits non-zero with this error
            log.exception("engine failed to load")
            self.load_error = f"{type(e).__name__}: {e}"
            self.failed = True
            if self.on_fatal is not None and self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.on_fatal, True)
            return
        freeze_startup_heap("server")
        self.ready.set()
        log.info("engine ready: model=%s kernels=%s", self.engine.model_name, self.engine.kernel_set.name)
        try:
            self._loop_forever()
        except Exception:
            log.exception("engine loop crashed")
            self.load_error = "engine loop crashed"
            self.ready.clear()
            self._fail_all(RuntimeError("engine loop crashed"))
        finally:
            self.engine.close()   # stops the tensor-parallel ranks, if any

    def _warm_up(self) -> None:
        t0 = time.perf_counter()
        self.engine.warmup()
        log.info("warm-up took %.2f s", time.perf_counter() - t0)

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not self._stop and not engine.has_unfinished_requests():
                    self._cv.wait(timeout=1.0)
                if self._stop:
                    break
            batch: list[tuple[asyncio.Queue, Any]] = []
            if engine.has_unfinished_requests():
                t0 = time.perf_counter()
                outputs = engine.step()
                dt = time.perf_counter() - t0
                self.steps += 1
                self.step_seconds += dt
                if self._metrics is not None:
                    self._metrics.observe_step(dt)
                produced = False
                for out in outputs:
                    produced = produced or bool(out.new_token_ids)
                    q = self._queues.get(out.request_id)
                    if q is not None:
                        batch.append((q, Output(out, t0)))
                        if out.finished:
                            self._queues.pop(out.request_id, None)
                if produced and self._fault_token_latency_s > 0:
                    # fault injection: a slow kernel makes every step, hence every generated token, slower
                    time.sleep(self._fault_token_latency_s)
            if batch:
                self._loop.call_soon_threadsafe(_deliver, batch)
        self._fail_all(RuntimeError("server shutting down"))

    def _fail_all(self, error: Exception) -> None:
        queues, self._queues = self._queues, {}
        if queues and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, [(q, Rejected(error)) for q in queues.values()])


def _deliver(batch: list[tuple[asyncio.Queue, Any]]) -> None:
    for q, item in batch:
        q.put_nowait(item)
