"""Rotary position embedding (HF "rotate_half" layout) fused with writing k/v into the paged KV cache.

For pair (x1, x2) = (x[:D/2], x[D/2:]) at position p: (x1*cos - x2*sin, x2*cos + x1*sin), cos/sin = table[p]
(Su et al. 2021, RoFormer). llama3 frequency scaling is already folded into the cos/sin tables by the caller.
"""
from __future__ import annotations

import torch

from sits.kernels.triton_env import check_device, fast, next_pow2, tl, triton


@triton.jit
def _rope_and_cache_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    HQ, HKV, PAGE,
    HALF: tl.constexpr, HALF_P: tl.constexpr, HQ_P: tl.constexpr, HKV_P: tl.constexpr,
):
    # one program per token: rotate all its q and k heads, then store rotated k and v into the cache slot
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, HALF_P)
    dm = d < HALF
    c = tl.load(cos_ptr + pos * stride_cos + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + pos * stride_sin + d, mask=dm, other=0.0).to(tl.float32)[None, :]

    hq = tl.arange(0, HQ_P)
    mq = (hq < HQ)[:, None] & dm[None, :]
    qp = q_ptr + t * stride_qt + hq[:, None] * stride_qh + d[None, :]
    q1 = tl.load(qp, mask=mq, other=0.0).to(tl.float32)
    q2 = tl.load(qp + HALF, mask=mq, other=0.0).to(tl.float32)
    qo = qo_ptr + t * stride_qot + hq[:, None] * stride_qoh + d[None, :]
    tl.store(qo, (q1 * c - q2 * s).to(qo_ptr.dtype.element_ty), mask=mq)
    tl.store(qo + HALF, (q2 * c + q1 * s).to(qo_ptr.dtype.element_ty), mask=mq)

    hk = tl.arange(0, HKV_P)
    mk = (hk < HKV)[:, None] & dm[None, :]
    kp = k_ptr + t * stride_kt + hk[:, None] * stride_kh + d[None, :]
    k1 = tl.load(kp, mask=mk, other=0.0).to(tl.float32)
    k2 = tl.load(kp + HALF, mask=mk, other=0.0).to(tl.float32)
    r1 = (k1 * c - k2 * s).to(ko_ptr.dtype.element_ty)
    r2 = (k2 * c + k1 * s).to(ko_ptr.dtype.element_ty)
    ko = ko_ptr + t * stride_kot + hk[:, None] * stride_koh + d[None, :]
    tl.store(ko, r1, mask=mk)
    tl.store(ko + HALF, r2, mask=mk)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        kc = kc_ptr + blk * stride_kcb + off * stride_kcs + hk[:, None] * stride_kch + d[None, :]
        tl.store(kc, r1.to(kc_ptr.dtype.element_ty), mask=mk)
        tl.store(kc + HALF, r2.to(kc_ptr.dtype.element_ty), mask=mk)
        vp = v_ptr + t * stride_vt + hk[:, None] * stride_vh + d[None, :]
        vc = vc_ptr + blk * stride_vcb + off * stride_vcs + hk[:, None] * stride_vch + d[None, :]
        tl.store(vc, tl.load(vp, mask=mk, other=0.0).to(vc_ptr.dtype.element_ty), mask=mk)
        tl.store(vc + HALF, tl.load(vp + HALF, mask=mk, other=0.0).to(vc_ptr.dtype.element_ty), mask=mk)


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


# The frequency base that kernels which compute their own angles often hard-code (the original RoFormer/Llama-1 one).
HARDCODED_ROPE_BASE = 10000.0


_FIXED_BASE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _fixed_base_tables(d: int, n: int, device, acc) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [>= n, d/2] for base 10000, built once per (head dim, device, dtype) and grown by doubling."""
    key = (d, str(device), acc)
    cos, sin = _FIXED_BASE_TABLES.get(key, (None, None))
    if cos is None or cos.shape[0] < n:
        size = max(4096, 1 << (n - 1).bit_length())
        inv_freq = 1.0 / (HARDCODED_ROPE_BASE ** (torch.arange(0, d, 2, device=device, dtype=acc) / d))
        angles = torch.arange(size, device=device, dtype=acc)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        _FIXED_BASE_TABLES[key] = (cos, sin)
    return cos, sin


def rope_and_cache_fixed_base_ref(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    """A WRONG RoPE, kept as an example of a bug that ships (kernel set torch-wrong-rope): it uses its own cos/sin
    tables for a hard-coded base of 10000 without frequency scaling, ignoring the caller's tables (which hold the
    model's rope_theta, 500000 for Llama 3, and its llama3 scaling). The same work as the reference: gather, rotate."""
    check_rope_args(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    pos = positions.long()
    own_cos, own_sin = _fixed_base_tables(q.shape[-1], int(pos.max()) + 1 if pos.numel() else 1, q.device, acc)
    c, s = own_cos[pos][:, None, :], own_sin[pos][:, None, :]
    q_out = _rotate(q.to(acc), c, s).to(q.dtype)
    k_out = _rotate(k.to(acc), c, s).to(k.dtype)
    write_kv_ref(k_out, v, k_cache, v_cache, slot_mapping)
    return q_out, k_out


def rope_and_cache(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    # q: [T, Hq, D], k/v: [T, Hkv, D] -> (q_out, k_out); k_cache/v_cache written in place
    check_rope_args(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
    check_device("rope_and_cache", q)
    t, hq, d = q.shape
    hkv = k.shape[1]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_and_cache: k_cache/v_cache must be contiguous along head_dim (written in place)")
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    if t:
        half = d // 2
        fast(_rope_and_cache_kernel, HALF=half, HALF_P=next_pow2(half), HQ_P=next_pow2(hq), HKV_P=next_pow2(hkv),
             num_warps=4)(
            (t,), q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            hq, hkv, k_cache.shape[1])
    return q_out, k_out
