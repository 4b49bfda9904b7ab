"""A persistent W8A8 GEMM fed by the tensor-memory accelerator (sm_90+): kernels/fp8_gemm.py's `_linear_fp8_kernel`
math (x quantized per row to e4m3, fp8 weights, y = acc * sx[t] * sw[n] (+ b), fp32 accumulation, the same K order)
with a different way to the tensor cores, for the prefill-size row counts where the W8A8 GEMM runs (more than
kernels/linear_w8a8.py's SCALED_MM_MAX_M rows), and in triton-v1.25 for the gate/up projection from 33 rows.

- The x and weight tiles come in through TMA descriptors (`TensorDescriptor` over xq [M, K] and the weight [N, K]):
  no per-element address arithmetic or masks in the K loop (the descriptor zero-fills past M, N and K), and the
  copies land in shared memory in the layout wgmma reads.
- One program per SM walks the output tiles (`tl.range` over tiles, NUM_SMS apart, flattened with the K loop), so
  the next tile's first loads are issued while this tile's epilogue runs, and no launch tail of short-lived
  programs is left.
- The epilogue stores through a descriptor too (the tile, or its two halves with EPILOGUE_SPLIT, which keeps the
  shared-memory staging within budget next to four pipeline stages).
- SILU_EPI: triton-v1.16's SiLU-and-mul epilogue (weight = [gate; up] [2N, K], out [M, N]): a second accumulator
  over the up rows N further, both rounded to out's dtype first, then silu(gate) * up in fp32, as silu_and_mul does.
- PAIRED (with SILU_EPI, triton-v1.24): the weight [gate; up] seen as [2, N, K] through a 3-D descriptor whose block
  [2, BLOCK_N / 2, BLOCK_K] holds a tile's gate and up rows: one copy and one dot a K step into one accumulator of
  BLOCK_N columns (the plain GEMM's shape: Triton 3.6 builds a 128 x 256 tile as four m64n256k32 wgmma a K step, no
  shared-memory round trip for the reshape), split into its gate and up halves in the epilogue; the output tile is
  BLOCK_N / 2 wide. The two-accumulator form issues two dots a K step, and measured 5-12 % slower than the pointer
  kernel on an H100; the paired form 15 % faster (376 against 440 us at llama3-8b's gate/up, 2,048 rows; 0 ulp).

Each output element sums the same K tiles in the same order as `_linear_fp8_kernel` with the same BLOCK_K, so the
two agree bit for bit under Triton's interpreter (CPU tests) and, measured, on an H100 at llama3-8b's shapes (0 ulp;
the GPU test allows the fp32 accumulator's rounding, as the tensor-core instruction shapes could order the in-tile
sums differently). Under the interpreter the descriptors are emulated, so the CPU tests cover this kernel too.
"""
from __future__ import annotations

import torch

from sits.kernels.fp8_gemm import w8a8_epilogue
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import (autotune, fast, grouped_tile, interpreting, num_sms, settle_before_tuning,
                                     tl, triton)

try:  # Triton >= 3.4: host-side TMA descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: no TMA GEMM
    TensorDescriptor = None


