"""Decode attention: one query token per sequence over its paged KV cache.

out[s, h] = softmax(q[s, h] . K_s^T * scale) V_s over the first context_lens[s] cached tokens of sequence s,
softmax statistics in fp32. Flash-decoding (Dao et al. 2023): the context is split into NUM_SPLITS ranges handled by
separate programs, each producing a partial output and its log-sum-exp, merged by a second small kernel -- so one long
sequence still fills the GPU. One program serves all GROUP query heads that share a kv head, so every K/V tile is
loaded once for the group.
"""
from __future__ import annotations

import math

import torch

from sits.kernels.kv_fp8 import page_tensors, take_blocks
from sits.kernels.paged import check_lens, check_paged_args, softmax_dtype
from sits.kernels.triton_env import (autotune, check_device, fast, fast_tuned, gdc_launch_dependents, gdc_wait,
                                     interpreting, next_pow2, num_sms, pdl_launch, tl, triton)



@triton.jit
def _paged_decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, ctx_ptr, o_ptr, part_o_ptr, part_lse_ptr, qk_scale,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    stride_os, stride_oh, num_q_heads, BATCH_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False,
):
    # grid: (num_seqs, num_kv_heads, NUM_SPLITS)
    if PDL:   # programmatic dependent launch (triton-v1.13): every read after the earlier kernel's writes land
        gdc_wait()
        gdc_launch_dependents()   # the next kernel may start now; it waits for this one's writes likewise
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
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [GROUP_P, BLOCK_N], log2 domain
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
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask_g[:, None] & mask_d[None, :])
    else:
        # partials: part_o [S, Hq, NUM_SPLITS, HEAD_DIM_P] normalized, part_lse [S, Hq, NUM_SPLITS] (log2 domain)
        empty = l_i == 0.0
        out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
        lse = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * num_q_heads + heads) * NUM_SPLITS + split
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM_P + offs_d[None, :], out, mask=mask_g[:, None])
        tl.store(part_lse_ptr + row, lse, mask=mask_g)


