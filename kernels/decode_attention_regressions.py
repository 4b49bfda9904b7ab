"""Two decode-attention kernels that a real release could ship by mistake: the example regressions of kernel sets
triton-v1-unsplit ("slow") and triton-v1-floor-pages ("wrong") in kernels/sets.py. Same signature and math as
kernels/paged_decode_attention.py (triton-v1), which they replace:

    out[s, h] = softmax(q[s, h] . K_s^T * scale) V_s over the first context_lens[s] cached tokens of sequence s

- `paged_decode_attention_per_seq` (slow, correct): one program per SEQUENCE that walks its kv heads and its whole
  context one tile of BLOCK_N=16 tokens after the other. No split over the context (flash-decoding's point) and no
  program per kv head: at batch 16 only 16 programs run, ~1/8 of an H200's 132 SMs, each doing
  num_kv_heads * ctx / 16 dependent steps. The same fp32 online softmax as triton-v1, so the same answers.
- `paged_decode_attention_floor_pages` (wrong, as fast): triton-v1's split-KV kernel with the classic floor-for-ceil
  bug in the context bound: it attends over `ctx // PAGE * PAGE` tokens (whole pages) once a sequence has more than
  one page, so the tokens of its last, partly filled page -- the most recent ones, the current token's own key
  included -- are dropped. Exact for ctx <= PAGE or a multiple of PAGE, off everywhere else.
"""
from __future__ import annotations

import math

import torch

from sits.kernels.paged_decode_attention import check_decode_args, choose_num_splits, merge_splits
from sits.kernels.triton_env import check_device, fast, interpreting, next_pow2, tl, triton


@triton.jit
def _paged_decode_attention_per_seq_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, ctx_ptr, o_ptr, qk_scale,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    stride_os, stride_oh, num_kv_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # grid: (num_seqs,): every kv head and every tile of the context in this one program
    seq = tl.program_id(0).to(tl.int64)
    ctx = tl.load(ctx_ptr + seq)
    offs_g = tl.arange(0, GROUP_P)
    mask_g = offs_g < GROUP
    offs_d = tl.arange(0, HEAD_DIM_P)
    mask_d = offs_d < HEAD_DIM
    bt_row = bt_ptr + seq * stride_bt
    for kv_head in range(0, num_kv_heads):
        heads = kv_head * GROUP + offs_g
        q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_g[:, None] & mask_d[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        m_i = tl.full([GROUP_P], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_P], dtype=tl.float32)
        acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
        for start_n in range(0, ctx, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < ctx
            blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
            slot = (offs_n % PAGE)[:, None]
            kv_mask = mask_n[:, None] & mask_d[None, :]
            k = tl.load(k_cache_ptr + blk[:, None] * stride_kb + slot * stride_ks + kv_head * stride_kh
                        + offs_d[None, :], mask=kv_mask, other=0.0)
            if DOT_F32:
                k = k.to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale   # [GROUP_P, BLOCK_N], log2
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + blk[:, None] * stride_vb + slot * stride_vs + kv_head * stride_vh
                        + offs_d[None, :], mask=kv_mask, other=0.0)
            p = p.to(v.dtype)
            if DOT_F32:
                p = p.to(tl.float32)
                v = v.to(tl.float32)
            acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])


@triton.jit
def _paged_decode_attention_floor_pages_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, ctx_ptr, part_o_ptr, part_lse_ptr, qk_scale,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt, num_q_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # grid: (num_seqs, num_kv_heads, NUM_SPLITS), as triton-v1; partials merged by _merge_splits_kernel
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    full = (ctx // PAGE) * PAGE            # THE BUG: whole pages only (should be ctx); a first page is kept
    ctx = tl.where(full > 0, full, ctx)
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
    m_i = tl.full([GROUP_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_P], dtype=tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
    bt_row = bt_ptr + seq * stride_bt
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
        slot = (offs_n % PAGE)[:, None]
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + blk[:, None] * stride_kb + slot * stride_ks + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + blk[:, None] * stride_vb + slot * stride_vs + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        p = p.to(v.dtype)
        if DOT_F32:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    empty = l_i == 0.0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
    lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    row = (seq * num_q_heads + heads) * NUM_SPLITS + split
    tl.store(part_o_ptr + row[:, None] * HEAD_DIM_P + offs_d[None, :], out, mask=mask_g[:, None])
    tl.store(part_lse_ptr + row, lse, mask=mask_g)


def _common(q, k_cache, v_cache, block_tables, context_lens):
    check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
    check_device("paged_decode_attention", q)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged_decode_attention: caches must be contiguous along head_dim")
    s, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    meta = dict(HEAD_DIM=d, HEAD_DIM_P=max(16, next_pow2(d)), GROUP=group, GROUP_P=max(16, next_pow2(group)),
                PAGE=page, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    # the interpreter computes dots in fp32 (as triton-v1 does there, except for fp16)
    dot_f32 = interpreting() and q.dtype != torch.float16
    return q, s, hq, hkv, meta, dot_f32


def paged_decode_attention_per_seq(q, k_cache, v_cache, block_tables, context_lens, scale):
    """triton-v1's decode attention with one program per sequence and 16-token tiles (module docstring): the same
    answers, far fewer programs in flight (kernel set triton-v1-unsplit)."""
    # q: [S, Hq, D]; k_cache/v_cache: [NB, PAGE, Hkv, D]; block_tables: [S, max_blocks]; context_lens: [S] (>= 1)
    q, s, hq, hkv, meta, dot_f32 = _common(q, k_cache, v_cache, block_tables, context_lens)
    out = torch.empty_like(q)
    if s == 0:
        return out
    args = (q, k_cache, v_cache, block_tables, context_lens, out, float(scale) * math.log2(math.e),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
            v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1), hkv)
    if interpreting():
        _paged_decode_attention_per_seq_kernel[(s,)](*args, **meta, BLOCK_N=16, DOT_F32=dot_f32, num_warps=4,
                                                     num_stages=1)
    else:
        fast(_paged_decode_attention_per_seq_kernel, **meta, BLOCK_N=16, DOT_F32=False, num_warps=4,
             num_stages=2)((s,), *args)
    return out


def paged_decode_attention_floor_pages(q, k_cache, v_cache, block_tables, context_lens, scale):
    """triton-v1's split-KV decode attention with the whole-pages bug (module docstring): as fast, and it drops the
    tokens of each sequence's last, partly filled page (kernel set triton-v1-floor-pages)."""
    q, s, hq, hkv, meta, dot_f32 = _common(q, k_cache, v_cache, block_tables, context_lens)
    out = torch.empty_like(q)
    if s == 0:
        return out
    splits = 2 if interpreting() else next_pow2(max(2, choose_num_splits(s, hkv, q.device)))
    d_p = meta["HEAD_DIM_P"]
    part_o = torch.empty(s, hq, splits, d_p, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(s, hq, splits, dtype=torch.float32, device=q.device)
    args = (q, k_cache, v_cache, block_tables, context_lens, part_o, part_lse, float(scale) * math.log2(math.e),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
            v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), hq)
    if interpreting():
        _paged_decode_attention_floor_pages_kernel[(s, hkv, splits)](*args, **meta, BLOCK_N=64, NUM_SPLITS=splits,
                                                                     DOT_F32=dot_f32, num_warps=4, num_stages=1)
    else:
        fast(_paged_decode_attention_floor_pages_kernel, **meta, BLOCK_N=64, NUM_SPLITS=splits, DOT_F32=False,
             num_warps=4, num_stages=3)((s, hkv, splits), *args)
    merge_splits(part_o, part_lse, out, splits)
    return out
