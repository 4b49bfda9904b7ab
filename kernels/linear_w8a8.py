"""triton-v1.4's linear: fp8 (e4m3) weights routed by row count to what measured fastest on the H200.

bench/fp8_rows.py (BENCHMARKS.md "FP8 linear by rows") timed llama3-8b's four weight shapes x 32 layers at 1..2,048
rows: triton-v1.3's fp8 linear (the weight-only Triton kernel below 64 rows, kernels/fp8_gemm.py's W8A8 GEMM tuned once
per weight shape above), torch's fp8 GEMM (`torch._scaled_mm`, cuBLASLt, row-wise scales), and cuBLAS on bf16 weights.
One step's linears, ms: 1 row 3.16 (v1.3) / 4.17 (_scaled_mm) / 3.71 (bf16); 64 rows 4.24 / 3.78 / 4.02; 128 rows
3.88 / 3.62; 256 rows 4.67 / 4.59; 2,048 rows 26.52 / 27.79 / 42.28, and 25.69 for the GEMM tuned for that many rows.
So, with fp8 weights on a GPU with fp8 tensor cores:
- up to WEIGHT_ONLY_MAX_M rows (decode of small batches): triton-v1.3's weight-only kernel, x in bf16 (exact);
- up to SCALED_MM_MAX_M rows: x quantized per row to e4m3 (kernels/fp8_gemm.py `quantize_rows`, one launch), then
  `torch._scaled_mm`;
- more rows (prefill): the same quantization, then kernels/fp8_gemm.py's W8A8 GEMM with candidates of its own, tuned
  for prefill-size row counts (not by whichever row count a weight shape saw first, as in v1.3).
A W8A8 kernel that also quantized x inside the GEMV (a scale per row and K tile, no extra launch) lost at every row
count up to 64 (1 row: 3.67 ms a step against v1.3's 3.16; commit 1350ead's bench/fp8_rows.py sweep): it is not here.

Accuracy: e4m3 activations (3 mantissa bits) cost ~2.7 % relative error per output against exact x times the same
fp8 weights (bench/fp8_rows.py's err column); against the bf16 model's logits, bench/fp8_accuracy.py states it.
int8 and plain weights, fp8 weights on GPUs before sm_89, and shapes torch's fp8 GEMM refuses (N or K not a multiple
of 16, x not bf16) take triton-v1.3's linear, or the Triton GEMM. Under TRITON_INTERPRET=1 the W8A8 rows run the
Triton GEMM on CPU tensors (Triton's interpreter computes e4m3 dots), so the CPU tests cover the quantization and the
GEMM bit for bit against their torch twin.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.fp8_gemm import FP8_MAX, _linear_fp8_kernel, quantize_rows
from sits.kernels.linear_dequant import linear_dequant_many_rows
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import autotune, check_device, fast_tuned, interpreting, triton

WEIGHT_ONLY_MAX_M = 32   # up to this many rows: v1.3's weight-only kernel
SCALED_MM_MAX_M = 512    # up to this many rows: torch._scaled_mm; more: the Triton W8A8 GEMM


# W8A8 GEMM candidates for more than SCALED_MM_MAX_M rows: tile 128 x 256 won on the H200 at 2,048 rows for all four
# llama3-8b shapes (bench/fp8_rows.py, BENCHMARKS.md "FP8 linear by rows")
_LARGE = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=8, num_stages=st)
          for bm, bn, st in ((128, 256, 3), (128, 128, 4), (256, 128, 3))]
_gemm = autotune(_LARGE, key=["N", "K"], warmup=5, rep=25)(_linear_fp8_kernel)
# the same GEMM with triton-v1.16's SiLU-and-mul epilogue (SILU_EPI: two accumulators a program, gate and up): tiles
# of half _LARGE's width so that a program holds as many accumulators
_PAIRED = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=w, num_stages=st)
           for bm, bn, w, st in ((128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 4, 4), (64, 128, 4, 4))]
_gemm_silu = autotune(_PAIRED, key=["N", "K", "SILU_EPI"], warmup=5, rep=25)(_linear_fp8_kernel)


def w8a8_available(x: torch.Tensor) -> bool:
    """Whether this process runs W8A8 on x's device: fp8 tensor cores (sm_89+), or Triton's interpreter on CPU."""
    if x.device.type == "cpu":
        return interpreting()
    return x.is_cuda and not interpreting() and torch.cuda.get_device_capability(x.device) >= (8, 9)


def _scaled_mm_takes(xq: torch.Tensor, dtype: torch.dtype, n: int, k: int) -> bool:
    # cuBLASLt's row-wise scaled fp8 GEMM: bf16 output, both dims multiples of 16; not on CPU
    return xq.is_cuda and dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0


def w8a8_rows(x: torch.Tensor, weight) -> int:
    """x's rows [..., K] where they take the W8A8 routes (fp8 weights, more than WEIGHT_ONLY_MAX_M rows, fp8 tensor
    cores or the interpreter); 0 where they do not (or x does not match the weight)."""
    if not (isinstance(weight, QuantizedWeight) and weight.kind == "fp8") or not w8a8_available(x):
        return 0
    k = weight.shape[1]
    m = x.numel() // k if k and x.shape[-1] == k else 0
    return m if m > WEIGHT_ONLY_MAX_M else 0


def linear_w8a8(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = x W^T (+ b): fp8 weights by row count (the module docstring); everything else as triton-v1.3."""
    if not w8a8_rows(x, weight):
        return linear_dequant_many_rows(x, weight, bias)   # which checks its arguments (and m == 0)
    n = weight.shape[0]
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    x2 = _lin.as_rows(x)
    xq, xs = quantize_rows(x2)
    return w8a8_quantized(xq, xs, weight, bias, x.dtype).view(*x.shape[:-1], n)


