"""RMSNorm and fused residual-add + RMSNorm.

y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32 (Zhang & Sennrich 2019; HF LlamaRMSNorm rounding order:
the normalized row is rounded to x.dtype before the weight multiply). One program per row.
"""
from __future__ import annotations

import torch

from sits.kernels.triton_env import (check_device, fast, gdc_launch_dependents, gdc_wait, next_pow2, pdl_launch,
                                     pdl_launches, tl, triton)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr,
                     stride_x, stride_r, stride_o, stride_ro, H, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    # PDL (triton-v1.12, bench/pdl_chain.py; launched with launch_pdl=True, sm_90+): the norm weight is read before
    # waiting for the earlier kernel's writes (griddepcontrol.wait); the next kernel may launch once the row is loaded
    # (it waits for this one's writes before it reads them)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < H
    if PDL:
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        gdc_wait()
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # residual_out = x + residual rounds to x.dtype, exactly like the reference (add in fp32: the interpreter
        # can't do bf16 arithmetic)
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    if PDL:
        gdc_launch_dependents()
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    if not PDL:
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not match hidden size of x {tuple(x.shape)}")


def _launch(x, residual, weight, eps):
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty_like(x2)
    r2 = res_out = None
    if residual is not None:
        r2 = residual.reshape(-1, h)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty_like(x2)
    rows = x2.shape[0]
    if rows:
        block = next_pow2(h)
        fast(_rms_norm_kernel, HAS_RESIDUAL=residual is not None, BLOCK_H=block,
             num_warps=min(16, max(1, block // 256)), **pdl_launch(x2.device))(
            (rows,), x2, r2 if r2 is not None else x2, weight.contiguous(), out,
            res_out if res_out is not None else out, x2.stride(0), r2.stride(0) if r2 is not None else 0,
            out.stride(0), res_out.stride(0) if res_out is not None else 0, h, float(eps))
    return out.view(x.shape), (res_out.view(x.shape) if res_out is not None else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [T, H], weight: [H]
    _check(x, weight)
    check_device("rms_norm", x)
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape != residual.shape:
        raise ValueError(f"fused_add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    _check(x, weight)
    check_device("fused_add_rms_norm", x)
    return _launch(x, residual, weight, eps)


def rms_norm_pdl(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """triton-v1.12's rms_norm: rms_norm inside pdl_launches() (programmatic dependent launch on sm_90+)."""
    with pdl_launches():
        return rms_norm(x, weight, eps)


def fused_add_rms_norm_pdl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """triton-v1.12's fused_add_rms_norm: fused_add_rms_norm inside pdl_launches()."""
    with pdl_launches():
        return fused_add_rms_norm(x, residual, weight, eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check(x, weight)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(acc)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # residual_out = x + residual; out = rms_norm(residual_out)
    if x.shape != residual.shape:
        raise ValueError(f"fused_add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    residual_out = x + residual
    return rms_norm_ref(residual_out, weight, eps), residual_out
