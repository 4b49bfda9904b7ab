"""RMSNorm through the kernel set (plain, and fused with the residual add)."""

from __future__ import annotations

import torch


class RMSNorm:
    def __init__(self, kernel_set, hidden_size: int, eps: float, device, dtype):
        self.ks = kernel_set
        self.eps = eps
        self.weight = torch.empty(hidden_size, device=device, dtype=dtype)
        self.loaded = [False]

    def load(self, tensor: torch.Tensor) -> None:
        self.weight.copy_(tensor)
        self.loaded[0] = True

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [T, H] -> rms_norm(x); with residual: (rms_norm(x + residual), x + residual)."""
        if residual is None:
            return self.ks.rms_norm(x, self.weight, self.eps)
        return self.ks.fused_add_rms_norm(x, residual, self.weight, self.eps)
