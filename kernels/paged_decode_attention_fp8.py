"""Decode attention over FP8 KV pages (kernel set triton-v1.3): paged_decode_attention.py's split-KV flash-decoding
kernel reading e4m3 pages and their per-(token, kv head) scales (kernels/kv_fp8.py), dequantized in the kernel.

With k_j ~ s_j * K8_j and v_j ~ t_j * V8_j (s, t the scales of key/value j of this kv head):
    q . k_j = s_j (q . K8_j)             a key's scale multiplies its column of the scores,
    sum_j p_j v_j = sum_j (p_j t_j) V8_j  a value's scale multiplies its column of the softmax weights,
so a [GROUP, BLOCK_N] tile is scaled instead of a [BLOCK_N, HEAD_DIM] one, and the e4m3 tiles enter the dot
converted to q's dtype, which holds every e4m3 value exactly. The softmax normalizer sums the unscaled weights. A
scale is max|v| / 448, so p_j t_j would sink into fp16's subnormals: the weights are raised by 2^8 before the cast
and the output lowered by 2^8 (both exact). The reference is paged_decode_attention_ref on the dequantized pages
(torch set). Plain pages go to triton-v1's kernel. triton-v1.5 runs the dots in fp16 (F16_DOT); triton-v1.8 also
converts each tile where it is loaded (STAGED, `e4m3_to_f16`) and runs a sequence's kv heads in neighbouring programs
(HEADS_FIRST).
"""
from __future__ import annotations

import math

import torch

from sits.kernels.kv_fp8 import Fp8Pages, kernel_page_args, page_tensors
from sits.kernels.linear import fp16_shift
from sits.kernels.paged_decode_attention import (_CONFIGS, _TUNE_MIN_BLOCKS, check_decode_args, choose_num_splits,
                                                 merge_splits, paged_decode_attention, split_buffers)
from sits.kernels.occupancy import WavesRule
from sits.kernels.triton_env import (autotune, check_device, fast, fast_tuned, gdc_launch_dependents, gdc_wait,
                                     interpreting, next_pow2, pdl_launch, pdl_launches, tl, triton)

PV_SHIFT = tl.constexpr(256.0)   # p * v_scale is raised by this before the p.v dot, the output lowered by it
# triton-v1.5's launch config past the small problems, fixed rather than autotuned: the engine tunes decode attention
# while it captures the decode CUDA graphs, on dummy sequences of one token (engine/execution/cuda_graphs.py), which
# picks configs that lose at real lengths (triton-v1.3's kernel took 798 us a layer in the engine at 256 x ~2,300
# tokens). bench/decode_attention_fp8.py on the H200 (2026-12-04), 108 configs: this one 553 us at 256 x 2,304 (best
# 552; BLOCK_N 64 w8 s3, 1,178) and 90 us at 32 x 2,304 (best 88).
F16_CONFIG = dict(BLOCK_N=128, num_warps=4, num_stages=3)
# triton-v1.8's (HEADS_FIRST, pages converted where they are loaded): measured on the H200 in
# bench/decode_attention_fp8.py's sweep
V18_CONFIG = dict(BLOCK_N=128, num_warps=4, num_stages=2)
# triton-v1.14's: one warp a program (bench/decode_attention_bound.py on an H100, 2026-12-06: the pages can be read at
# the copy rate with this walk, so the four-warp programs' on-chip path is the bound; a one-warp program exchanges no
# tile between warps, and more of them fit an SM)
V114_CONFIG = dict(BLOCK_N=32, num_warps=1, num_stages=3)
# triton-v1.15's rule picks between v1.14's config and v1.8's a launch (occupancy.WavesRule, where its fit is);
# triton-v1.26's between the same two with the key tile converted in the q.k dot's operand layout (STAGE_K=False):
# the same registers and shared memory compiled for sm_90 (bench/kernel_resources.py), so the same picks; on an H100
# (2026-12-07, bench/decode_attention_batch.py --k-conversion) 14-21 % faster at every batch and config measured
V115_CONFIGS = (V114_CONFIG, V18_CONFIG)
V126_CONFIGS = tuple({**c, "STAGE_K": False} for c in V115_CONFIGS)
v115_config = WavesRule(*V115_CONFIGS)   # a launch's config: its one-warp config or its four-warp one
v126_config = WavesRule(*V126_CONFIGS)


