"""triton-v1.5's linear: fp8 weights times few rows (decode) on the fp16 tensor-core path.

triton-v1.4 sends fp8 weights times up to 32 rows to kernels/linear.py's weight-only kernel, which converts each e4m3
weight tile to x's dtype (bf16) before the MMA. On the H200 that kernel streamed the weights at 42-57 % of the copy
rate (bench/fp8_rows.py: 3.16 ms of linears a batch-1 step against 1.71 ms for the bytes; the int8 kernel, whose
conversion is cheaper, ~70 %). Hopper converts e4m3 to fp16 in one instruction per pair (cvt.rn.f16x2.e4m3x2); to bf16
it takes a second one per element (from fp16). So here x and the weight tile enter an fp16 dot: each K tile of x is
lowered by a power of two per row (exact) into fp16's range -- 1 unless a row holds a value past 2^14 -- and the
tile's product raised by it into the fp32 accumulator. fp16 keeps 10 mantissa bits where bf16 keeps 7, so x's values
convert exactly down to 2^-14 (below that, fp16's subnormal grid of 2^-24: nothing next to a tile's others); e4m3
values are exact in both. The kernel is kernels/linear.py's weight-only kernel with its constexpr F16_DOT (same tiles,
split-K and autotuning candidates, tuned apart from the bf16-dot variant).

Everything else -- more rows, int8 and plain weights, fp16/fp32 models, GPUs without fp8 conversion (before sm_89)
-- is triton-v1.4's linear (kernels/linear_w8a8.py) unchanged. So are 17-32 rows: on the H200 (bench/fp8_rows.py,
2026-12-04) one step's linears took 2.99 ms at 1 row and 3.03 at 16 with fp16 dots against v1.4's 3.21 / 3.41, but
4.69 at 32 against 3.54 (the fp16-dot variant's tiles for the 17-32 bucket lose), hence F16_DOT_MAX_M. Under TRITON_INTERPRET=1 the kernel runs on CPU
tensors (fp16 dots are exact there), so the CPU tests cover it.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_w8a8 import linear_w8a8
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import check_device, interpreting

F16_DOT_MAX_M = 16   # up to this many rows fp16 dots win (measured above); more: triton-v1.4


def _f16_path(x: torch.Tensor) -> bool:
    if x.dtype != torch.bfloat16:
        return False
    if x.device.type == "cpu":
        return interpreting()
    return x.is_cuda and not interpreting() and torch.cuda.get_device_capability(x.device) >= (8, 9)


def linear_fp8_f16(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = x W^T (+ b): a bf16 model's fp8 weights times up to F16_DOT_MAX_M rows through the weight-only kernel
    with fp16 dots; everything else as triton-v1.4."""
    if not (isinstance(weight, QuantizedWeight) and weight.kind == "fp8") or not _f16_path(x):
        return linear_w8a8(x, weight, bias)
    n, k = weight.shape
    m = x.numel() // k if x.shape[-1] == k else 0
    if m == 0 or m > F16_DOT_MAX_M:
        return linear_w8a8(x, weight, bias)   # which checks its arguments
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    return weight_only_rows(x, weight, bias, n)


def weight_only_rows(x: torch.Tensor, weight: QuantizedWeight, bias, n_out: int, **fusion) -> torch.Tensor:
    """x [..., K] (at least one row, arguments checked) through kernels/linear.py's weight-only kernel as triton-v1.5
    runs it -- fp16 dots for a bf16 model's fp8 weights up to F16_DOT_MAX_M rows -> [..., n_out]. `fusion`: the
    kernel's silu_mul or silu_epi (the fused ops of triton-v1.6 and v1.7), which change what K and n_out are."""
    m = x.numel() // x.shape[-1]
    f16 = weight.kind == "fp8" and m <= F16_DOT_MAX_M and _f16_path(x)
    return _lin.through_rows(x, n_out, lambda x2, out: _lin.weight_only(x2, weight, bias, out, f16_dot=f16,
                                                                          **fusion))
