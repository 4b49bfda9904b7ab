"""Decode attention over FP8 KV pages on fp8 tensor cores: the products written transposed, so that the tokens are
the dots' M dimension and the e4m3 pages enter them as they are stored (no conversion, no fp16 copy in shared memory).

    S^T [BLOCK_N, GROUP_P] = K8 [BLOCK_N, D] . q8^T        q rounded to e4m3 per head, scale max|q| / 448
    O^T [D, GROUP_P]      += V8^T [D, BLOCK_N] . P8^T      P8 = e4m3(p_j * t_j * c), c a power of two per tile

A key's scale s_j multiplies its row of S^T, a query head's scale its column; a value's scale t_j goes into its row
of the weights before they are rounded, with c = 2^floor(log2(448 / max_j t_j)) so that the tile's largest weight
stays at or below e4m3's 448 and the rest keep its relative precision; when c changes from one tile to the next the
accumulator is rescaled with the softmax's alpha (both are per column). The normalizer sums the unrounded weights.
The query heads of a kv head are padded to GROUP_P >= 8 (the MMA's N), not 16 as in the row-major kernels.

Why (BENCHMARKS.md "FP8 decode attention"): the row-major kernels keep 16 query rows in Ampere-style fp16 MMAs and must
convert every e4m3 element, through registers and shared memory: Nsight Compute found triton-v1.5 held to two programs
an SM by its registers and triton-v1.8 waiting on shared memory, both reading FP8 pages at ~2.3 TB/s against the bf16
kernel's 4.4. Compiled for sm_90 (Triton 3.9, on the CPU machine), this kernel's inner loop is fp8 warpgroup MMAs
(QGMMA) in 844 instructions a warp per 128-token tile at 94 registers and 51 KB of shared memory (four programs an
SM), against v1.8's 709 at 144 registers and 75 KB (three): more instructions (the value tile is transposed into
shared memory by byte stores, 136 STS.U8), no conversions, no fp16 copies. Its numerics (q and the weights
in e4m3) were measured on CPU as moving a model's answers about as far as bf16 compute on the same pages
(bench/kv_fp8_accuracy.py --qp). In no kernel set, nor meant for one: on the H200 it is no faster than triton-v1.8
(552 against 543 us at 256 x 2,304 tokens, best configs; bench/decode_attention_fp8.py), and the correctness gate
fails it (its error is 10-18x the torch reference's in bf16), while an allowance for e4m3 q and weights would leave
the gate catching a softmax scale 15 % off by as little as 2 % (bench/e4m3_attention_gate.py; BENCHMARKS.md "FP8
decode attention"). Kept as the measured answer to "would fp8 tensor cores help decode attention".
"""
from __future__ import annotations

import torch

from sits.kernels.fp8_gemm import round_e4m3
from sits.kernels.kv_fp8 import FP8_MAX, Fp8Pages
from sits.kernels.paged_decode_attention_fp8 import DecodeLaunch
from sits.kernels.triton_env import fast, interpreting, next_pow2, tl, triton

E4M3_MAX = tl.constexpr(FP8_MAX)   # 448: e4m3fn's largest finite value
# the launch config until one is measured: the transposed tile of 128 tokens a warpgroup's MMA takes at once
CONFIG = dict(BLOCK_N=128, num_warps=4, num_stages=2)


