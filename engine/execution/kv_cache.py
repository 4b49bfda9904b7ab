"""The paged KV cache's memory: every layer's K and V pages in one allocation, in the model's dtype
(`kv_cache_dtype="auto"`) or as FP8 e4m3 with an fp32 scale per (token, kv head) in a second one beside it ("fp8",
kernels/kv_fp8.py), and what one block of it costs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sits.kernels.kv_fp8 import FP8_DTYPE, SCALE_DTYPE, Fp8Pages


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    num_layers: int
    block_size: int
    num_kv_heads: int   # this rank's
    head_dim: int
    dtype: torch.dtype   # the model's
    kv_cache_dtype: str   # "auto" | "fp8"

    def bytes_per_token(self) -> int:
        """K and V of one token in every layer: head_dim values of the model's dtype per kv head, or head_dim e4m3
        bytes and a 4-byte scale."""
        if self.kv_cache_dtype == "fp8":
            per_head = self.head_dim * FP8_DTYPE.itemsize + SCALE_DTYPE.itemsize
        else:
            per_head = self.head_dim * self.dtype.itemsize
        return 2 * self.num_layers * self.num_kv_heads * per_head

    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token()

    def describe(self) -> str:
        if self.kv_cache_dtype == "fp8":
            return "fp8 (e4m3, fp32 scale per token and kv head)"
        return str(self.dtype).removeprefix("torch.")


@dataclass(slots=True)
class KVCache:
    pages: torch.Tensor   # [layers, 2 (K, V), blocks, block_size, kv_heads, head_dim], model dtype or e4m3
    scales: torch.Tensor | None   # fp8: [layers, 2, blocks, block_size, kv_heads] fp32; auto: None
    layers: list[tuple]   # per layer (k_cache, v_cache): views of `pages`, or Fp8Pages over pages and scales


def allocate_kv_cache(layout: KVCacheLayout, num_blocks: int, device: torch.device) -> KVCache:
    shape = (layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
    if layout.kv_cache_dtype == "fp8":
        pages = torch.zeros(shape, device=device, dtype=torch.uint8).view(FP8_DTYPE)   # zero bytes: +0.0 in e4m3
        scales = torch.ones(shape[:-1], device=device, dtype=SCALE_DTYPE)
        layers = [(Fp8Pages(pages[i, 0], scales[i, 0]), Fp8Pages(pages[i, 1], scales[i, 1]))
                  for i in range(layout.num_layers)]
        return KVCache(pages, scales, layers)
    pages = torch.zeros(shape, device=device, dtype=layout.dtype)
    return KVCache(pages, None, [(pages[i, 0], pages[i, 1]) for i in range(layout.num_layers)])
