"""The tensor-parallel process group: a rendezvous store on a free local port, torch.distributed over NCCL (CUDA) or
gloo (CPU), and what the ranks need of it: the all-reduce of the row-parallel layers' partial outputs and the
broadcast of rank 0's sampled tokens."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from sits.engine.config import ModelConfig
from sits.engine.errors import InvalidRequestError, TensorParallelError

HOST = "127.0.0.1"
# in every rank's environment: NVLink multicast (NCCL's NVLS, symmetric memory's multicast) stays off, as the lent
# multi-GPU machines require
RANK_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# the rendezvous, or a collective, fails after this long (a rank is gone); NCCL then ends the process
TIMEOUT = datetime.timedelta(seconds=120)
SPLIT_SIZES = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def check_sizes(size: int, mc: ModelConfig, device: torch.device) -> None:
    """Raise InvalidRequestError unless `size` ranks can split this model on `device`: every split size divides
    evenly, and on CUDA there is a GPU per rank."""
    for name in SPLIT_SIZES:
        if getattr(mc, name) % size:
            raise InvalidRequestError(f"tensor_parallel_size {size} must divide the model's {name} "
                                      f"({getattr(mc, name)}): every rank holds an equal share of them",
                                      "tensor_parallel_size")
    if device.type == "cuda" and size > torch.cuda.device_count():
        raise InvalidRequestError(f"tensor_parallel_size {size} needs {size} GPUs (one per rank) but "
                                  f"{torch.cuda.device_count()} are visible (CUDA_VISIBLE_DEVICES)",
                                  "tensor_parallel_size")


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: cuda:r of the visible GPUs, or the CPU."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def open_store() -> dist.TCPStore:
    """Rank 0's rendezvous store, on a port the OS picks (`store.port`: no race for a guessed free port)."""
    return dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def connect_store(port: int) -> dist.TCPStore:
    return dist.TCPStore(HOST, port, is_master=False, timeout=TIMEOUT)


def check_no_group() -> None:
    """Raise TensorParallelError if this process is in a torch.distributed group already (RankGroup takes the
    default group: one tensor-parallel engine per process)."""
    if dist.is_initialized():
        raise TensorParallelError("this process already belongs to a torch.distributed group: one tensor-parallel "
                                  "engine per process (close the other one first)")


class RankGroup:
    """This process's rank in torch.distributed's default group (so one tensor-parallel engine per process)."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device):
        check_no_group()
        os.environ.update(RANK_ENV)   # read by NCCL when it starts, below or at the first collective
        self.rank, self.size, self.device = rank, size, device
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=size,
                                timeout=TIMEOUT, device_id=device if cuda else None)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def broadcast(self, x: torch.Tensor) -> None:
        dist.broadcast(x, src=0)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