@triton.jit
def e4m3_to_f16(x):
    """An e4m3 tile in fp16 (exact: fp16 holds every e4m3 value), for the kernel's STAGED (triton-v1.8; compiled for
    sm_89+, never under the interpreter, which runs no asm): converted in the registers its load left it in, two elements per cvt.rn.f16x2.e4m3x2, by an asm op marked impure so that Triton's compiler leaves it there.
    A plain conversion it moves past the tile's shared-memory staging into the dot's operand layout, where a tile
    whose dot sums along tokens (v in p.v; tokens 1 KB apart in the pages) is gathered from shared memory one byte per
    load: on sm_90, 128 LDS.U8 of 1,089 instructions a warp runs per 128-token tile, 197-203 registers a thread (two
    programs per SM). Staged, the fp16 tiles go through shared memory in 16-byte stores and ldmatrix as bf16 tiles do:
    725 instructions, 144-159 registers (three programs per SM). On the H200 that bought 1-4 % (Nsight Compute,
    bench/decode_attention_ncu.py: the warps now wait on shared memory, short scoreboard and MIO throttle, instead of
    on issue; BENCHMARKS.md "FP8 decode attention")."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _paged_decode_attention_fp8_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt_ptr, ctx_ptr, o_ptr, part_o_ptr, part_lse_ptr,
    qk_scale,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh, stride_bt,
    stride_os, stride_oh, num_q_heads, BATCH_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr, F16_DOT: tl.constexpr, STAGED: tl.constexpr, HEADS_FIRST: tl.constexpr,
    PDL: tl.constexpr = False, STAGE_K: tl.constexpr = True,
):
    # grid: (num_seqs, num_kv_heads, NUM_SPLITS), as _paged_decode_attention_kernel, or with HEADS_FIRST (triton-v1.8)
    # (num_kv_heads, num_seqs, NUM_SPLITS): the programs that run side by side are one sequence's kv heads, which
    # read the neighbouring 128-byte pieces of the same tokens' rows; STAGED: q in fp16 (e4m3_to_f16). STAGE_K=False
    # (triton-v1.26): with STAGED, the key tile is converted by Triton in the q.k dot's operand layout (8-byte shared
    # loads of the e4m3 tile along head_dim), not staged as fp16 through shared memory; the value tile, whose dot sums
    # along tokens, stays staged
    if PDL:   # programmatic dependent launch (triton-v1.13): every read after the earlier kernel's writes land
        gdc_wait()
        gdc_launch_dependents()   # the next kernel may start now; it waits for this one's writes likewise
    if HEADS_FIRST:
        kv_head = tl.program_id(0)
        seq = tl.program_id(1).to(tl.int64)
    else:
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    tiles_per_split = tl.cdiv(tl.cdiv(ctx, BLOCK_N), NUM_SPLITS)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(ctx, lo + tiles_per_split * BLOCK_N)

    offs_g = tl.arange(0, GROUP_P)
    mask_g = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    offs_d = tl.arange(0, HEAD_DIM_P)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    q_shift = 1.0
    if F16_DOT:   # (triton-v1.5) q in fp16, lowered by a power of two so that max|q| <= 2^14 (exact both ways)
        qf = q.to(tl.float32)
        q_max = tl.max(tl.max(tl.abs(qf), 1), 0)
        q_shift = fp16_shift(q_max)
        q = (qf / q_shift).to(tl.float16)
    m_i = tl.full([GROUP_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_P], dtype=tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + blk[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        if STAGED and STAGE_K:
            k = e4m3_to_f16(k)
        else:
            k = k.to(q.dtype)
        k_scale = tl.load(k_scale_ptr + blk * stride_ksb + slot * stride_kss + kv_head * stride_ksh, mask=mask_n,
                          other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (k_scale * (qk_scale * q_shift))[None, :]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + blk[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        if STAGED:
            v = e4m3_to_f16(v)
        else:
            v = v.to(q.dtype)
        v_scale = tl.load(v_scale_ptr + blk * stride_vsb + slot * stride_vss + kv_head * stride_vsh, mask=mask_n,
                          other=0.0)
        pv = (p * (v_scale * PV_SHIFT)[None, :]).to(q.dtype)
        acc = tl.dot(pv, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    acc = acc * (1.0 / PV_SHIFT)
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
    else:
        # partials for _merge_splits_kernel: part_o [S, Hq, NUM_SPLITS, HEAD_DIM_P], part_lse [S, Hq, NUM_SPLITS]
        empty = l_i == 0.0
        out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
        lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * num_q_heads + heads) * NUM_SPLITS + split
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM_P + offs_d[None, :], out, mask=mask_g[:, None])
        tl.store(part_lse_ptr + row, lse, mask=mask_g)


_paged_decode_attention_fp8_tuned = autotune(
    _CONFIGS, key=["HEAD_DIM", "GROUP", "PAGE", "NUM_SPLITS", "BATCH_BUCKET", "F16_DOT", "STAGED", "HEADS_FIRST"],
    use_cuda_graph=True)(_paged_decode_attention_fp8_kernel)


def paged_decode_attention_fp8kv(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                 num_splits: int | None = None):
    """triton-v1.3: Fp8Pages through the kernel above; plain caches through triton-v1's paged_decode_attention."""
    return _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, f16_dot=False)


