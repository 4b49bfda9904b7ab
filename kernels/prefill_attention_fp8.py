"""Prefill attention over FP8 KV pages (kernel set triton-v1.3): prefill_attention.py's pointer-gather varlen flash
kernel (same schedule, query tiles and causal bounds) reading e4m3 pages and their per-(token, kv head) scales
(kernels/kv_fp8.py), dequantized in the kernel as paged_decode_attention_fp8.py does: a key's scale multiplies its
column of q.k^T, a value's scale (raised by 2^8, kept out of fp16's subnormals) its column of the softmax weights,
and the e4m3 tiles enter the dots converted to q's dtype (exact). The reference is prefill_attention_ref on the dequantized pages (torch set). Plain pages go to
triton-v1.2's prefill (v1.1's TMA kernel where it applies).
"""
from __future__ import annotations

import math

import torch

from sits.kernels.kv_fp8 import Fp8Pages, kernel_page_args, page_tensors
from sits.kernels.linear import fp16_shift
from sits.kernels.paged import check_prefill_args
from sits.kernels.prefill_attention import (_TUNE_MIN_TOKENS, _key_bounds, _q_tile, _query_tile,
                                            prefill_attention_tma)
from sits.kernels.paged_decode_attention_fp8 import PV_SHIFT
from sits.kernels.triton_env import autotune, check_device, interpreting, next_pow2, tl, triton


