"""triton-v1.2's linear: weight-only quantized weights times many rows through cuBLAS on the dequantized weight.

A step of DEQUANT_MIN_M rows or more (prefill) is compute-bound, and there the weight-only kernel of kernels/linear.py,
which converts each int8 tile to bf16 inside its MMA loop, stays far below cuBLAS's bf16 rate (2,048 rows on the
H200: the int8 engine's prefill steps took ~97 ms against ~62 for bf16). So `linear_dequant_many_rows` dequantizes the
weight once per call, w = bf16(q * scale) rounded once, into a scratch buffer (1 byte read and 2 written per weight)
and cuBLAS multiplies. Fewer rows, plain weights, and fp8 weights on fp8 tensor cores go to kernels/linear.py's
`linear` unchanged.

The scratch buffer is kept per device and dtype and shared by every layer: launches on one stream run in order, so a
layer's GEMM has read it before the next layer's dequantization writes it. It grows to the largest weight seen; a
smaller one stays allocated, because a CUDA graph captured with it keeps reading its address (the engine's warm-up
runs the largest weight before capturing, so in practice it grows a few times at the start).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sits.kernels.fp8_gemm import fp8_native
from sits.kernels.linear import check_linear_args, linear
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import check_device, interpreting, tl, triton

# from this many rows on, dequantize and call cuBLAS: the crossover of the H200 sweep in BENCHMARKS.md ("int8 at many
# rows", bench/int8_rows.py)
DEQUANT_MIN_M = 512
_SCRATCH: dict = {}  # (device, dtype) -> buffers, the last one in use


@triton.jit
def _dequantize_kernel(q_ptr, scale_ptr, out_ptr, N, K, stride_qn, stride_on, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    # out[n, k] = q[n, k] * scale[n], rounded once to out's dtype
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rn < N)[:, None] & (rk < K)[None, :]
    q = tl.load(q_ptr + rn[:, None].to(tl.int64) * stride_qn + rk[None, :], mask=mask, other=0.0)
    s = tl.load(scale_ptr + rn, mask=rn < N, other=0.0)
    w = (q.to(tl.float32) * s[:, None]).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(out_ptr + rn[:, None].to(tl.int64) * stride_on + rk[None, :], w, mask=mask)


def dequantize_into_scratch(weight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The weight as a [N, K] `dtype` tensor, w = q * scale rounded once, written into this device's and dtype's
    scratch buffer: valid until the next call on the same device and dtype."""
    check_device("dequantize", weight.qweight)
    n, k = weight.shape
    bufs = _SCRATCH.setdefault((str(weight.device), dtype), [])
    if not bufs or bufs[-1].numel() < n * k:
        bufs.append(torch.empty(n * k, dtype=dtype, device=weight.device))
    out = bufs[-1][:n * k].view(n, k)
    qw = weight.qweight
    bn, bk = (16, 64) if interpreting() else (32, 256)
    _dequantize_kernel[(triton.cdiv(n, bn), triton.cdiv(k, bk))](qw, weight.scale, out, n, k, qw.stride(0),
                                                                 out.stride(0), BLOCK_N=bn, BLOCK_K=bk)
    return out


def linear_dequant_many_rows(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """`linear`, except that a weight-only quantized weight times DEQUANT_MIN_M rows or more (and no fp8 tensor
    cores) is dequantized into the scratch buffer and multiplied by cuBLAS."""
    if not isinstance(weight, QuantizedWeight):
        return linear(x, weight, bias)
    m = x.numel() // weight.shape[1]
    if m < DEQUANT_MIN_M or (weight.kind == "fp8" and fp8_native(x, m)):
        return linear(x, weight, bias)   # which checks its arguments itself: once per call on the decode path
    check_linear_args(x, weight, bias)
    check_device("linear", x)
    w = dequantize_into_scratch(weight, x.dtype)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
