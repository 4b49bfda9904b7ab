"""Linear layer y = x W^T (+ b) for plain weights and weight-only quantized (int8 / fp8 e4m3) weights.

Quantized: y[t, n] = (sum_k x[t, k] * q[n, k]) * scale[n]: the per-output-channel scale is applied once after the
reduction. Plain weights go to cuBLAS (F.linear), which no hand-written kernel here beats.
Triton paths:
- `_linear_kernel`: weight-only, the int8/fp8 weight tile is upcast to x.dtype in registers and fed to tl.dot
  (fp32 accumulation). Small M (decode, GEMV-like) uses 16-row tiles and long K tiles so enough weight bytes are in
  flight to stream at memory bandwidth, and optionally split-K (a narrow N such as the down projection's 4096 has
  too few column tiles for 132 SMs): the splits' fp32 partials are summed by the last split to finish a tile, in
  one launch. 17..64 rows (batched decode) use one 32- or 64-row tile, also with split-K, so the weights are still
  read once; larger M uses square-ish tiles with grouped ordering for L2 reuse.
- fp8 weights times FP8_NATIVE_MIN_M (64) rows or more on GPUs with fp8 tensor cores (sm_89+): W8A8, activations
  quantized per token to e4m3 and both operands on the fp8 tensor cores (kernels/fp8_gemm.py).
triton-v1.2's linear (kernels/linear_dequant.py) sends steps of many rows to cuBLAS on dequantized weights instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sits.kernels.fp8_gemm import fp8_native, w8a8
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import (autotune, check_device, fast_tuned, grouped_tile, interpreting, next_pow2, tl,
                                triton, tuned_launcher)

_TUNE_MIN_WEIGHT = 1 << 22  # smaller weights run a fixed config: tuning would cost more than it saves


@triton.jit
def fp16_shift(amax):
    """A power of two that brings values up to `amax` to at most 2^14, inside fp16's range (1 for amax <= 2^14):
    x / shift and y * shift are exact. triton-v1.5 reads e4m3 through fp16 dots with it (here, and in the FP8
    attention kernels for q)."""
    return tl.math.exp2(tl.maximum(tl.math.ceil(tl.math.log2(tl.maximum(amax, 1.0))) - 14.0, 0.0))


@triton.jit
def _linear_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, ws_ptr, lock_ptr, M, N, K, stride_xm, stride_wn,
                   stride_om, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                   DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr, F16_DOT: tl.constexpr = False,
                   SILU_MUL: tl.constexpr = False, SILU_EPI: tl.constexpr = False):
    # grid: (tiles, SPLIT_K). Split s reduces k in [s * k_per, (s + 1) * k_per); with SPLIT_K > 1 every split stores
    # its fp32 partial to ws [SPLIT_K, M, N] and bumps the tile's counter; the last to arrive sums the partials in
    # split order (deterministic), applies scale/bias, writes out and resets the counter to 0 for the next launch.
    # SILU_MUL (triton-v1.6, kernels/silu_and_mul_linear.py): x's rows are [gate | up] (2K wide) and each x tile is
    # silu(gate) * up, computed as kernels/silu_and_mul.py computes it (fp32, rounded to x's dtype), so the product
    # sees the same values as after the separate activation.
    # SILU_EPI (triton-v1.7, kernels/linear_silu_and_mul.py): W is the MLP's [gate; up] (N = 2 I rows) and out is
    # [M, I]: a tile's columns pair gate row j with up row j (columns 2j, 2j + 1), and the epilogue writes
    # silu(gate) * up of the rounded pair, as the product then kernels/silu_and_mul.py would.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # weight rows past N wrap around (valid addresses, no load mask); x rows past M load as 0 (no memory traffic)
    mask_m = rm < M
    offs_m = rm % M
    offs_n = rn % N
    if SILU_EPI:
        offs_n = offs_n // 2 + (offs_n % 2) * (N // 2)
    offs_k = tl.arange(0, BLOCK_K)
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_lo + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + (k_lo + offs_k)[:, None]  # W^T tile [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:  # K % (SPLIT_K * BLOCK_K) == 0: every tile is whole
            x_mask = mask_m[:, None]
            w = tl.load(w_ptrs, eviction_policy="evict_first")  # weights stream through once
        else:
            mask_k = (k0 + offs_k) < k_hi
            x_mask = mask_m[:, None] & mask_k[None, :]
            w = tl.load(w_ptrs, mask=mask_k[:, None], other=0.0, eviction_policy="evict_first")
        if SILU_MUL:
            g = tl.load(x_ptrs, mask=x_mask, other=0.0).to(tl.float32)
            u = tl.load(x_ptrs + K, mask=x_mask, other=0.0).to(tl.float32)
            x = (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)
        else:
            x = tl.load(x_ptrs, mask=x_mask, other=0.0)
        if F16_DOT:   # (triton-v1.5, bf16 x, e4m3 w) each row of the tile lowered into fp16's range, raised after
            xf = x.to(tl.float32)
            shift = fp16_shift(tl.max(tl.abs(xf), 1))
            acc += tl.dot((xf / shift[:, None]).to(tl.float16), w.to(tl.float16)) * shift[:, None]
        elif DOT_F32:
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(x, w.to(x.dtype), acc, input_precision=DOT_PRECISION)
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
        acc = acc * tl.load(scale_ptr + offs_n)[None, :]  # per-output-channel scale, once per output
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
        if SILU_EPI:
            gu = acc.to(out_ptr.dtype.element_ty).to(tl.float32)   # the [gate | up] output, rounded as stored
            g, u = tl.split(tl.reshape(gu, [BLOCK_M, BLOCK_N // 2, 2]))
            rj = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rj[None, :],
                     (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty),
                     mask=mask_m[:, None] & (rj < N // 2)[None, :])
        else:
            tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :],
                     acc.to(out_ptr.dtype.element_ty), mask=mask)


def _cfg(bm, bn, bk, w, s, **extra):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, **extra}, num_warps=w,
                         num_stages=s)


def _small(bn, bk, w, s, split_k=1):
    return _cfg(16, bn, bk, w, s, SPLIT_K=split_k)


# Candidates: two per row family, the ones that won for llama3-8b's four weight shapes on the H200 (bench/int8_rows.py,
# BENCHMARKS.md "int8 at many rows"): with these two, every shape's tuned time is within 2 % of the best of the
# earlier 4-6 (equal for all but the large-M down projection). Each candidate costs a compilation and a benchmark in
# a cold warm-up: 18 per shape took 68 s of an 87 s int8 warm-up.
# small M: 16-row tiles, 64 weight rows x 128-256 k per step; split-K so that a narrow N (the down projection,
# N=4096: 64 tiles) still puts every SM to work.
_SMALL_M = [_small(64, 256, 4, 4, 4), _small(64, 128, 4, 5)]
# 17..64 rows (batched decode): one M tile of 32 or 64 rows, so the weights still stream through once, with split-K
_MID_M = {bm: [_cfg(bm, bn, bk, w, s, SPLIT_K=sk) for bn, bk, w, s, sk in ((64, 256, 4, 3, 4), (64, 128, 4, 4, 2))]
          for bm in (32, 64)}
_LARGE_M = [_cfg(bm, bn, 64, w, s, SPLIT_K=1) for bm, bn, w, s in ((128, 128, 8, 3), (64, 128, 4, 4))]
MAX_SPLIT_K = max(c.kwargs["SPLIT_K"] for c in _SMALL_M + _MID_M[32] + _MID_M[64])
SPLIT_K_MAX_M = 64  # larger M never splits K


def _is_even_k(k: int, meta) -> bool:
    return k % (meta["BLOCK_K"] * meta["SPLIT_K"]) == 0  # every split's every k tile is whole


_even_k = triton.heuristics({"EVEN_K": lambda a: _is_even_k(a["K"], a)})
# these run for tens of microseconds: candidates are timed inside a CUDA graph, or Python launch overhead (not the
# kernel) would decide the winner
# each candidate is timed over 25 ms of calls (Triton's default: 100, after 25 of warm-up): the two candidates of a
# family differed by 7 % or more on the H200 (BENCHMARKS.md "int8 at many rows"), which 25 ms of calls of 10-1,000 us
# tells apart, and a cold warm-up times 32 of them
_BENCH = dict(warmup=5, rep=25)
# F16_DOT (triton-v1.5's fp16 dots, decode sizes only) tunes apart: the conversion changes which tile wins
# (and SILU_MUL, triton-v1.6's activation prologue; SILU_EPI, triton-v1.7's activation epilogue)
_linear_small_m = autotune(_SMALL_M, key=["N", "K", "F16_DOT", "SILU_MUL", "SILU_EPI"], use_cuda_graph=True,
                           **_BENCH)(_even_k(_linear_kernel))
_linear_mid_m = {bm: autotune(c, key=["N", "K", "F16_DOT", "SILU_MUL", "SILU_EPI"], use_cuda_graph=True,
                              **_BENCH)(_even_k(_linear_kernel))
                 for bm, c in _MID_M.items()}
_linear_large_m = autotune(_LARGE_M, key=["N", "K"], **_BENCH)(_even_k(_linear_kernel))
MIN_LOCKS = 1024   # counters in a stream's first lock buffer
_LOCKS: dict = {}
_RETIRED: list = []   # lock buffers replaced by larger ones: kept for the CUDA graphs that captured them


def autotuner_for(m: int):
    """The autotuned weight-only kernel that serves M rows (each keeps its own winner per N, K)."""
    return _linear_small_m if m <= 16 else _linear_mid_m[32] if m <= 32 else _linear_mid_m[64] if m <= 64 \
        else _linear_large_m


def _split_k_locks(device: torch.device, tiles: int) -> torch.Tensor:
    """Per-tile arrival counters for split-K, zero between launches (the last split of a tile resets its counter).

    One buffer per (device, stream): launches on one stream run in order, so they can share it. A CUDA graph
    captured on a stream records the address of that stream's buffer, so a buffer is never freed: when a launch
    needs more tiles than the stream's buffer holds, a larger one replaces it for later launches and the old one
    stays allocated (in _RETIRED) for the graphs that captured it. Freeing it had broken the engine's batch-1 decode
    graph on the GPU: captured first (on demand by the warm-up's request), before a larger batch's capture grew the
    stream's buffer, it kept counting in freed memory that later allocations overwrote, so split-K tiles were summed
    before all their splits had arrived or never written (BENCHMARKS.md "Fused decode layers"). A buffer allocated
    inside a capture comes from the graph's pool, its zero-fill captured (and replayed) with it."""
    stream = torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else
                                                 torch.cuda.current_device()) if device.type == "cuda" else 0
    key = (str(device), stream)
    locks = _LOCKS.get(key)
    if locks is None or locks.numel() < tiles:
        if locks is not None:   # graphs captured with it still count in it: never freed (growth doubles, so all
            _RETIRED.append(locks)   # the outgrown ones together hold fewer counters than the last)
        locks = torch.zeros(max(MIN_LOCKS, next_pow2(tiles)), dtype=torch.int32, device=device)
        _LOCKS[key] = locks
    return locks


