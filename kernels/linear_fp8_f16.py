"""triton-v1.5's linear: fp8 weights times few rows (decode) on the fp16 tensor-core path.

triton-v1.4 sends fp8 weights times up to 32 rows to kernels/linear.py's weight-only kernel, which converts each e4m3
weight tile to x's dtype (bf16) before the MMA. On the H200 that kernel streamed the weights at 42-57 % of the copy
rate (bench/fp8_rows.py: 3.16 ms of linears a batch-1 step against 1.71 ms for the bytes; the int8 kernel, whose
conversion is cheaper, ~70 %). Hopper converts e4m3 to fp16 in one instruction per pair (cvt.rn.f16x2.e4m3x2); to bf16
it takes a second one per element (from fp16). So here x and the weight tile enter an fp16 dot: each K tile of x is
lowered by a power of two per row (exact) into fp16's range -- 1 unless a row holds a value past 2^14 -- and the
tile's product raised by it into the fp32 accumulator. fp16 keeps 10 mantissa bits where bf16 keeps 7, so x's values
convert exactly down to 2^-14 (below that, fp16's subnormal grid of 2^-24: nothing next to a tile's others); e4m3
values are exact in both. Split-K over the reduction as kernels/linear.py does (the
splits' fp32 partials summed in split order by the last to finish a tile: deterministic).

Everything else -- more rows, int8 and plain weights, fp16/fp32 models, GPUs without fp8 conversion (before sm_89)
-- is triton-v1.4's linear (kernels/linear_w8a8.py) unchanged. Under TRITON_INTERPRET=1 the kernel runs on CPU
tensors (fp16 dots are exact there), so the CPU tests cover it.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_w8a8 import WEIGHT_ONLY_MAX_M, linear_w8a8
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import autotune, check_device, fast_tuned, interpreting, tl, triton, tuned_launcher


@triton.jit
def _fp8_gemv_f16_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, ws_ptr, lock_ptr, M, N, K, stride_xm, stride_wn,
                         stride_om, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr):
    # grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K); split s reduces k in [s * k_per, (s + 1) * k_per)
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    offs_m = rm % M
    offs_n = rn % N   # weight rows past N wrap around (valid addresses, no load mask)
    offs_k = tl.arange(0, BLOCK_K)
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + (k_lo + offs_k)[:, None]  # W^T tile [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, eviction_policy="evict_first")   # weights stream through once
        else:
            mask_k = (k0 + offs_k) < k_hi
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            w = tl.load(w_ptrs, mask=mask_k[:, None], other=0.0, eviction_policy="evict_first")
        # a power of two per row that brings the tile's max|x| to <= 2^14 (1 for every usual activation)
        amax = tl.max(tl.abs(x), 1)
        shift = tl.math.exp2(tl.maximum(tl.math.ceil(tl.math.log2(tl.maximum(amax, 1.0))) - 14.0, 0.0))
        acc += tl.dot((x / shift[:, None]).to(tl.float16), w.to(tl.float16)) * shift[:, None]
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    last = True
    if SPLIT_K > 1:
        part = ws_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(part + pid_k.to(tl.int64) * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the counter is bumped (release, gpu scope)
        last = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
        if last:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(part + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(lock_ptr + pid, 0)
    if last:
        acc = acc * tl.load(scale_ptr + offs_n)[None, :]   # per-output-channel scale, once per output
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
        tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=mask)


def _cfg(bm, bn, bk, sk, w, s):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w, num_stages=s)


# kernels/linear.py's weight-only candidates for the same row families (chosen there on the H200 for llama3-8b's
# shapes), plus a wider-N one: what wins with a cheaper conversion is measured by bench/fp8_rows.py
_CANDIDATES = {16: [_cfg(16, 64, 256, 4, 4, 4), _cfg(16, 64, 128, 1, 4, 5), _cfg(16, 128, 128, 4, 4, 5)],
               32: [_cfg(32, 64, 256, 4, 4, 3), _cfg(32, 64, 128, 2, 4, 4)]}
MAX_SPLIT_K = max(c.kwargs["SPLIT_K"] for cs in _CANDIDATES.values() for c in cs)


def _is_even_k(k: int, meta) -> bool:
    return k % (meta["BLOCK_K"] * meta["SPLIT_K"]) == 0


_even_k = triton.heuristics({"EVEN_K": lambda a: _is_even_k(a["K"], a)})
_tuned = {bm: autotune(c, key=["N", "K"], use_cuda_graph=True, warmup=5, rep=25)(_even_k(_fp8_gemv_f16_kernel))
          for bm, c in _CANDIDATES.items()}


def _f16_path(x: torch.Tensor) -> bool:
    if x.dtype != torch.bfloat16:
        return False
    if x.device.type == "cpu":
        return interpreting()
    return x.is_cuda and not interpreting() and torch.cuda.get_device_capability(x.device) >= (8, 9)


def linear_fp8_f16(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = x W^T (+ b): a bf16 model's fp8 weights times up to WEIGHT_ONLY_MAX_M rows through the fp16 GEMV above;
    everything else as triton-v1.4."""
    if not (isinstance(weight, QuantizedWeight) and weight.kind == "fp8") or not _f16_path(x):
        return linear_w8a8(x, weight, bias)
    n, k = weight.shape
    m = x.numel() // k if x.shape[-1] == k else 0
    if m == 0 or m > WEIGHT_ONLY_MAX_M:
        return linear_w8a8(x, weight, bias)   # which checks its arguments
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _launch(x2, weight, bias, out, None)
    return out.view(*x.shape[:-1], n)


