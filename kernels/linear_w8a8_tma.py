"""triton-v1.22's and v1.23's prefill linears: triton-v1.21's fp8 linear ops with their W8A8 GEMM past SCALED_MM_MAX_M
rows run by the persistent TMA kernel (kernels/fp8_gemm_tma.py) instead of the pointer kernel (kernels/fp8_gemm.py
`_linear_fp8_kernel`). The same quantization (kernels/fp8_gemm.py `quantize_rows`, or triton-v1.17's norm that
quantizes), the same math and K order. Calls the TMA kernel cannot take (an fp32 model, K not a multiple of 16, a GPU
before sm_90) and calls with less than TMA_MIN_WORK multiply-adds run the pointer kernel; up to SCALED_MM_MAX_M rows
and other weights everything is v1.21's op.

- triton-v1.22: all four ops (the linear, the fused gate/up projection with SiLU-and-mul, the two norm-fronted ones),
  the TMA kernel launched through Triton's own launch path. Measured on an H100: the kernel 5-9 % faster than the
  pointer one for q/k/v, o and down at 2,048 rows and 5-12 % slower with the SiLU-and-mul epilogue, 50-113 us of host
  time a call against 18-42; the 256 x 2048/512 row 14 % slower on one machine, a 2,048-token prefill step +1.2 ms
  in a profile on another (BENCHMARKS.md "A persistent TMA GEMM").
- triton-v1.23: the linear (o and down projections) and the norm-fronted linear (q/k/v) only, the TMA kernel launched
  through the project's FastLauncher (kernels/triton_env.py, now taking host descriptors); the gate/up projection
  stays v1.21's. Measured on an H100 against v1.21 in the same call: TTFT -1.9 %, the 256 row +0.9 %.
- triton-v1.24: v1.23 with the gate/up projection's SiLU-and-mul ops (plain and norm-fronted) through the TMA kernel
  too, its gate and up rows paired (kernels/fp8_gemm_tma.py `paired`: one descriptor load and one dot a K step into one
  accumulator, the plain GEMM's shape, where v1.22's kernel issued two dots into two accumulators), fast launch.
  Measured on an H100: that GEMM 376 against the pointer kernel's 440 us at 2,048 rows; against v1.23 in the same call
  TTFT 29.6 ms (v1.23 31.3 at best), the 256 row +1.2 %.
- triton-v1.25: v1.24 whose gate/up projection (plain and norm-fronted) also takes the paired TMA kernel at 33-512
  rows -- decode steps of 33 or more sequences and small mixed steps -- where v1.21's op runs `torch._scaled_mm` and
  then a separate SiLU-and-mul; tuned per row bucket (kernels/fp8_gemm_tma.py `row_bucket`). Measured on an H100
  (bench/fp8_gemm_tma.py, llama3-8b's gate/up at 40-512 rows): the paired kernel 45.2-100.8 us against `_scaled_mm`
  and the project's silu_and_mul 48.9-118.9; q/k/v, o and down stay v1.21's there (cuBLASLt measured faster). The 256
  x 2048/512 row +1.2 % against v1.24 in the same call. The values are the W8A8 GEMM's, not cuBLASLt's: not v1.21's
  bits at those rows (4.0e-3 against 2.0e-3 from the exact product of the e4m3 operands).

Why a work threshold: a launch costs host time whatever the call's size, and a small model's prefill steps are
launch-bound: there the host time is the step (triton-v1.20's second launch a layer cost the tiny model +5 % ITL P90
in the canary). 2^32 multiply-adds: every llama3-8b projection past 512 rows (513 x 4,096 x 4,096 = 2^33), never the
tiny model (2,048 x 1,536 x 256 = 2^29.6 at its default step).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from sits.kernels import linear as _lin
from sits.kernels.fp8_gemm import quantize_rows
from sits.kernels.fp8_gemm_tma import gemm_tma, tma_gemm_ok
from sits.kernels.linear_gemv import linear_gemv_pdl
from sits.kernels.linear_w8a8 import SCALED_MM_MAX_M, gemm_silu_and_mul, w8a8_quantized, w8a8_rows
from sits.kernels.linear_w8a8_silu import linear_silu_and_mul_w8a8
from sits.kernels.norm_w8a8 import (add_rms_norm_linear_silu_and_mul_w8a8, add_rms_norm_linear_w8a8,
                                    norm_quant)
from sits.kernels.silu_and_mul import silu_and_mul
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import check_device

TMA_MIN_WORK = 2**32   # multiply-adds (M x N x K) from which a call takes the TMA kernel


def gemm(xq: torch.Tensor, xs: torch.Tensor, weight: QuantizedWeight, bias, dtype: torch.dtype, *,
         silu_epi: bool = False, paired: bool = False, fast_launch: bool = False,
         other: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """The W8A8 GEMM for x quantized per row (xq [M, K] e4m3, xs [M]): the TMA kernel where it takes the call and
    the call has TMA_MIN_WORK multiply-adds, else `other()` -- by default the pointer kernel (kernels/linear_w8a8.py),
    the route past SCALED_MM_MAX_M rows -> [M, N] (or [M, N / 2] with the SiLU-and-mul epilogue) in dtype.
    `fast_launch`: the TMA kernel through the project's FastLauncher (triton-v1.23) instead of Triton's own launch
    (v1.22); `paired`: the SiLU-and-mul epilogue's gate and up rows in one accumulator (triton-v1.24)."""
    def pointer() -> torch.Tensor:
        return gemm_silu_and_mul(xq, xs, weight, bias, dtype) if silu_epi else w8a8_quantized(xq, xs, weight, bias,
                                                                                             dtype)
    other = other or pointer
    if xq.shape[0] * weight.shape[0] * xq.shape[1] < TMA_MIN_WORK:   # before allocating: the small calls' route
        return other()
    out = torch.empty(xq.shape[0], weight.shape[0] // 2 if silu_epi else weight.shape[0], dtype=dtype,
                      device=xq.device)
    if not tma_gemm_ok(xq, weight, out):
        return other()
    gemm_tma(xq, xs, weight, bias, out, silu_epi=silu_epi, paired=paired, fast_launch=fast_launch)
    return out


