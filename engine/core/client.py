"""The API server's side of the engine-core process (engine/core/process.py): start it (spawned, or forked by the
local deployer's engine zygote: engine/core/zygote.py), send it requests, route its outputs to per-request asyncio
queues on the event loop, and report its crash.

Same surface as engine/core/runner.EngineRunner (the in-process engine thread), so the handlers do not know which
one serves them: `ready`, `load_error`, `engine` (here an `EngineInfo`: tokenizer, max_model_len, kernel set, dtype
-- what the front needs, without the model), `start`, `shutdown`, `submit` (awaits the core's admission, so
QueueFullError and friends still come before any response starts) and `abort`.

Metrics across the processes: the request histograms (TTFT, ITL, e2e, queue time, HTTP) are observed here as they
always were; the engine's step time arrives with each step's outputs and is observed here; its counters and gauges
(`LLMEngine.stats()`) and its loop's CPU seconds arrive after every step and once a second while idle, and /metrics
reads the latest. So every name and label stays what it was.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq
import zmq.asyncio

from sits.engine.core import messages as m
from sits.engine.core.process import CoreOptions, run_engine_core
from sits.engine.core.zygote import ZygoteError, fork_core
from sits.wire.zygote import ZYGOTE_ENV
from sits.engine.errors import EngineError
from sits.engine.core.heap import freeze_startup_heap
from sits.engine.model.tokenizer import IncrementalDetokenizer
from sits.engine.core.runner import Output, Rejected

log = logging.getLogger("sits.engine.server")


@dataclass(slots=True)
class EngineInfo:
    """What the handlers read of the engine: the model's name and context, the tokenizer, the kernel set."""

    model_name: str
    max_model_len: int
    dtype: str
    tokenizer: Any
    kernel_set: "KernelIdentity"   # what the core loaded: this process never imports the kernels (nor torch)
    pid: int            # the core process
    conformance: dict | None = None   # the core's op-level conformance report (engine/execution/conformance.py)


@dataclass(slots=True, frozen=True)
class KernelIdentity:
    name: str
    version: str


def _ended(proc: Any, timeout: float) -> bool:
    """Whether `proc` ended within `timeout` s. Its sentinel becomes readable when it exits, whichever thread reaps
    it: the loop's exit watcher (_on_exit) joins it too, and after that is_alive() takes the second waitpid's ECHILD
    for "still running"."""
    return bool(multiprocessing.connection.wait([proc.sentinel], timeout))


def load_front_tokenizer(model: str, seed: int) -> Any:
    """The tokenizer the core uses, loaded here too (tokenizing and detokenizing logprobs happen on the front)."""
    from sits.engine.model.loader import resolve_model
    from sits.engine.model.tokenizer import load_tokenizer

    source = resolve_model(model, seed)
    mc = source.config
    return load_tokenizer(source.path, mc.vocab_size, mc.eos_token_id, mc.bos_token_id)


