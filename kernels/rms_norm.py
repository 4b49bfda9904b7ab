"""RMSNorm and fused residual-add + RMSNorm.

y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32 (Zhang & Sennrich 2019; HF LlamaRMSNorm rounding order:
the normalized row is rounded to x.dtype before the weight multiply). One program per row.
"""
from __future__ import annotations

import torch

from sits.kernels.fp8_gemm import round_e4m3
from sits.kernels.triton_env import (check_device, fast, gdc_launch_dependents, gdc_wait, next_pow2, pdl_launch,
                                     pdl_launches, tl, triton)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_out_ptr, scale_ptr,
                     stride_x, stride_r, stride_o, stride_ro, H, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr = False,
                     QUANT: tl.constexpr = False):
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
    if QUANT:
        # triton-v1.17: out is e4m3 and scale_ptr the rows' scales; the row as stored without QUANT (rounded to x's
        # dtype), quantized as fp8_gemm.py's _quantize_rows_kernel (EXACT) quantizes a row it loads
        y = y.to(x.dtype).to(tl.float32)
        amax = tl.max(tl.abs(y), 0)
        s = tl.where(amax > 0, amax / 448.0, 1.0)
        y = round_e4m3(tl.minimum(tl.maximum(y / s, -448.0), 448.0))
        tl.store(scale_ptr + row, s)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.shape[-1] != weight.shape[-1] or weight.dim() != 1:
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not match hidden size of x {tuple(x.shape)}")


def _launch(x, residual, weight, eps, quant: bool = False):
    # -> (out, residual_out or None, scales or None); quant: out in e4m3 [rows, H] with one fp32 scale a row
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty_like(x2, dtype=torch.float8_e4m3fn if quant else None)
    scales = torch.empty(x2.shape[0], dtype=torch.float32, device=x2.device) if quant else None
    r2 = res_out = None
    if residual is not None:
        r2 = residual.reshape(-1, h)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty_like(x2)
    rows = x2.shape[0]
    if rows:
        block = next_pow2(h)
        flags = dict(QUANT=True) if quant else {}   # the launcher's constexprs as the plain norm's without it
        fast(_rms_norm_kernel, HAS_RESIDUAL=residual is not None, BLOCK_H=block,
             num_warps=min(16, max(1, block // 256)), **flags, **pdl_launch(x2.device))(
            (rows,), x2, r2 if r2 is not None else x2, weight.contiguous(), out,
            res_out if res_out is not None else out, scales if quant else out, x2.stride(0),
            r2.stride(0) if r2 is not None else 0, out.stride(0), res_out.stride(0) if res_out is not None else 0, h,
            float(eps))
    return (out.view(x.shape) if not quant else out), (res_out.view(x.shape) if res_out is not None else None), scales


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
    out, res, _ = _launch(x, residual, weight, eps)
    return out, res


def add_rms_norm_quant(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(xq [T, H] e4m3, xs [T] fp32, h): the norm of h = x + residual (h = x where residual is None), quantized per
    row as `quantize_rows(rms_norm(h))` quantizes it, bit for bit, in one launch (triton-v1.17). x: [..., H] ->
    T = its rows; h in x's shape."""
    if residual is not None and x.shape != residual.shape:
        raise ValueError(f"fused_add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    _check(x, weight)
    check_device("fused_add_rms_norm" if residual is not None else "rms_norm", x)
    xq, res, xs = _launch(x, residual, weight, eps, quant=True)
    return xq, xs, (res if res is not None else x)


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
