"""Rotary position embedding (HF "rotate_half" layout) fused with writing k/v into the paged KV cache.

For pair (x1, x2) = (x[:D/2], x[D/2:]) at position p: (x1*cos - x2*sin, x2*cos + x1*sin), cos/sin = table[p]
(Su et al. 2021, RoFormer). llama3 frequency scaling is already folded into the cos/sin tables by the caller.
"""
from __future__ import annotations

import torch

from sits.kernels.kv_fp8 import FP8_MAX, Fp8Pages, check_fp8_device, page_tensors, write_tokens
from sits.kernels.triton_env import (check_device, fast, gdc_launch_dependents, gdc_wait, interpreting, next_pow2,
                                     pdl_launch, pdl_launches, tl, triton)


@triton.jit
def _rope_and_cache_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, slot_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    HQ, HKV, PAGE,
    HALF: tl.constexpr, HALF_P: tl.constexpr, HQ_P: tl.constexpr, HKV_P: tl.constexpr, PDL: tl.constexpr = False,
):
    # one program per token: rotate all its q and k heads, then store rotated k and v into the cache slot
    if PDL:   # programmatic dependent launch (triton-v1.13): every read after the earlier kernel's writes land
        gdc_wait()
        gdc_launch_dependents()   # the next kernel may start now; it waits for this one's writes likewise
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


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Store k/v [T, Hkv, D] at flat slots of the caches (tensors, or Fp8Pages: quantized); slots < 0 are skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    if isinstance(k_cache, Fp8Pages):
        write_tokens(k[keep], k_cache, slots)
        write_tokens(v[keep], v_cache, slots)
        return
    kc = k_cache.view(-1, *k_cache.shape[2:])
    vc = v_cache.view(-1, *v_cache.shape[2:])
    kc[slots] = k[keep].to(k_cache.dtype)
    vc[slots] = v[keep].to(v_cache.dtype)