@triton.jit
def _attn_tile_fp8(acc, l_i, m_i, q, start_n, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt_row, kv_head,
                   qpos, ctx, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                   stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh,
                   offs_d, mask_d, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    mask_n = offs_n < ctx
    blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
    slot = offs_n % PAGE
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_cache_ptr + blk[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh
                + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    k_scale = tl.load(k_scale_ptr + blk * stride_ksb + slot * stride_kss + kv_head * stride_ksh, mask=mask_n,
                      other=0.0)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (k_scale * qk_scale)[None, :]  # log2 domain
    if MASK:
        qk = tl.where((offs_n[None, :] <= qpos[:, None]) & mask_n[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + blk[:, None] * stride_vb + slot[:, None] * stride_vs + kv_head * stride_vh
                + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
    v_scale = tl.load(v_scale_ptr + blk * stride_vsb + slot * stride_vss + kv_head * stride_vsh, mask=mask_n,
                      other=0.0)
    acc = tl.dot((p * (v_scale * PV_SHIFT)[None, :]).to(q.dtype), v, acc * alpha[:, None],
                 input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def q_in_f16(q, qk_scale):
    """A bf16 model's query tile for fp16 dots (triton-v1.5): (q lowered by a power of two below 2^14 -- exact -- in
    fp16, qk_scale raised by the same power), so the scores come out as they would from q itself."""
    qf = q.to(tl.float32)
    q_shift = fp16_shift(tl.max(tl.max(tl.abs(qf), 1), 0))
    return (qf / q_shift).to(tl.float16), qk_scale * q_shift


@triton.jit
def _prefill_attention_fp8_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, bt_ptr, cu_q_ptr, ctx_ptr, o_ptr, qk_scale,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh, stride_bt,
    stride_ot, stride_oh, num_seqs, TOKENS_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    F16_DOT: tl.constexpr,
):
    # the grid (T // BLOCK_M + B, Hq) and its tile order: _query_tile
    seq, head, q_start, q_len, m0 = _query_tile(cu_q_ptr, num_seqs, BLOCK_M)
    if m0 < q_len:
        ctx = tl.load(ctx_ptr + seq)
        kv_head = head // GROUP
        q, rows, offs_m, mask, offs_d, mask_d = _q_tile(q_ptr, q_start, q_len, m0, head, stride_qt, stride_qh,
                                                        HEAD_DIM, HEAD_DIM_P, BLOCK_M, DOT_F32)
        qpos = ctx - q_len + offs_m
        if F16_DOT:   # (triton-v1.5) as paged_decode_attention_fp8.py: q in fp16 below 2^14, the scores raised back
            q, qk_scale = q_in_f16(q, qk_scale)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
        bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
        hi, full_hi = _key_bounds(ctx, q_len, m0, BLOCK_M, BLOCK_N)
        for start_n in range(0, full_hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile_fp8(acc, l_i, m_i, q, start_n, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                                           v_scale_ptr, bt_row, kv_head, qpos, ctx, qk_scale, stride_kb, stride_ks,
                                           stride_kh, stride_vb, stride_vs, stride_vh, stride_ksb, stride_kss,
                                           stride_ksh, stride_vsb, stride_vss, stride_vsh, offs_d, mask_d, PAGE,
                                           BLOCK_N, False, DOT_PRECISION)
        for start_n in range(full_hi, hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile_fp8(acc, l_i, m_i, q, start_n, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                                           v_scale_ptr, bt_row, kv_head, qpos, ctx, qk_scale, stride_kb, stride_ks,
                                           stride_kh, stride_vb, stride_vs, stride_vh, stride_ksb, stride_kss,
                                           stride_ksh, stride_vsb, stride_vss, stride_vsh, offs_d, mask_d, PAGE,
                                           BLOCK_N, True, DOT_PRECISION)
        out = acc / (l_i * PV_SHIFT)[:, None]
        tl.store(o_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask)


# the candidates: the two fastest of the plain kernel's seven (_CONFIGS) over FP8 pages on the H200, llama3-8b's heads
# at 1,024 and 2,048 tokens (bench/tuning_winners.py, 2026-12-05): BLOCK_M 64 / BLOCK_N 128 won both by 1.45-1.51x over
# the next; timing all seven took 23-25 s of a 79-83 s cold fp8 warm-up
_FP8_CONFIGS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
                triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4)]
_prefill_attention_fp8_tuned = autotune(_FP8_CONFIGS, key=["TOKENS_BUCKET", "HEAD_DIM", "GROUP", "PAGE", "F16_DOT"])(
    _prefill_attention_fp8_kernel)


def prefill_attention_fp8kv(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.3: Fp8Pages through the kernel above; plain caches through triton-v1.2's prefill_attention_tma."""
    return _prefill_fp8(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, f16_dot=False)


def prefill_attention_fp8kv_f16(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.5: as triton-v1.3's, with a bf16 model's dots in fp16 (one conversion per e4m3 pair; q lowered by a
    power of two into fp16's range, the scores raised by it): paged_decode_attention_fp8.py's
    `paged_decode_attention_fp8kv_f16`."""
    return _prefill_fp8(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                        f16_dot=q.dtype == torch.bfloat16)


def fp8_prefill_inputs(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens):
    """A prefill over FP8 pages, checked for the kernels: (q with unit stride along head_dim, k data, v data, k
    scales, v scales, out [T, Hq, D] to write, the number of sequences)."""
    kd, vd = page_tensors(k_cache, v_cache)
    b = check_prefill_args(q, kd, vd, block_tables, cu_seqlens_q, context_lens)
    check_device("prefill_attention", q)
    kd, vd, ks, vs = kernel_page_args("prefill_attention", k_cache, v_cache)
    return (q if q.stride(-1) == 1 else q.contiguous()), kd, vd, ks, vs, torch.empty_like(q), b


def _prefill_fp8(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, *, f16_dot: bool):
    kd, vd = page_tensors(k_cache, v_cache)
    if not isinstance(k_cache, Fp8Pages):
        return prefill_attention_tma(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
    q, kd, vd, ks, vs, out, b = fp8_prefill_inputs(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    t, hq, d = q.shape
    if t == 0 or b == 0:
        return out
    page, hkv = kd.shape[1], kd.shape[2]
    args = (q, kd, vd, ks, vs, block_tables, cu_seqlens_q, context_lens, out, float(scale) * math.log2(math.e),
            q.stride(0), q.stride(1), kd.stride(0), kd.stride(1), kd.stride(2), vd.stride(0), vd.stride(1),
            vd.stride(2), ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
            block_tables.stride(0), out.stride(0), out.stride(1), b, min(next_pow2(t), 8192))
    meta = dict(HEAD_DIM=d, HEAD_DIM_P=max(16, next_pow2(d)), GROUP=hq // hkv, PAGE=page,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", F16_DOT=f16_dot)
    if interpreting():  # few, large tiles; fp32 dots (the interpreter's bf16 dot is wrong; exact for these inputs)
        bm = 64 if t > 32 else 32
        _prefill_attention_fp8_kernel[(t // bm + b, hq)](*args, **meta, BLOCK_M=bm, BLOCK_N=64,
                                                         DOT_F32=q.dtype != torch.float16 and not f16_dot)
    elif q.dtype == torch.float32 or t < _TUNE_MIN_TOKENS:
        bm, bn = (32, 32) if q.dtype == torch.float32 else (64, 64)
        _prefill_attention_fp8_kernel[(t // bm + b, hq)](*args, **meta, BLOCK_M=bm, BLOCK_N=bn, DOT_F32=False,
                                                         num_warps=4, num_stages=2)
    else:
        grid = lambda m: (t // m["BLOCK_M"] + b, hq)  # noqa: E731
        _prefill_attention_fp8_tuned[grid](*args, **meta, DOT_F32=False)
    return out
