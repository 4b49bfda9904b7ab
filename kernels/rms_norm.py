"""RMSNorm and fused residual-add + RMSNorm.

y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32 (Zhang & Sennrich 2019; HF LlamaRMSNorm rounding order).
"""
from __future__ import annotations

import torch


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not match hidden size of x {tuple(x.shape)}")


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [T, H], weight: [H]
    _check(x, weight)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(acc)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # residual_out = x + residual; out = rms_norm(residual_out)
    if x.shape != residual.shape:
        raise ValueError(f"fused_add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    residual_out = x + residual
    return rms_norm_ref(residual_out, weight, eps), residual_out