@triton.jit
def _paged_decode_attention_fp8_dots_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt_ptr, ctx_ptr, o_ptr, part_o_ptr, part_lse_ptr,
    qk_scale,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh, stride_bt,
    stride_os, stride_oh, num_q_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    # grid: (num_kv_heads, num_seqs, NUM_SPLITS): a sequence's kv heads side by side (triton-v1.8's HEADS_FIRST)
    kv_head = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
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
                mask=mask_g[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    q_amax = tl.max(tl.abs(q), 1)
    q_scale = tl.where(q_amax > 0.0, q_amax / E4M3_MAX, 1.0)                       # [GROUP_P]
    q8 = round_e4m3(q / q_scale[:, None]).to(tl.float8e4nv)   # rounded as the GPU rounds, on every backend
    col_scale = q_scale * qk_scale                                              # log2 domain

    m_i = tl.full([GROUP_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_P], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM_P, GROUP_P], dtype=tl.float32)                     # O^T, raised by c
    c_i = tl.full([], 1.0, dtype=tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + blk[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        k_scale = tl.load(k_scale_ptr + blk * stride_ksb + slot * stride_kss + kv_head * stride_ksh, mask=mask_n,
                          other=0.0)
        s = tl.dot(k, tl.trans(q8)) * k_scale[:, None] * col_scale[None, :]     # [BLOCK_N, GROUP_P]
        s = tl.where(mask_n[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.math.exp2(s - m_new[None, :])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        v = tl.load(v_cache_ptr + blk[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        v_scale = tl.load(v_scale_ptr + blk * stride_vsb + slot * stride_vss + kv_head * stride_vsh, mask=mask_n,
                          other=0.0)
        t_max = tl.max(v_scale, 0)
        c_new = tl.math.exp2(tl.floor(-tl.math.log2(tl.where(t_max > 0.0, t_max, 1.0) / E4M3_MAX)))
        p8 = round_e4m3(p * (v_scale * c_new)[:, None]).to(tl.float8e4nv)
        acc = tl.dot(tl.trans(v), p8, acc * (alpha * (c_new / c_i))[None, :])
        m_i = m_new
        c_i = c_new
    acc = acc / c_i
    if NUM_SPLITS == 1:
        out = acc / l_i[None, :]
        tl.store(o_ptr + seq * stride_os + heads[None, :] * stride_oh + offs_d[:, None],
                 out.to(o_ptr.dtype.element_ty), mask=mask_g[None, :] & mask_d[:, None])
    else:
        # partials for _merge_splits_kernel: part_o [S, Hq, NUM_SPLITS, HEAD_DIM_P], part_lse [S, Hq, NUM_SPLITS]
        empty = l_i == 0.0
        out = tl.where(empty[None, :], 0.0, acc / tl.where(empty, 1.0, l_i)[None, :])
        lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * num_q_heads + heads) * NUM_SPLITS + split
        tl.store(part_o_ptr + row[None, :] * HEAD_DIM_P + offs_d[:, None], out, mask=mask_g[None, :])
        tl.store(part_lse_ptr + row, lse, mask=mask_g)


def paged_decode_attention_fp8_dots(q, k_cache, v_cache, block_tables, context_lens, scale, *,
                                    num_splits: int | None = None, block_n: int | None = None,
                                    num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """Decode attention over Fp8Pages with the kernel above (the module docstring); the launch config may be given
    (bench/decode_attention_fp8.py's sweep). Fp8Pages only, a 16-bit or fp32 q."""
    if not isinstance(k_cache, Fp8Pages) or not isinstance(v_cache, Fp8Pages):
        raise TypeError("paged_decode_attention_fp8_dots reads FP8 pages (Fp8Pages) only")
    # the same checks, buffers, arguments and grid as triton-v1.8's kernel (a sequence's kv heads side by side); this
    # kernel takes them all but the batch bucket, which only the other's autotuner keys on
    launch = DecodeLaunch.prepare(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, f16_dot=False,
                                  heads_first=True)
    if q.shape[0] == 0:
        return launch.out
    m = launch.meta
    cfg = dict(CONFIG, **{k: v for k, v in (("BLOCK_N", block_n), ("num_warps", num_warps),
                                             ("num_stages", num_stages)) if v is not None})
    if interpreting():
        cfg = dict(cfg, BLOCK_N=min(cfg["BLOCK_N"], 64), num_stages=1)
    fast(_paged_decode_attention_fp8_dots_kernel, HEAD_DIM=m["HEAD_DIM"], HEAD_DIM_P=m["HEAD_DIM_P"], GROUP=m["GROUP"],
         GROUP_P=max(8, next_pow2(m["GROUP"])), PAGE=m["PAGE"], NUM_SPLITS=m["NUM_SPLITS"], **cfg)(
        launch.grid, *launch.args[:-1])
    return launch.merge()
