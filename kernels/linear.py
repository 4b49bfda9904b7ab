"""Linear layer y = x W^T (+ b) for plain weights and weight-only quantized (int8 / fp8 e4m3) weights.

Quantized: y[t, n] = (sum_k x[t, k] * q[n, k]) * scale[n], i.e. the per-output-channel scale is applied once after
the reduction.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.quant import QuantizedWeight


def check_linear_args(x: torch.Tensor, weight, bias) -> None:
    k = weight.shape[1] if len(weight.shape) == 2 else -1
    if x.shape[-1] != k:
        raise ValueError(f"linear: x {tuple(x.shape)} does not match weight [N, K] {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias {tuple(bias.shape)} must be [{weight.shape[0]}]")


def linear_ref(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    # x: [T, K]; weight: [N, K] tensor or QuantizedWeight; out: [T, N] in x.dtype
    check_linear_args(x, weight, bias)
    if not isinstance(weight, QuantizedWeight):
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    # int8 values and e4m3 values are exact in fp16/bf16/fp32, so this matmul only rounds its own result
    y = F.linear(x, weight.qweight.to(x.dtype)).to(torch.float32) * weight.scale
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)