def check_gate_up(op: str, weight) -> None:
    """A fused gate/up op's weight must be [2 x I, H]: [gate; up] stacked along the rows."""
    if len(weight.shape) != 2 or weight.shape[0] % 2:
        raise ValueError(f"{op}: weight {tuple(weight.shape)} must be [2 x I, H] ([gate; up])")


def check_linear_args(x: torch.Tensor, weight, bias) -> None:
    k = weight.shape[1] if len(weight.shape) == 2 else -1
    if x.shape[-1] != k:
        raise ValueError(f"linear: x {tuple(x.shape)} does not match weight [N, K] {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias {tuple(bias.shape)} must be [{weight.shape[0]}]")


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as rows [M, K] with unit column stride (a view where it can be)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def through_rows(x: torch.Tensor, n_out: int, launch) -> torch.Tensor:
    """x [..., K] as rows [M, K] with unit column stride, `launch(x2, out)` writing out [M, n_out] in x's dtype ->
    [..., n_out]: the reshaping around the weight-only kernel (triton-v1.5-v1.7) and the GEMV (v1.9)."""
    x2 = as_rows(x)
    out = torch.empty(x2.shape[0], n_out, dtype=x.dtype, device=x.device)
    launch(x2, out)
    return out.view(*x.shape[:-1], n_out)


