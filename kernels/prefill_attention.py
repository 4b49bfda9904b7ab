"""Causal varlen attention of new tokens over the paged KV cache (prefill, chunked prefill, prefix-cache hits).

Sequence b has q_len_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] new tokens whose K/V are already in the cache, and
context_lens[b] tokens in total; new token i sits at position context_lens[b] - q_len_b + i and attends to cache
positions <= its own. softmax(q k^T * scale) v, softmax statistics in fp32.
"""
from __future__ import annotations

import torch

from kernels.paged import PagedAttentionError, check_lens, check_paged_args, gather_kv


def check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens) -> int:
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1 or cu_seqlens_q.is_floating_point():
        raise PagedAttentionError(f"prefill_attention: cu_seqlens_q must be integer [B+1], got "
                                  f"{tuple(cu_seqlens_q.shape)} {cu_seqlens_q.dtype}")
    b = cu_seqlens_q.numel() - 1
    check_paged_args("prefill_attention", q, k_cache, v_cache, block_tables, b)
    check_lens("prefill_attention", context_lens, b)
    return b


def prefill_attention_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    # q: [T, Hq, D]; returns [T, Hq, D]. Matmuls in q.dtype, softmax in fp32 (HF eager attention).
    b = check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    out = torch.zeros_like(q)
    cu = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    if cu[-1] != q.shape[0]:
        raise PagedAttentionError(f"prefill_attention: cu_seqlens_q[-1]={cu[-1]} but q has {q.shape[0]} tokens")
    hq, hkv = q.shape[1], k_cache.shape[2]
    g = hq // hkv
    for i in range(b):
        s, e, length = cu[i], cu[i + 1], ctx[i]
        n = e - s
        if n == 0:
            continue
        if n < 0 or n > length:
            raise PagedAttentionError(f"prefill_attention: sequence {i} has {n} new tokens but context length {length}")
        k = gather_kv(k_cache, block_tables[i], length).to(q.dtype).repeat_interleave(g, dim=1).transpose(0, 1)
        v = gather_kv(v_cache, block_tables[i], length).to(q.dtype).repeat_interleave(g, dim=1).transpose(0, 1)
        qb = q[s:e].transpose(0, 1)  # [Hq, n, D]
        scores = torch.matmul(qb, k.transpose(1, 2)) * scale  # [Hq, n, L]
        qpos = torch.arange(length - n, length, device=q.device)
        kpos = torch.arange(length, device=q.device)
        scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
        p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[s:e] = torch.matmul(p, v).transpose(0, 1)
    return out
