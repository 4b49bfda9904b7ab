"""Decode attention: one query token per sequence over its paged KV cache.

out[s, h] = softmax(q[s, h] . K_s^T * scale) V_s over the first context_lens[s] cached tokens of sequence s,
softmax statistics in fp32.
"""
from __future__ import annotations

import torch

from kernels.paged import check_lens, check_paged_args


def check_decode_args(q, k_cache, v_cache, block_tables, context_lens) -> None:
    check_paged_args("paged_decode_attention", q, k_cache, v_cache, block_tables, q.shape[0] if q.dim() == 3 else -1)
    check_lens("paged_decode_attention", context_lens, q.shape[0])


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale):
    # q: [S, Hq, D]; k_cache/v_cache: [NB, BS, Hkv, D]; block_tables: [S, max_blocks]; context_lens: [S]
    check_decode_args(q, k_cache, v_cache, block_tables, context_lens)
    s, hq, d = q.shape
    if s == 0:
        return torch.empty_like(q)
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    lens = context_lens.long()
    max_len = int(lens.max())
    nb = -(-max_len // bs)
    bt = block_tables[:, :nb].long().clamp(min=0)  # unused table entries may hold padding such as -1
    k = k_cache[bt].reshape(s, nb * bs, hkv, d).to(q.dtype)  # [S, L, Hkv, D]
    v = v_cache[bt].reshape(s, nb * bs, hkv, d).to(q.dtype)
    qg = q.view(s, hkv, hq // hkv, d)
    scores = torch.einsum("skgd,slkd->skgl", qg, k) * scale  # [S, Hkv, G, L]
    pad = torch.arange(nb * bs, device=q.device)[None, :] >= lens[:, None]  # [S, L]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.einsum("skgl,slkd->skgd", p, v).reshape(s, hq, d)
