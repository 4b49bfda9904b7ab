"""The W8A8 GEMM on the fp8 tensor cores (sm_89+): activations quantized per row (token) to e4m3, both operands
1 byte, y = acc * sx[t] * sw[n] (fp32 accumulation).

- `w8a8`: kernels/linear.py's fp8 path from FP8_NATIVE_MIN_M rows (triton-v1 .. v1.3): `quantize_fp8_rows`, then
  `_linear_fp8_kernel` tuned once per weight shape over `_FP8`.
- `quantize_rows` (triton-v1.4, kernels/linear_w8a8.py, which tunes the same GEMM kernel for prefill): the same
  quantization with its rounding done in fp32 bit arithmetic (`round_e4m3`), so Triton's interpreter on CPU rounds
  as the GPU does, and a row of zeros gets scale 1. On a GPU both quantizers give the same bytes.
`linear_fp8_w8a8_ref` is what the GEMM computes, in torch.
"""
from __future__ import annotations

import torch

from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import autotune, grouped_tile, next_pow2, tl, triton

FP8_NATIVE_MIN_M = 64
FP8_MAX = 448.0


@triton.jit
def _linear_fp8_kernel(a_ptr, w_ptr, a_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, M, N, K, stride_am, stride_wn,
                       stride_om, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SILU_EPI: tl.constexpr = False):
    # SILU_EPI (triton-v1.16): w is [gate; up] [2N, K] and out [M, N] = silu(x gate^T) * (x up^T), both products
    # scaled and rounded to out's dtype first, then combined in fp32 as silu_and_mul does: each program multiplies the
    # same x tile by its gate columns and by the up columns N rows further, so the [M, 2N] product never leaves it
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    up_ptrs = w_ptr + (offs_n[None, :] + N).to(tl.int64) * stride_wn + offs_k[:, None]   # unused unless SILU_EPI
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, w, acc)
        if SILU_EPI:
            w_up = tl.load(up_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc_up = tl.dot(a, w_up, acc_up)
            up_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc = w8a8_epilogue(acc, acc_up, offs_m, offs_n, mask_m, mask_n, a_scale_ptr, w_scale_ptr, bias_ptr, N,
                        out_ptr.dtype.element_ty, HAS_BIAS, SILU_EPI)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def w8a8_epilogue(acc, acc_up, offs_m, offs_n, mask_m, mask_n, a_scale_ptr, w_scale_ptr, bias_ptr, N,
                  OUT_DTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_EPI: tl.constexpr):
    """A W8A8 tile's output in fp32 before the store: acc (x W^T over the tile's rows offs_m and columns offs_n) times
    the rows' and columns' scales (+ bias); with SILU_EPI, acc_up the same over the up rows N further and the result
    silu(gate) * up, both products rounded to OUT_DTYPE first as silu_and_mul reads them. Shared by the pointer
    kernel and the TMA one (kernels/fp8_gemm_tma.py)."""
    sa = tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0)
    sw = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
    y = acc * sa[:, None] * sw[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if SILU_EPI:
        sw_up = tl.load(w_scale_ptr + N + offs_n, mask=mask_n, other=0.0)
        up = acc_up * sa[:, None] * sw_up[None, :]
        if HAS_BIAS:
            up = up + tl.load(bias_ptr + N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        gate = y.to(OUT_DTYPE).to(tl.float32)
        up = up.to(OUT_DTYPE).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
    return y


def _cfg(bm, bn, bk, w, s):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)


_FP8 = [_cfg(128, 256, 128, 8, 3), _cfg(128, 128, 128, 8, 4), _cfg(256, 128, 128, 8, 3), _cfg(128, 128, 128, 4, 4)]
_linear_fp8 = autotune(_FP8, key=["N", "K"])(_linear_fp8_kernel)


@triton.jit
def round_e4m3(v):
    # v (fp32, |v| <= 448) rounded to nearest-even at e4m3's 3 mantissa bits, in fp32: the integer add carries into
    # the exponent, so the cast to e4m3 that follows is exact for every normal value (it is how the hardware rounds;
    # Triton's interpreter alone drops that carry, 127.9 -> 64, so CPU runs would differ without it)
    # below 2^-6 e4m3 is subnormal, multiples of 2^-9: round v * 512 to an integer (1.5 * 2^23 forces it, RTNE)
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    sub = ((v * 512.0 + 12582912.0) - 12582912.0) * 0.001953125
    return tl.where(tl.abs(v) < 0.015625, sub, bits.to(tl.float32, bitcast=True))


@triton.jit
def _quantize_rows_kernel(x_ptr, xq_ptr, xs_ptr, K, stride_x, stride_q, BLOCK_K: tl.constexpr, EXACT: tl.constexpr):
    # one row: sx = max|x| / 448, xq = e4m3(x / sx). EXACT (triton-v1.4): scale 1 for a row of zeros and the e4m3
    # rounding done in fp32 bits (round_e4m3); else (triton-v1 .. v1.3) the cast rounds and a row of zeros gets
    # 1e-12 / 448
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 0)
    if EXACT:
        s = tl.where(amax > 0, amax / 448.0, 1.0)
        q = round_e4m3(tl.minimum(tl.maximum(x / s, -448.0), 448.0))
    else:
        s = tl.maximum(amax, 1e-12) / 448.0
        q = tl.minimum(tl.maximum(x / s, -448.0), 448.0)
    tl.store(xq_ptr + row * stride_q + offs, q.to(xq_ptr.dtype.element_ty), mask=mask)
    tl.store(xs_ptr + row, s)