@triton.jit
def _merge_splits_kernel(part_o_ptr, part_lse_ptr, o_ptr, stride_os, stride_oh, num_q_heads,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         PDL: tl.constexpr = False):
    # grid: (num_seqs, num_q_heads); out = sum_j w_j o_j / sum_j w_j with w_j = 2^(lse_j - max lse)
    if PDL:   # programmatic dependent launch (triton-v1.13): every read after the earlier kernel's writes land
        gdc_wait()
        gdc_launch_dependents()   # the next kernel may start now; it waits for this one's writes likewise
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM_P)
    row = (seq * num_q_heads + head) * NUM_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + row)
    w = tl.math.exp2(lse - tl.max(lse, 0))
    o = tl.load(part_o_ptr + row[:, None] * HEAD_DIM_P + offs_d[None, :])
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(o_ptr + seq * stride_os + head * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


_CONFIGS = [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn, w, st in ((64, 4, 2), (64, 4, 4), (128, 4, 3), (32, 4, 4), (64, 8, 3))]
# candidates timed inside a CUDA graph: at small batch the launch overhead would otherwise pick the config
_paged_decode_attention_tuned = autotune(
    _CONFIGS, key=["HEAD_DIM", "GROUP", "PAGE", "NUM_SPLITS", "BATCH_BUCKET"],
    use_cuda_graph=True)(_paged_decode_attention_kernel)
_TUNE_MIN_BLOCKS = 512  # smaller problems (s * max_blocks) run a fixed config: tuning would cost more than it saves


def check_decode_args(q, k_cache, v_cache, block_tables, context_lens) -> None:
    check_paged_args("paged_decode_attention", q, k_cache, v_cache, block_tables, q.shape[0] if q.dim() == 3 else -1)
    check_lens("paged_decode_attention", context_lens, q.shape[0])


def choose_num_splits(num_seqs: int, num_kv_heads: int, device) -> int:
    """Enough programs to give every SM ~4 of them, at most 64 splits (a power of two)."""
    work = num_seqs * num_kv_heads
    return min(64, next_pow2(triton.cdiv(4 * num_sms(device), max(1, work))))


def split_buffers(out: torch.Tensor, splits: int, d_p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The partials _merge_splits_kernel reads, for `out` [S, Hq, D] in `splits` KV splits: part_o
    [S, Hq, splits, d_p] and part_lse [S, Hq, splits] fp32 (with one split, `out` twice: unused)."""
    if splits == 1:
        return out, out
    s, hq = out.shape[0], out.shape[1]
    return (torch.empty(s, hq, splits, d_p, dtype=torch.float32, device=out.device),
            torch.empty(s, hq, splits, dtype=torch.float32, device=out.device))


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, *, num_splits: int | None = None):
    # q: [S, Hq, D]; k_cache/v_cache: [NB, PAGE, Hkv, D]; block_tables: [S, max_blocks]; context_lens: [S] (>= 1)
    check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
    check_device("paged_decode_attention", q)
    s, hq, d = q.shape
    out = torch.empty_like(q)
    if s == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged_decode_attention: caches must be contiguous along head_dim")
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    interp = interpreting()
    splits = num_splits or (2 if interp else choose_num_splits(s, hkv, q.device))
    splits = next_pow2(splits)
    d_p = max(16, next_pow2(d))
    part_o, part_lse = split_buffers(out, splits, d_p)
    args = (q, k_cache, v_cache, block_tables, context_lens, out, part_o, part_lse, float(scale) * math.log2(math.e),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
            v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1), hq,
            min(next_pow2(s), 256))
    meta = dict(HEAD_DIM=d, HEAD_DIM_P=d_p, GROUP=group, GROUP_P=max(16, next_pow2(group)), PAGE=page,
                NUM_SPLITS=splits, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                **pdl_launch(q.device))
    if interp:
        _paged_decode_attention_kernel[(s, hkv, splits)](*args, **meta, BLOCK_N=64,
                                                         DOT_F32=q.dtype != torch.float16, num_warps=4, num_stages=1)
    elif q.dtype == torch.float32 or s * block_tables.shape[1] < _TUNE_MIN_BLOCKS:
        fast(_paged_decode_attention_kernel, **meta, BLOCK_N=64, DOT_F32=False, num_warps=4, num_stages=3)(
            (s, hkv, splits), *args)
    else:  # tuned per (meta, batch bucket), as the autotuner's key
        fast_tuned(_paged_decode_attention_tuned, _paged_decode_attention_kernel,
                   (*meta.values(), args[-1], q.dtype, k_cache.dtype), (s, hkv, splits), *args, **meta, DOT_F32=False)
    if splits > 1:
        merge_splits(part_o, part_lse, out, splits)
    return out


def merge_splits(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, splits: int) -> None:
    """out [S, Hq, D] from the `splits` partials of a split-KV decode (split_buffers)."""
    s, hq, d = out.shape
    fast(_merge_splits_kernel, HEAD_DIM=d, HEAD_DIM_P=part_o.shape[-1], NUM_SPLITS=splits, num_warps=4,
         **pdl_launch(out.device))((s, hq), part_o, part_lse, out, out.stride(0), out.stride(1), hq)


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale):
    # q: [S, Hq, D]; k_cache/v_cache: [NB, BS, Hkv, D] (or Fp8Pages, dequantized to q's dtype as gathered);
    # block_tables: [S, max_blocks]; context_lens: [S]
    kd, vd = page_tensors(k_cache, v_cache)
    check_decode_args(q, kd, vd, block_tables, context_lens)
    s, hq, d = q.shape
    if s == 0:
        return torch.empty_like(q)
    bs, hkv = kd.shape[1], kd.shape[2]
    lens = context_lens.long()
    max_len = int(lens.max())
    nb = -(-max_len // bs)
    bt = block_tables[:, :nb].long().clamp(min=0)  # unused table entries may hold padding such as -1
    k = take_blocks(k_cache, bt, q.dtype).reshape(s, nb * bs, hkv, d)  # [S, L, Hkv, D]
    v = take_blocks(v_cache, bt, q.dtype).reshape(s, nb * bs, hkv, d)
    qg = q.view(s, hkv, hq // hkv, d)
    scores = torch.einsum("skgd,slkd->skgl", qg, k) * scale  # [S, Hkv, G, L]
    pad = torch.arange(nb * bs, device=q.device)[None, :] >= lens[:, None]  # [S, L]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=softmax_dtype(q.dtype)).to(q.dtype)
    return torch.einsum("skgl,slkd->skgd", p, v).reshape(s, hq, d)


def paged_decode_attention_per_head_ref(q, k_cache, v_cache, block_tables, context_lens, scale):
    """paged_decode_attention_ref computed one (sequence, query head) at a time over that sequence's own blocks:
    same math and dtypes, unfused (a gather and two matrix-vector products per head). Correct and slower (kernel
    set torch-slow-attn)."""
    check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
    s, hq, d = q.shape
    out = torch.empty_like(q)
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    for i, length in enumerate(context_lens.tolist()):
        blocks = block_tables[i, :-(-length // bs)].long()
        for h in range(hq):
            k = k_cache[blocks, :, h // g].reshape(-1, d)[:length].to(q.dtype)  # [L, D]
            v = v_cache[blocks, :, h // g].reshape(-1, d)[:length].to(q.dtype)
            p = torch.softmax(torch.mv(k, q[i, h]) * scale, dim=-1, dtype=softmax_dtype(q.dtype)).to(q.dtype)
            out[i, h] = torch.mv(v.t(), p)
    return out
