"""triton-v1.16's fused gate/up projection: the MLP's SiLU-and-mul in the W8A8 GEMM's epilogue at prefill sizes.

Up to triton-v1.15, fp8 weights (--quantization fp8) times more than SCALED_MM_MAX_M rows (prefill steps) run the
gate/up projection as kernels/linear_w8a8.py's W8A8 GEMM writing [T, 2I] in bf16, then kernels/silu_and_mul.py
reading it back and writing silu(gate) * up [T, I]: at llama3-8b's 2,048-token prefill step that round trip is
117 MB written, 117 read and 59 written again a layer (bench/profile_steps.py: SiLU-and-mul 1.8 ms of a 35.7 ms step
on an H100). Here each program of the GEMM (kernels/fp8_gemm.py `SILU_EPI`) multiplies its x tile by a tile of gate
rows and by the up rows I further, scales and rounds both products to bf16 as the two ops did, and writes
silu(gate) * up: one launch and the [T, 2I] round trip fewer a layer. The values are the two ops' bit for bit where
the dots sum alike (the same x, weights and scales; Triton's interpreter on CPU: checked against them in
tests/kernels/test_linear_w8a8.py). Fewer rows, other weights and GPUs without fp8 tensor cores: triton-v1.15's
op (the batch-1 GEMV, then v1.7's).
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.fp8_gemm import quantize_rows
from sits.kernels.linear_gemv import linear_silu_and_mul_gemv_pdl
from sits.kernels.linear_w8a8 import SCALED_MM_MAX_M, gemm_silu_and_mul, w8a8_rows
from sits.kernels.triton_env import check_device


def linear_silu_and_mul_w8a8(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = silu_and_mul(x W^T (+ b)), W = [gate; up] [2I, H] -> [..., I]: fp8 weights times more than
    SCALED_MM_MAX_M rows through the W8A8 GEMM with the SiLU-and-mul epilogue; everything else as triton-v1.15."""
    _lin.check_gate_up("linear_silu_and_mul", weight)
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return linear_silu_and_mul_gemv_pdl(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear_silu_and_mul", x)
    x2 = _lin.as_rows(x)
    xq, xs = quantize_rows(x2)
    return gemm_silu_and_mul(xq, xs, weight, bias, x.dtype).view(*x.shape[:-1], weight.shape[0] // 2)