def linear_fp8_f16_with_config(x: torch.Tensor, weight: QuantizedWeight, bias=None, *, block_m: int = 16,
                               block_n: int = 64, block_k: int = 256, split_k: int = 1, num_warps: int = 4,
                               num_stages: int = 4) -> torch.Tensor:
    """The fp16 GEMV with one fixed tile config (benchmark sweeps, tests): any row count, bf16 x, fp8 weights."""
    if not isinstance(weight, QuantizedWeight) or weight.kind != "fp8" or x.dtype != torch.bfloat16 or split_k < 1:
        raise ValueError("linear_fp8_f16_with_config: needs bf16 x, an fp8 QuantizedWeight and split_k >= 1")
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    x2 = x.reshape(-1, weight.shape[1]).contiguous()
    out = torch.empty(x2.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        config = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k)
        if not interpreting():
            config.update(num_warps=num_warps, num_stages=num_stages)
        _launch(x2, weight, bias, out, config)
    return out.view(*x.shape[:-1], weight.shape[0])


def _launch(x2, weight: QuantizedWeight, bias, out, config: dict | None) -> None:
    m, k = x2.shape
    n = weight.shape[0]
    qw = weight.qweight
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else weight.scale
    if config is None and interpreting():   # small tiles and split-K: CPU tests cover the cross-program sum
        config = dict(BLOCK_M=16 if m <= 16 else 32, BLOCK_N=32 if n >= 32 else 16, BLOCK_K=64 if k >= 64 else 32,
                      SPLIT_K=2)
    autotuned = tune_key = None
    if config is None:
        autotuned = _tuned[16 if m <= 16 else 32]
        tune_key = (x2.device, n, k, has_bias)
        tuned = tuned_launcher(autotuned, tune_key)
        config = tuned.constexprs if tuned is not None else None
    split = MAX_SPLIT_K if config is None else config["SPLIT_K"]
    bm = 16 if config is None else config["BLOCK_M"]
    if split > 1:   # fp32 partials [split, M, N] and the per-tile arrival counters (kernels/linear.py's)
        ws = torch.empty(split * m * n, dtype=torch.float32, device=x2.device)
        locks = _lin._split_k_locks(x2.device, triton.cdiv(m, bm) * triton.cdiv(n, 16))
    else:
        locks = _lin._split_k_locks(x2.device, 1)
        ws = locks.view(torch.float32)
    args = (x2, qw, weight.scale, b, out, ws, locks, m, n, k, x2.stride(0), qw.stride(0), out.stride(0))
    if autotuned is not None:
        grid = lambda c: (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]), c["SPLIT_K"])  # noqa: E731
        fast_tuned(autotuned, _fp8_gemv_f16_kernel, tune_key, grid, *args, HAS_BIAS=has_bias,
                   derived=lambda best: {"EVEN_K": _is_even_k(k, best.kwargs)})
        return
    c = dict(config)
    c["EVEN_K"] = _is_even_k(k, c)
    grid = (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]), c["SPLIT_K"])
    _fp8_gemv_f16_kernel[grid](*args, HAS_BIAS=has_bias, **c)
