"""triton-v1.22's prefill linears: triton-v1.21's four fp8 linear ops (the linear, the fused gate/up projection with
SiLU-and-mul, and the two norm-fronted ones) with their W8A8 GEMM past SCALED_MM_MAX_M rows run by the persistent TMA
kernel (kernels/fp8_gemm_tma.py) instead of the pointer kernel (kernels/fp8_gemm.py `_linear_fp8_kernel`). The same
quantization (kernels/fp8_gemm.py `quantize_rows`, or triton-v1.17's norm that quantizes), the same math and K order.
Calls the TMA kernel cannot take (an fp32 model, K not a multiple of 16, a GPU before sm_90) and calls with less than
TMA_MIN_WORK multiply-adds run the pointer kernel; up to SCALED_MM_MAX_M rows and other weights everything is v1.21's
op.

Why a work threshold: the TMA kernel's launch goes through Triton's own launch path (three host descriptors a call,
which the project's FastLauncher does not take), tens of microseconds of host work more than the pointer kernel's.
Where a step is long on the GPU the host runs ahead and only the GPU time counts; a small model's prefill steps are
launch-bound, and there the host time is the step (triton-v1.20's second launch a layer cost the tiny model +5 % ITL
P90 in the canary). 2^32 multiply-adds: every llama3-8b projection past 512 rows (513 x 4,096 x 4,096 = 2^33), never
the tiny model (2,048 x 1,536 x 256 = 2^29.6 at its default step).
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.fp8_gemm import quantize_rows
from sits.kernels.fp8_gemm_tma import gemm_tma, tma_gemm_ok
from sits.kernels.linear_gemv import linear_gemv_pdl
from sits.kernels.linear_w8a8 import SCALED_MM_MAX_M, gemm_silu_and_mul, w8a8_quantized, w8a8_rows
from sits.kernels.linear_w8a8_silu import linear_silu_and_mul_w8a8
from sits.kernels.norm_w8a8 import (add_rms_norm_linear_silu_and_mul_w8a8, add_rms_norm_linear_w8a8,
                                    norm_quant)
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import check_device

TMA_MIN_WORK = 2**32   # multiply-adds (M x N x K) from which a call takes the TMA kernel


def gemm(xq: torch.Tensor, xs: torch.Tensor, weight: QuantizedWeight, bias, dtype: torch.dtype, *,
         silu_epi: bool = False) -> torch.Tensor:
    """The W8A8 GEMM past SCALED_MM_MAX_M rows for x quantized per row (xq [M, K] e4m3, xs [M]): the TMA kernel
    where it takes the call and the call has TMA_MIN_WORK multiply-adds, else the pointer kernel
    (kernels/linear_w8a8.py) -> [M, N] (or [M, N / 2] with the SiLU-and-mul epilogue) in dtype."""
    n = weight.shape[0] // 2 if silu_epi else weight.shape[0]
    out = torch.empty(xq.shape[0], n, dtype=dtype, device=xq.device)
    if xq.shape[0] * weight.shape[0] * xq.shape[1] < TMA_MIN_WORK or not tma_gemm_ok(xq, weight, out):
        return gemm_silu_and_mul(xq, xs, weight, bias, dtype) if silu_epi else w8a8_quantized(xq, xs, weight, bias,
                                                                                             dtype)
    gemm_tma(xq, xs, weight, bias, out, silu_epi=silu_epi)
    return out


def linear_w8a8_tma(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = x W^T (+ b): fp8 weights times more than SCALED_MM_MAX_M rows through the TMA GEMM; else v1.21's linear."""
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return linear_gemv_pdl(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    xq, xs = quantize_rows(_lin.as_rows(x))
    return gemm(xq, xs, weight, bias, x.dtype).view(*x.shape[:-1], weight.shape[0])


def linear_silu_and_mul_w8a8_tma(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = silu_and_mul(x W^T (+ b)), W = [gate; up] [2I, H] -> [..., I]: past SCALED_MM_MAX_M rows the TMA GEMM with
    the SiLU-and-mul epilogue; else v1.21's op (v1.16's)."""
    if len(weight.shape) != 2 or weight.shape[0] % 2:
        raise ValueError(f"linear_silu_and_mul: weight {tuple(weight.shape)} must be [2 x I, H] ([gate; up])")
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return linear_silu_and_mul_w8a8(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear_silu_and_mul", x)
    xq, xs = quantize_rows(_lin.as_rows(x))
    return gemm(xq, xs, weight, bias, x.dtype, silu_epi=True).view(*x.shape[:-1], weight.shape[0] // 2)


def add_rms_norm_linear_w8a8_tma(x: torch.Tensor, weight, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                                 eps: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(h), W, b), h), h = x + residual (or x): past SCALED_MM_MAX_M rows v1.17's quantizing norm,
    then the TMA GEMM; else v1.21's op."""
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return add_rms_norm_linear_w8a8(x, weight, residual, norm_weight, eps, bias)
    xq, xs, h = norm_quant(x, weight, residual, norm_weight, eps, bias)
    return gemm(xq, xs, weight, bias, x.dtype).view(*x.shape[:-1], weight.shape[0]), h


def add_rms_norm_linear_silu_and_mul_w8a8_tma(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                              norm_weight: torch.Tensor, eps: float,
                                              bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu_and_mul(linear(rms_norm(h), W, b)), h), W = [gate; up] [2I, H]: past SCALED_MM_MAX_M rows v1.17's
    quantizing norm, then the TMA GEMM with the SiLU-and-mul epilogue; else v1.21's op."""
    if len(weight.shape) != 2 or weight.shape[0] % 2:
        raise ValueError(f"add_rms_norm_linear_silu_and_mul: weight {tuple(weight.shape)} must be [2 x I, H] "
                         "([gate; up])")
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return add_rms_norm_linear_silu_and_mul_w8a8(x, weight, residual, norm_weight, eps, bias)
    xq, xs, h = norm_quant(x, weight, residual, norm_weight, eps, bias)
    return gemm(xq, xs, weight, bias, x.dtype, silu_epi=True).view(*x.shape[:-1], weight.shape[0] // 2), h
