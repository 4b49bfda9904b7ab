"""What crosses the pipe between rank 0 and each worker rank, pickled: the start-up handshake, a few control messages,
and the mirrored device work itself (engine/execution/rank_ops.py)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sits.engine.config import EngineConfig


@dataclass(slots=True)
class WorkerSpec:
    """rank 0 -> worker, first: what the worker loads and how it joins."""
    config: EngineConfig
    rank: int
    size: int
    store_port: int      # rank 0's rendezvous store (group.open_store)
    device: str          # rank 0's device type: "cuda" (rank r takes cuda:r) or "cpu"
    dtype: str           # rank 0's compute dtype ("bfloat16", ...)
    max_model_len: int


@dataclass(slots=True)
class Hello:
    """worker -> rank 0: started, joining the group."""


@dataclass(slots=True)
class Loaded:
    """worker -> rank 0: its shard is loaded; the KV-cache blocks it can hold."""
    num_blocks: int


@dataclass(slots=True)
class UseBlocks:
    """rank 0 -> worker: the KV-cache blocks every rank allocates (the fewest any rank can hold)."""
    num_blocks: int


@dataclass(slots=True)
class Ready:
    """worker -> rank 0: cache allocated, waiting for rank 0's ops."""


@dataclass(slots=True)
class Failed:
    """worker -> rank 0: it cannot go on (then it exits)."""
    error: str


@dataclass(slots=True)
class RecordSteps:
    """rank 0 -> worker: log every forward pass from now on (ModelRunner.step_log; tests)."""


@dataclass(slots=True)
class ReadStepLog:
    """rank 0 -> worker: answer with a StepLog."""


@dataclass(slots=True)
class StepLog:
    entries: list


@dataclass(slots=True)
class Stop:
    """rank 0 -> worker: leave the group and exit."""


def encode(msg: Any) -> bytes:
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def send(conn: Connection, msg: Any) -> None:
    conn.send_bytes(encode(msg))


def recv(conn: Connection) -> Any:
    """The next message (EOFError when the other side is gone)."""
    return pickle.loads(conn.recv_bytes())
