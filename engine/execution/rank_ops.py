"""What rank 0's model runner sends the other tensor-parallel ranks before each piece of device work, so that every
rank runs the same forward passes, hence the same collectives, in the same order (engine/parallel/ carries them).

Only forward passes are mirrored: the scheduler, the block manager, sampling and outputs live on rank 0 alone. An op
holds host arrays (numpy, pickled as they are), never device tensors; the one device tensor a rank needs from rank 0,
the previous decode step's sampled tokens (decode steps launched one ahead, engine/execution/async_decode.py), is
broadcast through the process group right after its DecodeOp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from sits.engine.execution.step_inputs import StepLayout


class TensorParallelRank(Protocol):
    """This process's rank of a tensor-parallel group, as the model runner uses it (engine/parallel/)."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...   # the sum over the ranks, in place
    def broadcast(self, x: torch.Tensor) -> None: ...            # rank 0's x into every rank's x
    def agree_num_blocks(self, num_blocks: int) -> int: ...      # the fewest KV blocks any rank can hold
    def mirror(self, op: "RankOp") -> None: ...                  # rank 0: send op to every other rank; others: no-op


@dataclass(slots=True)
class EagerOp:
    """An eager (or piecewise-graph) step: a PackedStep's layout and staging buffers."""
    layout: StepLayout
    i64: np.ndarray
    i32: np.ndarray


@dataclass(slots=True)
class DecodeOp:
    """A decode step through the decode graphs' static buffers: a DecodeStep's sizes and host buffer."""
    b: int
    n: int
    u: int
    num_prev: int
    host: np.ndarray


@dataclass(slots=True)
class CaptureOp:
    """Capture every decode (and piecewise) CUDA graph now (the engine's warm-up)."""


@dataclass(slots=True)
class StaticBuffersOp:
    """Run decode and prefill steps through the graphs' static buffers, eagerly (CPU tests of those paths)."""


RankOp = EagerOp | DecodeOp | CaptureOp | StaticBuffersOp
