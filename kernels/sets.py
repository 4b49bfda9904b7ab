"""The built-in kernel sets. Every set is registered here, in one place."""
from __future__ import annotations

from kernels.linear import linear_ref
from kernels.paged_decode_attention import paged_decode_attention_ref
from kernels.prefill_attention import prefill_attention_ref
from kernels.registry import KernelSet, register_kernel_set
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rope_and_cache import rope_and_cache_ref
from kernels.silu_and_mul import silu_and_mul_ref

TORCH = register_kernel_set(KernelSet(
    name="torch",
    version="1.0.0",
    devices=("cpu", "cuda"),
    description="reference implementations in plain PyTorch (fp32 softmax/norm statistics); runs anywhere",
    rms_norm=rms_norm_ref,
    fused_add_rms_norm=fused_add_rms_norm_ref,
    silu_and_mul=silu_and_mul_ref,
    rope_and_cache=rope_and_cache_ref,
    prefill_attention=prefill_attention_ref,
    paged_decode_attention=paged_decode_attention_ref,
    linear=linear_ref,
))
