"""PyTorch references of `prefill_attention` (kernels/prefill_attention.py has the contract): the batched one of
kernel set `torch`, and the per-head, one-row-at-a-time one of the example slow release `torch-slow-attn`."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from sits.kernels.kv_fp8 import gather_tokens, page_tensors
from sits.kernels.paged import PagedAttentionError, check_prefill_args, gather_kv, softmax_dtype


def _sequences(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens) -> Iterator[tuple[int, int, int, int]]:
    """(sequence, first new token's row in q, number of new tokens, context length) for each sequence with new
    tokens, after the argument checks both references share."""
    b = check_prefill_args(q, *page_tensors(k_cache, v_cache), block_tables, cu_seqlens_q, context_lens)
    cu = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    if cu[-1] != q.shape[0]:
        raise PagedAttentionError(f"prefill_attention: cu_seqlens_q[-1]={cu[-1]} but q has {q.shape[0]} tokens")
    for i in range(b):
        s, n, length = cu[i], cu[i + 1] - cu[i], ctx[i]
        if n == 0:
            continue
        if n < 0 or n > length:
            raise PagedAttentionError(f"prefill_attention: sequence {i} has {n} new tokens but context length {length}")
        yield i, s, n, length


def prefill_attention_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    # q: [T, Hq, D]; returns [T, Hq, D]. Matmuls in q.dtype, softmax in fp32 (HF eager attention). k_cache/v_cache:
    # [NB, BS, Hkv, D], or Fp8Pages dequantized to q's dtype as gathered
    out = torch.zeros_like(q)
    g = q.shape[1] // page_tensors(k_cache, v_cache)[0].shape[2]
    for i, s, n, length in _sequences(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens):
        k = gather_tokens(k_cache, block_tables[i], length, q.dtype).repeat_interleave(g, dim=1).transpose(0, 1)
        v = gather_tokens(v_cache, block_tables[i], length, q.dtype).repeat_interleave(g, dim=1).transpose(0, 1)
        qb = q[s:s + n].transpose(0, 1)  # [Hq, n, D]
        scores = torch.matmul(qb, k.transpose(1, 2)) * scale  # [Hq, n, L]
        qpos = torch.arange(length - n, length, device=q.device)
        kpos = torch.arange(length, device=q.device)
        scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
        p = torch.softmax(scores, dim=-1, dtype=softmax_dtype(q.dtype)).to(q.dtype)
        out[s:s + n] = torch.matmul(p, v).transpose(0, 1)
    return out


def prefill_attention_per_head_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """prefill_attention_ref computed one query row at a time, per (sequence, head): the same math and dtypes, but
    unfused -- the K/V of the head gathered again for every head, one vector-matrix product and one softmax per new
    token instead of one batched matmul per sequence. Correct and slower (kernel set torch-slow-attn, the example
    of a slow release)."""
    out = torch.zeros_like(q)
    hq = q.shape[1]
    g = hq // k_cache.shape[2]
    for i, s, n, length in _sequences(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens):
        for h in range(hq):
            k = gather_kv(k_cache, block_tables[i], length)[:, h // g].to(q.dtype)  # [L, D]
            v = gather_kv(v_cache, block_tables[i], length)[:, h // g].to(q.dtype)
            for t in range(n):
                visible = length - n + t + 1   # causal: keys up to this token's own position
                scores = torch.mv(k[:visible], q[s + t, h]) * scale
                p = torch.softmax(scores, dim=-1, dtype=softmax_dtype(q.dtype)).to(q.dtype)
                out[s + t, h] = torch.mv(v[:visible].t(), p)
    return out
