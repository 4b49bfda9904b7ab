"""Attention over the paged KV cache: rope + cache write, then prefill (varlen) and decode kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """One step's batch layout: the prefill tokens (sequences with > 1 new token) come first, then one token per
    decoding sequence."""

    slot_mapping: torch.Tensor  # [T] int64, flat cache slot of each new token
    num_prefill_tokens: int
    cu_seqlens_q: torch.Tensor | None  # [Bp + 1] int32
    prefill_context_lens: torch.Tensor | None  # [Bp] int32, total length incl. the new tokens
    prefill_block_tables: torch.Tensor | None  # [Bp, max_blocks] int32
    decode_context_lens: torch.Tensor | None  # [Bd] int32
    decode_block_tables: torch.Tensor | None  # [Bd, max_blocks] int32


class Attention:
    def __init__(self, kernel_set, num_heads: int, num_kv_heads: int, head_dim: int):
        self.ks = kernel_set
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5

    def __call__(self, q, k, v, positions, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        # q: [T, Hq, D], k/v: [T, Hkv, D] -> out [T, Hq, D]
        ks = self.ks
        q, _ = ks.rope_and_cache(q, k, v, positions, cos, sin, k_cache, v_cache, meta.slot_mapping)
        p = meta.num_prefill_tokens
        outs = []
        if p:
            outs.append(ks.prefill_attention(q[:p], k_cache, v_cache, meta.prefill_block_tables,
                                             meta.cu_seqlens_q, meta.prefill_context_lens, self.scale))
        if q.shape[0] > p:
            outs.append(ks.paged_decode_attention(q[p:], k_cache, v_cache, meta.decode_block_tables,
                                                  meta.decode_context_lens, self.scale))
        return outs[0] if len(outs) == 1 else torch.cat(outs)