def linear(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    # x: [T, K]; weight: [N, K] tensor or QuantizedWeight; out: [T, N] in x.dtype
    check_linear_args(x, weight, bias)
    if not isinstance(weight, QuantizedWeight):
        return linear_ref(x, weight, bias)
    check_device("linear", x)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    if weight.kind == "fp8" and fp8_native(x, m):
        w8a8(x2, weight, bias, out)
        return out.view(*x.shape[:-1], n)
    weight_only(x2, weight, bias, out)
    return out.view(*x.shape[:-1], n)


def weight_only(x2: torch.Tensor, weight: QuantizedWeight, bias, out: torch.Tensor, *, f16_dot: bool = False,
                silu_mul: bool = False, silu_epi: bool = False) -> None:
    """out = x2 W^T (+ b) through the weight-only kernel (x2 [M, K] with unit column stride, M >= 1), tuned or fixed
    as linear() does. f16_dot (triton-v1.5, kernels/linear_fp8_f16.py): bf16 x and e4m3 weights enter an fp16 dot.
    silu_mul (triton-v1.6, kernels/silu_and_mul_linear.py): x2 is [M, 2K] = [gate | up] and the product is
    silu_and_mul(x2) W^T. silu_epi (triton-v1.7, kernels/linear_silu_and_mul.py): W is [gate; up] (2I rows) and out
    is [M, I] = silu_and_mul(x2 W^T (+ b))."""
    m = x2.shape[0]
    k = weight.shape[1]
    n = weight.shape[0]
    precision = "ieee" if x2.dtype == torch.float32 else "tf32"
    fixed = interpreting() or x2.dtype == torch.float32 or n * k < _TUNE_MIN_WEIGHT  # no autotuning runs
    if interpreting():  # split-K for small M so that CPU tests cover the cross-program reduction too; wide weights
        # in 128-column tiles: the interpreter's cost is per program (the tiny model's gate/up projection 4x faster,
        # the same bits: each column's sum over K does not depend on BLOCK_N)
        config = dict(BLOCK_M=16 if m <= 16 else 32, BLOCK_N=128 if n >= 512 else 32 if n >= 32 else 16,
                      BLOCK_K=64 if k >= 64 else 32, SPLIT_K=2 if m <= 16 else 1, DOT_F32=True)
    elif fixed:
        config = dict(BLOCK_M=16 if m <= 16 else 64, BLOCK_N=64, BLOCK_K=64, SPLIT_K=1, num_warps=4, num_stages=3)
    else:
        config = None
    _launch(x2, weight, bias, out, precision, config, f16_dot, silu_mul, silu_epi)


def _launch(x2, weight: QuantizedWeight, bias, out, precision: str, config: dict | None, f16_dot: bool = False,
            silu_mul: bool = False, silu_epi: bool = False):
    # config None: the autotuned kernel for this M; else BLOCK_M/N/K, SPLIT_K (+ num_warps, num_stages, DOT_F32).
    # Returns the compiled kernel of a fixed config (its n_regs, n_spills: bench/fused_rows.py), else None
    m = x2.shape[0]
    n, k = weight.shape
    qw = weight.qweight
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else weight.scale
    autotuned = tune_key = None
    if config is None:  # the autotuner's winner for this shape, once it has run
        autotuned = autotuner_for(m)
        tune_key = (x2.device, n, k, x2.dtype, has_bias, precision, f16_dot, silu_mul, silu_epi)
        tuned = tuned_launcher(autotuned, tune_key)
        config = tuned.constexprs if tuned is not None else None
    # before the first tuning, size the split-K buffers for any candidate (locks: one per 16 x 16 tile at most)
    split = (MAX_SPLIT_K if m <= SPLIT_K_MAX_M else 1) if config is None else config["SPLIT_K"]
    bm = 16 if config is None else config["BLOCK_M"]
    if split > 1:  # fp32 partials [split, M, N]; the stream-ordered caching allocator makes this cheap and safe
        ws = torch.empty(split * m * n, dtype=torch.float32, device=x2.device)
        locks = _split_k_locks(x2.device, triton.cdiv(m, bm) * triton.cdiv(n, 16))
    else:  # not read when SPLIT_K == 1; typed as in the split launches so both share compiled kernels
        locks = _split_k_locks(x2.device, 1)
        ws = locks.view(torch.float32)
    args = (x2, qw, weight.scale, b, out, ws, locks, m, n, k, x2.stride(0), qw.stride(0), out.stride(0))
    if autotuned is not None:
        grid = lambda c: (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]), c["SPLIT_K"])  # noqa: E731
        fast_tuned(autotuned, _linear_kernel, tune_key, grid, *args, HAS_BIAS=has_bias, DOT_F32=False,
                   DOT_PRECISION=precision, F16_DOT=f16_dot, SILU_MUL=silu_mul, SILU_EPI=silu_epi,
                   derived=lambda best: {"EVEN_K": _is_even_k(k, best.kwargs)})  # the heuristic, for the launcher
        return
    c = dict(config)
    c.setdefault("DOT_F32", False)
    c["EVEN_K"] = _is_even_k(k, c)
    grid = (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]), c["SPLIT_K"])
    return _linear_kernel[grid](*args, HAS_BIAS=has_bias, GROUP_M=8, DOT_PRECISION=precision, F16_DOT=f16_dot,
                                SILU_MUL=silu_mul, SILU_EPI=silu_epi, **c)