def paged_decode_attention_fp8kv_f16(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                     num_splits: int | None = None):
    """triton-v1.5: as triton-v1.3's, except that with a bf16 model the dots run in fp16: an e4m3 element becomes
    fp16 in one conversion (cvt.rn.f16x2.e4m3x2 converts two), where bf16 takes a second one from fp16; q is lowered
    by a power of two into fp16's range first and the scores raised by it after (exact). H200, 256 sequences of
    ~2,300 tokens: triton-v1.3's kernel read its pages at 37 % of the copy rate (BENCHMARKS.md "FP8 end to end")."""
    return _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits,
                       f16_dot=q.dtype == torch.bfloat16)


def paged_decode_attention_fp8kv_staged(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                        num_splits: int | None = None):
    """triton-v1.8: as triton-v1.5's, with a sequence's kv heads in neighbouring programs (HEADS_FIRST) and every
    e4m3 tile converted to fp16 where its load left it (`e4m3_to_f16`, 16-bit models on a GPU), at its own measured
    launch config (V18_CONFIG). v1.5's values up to fp32 rounding: the conversions are exact and the programs' order
    changes no sum, but the tensor cores get the tiles in another operand arrangement (4e-5 relative on the H200
    at 256 x 2,304); under the interpreter (no asm) v1.5's bit for bit."""
    return _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits,
                       f16_dot=q.dtype == torch.bfloat16, config=V18_CONFIG)


def paged_decode_attention_pdl(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                               num_splits: int | None = None):
    """triton-v1.13's decode attention: triton-v1.8's (plain or FP8 pages) inside pdl_launches(), so on sm_90+ the
    attention kernel and its split merge start while the kernel before each finishes, and wait for its writes."""
    with pdl_launches():
        return paged_decode_attention_fp8kv_staged(q, k_cache, v_cache, block_tables, context_lens, scale,
                                                   num_splits=num_splits)


def paged_decode_attention_one_warp(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                    num_splits: int | None = None):
    """triton-v1.14's decode attention: triton-v1.13's (PDL on sm_90+; plain pages through triton-v1's kernel) whose
    kernel over FP8 pages runs one warp a program on 32-token tiles (V114_CONFIG) instead of four warps on 128: the
    same kernel and arithmetic; its values are v1.8's within a few bf16 ulps (smaller tiles move the running max, so
    the softmax weights round to fp16 at other points: 4.8e-4 relative at 256 x 2,304 on an H100)."""
    with pdl_launches():
        return _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits,
                           f16_dot=q.dtype == torch.bfloat16, config=V114_CONFIG)


def paged_decode_attention_by_waves(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                    num_splits: int | None = None):
    """triton-v1.15's decode attention: triton-v1.14's (PDL on sm_90+; plain pages through triton-v1's kernel) whose
    kernel over FP8 pages runs v1.8's four-warp config instead of one warp where that fills the GPU's waves better
    (`v115_config`); each call's values are v1.14's or v1.13's, bit for bit."""
    with pdl_launches():
        return _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits,
                           f16_dot=q.dtype == torch.bfloat16, config=v115_config)


def paged_decode_attention_k_in_dot(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                    num_splits: int | None = None):
    """triton-v1.26's decode attention: triton-v1.15's whose kernel over FP8 pages converts the key tile in the q.k
    dot's operand layout instead of staging it as fp16 through shared memory (STAGE_K=False), at the config the same
    rule picks (`v126_config`). The conversions are exact and the tiles v1.15's, so its values are v1.15's within a
    few bf16 ulps (the dot's operands reach the MMA in another order)."""
    with pdl_launches():
        return _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits,
                           f16_dot=q.dtype == torch.bfloat16, config=v126_config)


def _staged_conversion(q: torch.Tensor) -> bool:
    """Whether triton-v1.8's kernel converts with `e4m3_to_f16`'s asm (STAGED): a 16-bit model on a GPU (the kernels
    that read FP8 pages need sm_89+: kv_fp8.check_fp8_device), not the interpreter."""
    return q.dtype in (torch.float16, torch.bfloat16) and q.is_cuda and not interpreting()


