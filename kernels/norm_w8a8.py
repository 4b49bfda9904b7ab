"""triton-v1.17's fused ops: the RMSNorm in front of the q/k/v and gate/up projections quantizes its own output for
the W8A8 GEMM.

With fp8 weights (--quantization fp8) a linear of more than WEIGHT_ONLY_MAX_M (32) rows -- decode steps of 33 or more
sequences, every prefill step -- multiplies e4m3 activations with one scale a row (kernels/linear_w8a8.py). Up to
triton-v1.16 the layer's norm writes rms_norm(h) in bf16 [T, H], kernels/fp8_gemm.py's `quantize_rows` reads it back
and writes the e4m3 row and its scale, then the GEMM runs. Here the norm's program quantizes the row it already holds
(kernels/rms_norm.py `add_rms_norm_quant`, constexpr QUANT): one launch and one [T, H] bf16 write and read fewer,
twice a layer (the input norm before q/k/v, the post-attention norm before gate/up). At llama3-8b's 2,048-token
prefill step that is 64 launches and 64 x 33.6 MB (2.1 GB) of traffic fewer; bench/profile_steps.py put activation
quantization (all four linears' inputs, two of them these) at 2.3 ms of a 35.7 ms step on an H100.

The bytes and scales are `quantize_rows(rms_norm(h))`'s bit for bit (the norm's arithmetic and reduction unchanged,
its row rounded to x's dtype as the plain norm stores it, then quantized as quantize_rows quantizes), so the
projections are triton-v1.16's values bit for bit: the same GEMMs (torch._scaled_mm up to 512 rows, the Triton W8A8
GEMM above, with v1.16's SiLU-and-mul epilogue for gate/up) on the same operands. Fewer rows, int8 and plain weights,
GPUs without fp8 tensor cores: v1.16's two ops (its PDL norm, then its projection).
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_gemv import linear_gemv_pdl
from sits.kernels.linear_w8a8 import SCALED_MM_MAX_M, gemm_silu_and_mul, w8a8_quantized, w8a8_rows
from sits.kernels.linear_w8a8_silu import linear_silu_and_mul_w8a8
from sits.kernels.rms_norm import add_rms_norm_quant, fused_add_rms_norm_pdl, rms_norm_pdl
from sits.kernels.silu_and_mul import silu_and_mul
from sits.kernels.triton_env import pdl_launches


def _norm(x, residual, norm_weight, eps):
    """triton-v1.16's norm (PDL on sm_90+): (rms_norm(h), h)."""
    if residual is None:
        return rms_norm_pdl(x, norm_weight, eps), x
    return fused_add_rms_norm_pdl(x, residual, norm_weight, eps)


def norm_quant(x, weight, residual, norm_weight, eps, bias):
    """(xq, xs, h): h = x + residual (or x) and rms_norm(h) quantized per row for the W8A8 GEMM (e4m3 [M, H] and
    [M] scales), after checking x and bias against the weight."""
    _lin.check_linear_args(x, weight, bias)
    with pdl_launches():   # as v1.16's norm launches: it may start while the kernel before it finishes
        return add_rms_norm_quant(x, residual, norm_weight, eps)


def add_rms_norm_linear_w8a8(x: torch.Tensor, weight, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                             eps: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(h), W, b), h), h = x + residual (or x): the norm quantizing for the W8A8 GEMM where v1.16
    would quantize its output; else v1.16's norm then linear. x [..., H], W [N, H] -> ([..., N], [..., H])."""
    m = w8a8_rows(x, weight)
    if not m:
        h, r = _norm(x, residual, norm_weight, eps)
        return linear_gemv_pdl(h, weight, bias), r
    xq, xs, h = norm_quant(x, weight, residual, norm_weight, eps, bias)
    n = weight.shape[0]
    return w8a8_quantized(xq, xs, weight, bias, x.dtype).view(*x.shape[:-1], n), h


def add_rms_norm_linear_silu_and_mul_w8a8(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                          norm_weight: torch.Tensor, eps: float,
                                          bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu_and_mul(linear(rms_norm(h), W, b)), h), W = [gate; up] [2I, H]: the norm quantizing for the W8A8 GEMM
    (with v1.16's SiLU-and-mul epilogue past 512 rows, then SiLU-and-mul below); else v1.16's norm then its fused
    gate/up projection -> ([..., I], [..., H])."""
    _lin.check_gate_up("add_rms_norm_linear_silu_and_mul", weight)
    m = w8a8_rows(x, weight)
    if not m:
        h, r = _norm(x, residual, norm_weight, eps)
        return linear_silu_and_mul_w8a8(h, weight, bias), r
    xq, xs, h = norm_quant(x, weight, residual, norm_weight, eps, bias)
    if m > SCALED_MM_MAX_M:
        act = gemm_silu_and_mul(xq, xs, weight, bias, x.dtype)
    else:
        act = silu_and_mul(w8a8_quantized(xq, xs, weight, bias, x.dtype))
    return act.view(*x.shape[:-1], weight.shape[0] // 2), h