@triton.jit
def _w8a8_tma_kernel(a_desc, w_desc, out_desc, a_scale_ptr, w_scale_ptr, bias_ptr, M, N, K,
                     HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr,
                     SILU_EPI: tl.constexpr = False, PAIRED: tl.constexpr = False):
    # PAIRED (with SILU_EPI): w_desc is over the weight seen as [2, N, K] (gate rows, then up rows) with blocks
    # [2, BLOCK_N / 2, BLOCK_K]: one copy brings a tile's gate and up rows, one dot of BLOCK_N columns takes both into
    # one accumulator (the plain GEMM's shape), and the output tile is BLOCK_N / 2 wide
    TILE_N: tl.constexpr = BLOCK_N // 2 if PAIRED else BLOCK_N
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, TILE_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # the epilogue recomputes its tile's coordinates from a counter of its own: the flattened loop's software
    # pipeline runs the next tile's loads alongside this epilogue, so values from the loop's head are not kept live
    tile_c = start - NUM_SMS
    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, TILE_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * TILE_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            a = a_desc.load([off_m, off_k])
            if PAIRED:
                acc = tl.dot(a, w_desc.load([0, off_n, off_k]).reshape(BLOCK_N, BLOCK_K).T, acc)
            else:
                acc = tl.dot(a, w_desc.load([off_n, off_k]).T, acc)
                if SILU_EPI:
                    acc_up = tl.dot(a, w_desc.load([off_n + N, off_k]).T, acc_up)
        tile_c += NUM_SMS
        pid_m, pid_n = grouped_tile(tile_c, M, N, BLOCK_M, TILE_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * TILE_N + tl.arange(0, TILE_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        if PAIRED:   # the accumulator's first half is the gate product, its second the up product
            gate, up = acc.reshape(BLOCK_M, 2, TILE_N).permute(0, 2, 1).split()
            y = w8a8_epilogue(gate, up, offs_m, offs_n, mask_m, mask_n, a_scale_ptr, w_scale_ptr, bias_ptr, N,
                              out_desc.dtype, HAS_BIAS, True)
        else:
            y = w8a8_epilogue(acc, acc_up, offs_m, offs_n, mask_m, mask_n, a_scale_ptr, w_scale_ptr, bias_ptr, N,
                              out_desc.dtype, HAS_BIAS, SILU_EPI)
        y = y.to(out_desc.dtype)
        if EPILOGUE_SPLIT:   # two [BLOCK_M, TILE_N / 2] stores: half the shared-memory staging
            y0, y1 = y.reshape(BLOCK_M, 2, TILE_N // 2).permute(0, 2, 1).split()
            out_desc.store([pid_m * BLOCK_M, pid_n * TILE_N], y0)
            out_desc.store([pid_m * BLOCK_M, pid_n * TILE_N + TILE_N // 2], y1)
        else:
            out_desc.store([pid_m * BLOCK_M, pid_n * TILE_N], y)


def _block_shapes(bm, bn, bk, split, paired):
    # the descriptors' block shapes for a tile: x, weight, output (its width halved by the paired gate/up rows and by
    # the split epilogue)
    tile_n = bn // 2 if paired else bn
    return [bm, bk], ([2, bn // 2, bk] if paired else [bn, bk]), [bm, tile_n // 2 if split else tile_n]


def _set_blocks(nargs) -> None:
    # the autotuner's pre-hook: each candidate's tile shapes on the descriptors it is timed with
    shapes = _block_shapes(nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"], nargs["EPILOGUE_SPLIT"],
                           nargs.get("PAIRED", False))
    for name, shape in zip(("a_desc", "w_desc", "out_desc"), shapes):
        nargs[name].block_shape = shape


def _config(bm, bn, warps, stages, split):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8, "EPILOGUE_SPLIT": split},
                         num_warps=warps, num_stages=stages, pre_hook=_set_blocks)


# candidates: kernels/linear_w8a8.py's tiles (128 x 256 won at 2,048 rows on the H200 for the pointer kernel), with
# three or four stages (four need the split epilogue to fit 228 KB of shared memory at 128 x 256)
CONFIGS = [_config(bm, bn, w, st, split) for bm, bn, w, st, split in (
    (128, 256, 8, 3, False), (128, 256, 8, 4, True), (128, 128, 8, 4, False), (128, 128, 4, 4, False),
    (256, 128, 8, 3, False))]
# with the SiLU-and-mul epilogue a program holds two accumulators: tiles of half the width, as _PAIRED
CONFIGS_SILU = [_config(bm, bn, w, st, split) for bm, bn, w, st, split in (
    (128, 128, 8, 3, False), (128, 128, 8, 4, False), (128, 64, 4, 4, False), (64, 128, 4, 4, False))]
# paired gate/up rows (triton-v1.24): one accumulator BLOCK_N wide holds both halves, so the plain GEMM's tiles
# (an output tile half as wide); four stages fit at 128 x 256 without the split epilogue (224 KB in Triton 3.6's build)
CONFIGS_PAIRED = [_config(bm, bn, w, st, split) for bm, bn, w, st, split in (
    (128, 256, 8, 3, False), (128, 256, 8, 4, False), (128, 128, 8, 4, False), (128, 128, 4, 4, False),
    (256, 128, 8, 3, False))]
# triton-v1.25's gate/up projection at decode batches (33-512 rows): the paired tiles, and 64-row ones that fill more
# of the SMs at fewer rows; tuned once per row bucket (row_bucket), each bucket with an autotuner (and cache) of its own
SMALL_ROWS = 512
CONFIGS_PAIRED_SMALL = [_config(bm, bn, w, st, False) for bm, bn, w, st in (
    (128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4), (64, 256, 4, 3), (64, 128, 4, 4))]
_tuned = autotune(CONFIGS, key=["N", "K", "SILU_EPI"], warmup=5, rep=25)(_w8a8_tma_kernel)
_tuned_silu = autotune(CONFIGS_SILU, key=["N", "K", "SILU_EPI"], warmup=5, rep=25)(_w8a8_tma_kernel)
_tuned_paired = autotune(CONFIGS_PAIRED, key=["N", "K", "SILU_EPI"], warmup=5, rep=25)(_w8a8_tma_kernel)
_tuned_small: dict = {}   # row bucket -> the autotuner over CONFIGS_PAIRED_SMALL
_BEST: dict = {}   # (device, N, K, dtype, bias, silu, paired, row bucket) -> the winning config's kwargs


def row_bucket(m: int) -> int:
    """The row bucket a paired call of m rows is tuned for: 0 past SMALL_ROWS (one tuning for prefill steps), else the
    power of two from m up (at least 64): decode batches of 40 and 256 rows want different tiles."""
    return 0 if m > SMALL_ROWS else max(64, 1 << (m - 1).bit_length())


def _small_tuner(bucket: int):
    if bucket not in _tuned_small:
        _tuned_small[bucket] = autotune(CONFIGS_PAIRED_SMALL, key=["N", "K", "SILU_EPI"], warmup=5,
                                        rep=25)(_w8a8_tma_kernel)
    return _tuned_small[bucket]


def tma_gemm_ok(xq: torch.Tensor, weight: QuantizedWeight, out: torch.Tensor) -> bool:
    """Can the TMA GEMM take this call: Triton with host descriptors, sm_90+ (or the interpreter), e4m3 operands
    with unit column stride and 16-byte aligned rows (TMA's rule), a 16-bit output with aligned rows."""
    qw = weight.qweight
    if TensorDescriptor is None or out.dtype not in (torch.float16, torch.bfloat16):
        return False
    for t in (xq, qw, out):
        if t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return interpreting() or (xq.is_cuda and torch.cuda.get_device_capability(xq.device) >= (9, 0))


def _descriptors(xq, qw, out, bm, bn, bk, split, paired):
    m, k = xq.shape
    a_block, w_block, out_block = _block_shapes(bm, bn, bk, split, paired)
    if paired:   # [gate; up] [2N, K] seen as [2, N, K]
        n = qw.shape[0] // 2
        w = TensorDescriptor(qw, [2, n, k], [n * qw.stride(0), qw.stride(0), 1], w_block)
    else:
        w = TensorDescriptor(qw, list(qw.shape), [qw.stride(0), 1], w_block)
    return (TensorDescriptor(xq, [m, k], [xq.stride(0), 1], a_block), w,
            TensorDescriptor(out, list(out.shape), [out.stride(0), 1], out_block))


def gemm_tma(xq: torch.Tensor, xs: torch.Tensor, weight: QuantizedWeight, bias, out: torch.Tensor, *,
             silu_epi: bool = False, paired: bool = False, config: dict | None = None,
             fast_launch: bool = False) -> None:
    """out [M, N] = (xq W^T) * xs[:, None] * sw[None, :] (+ b) for xq [M, K] e4m3 and its row scales xs [M] (fp32)
    times fp8 weights W [N, K] (or with `silu_epi` silu_and_mul of the [gate; up] product, W [2N, K]). Tuned once per
    weight shape on a GPU (the winner kept for the process); `config` fixes the tile (benchmark sweeps, tests). The
    caller checks `tma_gemm_ok`. `fast_launch` (triton-v1.23): launched through the project's FastLauncher
    (kernels/triton_env.py, which specializes a descriptor by element type and block shape and hands it to Triton's
    launcher as Triton's own launch does) instead of Triton's launch path, which took 50-113 us of host time a call
    on an H100 against the pointer kernel's 18-42 through FastLauncher (bench/fp8_gemm_tma.py). `paired` (with
    `silu_epi`, triton-v1.24): each K step copies a tile's gate and up rows in one descriptor load and multiplies
    them in one dot, one accumulator (a config's BLOCK_N is then the product's width, twice the output tile's), where
    v1.22's kernel keeps two accumulators and issues two dots; up to SMALL_ROWS rows (triton-v1.25's decode batches)
    a paired call is tuned per row bucket over CONFIGS_PAIRED_SMALL."""
    if paired and not silu_epi:
        raise ValueError("gemm_tma: paired gate/up rows need the SiLU-and-mul epilogue (silu_epi=True)")
    m, k = xq.shape
    n = out.shape[1]
    if m == 0:
        return
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else weight.scale
    sms = num_sms(xq.device)
    if config is None and interpreting():   # small tiles: CPU tests cover partial tiles and the persistent walk
        tile_n = 32 if n >= 32 else 16
        config = dict(BLOCK_M=32, BLOCK_N=2 * tile_n if paired else tile_n, BLOCK_K=64 if k >= 64 else 32,
                      GROUP_M=8, EPILOGUE_SPLIT=False)
    bucket = row_bucket(m) if paired else 0
    key = (xq.device, n, k, out.dtype, has_bias, silu_epi, paired, bucket)
    if config is None:
        config = _BEST.get(key)
    width = 2 if paired else 1   # a config's BLOCK_N over the output tile's width
    if config is None:   # tune: the pre-hook sets each candidate's tile shapes on these descriptors
        settle_before_tuning((xq, out))
        descs = _descriptors(xq, weight.qweight, out, 64, 64, 64, False, paired)
        tuned = (_small_tuner(bucket) if bucket else _tuned_paired) if paired else _tuned_silu if silu_epi else _tuned
        grid = lambda c: (min(sms, triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n * width, c["BLOCK_N"])),)  # noqa
        tuned[grid](*descs, xs, weight.scale, b, m, n, k, HAS_BIAS=has_bias, NUM_SMS=sms, SILU_EPI=silu_epi,
                    PAIRED=paired)
        best = tuned.best_config
        _BEST[key] = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
        return
    bm, bn, bk, split = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["EPILOGUE_SPLIT"]
    launch = {c: v for c, v in config.items() if not (interpreting() and c in ("num_warps", "num_stages"))}
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n * width, bn)),)
    args = (*_descriptors(xq, weight.qweight, out, bm, bn, bk, split, paired), xs, weight.scale, b, m, n, k)
    if fast_launch:
        fast(_w8a8_tma_kernel, HAS_BIAS=has_bias, NUM_SMS=sms, SILU_EPI=silu_epi, PAIRED=paired,
             **launch)(grid, *args)
    else:
        _w8a8_tma_kernel[grid](*args, HAS_BIAS=has_bias, NUM_SMS=sms, SILU_EPI=silu_epi, PAIRED=paired, **launch)
