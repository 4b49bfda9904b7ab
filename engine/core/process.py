"""The engine-core process: LLMEngine (scheduler + model runner) stepping in a loop of its own, with its own GIL.

It owns no HTTP. Requests arrive on a ZMQ PULL socket; admission results and each step's outputs leave on a PUSH
socket (engine/core/messages.py). While requests are running it only polls its inbox between steps (no wait);
idle, it blocks on the inbox and every IDLE_REPORT_S sends its stats, so /metrics stays current. It ignores SIGINT
and SIGTERM (the API server drains first, then sends Shutdown) and dies with its parent (PR_SET_PDEATHSIG, and a
parent-pid check while idle); one forked by the engine zygote (engine/core/zygote.py) dies with the API server
through a pidfd watch instead. A load or loop failure is sent as `Failed`, then the process exits non-zero.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from sits.engine.core import messages as m
from sits.engine.core.heap import freeze_startup_heap
from sits.engine.errors import EngineError

log = logging.getLogger("sits.engine.core")

IDLE_REPORT_S = 1.0
EXIT_FAILED = 3   # the core's exit status after a load or loop failure


@dataclass(slots=True)
class CoreOptions:
    """Everything the core process needs, picklable (it crosses a multiprocessing spawn)."""

    engine_config: Any                 # engine.config.EngineConfig
    input_address: str                 # the front's PUSH binds here; the core connects its PULL
    output_address: str                # the front's PULL binds here; the core connects its PUSH
    parent_pid: int
    warmup: bool = True
    fault_token_latency_s: float = 0.0
    engine_factory: Callable[[Any], Any] | None = None   # EngineConfig -> LLMEngine (tests); default LLMEngine
    log_level: str = "info"
    forked: bool = False               # forked by the engine zygote (engine/core/zygote.py): not the front's child


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


def run_engine_core(opts: CoreOptions) -> None:
    """Entry point of the spawned process; never returns (exits 0 on Shutdown, EXIT_FAILED after a failure)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = zmq.Context(io_threads=1)
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(opts.input_address)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 5000)   # what is queued at exit still reaches the front
    outbox.connect(opts.output_address)
    code = 0
    core = EngineCore(opts, inbox, outbox)
    try:
        if core.load():
            core.serve()
        else:
            code = EXIT_FAILED
    except _LoopFailed:
        code = EXIT_FAILED
    finally:
        if core.engine is not None:
            core.engine.close()   # stops the tensor-parallel ranks, if any (they also end when this process does)
        inbox.close(linger=0)
        outbox.close()
        ctx.term()   # waits (up to the linger) until what is queued reached the front
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: it waits for library threads and frees the GPU slowly (seen: > 10 s on an H200 with
    # llama3-8b), and the server is waiting on this process
    os._exit(code)


class _LoopFailed(Exception):
    pass


class EngineCore:
    def __init__(self, opts: CoreOptions, inbox: zmq.Socket, outbox: zmq.Socket) -> None:
        self.opts = opts
        self.inbox, self.outbox = inbox, outbox
        self.engine: Any = None
        self._send = lambda msg: outbox.send(m.encoder.encode(msg), copy=False)

    def load(self) -> bool:
        try:
            from sits.engine.llm_engine import LLMEngine

            self.engine = (self.opts.engine_factory or LLMEngine)(self.opts.engine_config)
            if self.opts.warmup:
                t0 = time.perf_counter()
                self.engine.warmup()
                log.info("warm-up took %.2f s", time.perf_counter() - t0)
            freeze_startup_heap("engine core")
        except Exception as e:
            log.exception("engine failed to load")
            self._send(m.Failed(f"{type(e).__name__}: {e}", loading=True))
            return False
        e = self.engine
        self._send(m.Ready(m.CoreInfo(model_name=e.model_name, kernel_set=e.kernel_set.name,
                                      kernel_version=e.kernel_set.version, max_model_len=e.max_model_len,
                                      dtype=str(e.dtype).removeprefix("torch."), pid=os.getpid(),
                                      conformance=json.dumps(e.conformance) if e.conformance else "")))
        self._send(m.Idle(e.stats(), time.thread_time()))   # the baseline /metrics starts from
        log.info("engine core ready (pid %d): model=%s kernels=%s", os.getpid(), e.model_name, e.kernel_set.name)
        return True

    def serve(self) -> None:
        engine, inbox = self.engine, self.inbox
        poller = zmq.Poller()
        poller.register(inbox, zmq.POLLIN)
        next_report = time.monotonic() + IDLE_REPORT_S
        while True:
            busy = engine.has_unfinished_requests()
            if busy or poller.poll(0 if busy else IDLE_REPORT_S * 1000):
                if not self._take_inbox():
                    return
            if engine.has_unfinished_requests():
                self._step()
                next_report = time.monotonic() + IDLE_REPORT_S
            elif time.monotonic() >= next_report:
                if not self.opts.forked and os.getppid() != self.opts.parent_pid:   # a forked core watches a pidfd
                    log.error("the API server (pid %d) is gone; exiting", self.opts.parent_pid)
                    return
                self._send(m.Idle(engine.stats(), time.thread_time()))
                next_report = time.monotonic() + IDLE_REPORT_S

    def _take_inbox(self) -> bool:
        """Apply every message waiting in the inbox; False on Shutdown."""
        engine = self.engine
        accepted: list[str] = []
        refused: list[m.Refusal] = []
        keep_going = True
        while True:
            try:
                raw = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            msg = m.to_core_decoder.decode(raw.buffer)
            if isinstance(msg, m.AddRequest):
                try:
                    engine.add_request(msg.request_id, msg.prompt, msg.params, tenant=msg.tenant,
                                       priority=msg.priority, detokenize=msg.detokenize)
                    accepted.append(msg.request_id)
                except EngineError as e:
                    refused.append(m.Refusal.of(msg.request_id, e))
            elif isinstance(msg, m.Abort):
                for rid in msg.request_ids:
                    engine.abort_request(rid)
            else:
                keep_going = False
                break
        if accepted or refused:
            self._send(m.Admitted(accepted, refused))
        return keep_going

    def _step(self) -> None:
        engine = self.engine
        t0 = time.perf_counter()
        try:
            outputs = engine.step()
        except Exception as e:
            log.exception("engine loop crashed")
            self._send(m.Failed(f"engine loop crashed: {type(e).__name__}: {e}", loading=False))
            raise _LoopFailed() from e
        dt = time.perf_counter() - t0
        self._send(m.StepOutputs(outputs, t0, dt, engine.stats(), time.thread_time()))
        fault = self.opts.fault_token_latency_s
        if fault > 0 and any(o.new_token_ids for o in outputs):
            time.sleep(fault)   # fault injection: a slow kernel makes every step, hence every token, slower
