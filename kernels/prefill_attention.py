"""Causal varlen attention of new tokens over the paged KV cache (prefill, chunked prefill, prefix-cache hits).

Sequence b has q_len_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] new tokens whose K/V are already in the cache, and
context_lens[b] tokens in total; new token i sits at position context_lens[b] - q_len_b + i and attends to cache
positions <= its own. softmax(q k^T * scale) v with FlashAttention-2's online softmax in fp32 (Dao 2023): each
program owns BLOCK_M queries of one head of one sequence and streams the sequence's K/V tiles through its block table;
tiles entirely below the causal diagonal skip the mask.

Two kernels, one schedule:
- `_prefill_attention_kernel` (`prefill_attention`, kernel set triton-v1): per-row pointer gathers through the block
  table; any page size, head_dim and dtype, any GPU.
- `_prefill_attention_tma_kernel` (`prefill_attention_tma`, kernel set triton-v1.1; Hopper and newer, fp16/bf16,
  power-of-two page, head_dim 64/128/256, as the engine's cache has; other calls fall back to the pointer kernel):
  K/V tiles are whole pages, copied by the tensor-memory accelerator from a descriptor over the cache viewed as
  [num_blocks * page, num_kv_heads * head_dim], one block-table entry per page. On an H200 at B2 S8k H32 D128: 470
  TFLOP/s against 371 for the pointer kernel in the same run (BENCHMARKS.md).
"""
from __future__ import annotations

import math

import torch

from sits.kernels.paged import PagedAttentionError, check_prefill_args
from sits.kernels.triton_env import autotune, check_device, interpreting, next_pow2, tl, triton

try:  # Triton >= 3.4: host-side TMA descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the pointer kernel only
    TensorDescriptor = None



