"""triton-v1.10's fused ops: the RMSNorm, with the residual add, in front of the q/k/v and gate/up projections.

A decode layer at batch 1 launches two norm kernels (input and post-attention: kernels/rms_norm.py, one program on a
row of H values) right before the two GEMVs that read their output; on the H200 a llama3-8b step of triton-v1.9 is
4.18 ms against a 3.70 ms copy floor, and those 64 launches a step were taken for a part of the gap. Here the GEMV
(kernels/linear_gemv.py, constexpr NORM) does the norm itself: every program walks all of K anyway, so as it loads
each x tile it forms h = x + residual (rounded to x's dtype, exactly as the norm kernel rounds it), accumulates h^2,
multiplies h by the norm weight before the dot products, and scales its sums by 1/rms(h) once after the reduction --
the norm is a scale of the row, so it commutes with the matmul. No extra pass over x, no [T, H] round trip through
memory, one launch instead of two. The programs of the first output tile store h (in the main loop; elsewhere the
store is masked off): the residual the next layer adds.

Numerics: the residual output is the norm kernel's bit for bit. The projection's input is not rounded to x's dtype
twice (the norm kernel rounds h / rms to x's dtype, then its product with the weight): the fused op is the
two ops' values to the rounding of one bf16 activation, closer to the fp64 result than they are.

Measured (BENCHMARKS.md "A GEMV for batch 1", H200, each set's engine in a process of its own, the same call):
batch-1 decode bf16 236 tok/s against v1.9's 239, int8 333 against 331, fp8 341 against 348: this release is no
faster. Where the launches it saves went (bench/norm_gemv_rows.py, H200): the GEMV with the norm in its loop is
slower than the norm kernel (1.7-1.8 us) then the plain GEMV at four of six projections (bf16 qkv 17.2 against 15.5
us, fp8 gate/up 41.2 against 33.8); both normed projections of a step bf16 2.40 ms against 2.28, fp8 1.69 against
1.47. Storing h after the loop (RES_AFTER) helps at some launch configs, hurts at others, never below the two ops.

Where triton-v1.9 would not run the GEMV (more than GEMV_MAX_M rows, unsupported dtypes or devices) these are
triton-v1's norm then v1.9's linear (or fused gate/up projection): the two ops' result bit for bit.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_gemv import GEMV_MAX_M, _supported, gemv, linear_gemv, linear_silu_and_mul_gemv
from sits.kernels.rms_norm import fused_add_rms_norm, rms_norm
from sits.kernels.triton_env import check_device


def _check(op: str, x: torch.Tensor, weight, residual, norm_weight) -> int:
    """The rows of x [..., K] (0 when none); raises ValueError on mismatched shapes."""
    if len(weight.shape) != 2:
        raise ValueError(f"{op}: weight {tuple(weight.shape)} must be [N, K]")
    k = weight.shape[1]
    if x.shape[-1] != k:
        raise ValueError(f"{op}: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"{op}: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    if norm_weight.dim() != 1 or norm_weight.shape[0] != k:
        raise ValueError(f"{op}: norm weight {tuple(norm_weight.shape)} does not match hidden size {k}")
    return x.numel() // k if k else 0


def _fused(op: str, x, weight, residual, norm_weight, eps, bias, silu_epi: bool):
    """The GEMV with the norm in front: (out, residual_out)."""
    _lin.check_linear_args(x, weight, bias)
    check_device(op, x)
    n_out = weight.shape[0] // 2 if silu_epi else weight.shape[0]
    r2 = _lin.as_rows(residual) if residual is not None else None
    res = torch.empty_like(r2) if r2 is not None else None
    nw = norm_weight.contiguous()
    out = _lin.through_rows(x, n_out, lambda x2, o: gemv(x2, weight, bias, o, silu_epi=silu_epi,
                                                         norm=(r2, nw, eps, res)))
    return out, (res.view(x.shape) if res is not None else x)


def _norm(x, residual, norm_weight, eps):
    if residual is None:
        return rms_norm(x, norm_weight, eps), x
    return fused_add_rms_norm(x, residual, norm_weight, eps)


def add_rms_norm_linear(x: torch.Tensor, weight, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                        eps: float, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(rms_norm(h), W, b), h) with h = x + residual, or h = x where residual is None: x [..., K], W [N, K]
    (a tensor or QuantizedWeight), norm_weight [K] -> ([..., N], [..., K]) in x's dtype."""
    m = _check("add_rms_norm_linear", x, weight, residual, norm_weight)
    if 0 < m <= GEMV_MAX_M and _supported(x, weight):
        return _fused("add_rms_norm_linear", x, weight, residual, norm_weight, eps, bias, False)
    h, r = _norm(x, residual, norm_weight, eps)
    return linear_gemv(h, weight, bias), r


def add_rms_norm_linear_silu_and_mul(x: torch.Tensor, weight, residual: torch.Tensor | None,
                                     norm_weight: torch.Tensor, eps: float,
                                     bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu_and_mul(linear(rms_norm(h), W, b)), h), W = [gate; up] [2I, K]: the MLP's input norm and gate/up
    projection with triton-v1.7's SiLU-and-mul epilogue -> ([..., I], [..., K])."""
    _lin.check_gate_up("add_rms_norm_linear_silu_and_mul", weight)
    m = _check("add_rms_norm_linear_silu_and_mul", x, weight, residual, norm_weight)
    if 0 < m <= GEMV_MAX_M and _supported(x, weight):
        return _fused("add_rms_norm_linear_silu_and_mul", x, weight, residual, norm_weight, eps, bias, True)
    h, r = _norm(x, residual, norm_weight, eps)
    return linear_silu_and_mul_gemv(h, weight, bias), r