def rope_and_cache_ref(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    # k_cache/v_cache: tensors in any float dtype, or Fp8Pages (the rotated k and v quantized per token and head)
    check_rope_args(q, k, v, positions, cos, sin, *page_tensors(k_cache, v_cache), slot_mapping)
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
_RETIRED_TABLES: list = []   # tables replaced by larger ones, kept: a CUDA graph may have captured their addresses


def _fixed_base_tables(d: int, n: int, device, acc) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [>= n, d/2] for base 10000, built once per (head dim, device, dtype) and grown by doubling."""
    key = (d, str(device), acc)
    cos, sin = _FIXED_BASE_TABLES.get(key, (None, None))
    if cos is None or cos.shape[0] < n:
        if cos is not None:
            _RETIRED_TABLES.append((cos, sin))
        size = max(4096, 1 << (n - 1).bit_length())
        inv_freq = 1.0 / (HARDCODED_ROPE_BASE ** (torch.arange(0, d, 2, device=device, dtype=acc) / d))
        angles = torch.arange(size, device=device, dtype=acc)[:, None] * inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        _FIXED_BASE_TABLES[key] = (cos, sin)
    return cos, sin


def rope_and_cache_fixed_base_ref(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    """A WRONG RoPE, kept as an example of a bug that ships (kernel set torch-wrong-rope): it uses its own cos/sin
    tables for a hard-coded base of 10000 without frequency scaling, ignoring the caller's tables (which hold the
    model's rope_theta, 500000 for Llama 3, and its llama3 scaling). The same work as the reference: gather, rotate
    (and the same pages: tensors or Fp8Pages)."""
    check_rope_args(q, k, v, positions, cos, sin, *page_tensors(k_cache, v_cache), slot_mapping)
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
             num_warps=4, **pdl_launch(q.device))(
            (t,), q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            hq, hkv, k_cache.shape[1])
    return q_out, k_out


# ---- FP8 pages (kernel set triton-v1.3): the same rotation, the cache write quantized (kernels/kv_fp8.py) ----
_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def _round_to_e4m3(x):
    # x: fp32 in [-448, 448] -> the nearest e4m3 value in fp32, ties to even (as torch and the GPU's cvt.rn round).
    # Only under the interpreter, whose fp32 -> e4m3 conversion drops the carry when rounding up to a power of two
    # (127.9 -> 64): it then converts exact values. The grid step is 2^(max(exponent, -6) - 3); adding and
    # subtracting 1.5 * 2^23 rounds |x| / step to an integer; the sign bit goes back on (so -0.0 stays -0.0).
    bits = x.to(tl.int32, bitcast=True)
    step = ((tl.maximum(((bits >> 23) & 0xFF) - 127, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)
    r = ((tl.abs(x) / step + 12582912.0) - 12582912.0) * step
    return tl.where(bits < 0, -r, r)


@triton.jit
def _quantize_store(page_ptr, scale_ptr, x1, x2, mask, head_mask, HALF: tl.constexpr, ROUND_E4M3: tl.constexpr):
    # x1/x2: [HKV_P, HALF_P] fp32, the two halves of each kv head's vector; page_ptr: its first half's slots,
    # scale_ptr: [HKV_P] its scale slots. scale = max|x| / 448 (1 for all zeros), data = e4m3(x / scale)
    # IEEE divisions (div_rn; Triton's `/` is approximate on NVIDIA GPUs): the scale and the quotient are torch's
    amax = tl.maximum(tl.max(tl.abs(x1), 1), tl.max(tl.abs(x2), 1))
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, tl.full(amax.shape, _FP8_MAX, tl.float32)), 1.0)
    q1 = tl.clamp(tl.math.div_rn(x1, tl.broadcast_to(scale[:, None], x1.shape)), -_FP8_MAX, _FP8_MAX)
    q2 = tl.clamp(tl.math.div_rn(x2, tl.broadcast_to(scale[:, None], x2.shape)), -_FP8_MAX, _FP8_MAX)
    if ROUND_E4M3:
        q1 = _round_to_e4m3(q1)
        q2 = _round_to_e4m3(q2)
    tl.store(page_ptr, q1.to(page_ptr.dtype.element_ty), mask=mask)
    tl.store(page_ptr + HALF, q2.to(page_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, scale, mask=head_mask)


@triton.jit
def _rope_and_cache_fp8_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    HQ, HKV, PAGE,
    HALF: tl.constexpr, HALF_P: tl.constexpr, HQ_P: tl.constexpr, HKV_P: tl.constexpr, ROUND_E4M3: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # _rope_and_cache_kernel with the KV write quantized: one program per token rotates its q and k heads, then stores
    # each kv head's rotated k (rounded to the model's dtype first, as the reference) and v as e4m3 with a scale
    if PDL:   # programmatic dependent launch (triton-v1.13): every read after the earlier kernel's writes land
        gdc_wait()
        gdc_launch_dependents()   # the next kernel may start now; it waits for this one's writes likewise
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
        ks = ks_ptr + blk * stride_ksb + off * stride_kss + hk * stride_ksh
        _quantize_store(kc, ks, r1.to(tl.float32), r2.to(tl.float32), mk, hk < HKV, HALF, ROUND_E4M3)
        vp = v_ptr + t * stride_vt + hk[:, None] * stride_vh + d[None, :]
        v1 = tl.load(vp, mask=mk, other=0.0).to(tl.float32)
        v2 = tl.load(vp + HALF, mask=mk, other=0.0).to(tl.float32)
        vc = vc_ptr + blk * stride_vcb + off * stride_vcs + hk[:, None] * stride_vch + d[None, :]
        vs = vs_ptr + blk * stride_vsb + off * stride_vss + hk * stride_vsh
        _quantize_store(vc, vs, v1, v2, mk, hk < HKV, HALF, ROUND_E4M3)


def rope_and_cache_fp8kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    """triton-v1.3: Fp8Pages caches through the quantizing kernel; plain caches through triton-v1's rope_and_cache,
    unchanged."""
    kd, vd = page_tensors(k_cache, v_cache)
    if kd is k_cache:
        return rope_and_cache(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
    check_rope_args(q, k, v, positions, cos, sin, kd, vd, slot_mapping)
    check_device("rope_and_cache", q)
    check_fp8_device("rope_and_cache", k_cache)
    t, hq, d = q.shape
    hkv = k.shape[1]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if cos.stride(-1) != 1 or sin.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    if kd.stride(-1) != 1 or vd.stride(-1) != 1:
        raise ValueError("rope_and_cache: FP8 pages must be contiguous along head_dim (written in place)")
    ks, vs = k_cache.scale, v_cache.scale
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    if t:
        half = d // 2
        fast(_rope_and_cache_fp8_kernel, HALF=half, HALF_P=next_pow2(half), HQ_P=next_pow2(hq),
             HKV_P=next_pow2(hkv), ROUND_E4M3=interpreting(), num_warps=4, **pdl_launch(q.device))(
            (t,), q, k, v, positions, cos, sin, kd, vd, ks, vs, slot_mapping, q_out, k_out,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
            kd.stride(0), kd.stride(1), kd.stride(2), vd.stride(0), vd.stride(1), vd.stride(2),
            ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), hq, hkv, kd.shape[1])
    return q_out, k_out


def rope_and_cache_pdl(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping):
    """triton-v1.13's rope_and_cache: triton-v1.3's (plain or FP8 pages) inside pdl_launches(), so on sm_90+ the
    kernel starts while the q/k/v projection finishes and waits for its writes before it reads anything."""
    with pdl_launches():
        return rope_and_cache_fp8kv(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