def _decode_fp8(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, *, f16_dot: bool,
                config=None):
    # config: triton-v1.8's kernel (HEADS_FIRST, and STAGED where the asm runs) at that launch config (v1.8's or
    # v1.14's dict, or v1.15's / v1.26's function of the launch); None: v1.3's / v1.5's
    kd, vd = page_tensors(k_cache, v_cache)
    if not isinstance(k_cache, Fp8Pages):
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits=num_splits)
    launch = DecodeLaunch.prepare(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, f16_dot=f16_dot,
                                  staged=config is not None and _staged_conversion(q),
                                  heads_first=config is not None)
    s = q.shape[0]
    if s == 0:
        return launch.out
    if interpreting():  # the interpreter's bf16 dot is wrong: fp32 there (exact for e4m3 and bf16 inputs)
        launch.run(BLOCK_N=64, num_warps=4, num_stages=1, DOT_F32=q.dtype != torch.float16 and not f16_dot)
        return launch.merge()
    if q.dtype == torch.float32 or s * block_tables.shape[1] < _TUNE_MIN_BLOCKS:
        fast(_paged_decode_attention_fp8_kernel, **launch.meta, BLOCK_N=64, DOT_F32=False, num_warps=4,
             num_stages=3)(launch.grid, *launch.args)
    elif config is not None:   # triton-v1.8 and later: a measured config (v1.15: a rule that picks one a launch)
        config = config(launch) if callable(config) else config
        fast(_paged_decode_attention_fp8_kernel, **launch.meta, DOT_F32=False, **config)(launch.grid, *launch.args)
    elif f16_dot:   # triton-v1.5: the measured config (F16_CONFIG)
        fast(_paged_decode_attention_fp8_kernel, **launch.meta, DOT_F32=False, **F16_CONFIG)(launch.grid, *launch.args)
    else:  # tuned per (meta, batch bucket), as the autotuner's key
        fast_tuned(_paged_decode_attention_fp8_tuned, _paged_decode_attention_fp8_kernel,
                   (*launch.meta.values(), launch.args[-1], q.dtype), launch.grid, *launch.args, **launch.meta,
                   DOT_F32=False)
    return launch.merge()


class DecodeLaunch:
    """One call's buffers, arguments and grid for the kernel above (bench/decode_attention_fp8.py times configs
    through it)."""

    def __init__(self, out, part_o, part_lse, args, meta, grid):
        self.out, self.part_o, self.part_lse, self.args, self.meta, self.grid = out, part_o, part_lse, args, meta, grid

    @classmethod
    def prepare(cls, q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, *, f16_dot: bool,
                staged: bool = False, heads_first: bool = False):
        kd, vd = page_tensors(k_cache, v_cache)
        check_decode_args(q, kd, vd, block_tables, context_lens)
        check_device("paged_decode_attention", q)
        kd, vd, ks, vs = kernel_page_args("paged_decode_attention", k_cache, v_cache)
        s, hq, d = q.shape
        out = torch.empty_like(q)
        if q.stride(-1) != 1:
            q = q.contiguous()
        page, hkv = kd.shape[1], kd.shape[2]
        group = hq // hkv
        splits = next_pow2(num_splits or (2 if interpreting() else choose_num_splits(max(s, 1), hkv, q.device)))
        d_p = max(16, next_pow2(d))
        part_o, part_lse = split_buffers(out, splits, d_p)
        args = (q, kd, vd, ks, vs, block_tables, context_lens, out, part_o, part_lse,
                float(scale) * math.log2(math.e),
                q.stride(0), q.stride(1), kd.stride(0), kd.stride(1), kd.stride(2), vd.stride(0), vd.stride(1),
                vd.stride(2), ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
                block_tables.stride(0), out.stride(0), out.stride(1), hq, min(next_pow2(max(s, 1)), 256))
        meta = dict(HEAD_DIM=d, HEAD_DIM_P=d_p, GROUP=group, GROUP_P=max(16, next_pow2(group)), PAGE=page,
                    NUM_SPLITS=splits, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", F16_DOT=f16_dot,
                    STAGED=staged, HEADS_FIRST=heads_first, **pdl_launch(q.device))
        return cls(out, part_o, part_lse, args, meta, (hkv, s, splits) if heads_first else (s, hkv, splits))

    def run(self, *, BLOCK_N: int, num_warps: int, num_stages: int, DOT_F32: bool = False,
            STAGE_K: bool = True) -> None:
        """The kernel with one explicit config (no autotuning); STAGE_K=False: the key tile converted in the dot's
        operand layout (the kernel's comment)."""
        _paged_decode_attention_fp8_kernel[self.grid](*self.args, **self.meta, BLOCK_N=BLOCK_N, DOT_F32=DOT_F32,
                                                      STAGE_K=STAGE_K, num_warps=num_warps, num_stages=num_stages)

    def compile(self, config: dict):
        """The kernel compiled (or found in Triton's cache) for this launch at `config`, without running it
        (occupancy.programs_per_sm_of reads its registers and shared memory)."""
        return _paged_decode_attention_fp8_kernel.warmup(*self.args, grid=self.grid, **self.meta, DOT_F32=False,
                                                         **config)

    def merge(self) -> torch.Tensor:
        if self.meta["NUM_SPLITS"] > 1:
            merge_splits(self.part_o, self.part_lse, self.out, self.meta["NUM_SPLITS"])
        return self.out
