"""Rotary position embedding (HF "rotate_half" layout) fused with writing k/v into the paged KV cache.

For pair (x1, x2) = (x[:D/2], x[D/2:]) at position p: (x1*cos - x2*sin, x2*cos + x1*sin), cos/sin = table[p]
(Su et al. 2021, RoFormer). llama3 frequency scaling is already folded into the cos/sin tables by the caller.
"""
from __future__ import annotations

import torch


def check_rope_args(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"rope_and_cache: q [T,Hq,D], k/v [T,Hkv,D] expected, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    t, _, d = q.shape
    if k.shape[0] != t or k.shape[2] != d or d % 2:
        raise ValueError(f"rope_and_cache: q {tuple(q.shape)} and k {tuple(k.shape)} disagree (or odd head dim)")
    if positions.shape != (t,) or slot_mapping.shape != (t,):
        raise ValueError(f"rope_and_cache: positions {tuple(positions.shape)} / slot_mapping "
                         f"{tuple(slot_mapping.shape)} must be [{t}]")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d // 2:
        raise ValueError(f"rope_and_cache: cos/sin must be [max_pos, {d // 2}], got {tuple(cos.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4 or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"rope_and_cache: caches {tuple(k_cache.shape)} must be [num_blocks, block_size, "
                         f"{k.shape[1]}, {d}]")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos/sin: [T, 1, D/2] in the compute dtype
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Store k/v [T, Hkv, D] at flat slots of the caches; slots < 0 are skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kc = k_cache.view(-1, *k_cache.shape[2:])
    vc = v_cache.view(-1, *v_cache.shape[2:])
    kc[slots] = k[keep].to(k_cache.dtype)
    vc[slots] = v[keep].to(v_cache.dtype)


def rope_and_cache_ref(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    check_rope_args(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    c = cos[positions.long()].to(acc)[:, None, :]
    s = sin[positions.long()].to(acc)[:, None, :]
    q_out = _rotate(q.to(acc), c, s).to(q.dtype)
    k_out = _rotate(k.to(acc), c, s).to(k.dtype)
    write_kv_ref(k_out, v, k_cache, v_cache, slot_mapping)
    return q_out, k_out