@triton.jit
def _attn_tile(acc, l_i, m_i, q, start_n, k_cache_ptr, v_cache_ptr, bt_row, kv_head, qpos, ctx, qk_scale,
               stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
               offs_d, mask_d, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
               DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    mask_n = offs_n < ctx
    blk = tl.load(bt_row + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
    slot = (offs_n % PAGE)[:, None]
    kv_mask = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_cache_ptr + blk[:, None] * stride_kb + slot * stride_ks + kv_head * stride_kh + offs_d[None, :],
                mask=kv_mask, other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 domain
    if MASK:
        qk = tl.where((offs_n[None, :] <= qpos[:, None]) & mask_n[None, :], qk, float("-inf"))
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
    return acc, l_i, m_new


@triton.jit
def _query_tile(cu_q_ptr, num_seqs, BLOCK_M: tl.constexpr):
    # This program's query tile and head, on the grid (T // BLOCK_M + B, Hq) every prefill kernel launches: the last
    # tiles (the heaviest under the causal mask) start first. Sequence b owns query tiles [cu[b] // BLOCK_M + b,
    # cu[b+1] // BLOCK_M + b + 1), at least cdiv(q_len_b, BLOCK_M) of them; find tile pid's sequence by binary search
    # (vLLM's trick). Returns (seq, head, q_start, q_len, m0): the tile covers new tokens [m0, m0 + BLOCK_M) of the
    # sequence, none when m0 >= q_len.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    left = tl.full([], 0, tl.int32)  # tensors, not constexprs: they are loop-carried
    right = tl.full([], 0, tl.int32) + num_seqs - 1
    while left < right:
        mid = (left + right + 1) // 2
        if tl.load(cu_q_ptr + mid) // BLOCK_M + mid <= pid:
            left = mid
        else:
            right = mid - 1
    q_start = tl.load(cu_q_ptr + left)
    q_len = tl.load(cu_q_ptr + left + 1) - q_start
    return left, tl.program_id(1), q_start, q_len, (pid - q_start // BLOCK_M - left) * BLOCK_M


@triton.jit
def _q_tile(q_ptr, q_start, q_len, m0, head, stride_qt, stride_qh, HEAD_DIM: tl.constexpr,
            HEAD_DIM_P: tl.constexpr, BLOCK_M: tl.constexpr, DOT_F32: tl.constexpr):
    # the tile's queries (rows past q_len and dims past HEAD_DIM as 0): (q, rows, offs_m, mask [BLOCK_M, HEAD_DIM_P],
    # offs_d, mask_d)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_P)
    mask_d = offs_d < HEAD_DIM
    mask = (offs_m < q_len)[:, None] & mask_d[None, :]
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=mask, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    return q, rows, offs_m, mask, offs_d, mask_d


@triton.jit
def _key_bounds(ctx, q_len, m0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # keys [0, full_hi) are seen whole by every query of the tile (no mask); [full_hi, hi) straddle the diagonal
    hi = tl.minimum(ctx, ctx - q_len + m0 + BLOCK_M)
    return hi, ((ctx - q_len + m0 + 1) // BLOCK_N) * BLOCK_N


@triton.jit
def _prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, cu_q_ptr, ctx_ptr, o_ptr, qk_scale,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    stride_ot, stride_oh, num_seqs, TOKENS_BUCKET,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # the grid (T // BLOCK_M + B, Hq) and its tile order: _query_tile
    seq, head, q_start, q_len, m0 = _query_tile(cu_q_ptr, num_seqs, BLOCK_M)
    if m0 < q_len:
        ctx = tl.load(ctx_ptr + seq)
        kv_head = head // GROUP
        q, rows, offs_m, mask, offs_d, mask_d = _q_tile(q_ptr, q_start, q_len, m0, head, stride_qt, stride_qh,
                                                        HEAD_DIM, HEAD_DIM_P, BLOCK_M, DOT_F32)
        qpos = ctx - q_len + offs_m
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
        bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
        hi, full_hi = _key_bounds(ctx, q_len, m0, BLOCK_M, BLOCK_N)
        for start_n in range(0, full_hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, start_n, k_cache_ptr, v_cache_ptr, bt_row, kv_head, qpos,
                                       ctx, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                       stride_vh, offs_d, mask_d, PAGE, BLOCK_N, False, DOT_F32, DOT_PRECISION)
        for start_n in range(full_hi, hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, start_n, k_cache_ptr, v_cache_ptr, bt_row, kv_head, qpos,
                                       ctx, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                       stride_vh, offs_d, mask_d, PAGE, BLOCK_N, True, DOT_F32, DOT_PRECISION)
        out = acc / l_i[:, None]
        tl.store(o_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tma_page(desc, bt_row, page_idx, valid, col, PAGE: tl.constexpr):
    # one [PAGE, HEAD_DIM] page of one kv head through the tensor-memory accelerator (a page past the sequence reads
    # block 0, which exists; its keys are masked out by the caller)
    blk = tl.load(bt_row + page_idx, mask=valid, other=0)
    return desc.load([blk * PAGE, col])


@triton.jit
def _tma_tile(acc, l_i, m_i, q, start_n, k_desc, v_desc, bt_row, col, qpos, ctx, qk_scale,
              PAGE: tl.constexpr, PAGES: tl.constexpr, MASK: tl.constexpr, DOT_F32: tl.constexpr):
    # PAGES (1 or 2) whole pages = one BLOCK_N = PAGES * PAGE key tile; the scale is folded into the exp2 argument
    # (one FMA per score, as in Triton's fused-attention tutorial)
    j = start_n // PAGE
    offs0 = start_n + tl.arange(0, PAGE)
    k0 = _tma_page(k_desc, bt_row, j, True, col, PAGE)
    if DOT_F32:  # the interpreter's bf16 dot is wrong; fp32 is exact for bf16 inputs
        k0 = k0.to(tl.float32)
    s0 = tl.dot(q, k0.T)
    if MASK:
        s0 = tl.where((offs0[None, :] <= qpos[:, None]) & (offs0 < ctx)[None, :], s0, float("-inf"))
    row_max = tl.max(s0, 1)
    if PAGES == 2:
        offs1 = offs0 + PAGE
        k1 = _tma_page(k_desc, bt_row, j + 1, start_n + PAGE < ctx, col, PAGE)
        if DOT_F32:
            k1 = k1.to(tl.float32)
        s1 = tl.dot(q, k1.T)
        if MASK:
            s1 = tl.where((offs1[None, :] <= qpos[:, None]) & (offs1 < ctx)[None, :], s1, float("-inf"))
        row_max = tl.maximum(row_max, tl.max(s1, 1))
    m_new = tl.maximum(m_i, row_max * qk_scale)
    alpha = tl.math.exp2(m_i - m_new)
    p0 = tl.math.exp2(s0 * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p0, 1)
    acc = acc * alpha[:, None]
    v0 = _tma_page(v_desc, bt_row, j, True, col, PAGE)
    if MASK:  # slots past the context hold whatever the cache had (maybe NaN): p = 0 there must not meet NaN
        v0 = tl.where((offs0 < ctx)[:, None], v0, 0.0)
    p0 = p0.to(v_desc.dtype)
    if DOT_F32:
        p0 = p0.to(tl.float32)
        v0 = v0.to(tl.float32)
    acc = tl.dot(p0, v0, acc)
    if PAGES == 2:
        p1 = tl.math.exp2(s1 * qk_scale - m_new[:, None])
        l_i += tl.sum(p1, 1)
        v1 = _tma_page(v_desc, bt_row, j + 1, start_n + PAGE < ctx, col, PAGE)
        if MASK:
            v1 = tl.where((offs1 < ctx)[:, None], v1, 0.0)
        p1 = p1.to(v_desc.dtype)
        if DOT_F32:
            p1 = p1.to(tl.float32)
            v1 = v1.to(tl.float32)
        acc = tl.dot(p1, v1, acc)
    return acc, l_i, m_new


@triton.jit
def _prefill_attention_tma_kernel(
    q_ptr, k_desc, v_desc, bt_ptr, cu_q_ptr, ctx_ptr, o_ptr, qk_scale,
    stride_qt, stride_qh, stride_bt, stride_ot, stride_oh, num_seqs, TOKENS_BUCKET,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, PAGES: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # The same schedule and masking as _prefill_attention_kernel; K/V pages come through TMA descriptors over the
    # cache viewed as [num_blocks * PAGE, num_kv_heads * HEAD_DIM] (Hopper+), one [PAGE, HEAD_DIM] box per page.
    BLOCK_N: tl.constexpr = PAGES * PAGE
    seq, head, q_start, q_len, m0 = _query_tile(cu_q_ptr, num_seqs, BLOCK_M)
    if m0 < q_len:
        ctx = tl.load(ctx_ptr + seq)
        col = (head // GROUP) * HEAD_DIM
        q, rows, offs_m, mask, offs_d, _ = _q_tile(q_ptr, q_start, q_len, m0, head, stride_qt, stride_qh, HEAD_DIM,
                                                   HEAD_DIM, BLOCK_M, DOT_F32)
        qpos = ctx - q_len + offs_m
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
        hi, full_hi = _key_bounds(ctx, q_len, m0, BLOCK_M, BLOCK_N)
        for start_n in range(0, full_hi, BLOCK_N):
            acc, l_i, m_i = _tma_tile(acc, l_i, m_i, q, start_n, k_desc, v_desc, bt_row, col, qpos, ctx, qk_scale,
                                      PAGE, PAGES, False, DOT_F32)
        for start_n in range(full_hi, hi, BLOCK_N):
            acc, l_i, m_i = _tma_tile(acc, l_i, m_i, q, start_n, k_desc, v_desc, bt_row, col, qpos, ctx, qk_scale,
                                      PAGE, PAGES, True, DOT_F32)
        out = acc / l_i[:, None]
        tl.store(o_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask)


_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
]
_TUNE_MIN_TOKENS = 1024
_prefill_attention_tuned = autotune(_CONFIGS, key=["TOKENS_BUCKET", "HEAD_DIM", "GROUP", "PAGE"])(
    _prefill_attention_kernel)
_TMA_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "PAGES": pages}, num_warps=w, num_stages=st)
    # the H200 sweep's leaders (BENCHMARKS.md): one warpgroup over 128 queries, 64-key pages, two CTAs per SM first
    for bm, pages, w, st in ((128, 1, 4, 2), (128, 1, 4, 3), (128, 2, 8, 2), (128, 2, 8, 3), (64, 1, 4, 3))
]
_prefill_attention_tma_tuned = autotune(_TMA_CONFIGS, key=["TOKENS_BUCKET", "HEAD_DIM", "GROUP", "PAGE"])(
    _prefill_attention_tma_kernel)


def _tma_ok(q, k_cache, v_cache) -> bool:
    """Can the TMA kernel take this call: fp16/bf16, a power-of-two page, head_dim 64/128/256, contiguous caches, and
    Hopper or newer (or the interpreter, which emulates the descriptors)."""
    page, d = k_cache.shape[1], k_cache.shape[3]
    if q.dtype not in (torch.float16, torch.bfloat16) or TensorDescriptor is None:
        return False
    if not (page & (page - 1) == 0 and 16 <= page <= 256 and d in (64, 128, 256)
            and k_cache.is_contiguous() and v_cache.is_contiguous()):
        return False
    return interpreting() or torch.cuda.get_device_capability(q.device) >= (9, 0)


def _page_descriptor(cache: torch.Tensor) -> "TensorDescriptor":
    nb, page, hkv, d = cache.shape
    return TensorDescriptor(cache.view(nb * page, hkv * d), [nb * page, hkv * d], [hkv * d, 1], [page, d])


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1: the pointer-gather kernel. q: [T, Hq, D] -> out [T, Hq, D]"""
    return _prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, tma=False)


def prefill_attention_tma(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.1: the TMA kernel where it applies (see _tma_ok), else the pointer-gather kernel."""
    return _prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, tma=True)


def _prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, tma: bool):
    b = check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    check_device("prefill_attention", q)
    t, hq, d = q.shape
    out = torch.empty_like(q)
    if t == 0 or b == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise PagedAttentionError("prefill_attention: caches must be contiguous along head_dim")
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    if tma and _tma_ok(q, k_cache, v_cache):
        _launch_tma(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, scale, b)
        return out
    args = (q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, float(scale) * math.log2(math.e),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
            v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1), b,
            min(next_pow2(t), 8192))
    meta = dict(HEAD_DIM=d, HEAD_DIM_P=max(16, next_pow2(d)), GROUP=hq // hkv, PAGE=page,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    if interpreting():
        # the interpreter is slow per program and can't autotune: few, large tiles
        bm = 64 if t > 32 else 32
        grid = (t // bm + b, hq)
        _prefill_attention_kernel[grid](*args, **meta, BLOCK_M=bm, BLOCK_N=64, DOT_F32=q.dtype != torch.float16)
    elif q.dtype == torch.float32 or t < _TUNE_MIN_TOKENS:
        # fp32 (reference-grade, no tensor-core fast path) and small launches: one fixed config, no tuning runs
        bm, bn = (32, 32) if q.dtype == torch.float32 else (64, 64)
        _prefill_attention_kernel[(t // bm + b, hq)](*args, **meta, BLOCK_M=bm, BLOCK_N=bn, DOT_F32=False,
                                                     num_warps=4, num_stages=2)
    else:
        grid = lambda m: (t // m["BLOCK_M"] + b, hq)  # noqa: E731
        _prefill_attention_tuned[grid](*args, **meta, DOT_F32=False)
    return out


def _launch_tma(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, scale, b) -> None:
    t, hq, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    args = (q, _page_descriptor(k_cache), _page_descriptor(v_cache), block_tables, cu_seqlens_q, context_lens, out,
            float(scale) * math.log2(math.e), q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0),
            out.stride(1), b, min(next_pow2(t), 8192))
    meta = dict(HEAD_DIM=d, GROUP=hq // hkv, PAGE=page)
    if interpreting() or t < _TUNE_MIN_TOKENS:  # the interpreter takes two-page tiles so that CPU tests cover them
        pages = 2 if interpreting() else 1
        _prefill_attention_tma_kernel[(t // 64 + b, hq)](*args, **meta, BLOCK_M=64, PAGES=pages, num_warps=4,
                                                         num_stages=2, DOT_F32=interpreting())
    else:
        grid = lambda m: (t // m["BLOCK_M"] + b, hq)  # noqa: E731
        _prefill_attention_tma_tuned[grid](*args, **meta, DOT_F32=False)
