"""triton-v1.7's fused op `linear_silu_and_mul`: the MLP's gate/up projection with SiLU-and-mul in its epilogue.

A decode layer runs the gate/up projection (x [T, H] times W [2I, H] = [gate; up] -> [T, 2I]), SiLU-and-mul (one
small kernel: [T, 2I] -> [T, I]) and the down projection. With quantized weights at decode sizes the gate/up
projection is kernels/linear.py's weight-only kernel; with its constexpr SILU_EPI each output tile takes gate row j
and up row j side by side (tile columns 2j, 2j + 1), rounds the pair to x's dtype as the stored [T, 2I] output would
be, and writes silu(gate) * up, computed as kernels/silu_and_mul.py computes it (fp32, rounded to x's dtype). The
activation kernel, its launch and the [T, 2I] round trip through memory are gone, and the cost is in the epilogue,
once per output tile, not in the K loop.

triton-v1.6 put the activation in the down projection's prologue instead, where every program of every N tile
recomputes it for every x tile it loads: on the H200 that made the down projection 3.6x slower at one row (int8:
72.8 us against 20.3 for the two ops; BENCHMARKS.md "Fused decode layers").

Where triton-v1.5 would run the weight-only kernel for the gate/up projection -- int8 or fp8 weights times up to
WEIGHT_ONLY_MAX_M (32) rows, fp16 dots for fp8 weights of a bf16 model up to F16_DOT_MAX_M (16) -- this runs the same
kernel with the epilogue; everything else (plain weights on cuBLAS, more rows) is v1.5's linear then v1.5's
silu_and_mul. On CPU tensors under TRITON_INTERPRET=1 it runs too, and gives v1.5's two ops' result bit for bit.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_fp8_f16 import linear_fp8_f16, weight_only_rows
from sits.kernels.linear_w8a8 import WEIGHT_ONLY_MAX_M
from sits.kernels.quant import QuantizedWeight
from sits.kernels.silu_and_mul import silu_and_mul
from sits.kernels.triton_env import check_device


def linear_silu_and_mul(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = silu_and_mul(linear(x, W) (+ b)): x [..., H], W [2I, H] = [gate; up] (a tensor or QuantizedWeight)
    -> [..., I] in x's dtype."""
    _lin.check_gate_up("linear_silu_and_mul", weight)
    _lin.check_linear_args(x, weight, bias)
    n, k = weight.shape
    m = x.numel() // k if k else 0
    if not isinstance(weight, QuantizedWeight) or m == 0 or m > WEIGHT_ONLY_MAX_M:
        return silu_and_mul(linear_fp8_f16(x, weight, bias))
    check_device("linear_silu_and_mul", x)
    return weight_only_rows(x, weight, bias, n // 2, silu_epi=True)
