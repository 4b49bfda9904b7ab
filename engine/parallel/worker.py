"""A tensor-parallel rank > 0, in a process of its own started by rank 0 (engine/parallel/launch.py): it joins the
group, loads its shard of the model, then runs every op rank 0 mirrors to it, in order, until Stop. It exits when
rank 0 is gone: EOF on its lifeline pipe (even inside a collective) or on its op socket. Like the engine-core process
it ignores SIGINT and SIGTERM: rank 0 decides when it stops."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection

import torch

from sits.engine.execution.device import limit_cpu_threads, load_kernel_set
from sits.engine.execution.model_runner import ModelRunner
from sits.engine.execution.rank_ops import RankOp
from sits.engine.model.loader import resolve_model
from sits.engine.parallel import messages as m
from sits.engine.parallel.group import RankGroup, connect_store, rank_device

log = logging.getLogger("sits.engine.parallel")

EXIT_FAILED = 3


class WorkerRank:
    """The TensorParallelRank of a rank > 0 (engine/execution/rank_ops.py): its ops come from rank 0."""

    def __init__(self, group: RankGroup, conn: Connection):
        self.group, self.conn = group, conn
        self.rank, self.size = group.rank, group.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(x)

    def broadcast(self, x: torch.Tensor) -> None:
        self.group.broadcast(x)

    def agree_num_blocks(self, num_blocks: int) -> int:
        m.send(self.conn, m.Loaded(num_blocks))
        reply = m.recv(self.conn)
        if isinstance(reply, m.Stop):   # rank 0 failed to load: nothing to wait for
            _exit(0)
        assert isinstance(reply, m.UseBlocks), reply
        return reply.num_blocks

    def mirror(self, op: RankOp) -> None:
        pass   # this rank is running rank 0's op


def main(fd: int, lifeline: int) -> None:
    """Entry point (launch.WORKER_BOOT); never returns."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_exit_with_rank0, args=(lifeline,), name="sits-tp-lifeline", daemon=True).start()
    conn = Connection(fd)
    spec: m.WorkerSpec = m.recv(conn)
    logging.basicConfig(level="INFO", format=f"%(asctime)s %(levelname)s %(name)s[rank {spec.rank}]: %(message)s")
    try:
        runner = _load(spec, conn)
    except Exception as e:
        log.exception("tensor-parallel rank %d failed to load", spec.rank)
        _send_failed(conn, f"{type(e).__name__}: {e}")
        _exit(EXIT_FAILED)
    _exit(_serve(runner, conn))


def _load(spec: m.WorkerSpec, conn: Connection) -> ModelRunner:
    m.send(conn, m.Hello())
    device = rank_device(torch.device(spec.device), spec.rank)
    group = RankGroup(connect_store(spec.store_port), spec.rank, spec.size, device)
    config = spec.config
    source = resolve_model(config.model, config.seed)
    limit_cpu_threads(device, source.config)
    kernel_set = load_kernel_set(config.kernels, device, config.kv_cache_dtype)
    runner = ModelRunner(config, source, kernel_set, device, getattr(torch, spec.dtype), spec.max_model_len,
                         WorkerRank(group, conn))
    m.send(conn, m.Ready())
    return runner


def _serve(runner: ModelRunner, conn: Connection) -> int:
    """Run rank 0's ops until Stop (0) or rank 0's end (0); a failing op: EXIT_FAILED, rank 0 is told why."""
    while True:
        try:
            msg = m.recv(conn)
        except (EOFError, OSError):
            return 0
        if isinstance(msg, m.Stop):
            runner.parallel.group.close()
            return 0
        if isinstance(msg, m.RecordSteps):
            runner.step_log = []
        elif isinstance(msg, m.ReadStepLog):
            m.send(conn, m.StepLog(list(runner.step_log or [])))
        else:
            try:
                runner.apply(msg)
            except Exception as e:
                log.exception("tensor-parallel rank %d: a step failed", runner.parallel.rank)
                _send_failed(conn, f"{type(e).__name__}: {e}")
                return EXIT_FAILED


def _send_failed(conn: Connection, error: str) -> None:
    try:
        m.send(conn, m.Failed(error))
    except OSError:
        pass


def _exit_with_rank0(fd: int) -> None:
    while os.read(fd, 1):   # b"" once rank 0 closed its end or is gone
        pass
    _exit(0)


def _exit(code: int) -> None:
    """Exit without interpreter teardown (which would wait on library threads), as the engine-core process does."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
