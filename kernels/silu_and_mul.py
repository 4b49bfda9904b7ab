"""SwiGLU activation: silu(gate) * up with x = [gate | up] along the last dim (Shazeer 2020), computed in fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sits.kernels.triton_env import check_device, fast, tl, triton

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    g = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _split(x: torch.Tensor) -> int:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim of x {tuple(x.shape)} must be even ([gate | up])")
    return x.shape[-1] // 2


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # x: [T, 2*I] -> [T, I]
    i = _split(x)
    check_device("silu_and_mul", x)
    x2 = x.reshape(-1, 2 * i)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], i, dtype=x.dtype, device=x.device)
    if x2.shape[0] and i:
        fast(_silu_and_mul_kernel, BLOCK=_BLOCK, num_warps=4)((x2.shape[0], triton.cdiv(i, _BLOCK)), x2, out,
                                                             x2.stride(0), out.stride(0), i)
    return out.view(*x.shape[:-1], i)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    i = _split(x)
    return F.silu(x[..., :i]) * x[..., i:]