class EngineCoreClient:
    def __init__(self, engine_config: Any, *, metrics: Any = None, warmup: bool = True,
                 fault_token_latency_s: float = 0.0, engine_factory: Callable[[Any], Any] | None = None,
                 log_level: str = "info") -> None:
        self._config = engine_config
        self._metrics = metrics
        self._opts = dict(warmup=warmup, fault_token_latency_s=fault_token_latency_s,
                          engine_factory=engine_factory, log_level=log_level)
        self.engine: EngineInfo | None = None
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.failed = False            # the core died or failed after it was ready: the server must exit
        self.on_fatal: Callable[[], None] | None = None
        self.started_at = time.time()
        self.steps = 0
        self.step_seconds = 0.0
        self._queues: dict[str, asyncio.Queue] = {}
        self._admissions: dict[str, asyncio.Future] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}   # requests whose text this process decodes
        self._stats: Any = None
        self._core_cpu_s: float | None = None
        self._process: Any = None
        self._tmp = tempfile.TemporaryDirectory(prefix="sits-core-")
        self._ctx = zmq.asyncio.Context()     # the PULL of outputs, awaited on the event loop
        self._sync_ctx = zmq.Context()        # the PUSH of requests: a send never waits (no high-water mark)
        self._to_core: Any = None
        self._from_core: Any = None
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    # ---- lifecycle (event loop) ----
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        to_addr, from_addr = (f"ipc://{os.path.join(self._tmp.name, n)}" for n in ("in", "out"))
        self._to_core = self._sync_ctx.socket(zmq.PUSH)
        self._to_core.setsockopt(zmq.LINGER, 0)
        self._to_core.setsockopt(zmq.SNDHWM, 0)
        self._to_core.bind(to_addr)
        self._from_core = self._ctx.socket(zmq.PULL)
        self._from_core.setsockopt(zmq.LINGER, 0)
        self._from_core.bind(from_addr)
        self._process = self._start_core(CoreOptions(self._config, to_addr, from_addr, os.getpid(), **self._opts))
        # runs before multiprocessing's own exit hook, which would SIGTERM the core (ignored there) and wait forever
        atexit.register(self._kill_core)
        if self._metrics is not None:
            self._metrics.set_stats_source(lambda: self._stats)
            self._metrics.set_thread_cpu_source("engine", lambda: self._core_cpu_s)
        loop.add_reader(self._process.sentinel, self._on_exit)
        self._reader = loop.create_task(self._read())
        self._reader.add_done_callback(self._on_reader_done)

    @staticmethod
    def _start_core(opts: CoreOptions) -> Any:
        """The core process: forked by the engine zygote where one runs for this server (ZYGOTE_ENV, set by the
        local deployer on a machine without GPUs), else spawned (a fresh interpreter that imports torch itself)."""
        address = os.environ.get(ZYGOTE_ENV)
        if address:
            try:
                core = fork_core(dataclasses.replace(opts, forked=True), address)
                log.info("engine core (pid %d) forked by the engine zygote", core.pid)
                return core
            except ZygoteError as e:
                log.warning("%s; spawning the engine core", e)
        proc = multiprocessing.get_context("spawn").Process(target=run_engine_core, args=(opts,),
                                                            name="sits-engine-core", daemon=True)
        proc.start()
        return proc

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the core (after the server drained its requests); called off the event loop."""
        self._stopping = True
        proc = self._process
        if proc is not None and proc.is_alive() and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._send, m.Shutdown())
            if not _ended(proc, timeout):
                log.warning("engine core did not stop within %.0f s; killing it", timeout)
                proc.kill()
                _ended(proc, 5)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._close_sockets)
        self._fail_all(EngineError("server shutting down"))

    def _kill_core(self) -> None:
        proc = self._process
        if proc is not None and not _ended(proc, 0):
            proc.kill()
            _ended(proc, 5)

    def _close_sockets(self) -> None:
        if self._process is not None:
            self._loop.remove_reader(self._process.sentinel)
        if self._reader is not None:
            self._reader.cancel()
        self._sync_ctx.destroy(linger=0)   # closes its sockets, then terminates (never waits on a peer)
        self._ctx.destroy(linger=0)
        self._tmp.cleanup()

    # ---- requests (event loop) ----
    async def submit(self, request_id: str, prompt: Any, params: Any, *, tenant: str, priority: int) -> asyncio.Queue:
        """Send the request to the core and wait for its admission (raises the engine's InvalidRequestError /
        QueueFullError / ContextLengthError, or EngineError if the core is gone)."""
        if self.failed or self._stopping:
            raise EngineError(self.load_error or "the engine is shutting down")
        queue: asyncio.Queue = asyncio.Queue()
        admitted = self._loop.create_future()
        prompt = list(prompt)
        self._queues[request_id] = queue
        self._admissions[request_id] = admitted
        here = not params.stop   # stop strings need the text in the core, which then sends it
        if here:
            self._detok[request_id] = IncrementalDetokenizer(self.engine.tokenizer, prompt)
        try:
            if not self._send(m.AddRequest(request_id, prompt, params, tenant, priority, detokenize=not here)):
                raise EngineError("the engine core is not connected")
            await admitted
        except BaseException:
            self._queues.pop(request_id, None)
            self._admissions.pop(request_id, None)
            self._detok.pop(request_id, None)
            raise
        return queue

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone); a no-op once it finished. Its queue gets no further items."""
        self._detok.pop(request_id, None)
        if self._queues.pop(request_id, None) is None or self.failed:
            return
        self._send(m.Abort([request_id]))

    def stats(self) -> Any:
        """The engine's stats as the core last reported them (after its last step, or its last idle report)."""
        return self._stats

    def _send(self, msg: Any) -> bool:
        """On the event loop only (a zmq socket belongs to one thread). Never blocks: False when the core is not
        connected (gone, or not started yet)."""
        try:
            self._to_core.send(m.encoder.encode(msg), zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    # ---- outputs (event loop) ----
    async def _read(self) -> None:
        decode = m.from_core_decoder.decode
        while True:
            frame = await self._from_core.recv(copy=False)
            msg = decode(frame.buffer)
            if isinstance(msg, m.StepOutputs):
                self._on_step(msg)
            elif isinstance(msg, m.Admitted):
                self._on_admitted(msg)
            elif isinstance(msg, m.Idle):
                self._stats, self._core_cpu_s = msg.stats, msg.cpu_s
            elif isinstance(msg, m.Ready):
                await self._on_ready(msg.info)
            else:
                self._on_failed(msg)

    def _on_reader_done(self, task: asyncio.Task) -> None:
        # a broken channel must not leave requests waiting forever: treat it as the core's crash
        if not task.cancelled() and task.exception() is not None and not self._stopping:
            log.error("reading the engine core's outputs failed", exc_info=task.exception())
            self._fatal(f"lost the engine core's outputs: {type(task.exception()).__name__}: {task.exception()}")
            self._kill_core()

    def _on_step(self, msg: m.StepOutputs) -> None:
        self.steps += 1
        self.step_seconds += msg.step_s
        self._stats, self._core_cpu_s = msg.stats, msg.cpu_s
        if self._metrics is not None:
            self._metrics.observe_step(msg.step_s)
        queues, detok = self._queues, self._detok
        for out in msg.outputs:
            q = queues.get(out.request_id)
            if q is None:
                continue
            d = detok.get(out.request_id)
            if d is not None:   # decoded here, off the engine's loop
                if out.new_token_ids:
                    out.new_text = d.add(out.new_token_ids, final=out.finished and out.finish_reason != "abort")
                if out.finished:
                    del detok[out.request_id]
            q.put_nowait(Output(out, msg.step_start))
            if out.finished:
                del queues[out.request_id]

    def _on_admitted(self, msg: m.Admitted) -> None:
        for rid in msg.accepted:
            fut = self._admissions.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        for refusal in msg.refused:
            fut = self._admissions.pop(refusal.request_id, None)
            if fut is not None and not fut.done():
                fut.set_exception(refusal.error())

    async def _on_ready(self, info: m.CoreInfo) -> None:
        tokenizer = await asyncio.to_thread(load_front_tokenizer, self._config.model, self._config.seed)
        self.engine = EngineInfo(info.model_name, info.max_model_len, info.dtype, tokenizer,
                                 KernelIdentity(info.kernel_set, info.kernel_version), info.pid,
                                 json.loads(info.conformance) if info.conformance else None)
        freeze_startup_heap("API server")
        self.ready.set()
        log.info("engine ready: model=%s kernels=%s (engine core pid %d)", info.model_name, info.kernel_set,
                 info.pid)

    def _on_failed(self, msg: m.Failed) -> None:
        self._fatal(msg.error, loading=msg.loading)

    def _on_exit(self) -> None:
        """The core process ended (its sentinel fd became readable)."""
        self._loop.remove_reader(self._process.sentinel)
        self._process.join(1)
        code = self._process.exitcode
        if self._stopping:
            return
        if self.ready.is_set() or self.failed:
            self._fatal(self.load_error if self.failed else f"engine core process exited with code {code}")
        else:
            self._fatal(f"engine core process exited with code {code} while loading", loading=True)

    def _fatal(self, error: str, *, loading: bool = False) -> None:
        """The engine cannot serve (it failed to load, or its core died): fail what is in flight, then the server
        exits non-zero (`on_fatal(loading)`: the server decides how soon)."""
        first = not self.failed
        self.failed = True
        self.load_error = error
        self.ready.clear()
        self._fail_all(RuntimeError(error))
        if first:
            log.error("%s; the server exits", error)
            if self.on_fatal is not None:
                self.on_fatal(loading)

    def _fail_all(self, error: Exception) -> None:
        if self._loop is None or self._loop.is_closed():
            return

        def fail() -> None:
            queues, self._queues = self._queues, {}
            self._detok.clear()
            for q in queues.values():
                q.put_nowait(Rejected(error))
            admissions, self._admissions = self._admissions, {}
            for fut in admissions.values():
                if not fut.done():
                    fut.set_exception(EngineError(str(error)))

        if _running_loop() is self._loop:
            fail()
        else:
            self._loop.call_soon_threadsafe(fail)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
