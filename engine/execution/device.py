"""Where an engine, or one rank of a tensor-parallel engine, runs: device, compute dtype, kernel set, CPU threads."""

from __future__ import annotations

import torch

from sits import kernels
from sits.engine.config import ModelConfig
from sits.engine.errors import InvalidRequestError
from sits.engine.model.presets import num_params
from sits.kernels.catalog import catalogue, kv_cache_dtype_error

SMALL_MODEL_PARAMS = 50_000_000


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidRequestError(f"device {device!r} requested but CUDA is not available", "device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def limit_cpu_threads(device: torch.device, model_config: ModelConfig) -> None:
    """One intra-op thread for a small model on CPU: at that size threads cost more than they save (10x on busy
    hosts)."""
    if device.type == "cpu" and num_params(model_config) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)


def load_kernel_set(name: str, device: torch.device, kv_cache_dtype: str = "auto"):
    """The kernel set `name`, checked to run on `device` and to take KV pages of `kv_cache_dtype`."""
    try:
        ks = kernels.get_kernel_set(name)
    except KeyError as e:  # UnknownKernelSetError lists the known names
        raise InvalidRequestError(str(e), "kernels") from None
    if not ks.supports(device.type):
        raise InvalidRequestError(f"kernel set {name!r} runs on {', '.join(ks.devices)}, not {device.type}",
                                  "kernels")
    why = kv_cache_dtype_error(name, kv_cache_dtype, catalogue())   # the registry's sets, plugins included
    if why is not None:
        raise InvalidRequestError(why, "kv_cache_dtype")
    return ks