def linear_with_config(x: torch.Tensor, weight: QuantizedWeight, bias=None, *, block_m: int = 16, block_n: int = 64,
                       block_k: int = 256, split_k: int = 1, num_warps: int = 4, num_stages: int = 4) -> torch.Tensor:
    """The weight-only kernel with one fixed tile config (benchmark sweeps and tests of configs autotuning may pick)."""
    check_linear_args(x, weight, bias)
    check_device("linear", x)
    if not isinstance(weight, QuantizedWeight) or split_k < 1:
        raise ValueError("linear_with_config: needs a QuantizedWeight and split_k >= 1")
    x2 = x.reshape(-1, weight.shape[1]).contiguous()
    out = torch.empty(x2.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        config = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k)
        if not interpreting():
            config.update(num_warps=num_warps, num_stages=num_stages)
        else:
            config["DOT_F32"] = True
        _launch(x2, weight, bias, out, "ieee" if x.dtype == torch.float32 else "tf32", config)
    return out.view(*x.shape[:-1], weight.shape[0])


def linear_ref(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    check_linear_args(x, weight, bias)
    if not isinstance(weight, QuantizedWeight):
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    # int8 values and e4m3 values are exact in fp16/bf16/fp32, so this matmul only rounds its own result
    y = F.linear(x, weight.qweight.to(x.dtype)).to(torch.float32) * weight.scale
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)