def _linear(x: torch.Tensor, weight, bias, fast_launch: bool) -> torch.Tensor:
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return linear_gemv_pdl(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    xq, xs = quantize_rows(_lin.as_rows(x))
    return gemm(xq, xs, weight, bias, x.dtype, fast_launch=fast_launch).view(*x.shape[:-1], weight.shape[0])


def _add_rms_norm_linear(x, weight, residual, norm_weight, eps, bias, fast_launch: bool):
    if w8a8_rows(x, weight) <= SCALED_MM_MAX_M:
        return add_rms_norm_linear_w8a8(x, weight, residual, norm_weight, eps, bias)
    xq, xs, h = norm_quant(x, weight, residual, norm_weight, eps, bias)
    return gemm(xq, xs, weight, bias, x.dtype, fast_launch=fast_launch).view(*x.shape[:-1], weight.shape[0]), h


def linear_w8a8_tma(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = x W^T (+ b): fp8 weights times more than SCALED_MM_MAX_M rows through the TMA GEMM (Triton's launch);
    else v1.21's linear."""
    return _linear(x, weight, bias, False)


def linear_w8a8_tma_fast(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.23's linear: linear_w8a8_tma with the TMA GEMM launched through FastLauncher."""
    return _linear(x, weight, bias, True)


def _gate_up_gemm(xq: torch.Tensor, xs: torch.Tensor, weight, bias, dtype: torch.dtype, paired: bool) -> torch.Tensor:
    """The gate/up GEMM with SiLU-and-mul for x quantized per row: `gemm`'s TMA route where it takes the call, else at
    SCALED_MM_MAX_M rows or fewer (triton-v1.25's decode batches) v1.21's (`torch._scaled_mm`, then SiLU-and-mul),
    past them the pointer kernel."""
    small = xq.shape[0] <= SCALED_MM_MAX_M
    return gemm(xq, xs, weight, bias, dtype, silu_epi=True, paired=paired, fast_launch=paired,
                other=(lambda: silu_and_mul(w8a8_quantized(xq, xs, weight, bias, dtype))) if small else None)


def _linear_silu_and_mul(x: torch.Tensor, weight, bias, paired: bool, batched: bool = False) -> torch.Tensor:
    _lin.check_gate_up("linear_silu_and_mul", weight)
    m = w8a8_rows(x, weight)
    if m <= SCALED_MM_MAX_M and not (batched and m):   # v1.25 (`batched`) takes the TMA route from 33 rows
        return linear_silu_and_mul_w8a8(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear_silu_and_mul", x)
    xq, xs = quantize_rows(_lin.as_rows(x))
    return _gate_up_gemm(xq, xs, weight, bias, x.dtype, paired).view(*x.shape[:-1], weight.shape[0] // 2)


def _add_rms_norm_linear_silu_and_mul(x, weight, residual, norm_weight, eps, bias, paired: bool,
                                      batched: bool = False):
    _lin.check_gate_up("add_rms_norm_linear_silu_and_mul", weight)
    m = w8a8_rows(x, weight)
    if m <= SCALED_MM_MAX_M and not (batched and m):
        return add_rms_norm_linear_silu_and_mul_w8a8(x, weight, residual, norm_weight, eps, bias)
    xq, xs, h = norm_quant(x, weight, residual, norm_weight, eps, bias)
    return _gate_up_gemm(xq, xs, weight, bias, x.dtype, paired).view(*x.shape[:-1], weight.shape[0] // 2), h


def linear_silu_and_mul_w8a8_tma(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = silu_and_mul(x W^T (+ b)), W = [gate; up] [2I, H] -> [..., I]: past SCALED_MM_MAX_M rows the TMA GEMM with
    the SiLU-and-mul epilogue (two accumulators, Triton's launch); else v1.21's op (v1.16's)."""
    return _linear_silu_and_mul(x, weight, bias, False)


def linear_silu_and_mul_w8a8_tma_paired(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.24's gate/up projection: linear_silu_and_mul_w8a8_tma with the gate and up rows paired in one
    accumulator, launched through FastLauncher."""
    return _linear_silu_and_mul(x, weight, bias, True)


def linear_silu_and_mul_w8a8_tma_batched(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.25's gate/up projection: linear_silu_and_mul_w8a8_tma_paired, and at 33-512 rows the paired TMA
    kernel too (where it takes the call) instead of torch._scaled_mm and a separate SiLU-and-mul."""
    return _linear_silu_and_mul(x, weight, bias, True, batched=True)


def add_rms_norm_linear_w8a8_tma(x: torch.Tensor, weight, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                                 eps: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(h), W, b), h), h = x + residual (or x): past SCALED_MM_MAX_M rows v1.17's quantizing norm,
    then the TMA GEMM (Triton's launch); else v1.21's op."""
    return _add_rms_norm_linear(x, weight, residual, norm_weight, eps, bias, False)


def add_rms_norm_linear_w8a8_tma_fast(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                      norm_weight: torch.Tensor, eps: float,
                                      bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """triton-v1.23's norm-fronted linear: add_rms_norm_linear_w8a8_tma with the TMA GEMM launched through
    FastLauncher."""
    return _add_rms_norm_linear(x, weight, residual, norm_weight, eps, bias, True)


def add_rms_norm_linear_silu_and_mul_w8a8_tma(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                              norm_weight: torch.Tensor, eps: float,
                                              bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu_and_mul(linear(rms_norm(h), W, b)), h), W = [gate; up] [2I, H]: past SCALED_MM_MAX_M rows v1.17's
    quantizing norm, then the TMA GEMM with the SiLU-and-mul epilogue (two accumulators, Triton's launch); else
    v1.21's op."""
    return _add_rms_norm_linear_silu_and_mul(x, weight, residual, norm_weight, eps, bias, False)


def add_rms_norm_linear_silu_and_mul_w8a8_tma_paired(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                                     norm_weight: torch.Tensor, eps: float,
                                                     bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """triton-v1.24's norm-fronted gate/up projection: add_rms_norm_linear_silu_and_mul_w8a8_tma with the gate and
    up rows paired in one accumulator, launched through FastLauncher."""
    return _add_rms_norm_linear_silu_and_mul(x, weight, residual, norm_weight, eps, bias, True)


def add_rms_norm_linear_silu_and_mul_w8a8_tma_batched(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                                      norm_weight: torch.Tensor, eps: float,
                                                      bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """triton-v1.25's norm-fronted gate/up projection: add_rms_norm_linear_silu_and_mul_w8a8_tma_paired, and at
    33-512 rows v1.17's quantizing norm, then the paired TMA kernel (where it takes the call) instead of
    torch._scaled_mm and a separate SiLU-and-mul."""
    return _add_rms_norm_linear_silu_and_mul(x, weight, residual, norm_weight, eps, bias, True, batched=True)
