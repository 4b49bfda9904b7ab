"""Rank 0's side of a tensor-parallel engine: start ranks 1..N-1 as processes of their own, rendezvous with them, agree
on the KV cache, mirror every piece of device work to them, notice one that dies, and stop them on close.

Each worker is `python -c WORKER_BOOT` (a plain subprocess: the engine-core process is a daemonic multiprocessing
child, which may not start multiprocessing children of its own) with this process's sys.path, two descriptors
inherited: a socket to talk over (engine/parallel/messages.py) and the read end of a lifeline pipe whose write end
only rank 0 holds; its EOF, whether rank 0 closed it or died, ends the worker even inside a collective.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from sits.engine.config import EngineConfig
from sits.engine.errors import TensorParallelError
from sits.engine.execution.rank_ops import RankOp
from sits.engine.parallel import messages as m
from sits.engine.parallel.group import RANK_ENV, RankGroup, check_no_group, open_store, rank_device

log = logging.getLogger("sits.engine.parallel")

WORKER_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
               "from sits.engine.parallel.worker import main; main(int(sys.argv[2]), int(sys.argv[3]))")
START_TIMEOUT_S = 600.0   # a rank that neither answers nor exits this long while starting or loading is given up
STOP_TIMEOUT_S = 10.0


@dataclass(slots=True)
class _Worker:
    rank: int
    proc: subprocess.Popen
    conn: Connection
    lifeline: int   # the write end of its lifeline pipe


def _spawn(spec: m.WorkerSpec) -> _Worker:
    ours, theirs = socket.socketpair()
    life_r, life_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_BOOT, json.dumps(sys.path), str(theirs.fileno()), str(life_r)],
            pass_fds=(theirs.fileno(), life_r), stdin=subprocess.DEVNULL, env={**os.environ, **RANK_ENV})
    except BaseException:
        ours.close()
        os.close(life_w)
        raise
    finally:
        theirs.close()
        os.close(life_r)
    worker = _Worker(spec.rank, proc, Connection(ours.detach()), life_w)
    m.send(worker.conn, spec)
    return worker


class TensorParallel:
    """Rank 0 of the group: the TensorParallelRank its model runner uses (engine/execution/rank_ops.py), and the
    handle on the worker processes. It is built once every worker has joined the process group; the workers load
    their shards while rank 0 loads its own (ModelRunner, then wait_ready)."""

    def __init__(self, config: EngineConfig, device: torch.device, dtype: torch.dtype, max_model_len: int):
        check_no_group()
        size = config.tensor_parallel_size
        self.rank, self.size = 0, size
        self.device = rank_device(device, 0)
        self.group: RankGroup | None = None
        self.failed: str | None = None    # why the group cannot run any more
        self._closing = False
        self._workers: list[_Worker] = []
        try:
            self._store = open_store()
            dt = str(dtype).removeprefix("torch.")
            for r in range(1, size):
                self._workers.append(_spawn(m.WorkerSpec(config, r, size, self._store.port, device.type, dt,
                                                         max_model_len)))
            for w in self._workers:
                self._expect(w, m.Hello, "starting")
            self.group = RankGroup(self._store, 0, size, self.device)
        except BaseException:
            self.close()
            raise
        log.info("tensor parallelism: %d ranks on %s (worker pids %s)", size,
                 "cuda:0.." + str(size - 1) if self.device.type == "cuda" else "the CPU",
                 ", ".join(str(w.proc.pid) for w in self._workers))

    # ---- TensorParallelRank ----
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(x)

    def broadcast(self, x: torch.Tensor) -> None:
        self.group.broadcast(x)

    def agree_num_blocks(self, num_blocks: int) -> int:
        counts = [num_blocks] + [self._expect(w, m.Loaded, "loading its shard").num_blocks for w in self._workers]
        agreed = min(counts)
        for w in self._workers:
            m.send(w.conn, m.UseBlocks(agreed))
        if agreed < num_blocks:
            log.info("KV cache: %d blocks on every rank (the fewest any rank can hold: %s)", agreed, counts)
        return agreed

    def mirror(self, op: RankOp) -> None:
        self._send_all(m.encode(op))

    # ---- the workers ----
    def wait_ready(self) -> None:
        """Wait until every worker has allocated its cache; from then on a worker that exits fails the group."""
        for w in self._workers:
            self._expect(w, m.Ready, "allocating its KV cache")
        for w in self._workers:
            threading.Thread(target=self._watch, args=(w,), name=f"sits-tp-watch-{w.rank}", daemon=True).start()

    def fail(self, reason: str) -> None:
        """The ranks are out of step (a mirrored step failed on rank 0): refuse every later op."""
        if self.failed is None:
            self.failed = f"the tensor-parallel ranks are out of step since {reason}; restart the engine"

    def record_steps(self) -> None:
        """Every worker logs its forward passes from now on (rank 0's own: ModelRunner.step_log)."""
        self._send_all(m.encode(m.RecordSteps()))

    def step_logs(self) -> list[list]:
        """Ranks 1..N-1's step logs, in rank order."""
        self._send_all(m.encode(m.ReadStepLog()))
        return [self._expect(w, m.StepLog, "reading its step log").entries for w in self._workers]

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        """Stop the workers (Stop, then SIGKILL after STOP_TIMEOUT_S) and leave the group. Idempotent."""
        if self._closing:
            return
        self._closing = True
        for w in self._workers:
            try:
                m.send(w.conn, m.Stop())
            except OSError:
                pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for w in self._workers:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("tensor-parallel rank %d (pid %d) did not stop; killing it", w.rank, w.proc.pid)
                w.proc.kill()
                w.proc.wait()
            w.conn.close()
            os.close(w.lifeline)
        if self.group is not None:
            self.group.close()

    def _send_all(self, data: bytes) -> None:
        if self.failed is not None:
            raise TensorParallelError(self.failed)
        for w in self._workers:
            try:
                w.conn.send_bytes(data)
            except OSError as e:
                self.fail(f"rank {w.rank} stopped listening ({e})")
                raise TensorParallelError(self.failed) from None

    def _expect(self, w: _Worker, kind: type, doing: str, timeout: float = START_TIMEOUT_S):
        """The worker's next message, which must be a `kind`; TensorParallelError if it fails, exits or says
        nothing for `timeout` s."""
        deadline = time.monotonic() + timeout
        while not w.conn.poll(0.1):
            if w.proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel rank {w.rank} (pid {w.proc.pid}) said nothing for "
                                          f"{timeout:.0f} s while {doing}")
        try:
            msg = m.recv(w.conn)
        except (EOFError, OSError):
            raise TensorParallelError(f"tensor-parallel rank {w.rank} (pid {w.proc.pid}) exited with code "
                                      f"{_exit_code(w.proc)} while {doing}") from None
        if isinstance(msg, m.Failed):
            raise TensorParallelError(f"tensor-parallel rank {w.rank} failed while {doing}: {msg.error}")
        if not isinstance(msg, kind):
            raise TensorParallelError(f"tensor-parallel rank {w.rank} sent {type(msg).__name__} while {doing}, "
                                      f"expected {kind.__name__}")
        return msg

    def _watch(self, w: _Worker) -> None:
        code = w.proc.wait()
        if self._closing:
            return
        said = ""
        try:
            if w.conn.poll(0):
                msg = m.recv(w.conn)
                said = f": {msg.error}" if isinstance(msg, m.Failed) else ""
        except (EOFError, OSError):
            pass
        self.fail(f"rank {w.rank} (pid {w.proc.pid}) exited with code {code}{said}")
        log.error("tensor-parallel rank %d (pid %d) exited with code %d%s; stopping the other ranks (the engine "
                  "cannot step any more)", w.rank, w.proc.pid, code, said)
        for other in self._workers:   # a collective waiting on them fails now (gloo) instead of hanging
            if other is not w and other.proc.poll() is None:
                other.proc.kill()


def _exit_code(proc: subprocess.Popen) -> int | str:
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return "(still running)"
