"""SwiGLU activation: silu(gate) * up with x = [gate | up] along the last dim (Shazeer 2020)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _split(x: torch.Tensor) -> int:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim of x {tuple(x.shape)} must be even ([gate | up])")
    return x.shape[-1] // 2


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    # x: [T, 2*I] -> [T, I]
    i = _split(x)
    return F.silu(x[..., :i]) * x[..., i:]
