"""triton-v1.6's fused op `silu_and_mul_linear`: the MLP's activation folded into the down projection's prologue.

A decode layer runs the gate/up projection, SiLU-and-mul (one small kernel) and the down projection. With quantized
weights at decode sizes the down projection is kernels/linear.py's weight-only kernel, which loads x one K tile at a
time: with its constexpr SILU_MUL it loads the tile's gate and up halves instead and computes silu(gate) * up there,
exactly as kernels/silu_and_mul.py does (fp32, rounded to x's dtype), so the product sees the same values and the
separate kernel, its launch and its [T, I] round trip through memory are gone (32 launches of a llama3-8b step).

Where triton-v1.5 would run the weight-only kernel for the down projection -- int8 or fp8 weights times up to
WEIGHT_ONLY_MAX_M (32) rows, fp16 dots for fp8 weights of a bf16 model up to F16_DOT_MAX_M (16) -- this runs the same
kernel with the prologue; everything else (plain weights on cuBLAS, more rows) is v1.5's silu_and_mul then v1.5's
linear. On CPU tensors under TRITON_INTERPRET=1 it runs too, and gives v1.5's two ops' result bit for bit.

Measured on the H200 it is SLOWER (bench/fused_rows.py, BENCHMARKS.md "Fused decode layers"): every program of every
N tile recomputes the activation for each x tile inside its K loop, and the down projection takes 3.1-5.4x v1.5's two
ops with int8 weights (72.8 us against 21.2 at one row). The set stays a release, a regression a canary must catch;
triton-v1.7 (kernels/linear_silu_and_mul.py) puts the activation in the gate/up projection's epilogue instead.

Its GPU canary (H200, 2026-12-05: `sits-control demo --device cuda --scenario prologue --model llama3-8b
--engine-arg '--quantization int8' --production-kernels triton-v1.5`) was rolled back by the answer-level gate
(continuations of token 0 from the second token on), but the fault was not this op's: the baseline, triton-v1.5,
answered wrong too wherever a sequence decoded alone, and so did every Triton set with int8 weights in an engine of
64 sequences (bench/fused_prologue_served.py, bench/decode_graphs_check.py). The engine's batch-1 decode graph,
captured first (by warm-up's request), counted split-K arrivals in its stream's lock buffer, which a 64-row capture
then outgrew and freed; kernels/linear.py now keeps outgrown buffers (BENCHMARKS.md "Fused decode layers"). After
the mend (an H100, 10 req/s under CUDA MPS) the gate passed it and its latency was judged: ITL P90 +12.5 %, within
the demo policy's +25 % limit, so it was promoted -- served beside other engines, its slower down projection costs
less than alone.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_fp8_f16 import linear_fp8_f16, weight_only_rows
from sits.kernels.linear_w8a8 import WEIGHT_ONLY_MAX_M
from sits.kernels.quant import QuantizedWeight
from sits.kernels.silu_and_mul import silu_and_mul
from sits.kernels.triton_env import check_device


def silu_and_mul_linear(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = linear(silu_and_mul(x), W) (+ b): x [..., 2I] = [gate | up], W [N, I] (a tensor or QuantizedWeight)
    -> [..., N] in x's dtype."""
    if x.shape[-1] % 2 or x.shape[-1] // 2 != (weight.shape[1] if len(weight.shape) == 2 else -1):
        raise ValueError(f"silu_and_mul_linear: x {tuple(x.shape)} must be [..., 2 x I] for weight [N, I] "
                         f"{tuple(weight.shape)}")
    n, i = weight.shape
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not isinstance(weight, QuantizedWeight) or m == 0 or m > WEIGHT_ONLY_MAX_M:
        return linear_fp8_f16(silu_and_mul(x), weight, bias)
    _lin.check_linear_args(x[..., :i], weight, bias)
    check_device("silu_and_mul_linear", x)
    return weight_only_rows(x, weight, bias, n, silu_mul=True)