def _quantize(x2: torch.Tensor, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x2.shape
    xq = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x2.device)
    xs = torch.empty(m, dtype=torch.float32, device=x2.device)
    block = next_pow2(k)
    _quantize_rows_kernel[(m,)](x2, xq, xs, k, x2.stride(0), xq.stride(0), BLOCK_K=block, EXACT=exact,
                                num_warps=min(16, max(4, block // 1024)))
    return xq, xs


def quantize_rows(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic e4m3 quantization of x2 [M, K]: (xq [M, K] float8_e4m3fn, sx [M] fp32), rounded as the GPU
    rounds on every backend (triton-v1.4)."""
    return _quantize(x2, exact=True)


def fp8_native(x: torch.Tensor, m: int) -> bool:
    """Whether fp8 weights times x's M rows take the W8A8 fp8 tensor-core kernel."""
    return x.is_cuda and m >= FP8_NATIVE_MIN_M and torch.cuda.get_device_capability(x.device) >= (8, 9)


def quantize_fp8_rows(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows as triton-v1 .. v1.3 do it (the GPU's cast; a row of zeros gets scale 1e-12 / 448)."""
    return _quantize(x2, exact=False)


def w8a8(x2: torch.Tensor, weight: QuantizedWeight, bias, out: torch.Tensor) -> None:
    """out = x2 W^T (+ b) for fp8 weights: x2 [M, K] (unit column stride) quantized per row, then the tuned GEMM."""
    m, k = x2.shape
    n = weight.shape[0]
    qw = weight.qweight
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else weight.scale
    xq, xs = quantize_fp8_rows(x2)
    grid = lambda c: (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]),)  # noqa: E731
    _linear_fp8[grid](xq, qw, xs, weight.scale, b, out, m, n, k, xq.stride(0), qw.stride(0), out.stride(0),
                      HAS_BIAS=has_bias)


def linear_fp8_w8a8_ref(x: torch.Tensor, weight: QuantizedWeight, bias=None) -> torch.Tensor:
    """What the native fp8 path computes, in torch: x quantized per row to e4m3, then the scaled product."""
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    sx = x2.abs().amax(1).clamp(min=1e-12) / FP8_MAX
    xq = (x2 / sx[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    y = (xq @ weight.qweight.to(torch.float32).t()) * sx[:, None] * weight.scale[None, :]
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).view(*x.shape[:-1], weight.shape[0])