def w8a8_quantized(xq: torch.Tensor, xs: torch.Tensor, weight: QuantizedWeight, bias,
                   dtype: torch.dtype) -> torch.Tensor:
    """The W8A8 routes of linear_w8a8 (more than WEIGHT_ONLY_MAX_M rows) for x already quantized per row: xq [M, K]
    e4m3 and xs [M] its scales (quantize_rows, or triton-v1.17's norm that quantizes, kernels/rms_norm.py) times fp8
    weights [N, K] (+ b) -> [M, N] in dtype: torch._scaled_mm up to SCALED_MM_MAX_M rows where it takes them, else
    the Triton GEMM tuned for prefill."""
    m, k = xq.shape
    n = weight.shape[0]
    if m <= SCALED_MM_MAX_M and _scaled_mm_takes(xq, dtype, n, k):
        return torch._scaled_mm(xq, weight.qweight.t(), scale_a=xs[:, None], scale_b=weight.scale[None, :],
                                bias=None if bias is None else bias.to(torch.bfloat16), out_dtype=torch.bfloat16)
    out = torch.empty(m, n, dtype=dtype, device=xq.device)
    if m:
        _gemm_launch(xq, xs, weight, bias, out, None)
    return out


def linear_w8a8_gemm(x: torch.Tensor, weight: QuantizedWeight, bias=None, *, block_m: int, block_n: int,
                     block_k: int, num_warps: int = 8, num_stages: int = 3, silu_epi: bool = False) -> torch.Tensor:
    """The Triton W8A8 GEMM with one fixed tile config at any row count (benchmark sweeps, tests); `silu_epi`: with
    triton-v1.16's SiLU-and-mul epilogue, weight = [gate; up] [2I, H] -> [..., I]."""
    if not isinstance(weight, QuantizedWeight) or weight.kind != "fp8":
        raise ValueError("linear_w8a8_gemm: needs an fp8 QuantizedWeight")
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    n = weight.shape[0] // 2 if silu_epi else weight.shape[0]
    x2 = x.reshape(-1, weight.shape[1]).contiguous()
    out = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        config = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8)
        if not interpreting():
            config.update(num_warps=num_warps, num_stages=num_stages)
        xq, xs = quantize_rows(x2)
        _gemm_launch(xq, xs, weight, bias, out, config, silu_epi=silu_epi)
    return out.view(*x.shape[:-1], n)


def gemm_silu_and_mul(xq: torch.Tensor, xs: torch.Tensor, weight: QuantizedWeight, bias,
                      dtype: torch.dtype) -> torch.Tensor:
    """silu_and_mul(x W^T (+ b)) for fp8 weights W = [gate; up] [2I, K] and x quantized per row (xq [M, K] e4m3, xs
    [M]): the W8A8 GEMM with the SiLU-and-mul epilogue, tuned for its weight shape (triton-v1.16,
    kernels/linear_w8a8_silu.py) -> [M, I] in dtype."""
    out = torch.empty(xq.shape[0], weight.shape[0] // 2, dtype=dtype, device=xq.device)
    if xq.shape[0]:
        _gemm_launch(xq, xs, weight, bias, out, None, silu_epi=True)
    return out


def _gemm_launch(xq, xs, weight: QuantizedWeight, bias, out, config: dict | None, *, silu_epi: bool = False) -> None:
    # out [M, N]: N = the weight's rows, or half of them with the SiLU-and-mul epilogue
    m, k = xq.shape
    n = out.shape[1]
    qw = weight.qweight
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else weight.scale
    args = (xq, qw, xs, weight.scale, b, out, m, n, k, xq.stride(0), qw.stride(0), out.stride(0))
    if config is None and interpreting():   # small tiles: CPU tests cover partial tiles in seconds
        config = dict(BLOCK_M=32, BLOCK_N=32 if n >= 32 else 16, BLOCK_K=64 if k >= 64 else 32, GROUP_M=8)
    if config is None:
        grid = lambda c: (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]),)  # noqa: E731
        if silu_epi:
            fast_tuned(_gemm_silu, _linear_fp8_kernel, (xq.device, n, k, out.dtype, has_bias, True), grid, *args,
                       HAS_BIAS=has_bias, SILU_EPI=True)
        else:
            fast_tuned(_gemm, _linear_fp8_kernel, (xq.device, n, k, out.dtype, has_bias), grid, *args,
                       HAS_BIAS=has_bias)
        return
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
    _linear_fp8_kernel[grid](*args, HAS_BIAS=has_bias, SILU_EPI=silu_epi, **config)


def linear_w8a8_ref(x: torch.Tensor, weight: QuantizedWeight, bias=None) -> torch.Tensor:
    """What the W8A8 rows compute, in fp32 torch: x rounded to e4m3 with one scale per row (max|x| / 448), times the
    e4m3 weight, times both scales."""
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float32)
    amax = x2.abs().amax(1, keepdim=True)
    sx = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    xq = (x2 / sx).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    y = (xq @ weight.qweight.to(torch.float32).t()) * sx * weight.scale[None, :]
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).view(*x.shape[:-1], weight.shape[0])


def linear_w8a8_torch(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """linear_w8a8's numerics in torch, on any device: fp8 weights times more than WEIGHT_ONLY_MAX_M rows with x
    rounded to e4m3 per row, else the torch reference (bench/kv_fp8_accuracy.py's "torch-w8a8" set measures W8A8's
    effect on a model's answers with it)."""
    if isinstance(weight, QuantizedWeight) and weight.kind == "fp8" and x.numel() // x.shape[-1] > WEIGHT_ONLY_MAX_M:
        _lin.check_linear_args(x, weight, bias)
        return linear_w8a8_ref(x, weight, bias)
    return _lin.linear_ref(x, weight, bias)
