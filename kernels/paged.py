"""Shared argument checks for attention over the paged KV cache.

k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim]; token at position p of a sequence lives in block
block_tables[seq, p // block_size] at offset p % block_size. GQA: query head h reads kv head h // (Hq // Hkv).
"""
from __future__ import annotations

import torch


class PagedAttentionError(ValueError):
    """Inconsistent shapes or dtypes passed to a paged attention op."""


def check_paged_args(op: str, q, k_cache, v_cache, block_tables, num_seqs: int) -> None:
    if q.dim() != 3:
        raise PagedAttentionError(f"{op}: q must be [tokens, num_q_heads, head_dim], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise PagedAttentionError(f"{op}: k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, "
                                  f"head_dim], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    hq, d = q.shape[1], q.shape[2]
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise PagedAttentionError(f"{op}: head_dim of q ({d}) and cache ({k_cache.shape[3]}) differ")
    if hkv == 0 or hq % hkv:
        raise PagedAttentionError(f"{op}: num_q_heads {hq} is not a multiple of num_kv_heads {hkv}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or block_tables.is_floating_point():
        raise PagedAttentionError(f"{op}: block_tables must be integer [{num_seqs}, max_blocks], got "
                                  f"{tuple(block_tables.shape)} {block_tables.dtype}")
    for t in (k_cache, v_cache, block_tables):
        if t.device != q.device:
            raise PagedAttentionError(f"{op}: all tensors must be on {q.device}, found one on {t.device}")


def check_lens(op: str, context_lens: torch.Tensor, num_seqs: int) -> None:
    if context_lens.shape != (num_seqs,) or context_lens.is_floating_point():
        raise PagedAttentionError(f"{op}: context_lens must be integer [{num_seqs}], got "
                                  f"{tuple(context_lens.shape)} {context_lens.dtype}")


def gather_kv(cache: torch.Tensor, block_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence: [length, num_kv_heads, head_dim]."""
    bs = cache.shape[1]
    nb = -(-length // bs)
    return cache[block_row[:nb].long()].reshape(nb * bs, *cache.shape[2:])[:length]


def check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens) -> int:
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1 or cu_seqlens_q.is_floating_point():
        raise PagedAttentionError(f"prefill_attention: cu_seqlens_q must be integer [B+1], got "
                                  f"{tuple(cu_seqlens_q.shape)} {cu_seqlens_q.dtype}")
    b = cu_seqlens_q.numel() - 1
    check_paged_args("prefill_attention", q, k_cache, v_cache, block_tables, b)
    check_lens("prefill_attention", context_lens, b)
    return b


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """The reference kernels' softmax dtype: fp32 statistics (fp64 for fp64 inputs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32
