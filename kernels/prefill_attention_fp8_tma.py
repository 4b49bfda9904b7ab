"""triton-v1.18's prefill attention over FP8 KV pages: the e4m3 pages through the tensor-memory accelerator, as
triton-v1.1 reads bf16 pages.

Up to triton-v1.17, prefill over FP8 pages (--kv-cache-dtype fp8) is kernels/prefill_attention_fp8.py's pointer-gather
kernel with triton-v1.5's fp16 dots: on an H100 6.3 ms of a 2,048-token llama3-8b prefill step (bench/profile_steps.py,
BENCHMARKS.md), ~175 TFLOP/s of causal attention. Over bf16 pages at 8 x 2,048 tokens the H200 ran triton-v1's
pointer-gather kernel at 286 TFLOP/s and v1.1's TMA kernel at 380 (docs/benchmarks-history.md, first kernel timings).
Here the FP8 pages come in as v1.1's do: a descriptor over the e4m3 cache viewed as [num_blocks * page, num_kv_heads *
head_dim] bytes, one [page, head_dim] box a page (8 KB at llama3-8b's shapes, half a bf16 page), one block-table entry a
page; the page's per-token scales by pointer (one fp32 a token and kv head); v1.1's candidates, 128 queries of one head
a program first. The arithmetic is v1.5's kernel's: q lowered by a power of two into fp16's range (bf16 models) and the
e4m3 tiles converted to fp16 where they are loaded (exact; one instruction a pair on Hopper) for fp16 dots, each key's
scale multiplying its score column, each value's scale (raised by 2^8, out of fp16's subnormals) its column of the
softmax weights. Other tiles than v1.5's kernel (64 queries, 128 keys), so the online softmax rescales at other points:
the same function to fp32 and fp16 rounding, not the same bits.

triton-v1.19's kernel is the same loop with the scores transposed (S^T = K Q^T, O^T += V^T P^T): the converted K and
V are the dots' register operands and only P^T goes back through shared memory, one tile a step instead of two. On an
H100 it is slower still: Triton brings the e4m3 tiles into the dot-operand layout with narrow shared-memory loads and
warp shuffles, more instructions than the round trip saved (bench/kernel_resources.py; BENCHMARKS.md "Prefill
attention with the scores transposed"). Both kernels' tuners picked 64 queries, four warps there.

Where it does not apply -- plain pages, fp32 models, a page that is not a power of two in 16..256, head_dim other than
64/128/256, pages not contiguous, GPUs before Hopper -- triton-v1.5's op runs (v1.17's). Under TRITON_INTERPRET=1 the
kernel runs on CPU tensors (the interpreter emulates the descriptors), so the CPU tests cover it.
"""
from __future__ import annotations

import math

import torch

from sits.kernels.kv_fp8 import Fp8Pages, page_tensors
from sits.kernels.paged_decode_attention_fp8 import PV_SHIFT
from sits.kernels.prefill_attention import TensorDescriptor, _key_bounds, _q_tile, _query_tile, _TUNE_MIN_TOKENS
from sits.kernels.prefill_attention_fp8 import fp8_prefill_inputs, prefill_attention_fp8kv_f16, q_in_f16
from sits.kernels.triton_env import autotune, interpreting, next_pow2, tl, triton


@triton.jit
def _fp8_page(desc, scale_ptr, bt_row, page_idx, valid, col, kv_head, stride_sb, stride_ss, stride_sh,
              PAGE: tl.constexpr):
    # one [PAGE, HEAD_DIM] e4m3 page of one kv head through TMA, and its [PAGE] scales (a page past the sequence
    # reads block 0, which exists; the caller masks what lies past the context)
    blk = tl.load(bt_row + page_idx, mask=valid, other=0)
    tile = desc.load([blk * PAGE, col])
    scale = tl.load(scale_ptr + blk.to(tl.int64) * stride_sb + tl.arange(0, PAGE) * stride_ss + kv_head * stride_sh)
    return tile, scale


@triton.jit
def _fp8_values(v_desc, v_scale_ptr, bt_row, page_idx, col, kv_head, offs, ctx, stride_vsb, stride_vss, stride_vsh,
                DTYPE: tl.constexpr, PAGE: tl.constexpr, MASK: tl.constexpr):
    # one page of values in DTYPE (fp16 for a bf16 model's dots) and their scales; past the context (MASK) both 0,
    # so p = 0 there meets neither a NaN byte nor a NaN scale
    v, v_scale = _fp8_page(v_desc, v_scale_ptr, bt_row, page_idx, True, col, kv_head, stride_vsb, stride_vss,
                           stride_vsh, PAGE)
    v = v.to(DTYPE)
    if MASK:
        live = offs < ctx
        v = tl.where(live[:, None], v, 0.0)
        v_scale = tl.where(live, v_scale, 0.0)
    return v, v_scale


@triton.jit
def _tma_tile_fp8(acc, l_i, m_i, q, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row, col, kv_head, qpos,
                  ctx, qk_scale, stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh,
                  PAGE: tl.constexpr, MASK: tl.constexpr):
    # one page of keys and values (BLOCK_N = PAGE); scores in the log2 domain, as prefill_attention_fp8.py's tile
    j = start_n // PAGE
    offs = start_n + tl.arange(0, PAGE)
    k, k_scale = _fp8_page(k_desc, k_scale_ptr, bt_row, j, True, col, kv_head, stride_ksb, stride_kss, stride_ksh,
                           PAGE)
    qk = tl.dot(q, k.to(q.dtype).T) * (k_scale * qk_scale)[None, :]
    if MASK:   # past the diagonal or the context (where the bytes and scales are whatever the cache held): -inf
        qk = tl.where((offs[None, :] <= qpos[:, None]) & (offs < ctx)[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v, v_scale = _fp8_values(v_desc, v_scale_ptr, bt_row, j, col, kv_head, offs, ctx, stride_vsb, stride_vss,
                             stride_vsh, q.dtype, PAGE, MASK)
    acc = tl.dot((p * (v_scale * PV_SHIFT)[None, :]).to(q.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _tma_tile_fp8_t(acc_t, l_i, m_i, q_t, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row, col, kv_head,
                    qpos, ctx, qk_scale, stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh,
                    PAGE: tl.constexpr, MASK: tl.constexpr):
    # _tma_tile_fp8 with the scores transposed (triton-v1.19): S^T = K Q^T and O^T += V^T P^T, a query a column. The
    # converted K and V are the dots' first operand, which wgmma takes from registers: only P^T goes to shared memory
    # (bench/kernel_resources.py); the same products and sums as _tma_tile_fp8, other accumulation order
    j = start_n // PAGE
    offs = start_n + tl.arange(0, PAGE)
    k, k_scale = _fp8_page(k_desc, k_scale_ptr, bt_row, j, True, col, kv_head, stride_ksb, stride_kss, stride_ksh,
                           PAGE)
    s_t = tl.dot(k.to(q_t.dtype), q_t) * (k_scale * qk_scale)[:, None]
    if MASK:   # past the diagonal or the context: -inf
        s_t = tl.where((offs[:, None] <= qpos[None, :]) & (offs < ctx)[:, None], s_t, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_t, 0))
    p_t = tl.math.exp2(s_t - m_new[None, :])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p_t, 0)
    v, v_scale = _fp8_values(v_desc, v_scale_ptr, bt_row, j, col, kv_head, offs, ctx, stride_vsb, stride_vss,
                             stride_vsh, q_t.dtype, PAGE, MASK)
    acc_t = tl.dot(tl.trans(v), (p_t * (v_scale * PV_SHIFT)[:, None]).to(q_t.dtype), acc_t * alpha[None, :])
    return acc_t, l_i, m_new


@triton.jit
def _fp8_tile(acc, l_i, m_i, q, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row, col, kv_head, qpos, ctx,
              qk_scale, stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh, PAGE: tl.constexpr,
              MASK: tl.constexpr, TRANSPOSED: tl.constexpr):
    # one page: v1.18's tile, or v1.19's with the scores transposed (acc and q then transposed too)
    if TRANSPOSED:
        acc, l_i, m_i = _tma_tile_fp8_t(acc, l_i, m_i, q, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row,
                                        col, kv_head, qpos, ctx, qk_scale, stride_ksb, stride_kss, stride_ksh,
                                        stride_vsb, stride_vss, stride_vsh, PAGE, MASK)
    else:
        acc, l_i, m_i = _tma_tile_fp8(acc, l_i, m_i, q, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row,
                                      col, kv_head, qpos, ctx, qk_scale, stride_ksb, stride_kss, stride_ksh,
                                      stride_vsb, stride_vss, stride_vsh, PAGE, MASK)
    return acc, l_i, m_i


@triton.jit
def _prefill_attention_fp8_tma_kernel(
    q_ptr, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_ptr, cu_q_ptr, ctx_ptr, o_ptr, qk_scale,
    stride_qt, stride_qh, stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh, stride_bt,
    stride_ot, stride_oh, num_seqs, TOKENS_BUCKET,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, F16_DOT: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):
    # prefill_attention.py's schedule and masking (grid (T // BLOCK_M + B, Hq), the heaviest tiles first).
    # TRANSPOSED (triton-v1.19): the accumulator is O^T [HEAD_DIM, BLOCK_M], a query a column (_tma_tile_fp8_t)
    seq, head, q_start, q_len, m0 = _query_tile(cu_q_ptr, num_seqs, BLOCK_M)
    if m0 < q_len:
        ctx = tl.load(ctx_ptr + seq)
        kv_head = head // GROUP
        q, rows, offs_m, mask, offs_d, _ = _q_tile(q_ptr, q_start, q_len, m0, head, stride_qt, stride_qh, HEAD_DIM,
                                                   HEAD_DIM, BLOCK_M, False)
        qpos = ctx - q_len + offs_m
        if F16_DOT:   # a bf16 model: q in fp16 below 2^14 (exact), the scores raised back by the same power of two
            q, qk_scale = q_in_f16(q, qk_scale)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        if TRANSPOSED:
            q = tl.trans(q)
            acc = tl.zeros([HEAD_DIM, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
        col = kv_head * HEAD_DIM
        hi, full_hi = _key_bounds(ctx, q_len, m0, BLOCK_M, PAGE)
        for start_n in range(0, full_hi, PAGE):
            acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row,
                                      col, kv_head, qpos, ctx, qk_scale, stride_ksb, stride_kss, stride_ksh,
                                      stride_vsb, stride_vss, stride_vsh, PAGE, False, TRANSPOSED)
        for start_n in range(full_hi, hi, PAGE):
            acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, start_n, k_desc, v_desc, k_scale_ptr, v_scale_ptr, bt_row,
                                      col, kv_head, qpos, ctx, qk_scale, stride_ksb, stride_kss, stride_ksh,
                                      stride_vsb, stride_vss, stride_vsh, PAGE, True, TRANSPOSED)
        if TRANSPOSED:
            out = tl.trans(acc / (l_i * PV_SHIFT)[None, :])
        else:
            out = acc / (l_i * PV_SHIFT)[:, None]
        tl.store(o_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=mask)


# v1.1's TMA candidates at one page a key tile (its H200 sweep's leaders: one warpgroup over 128 queries first)
_CONFIGS = [triton.Config({"BLOCK_M": bm}, num_warps=w, num_stages=st)
            for bm, w, st in ((128, 4, 2), (128, 4, 3), (128, 8, 2), (64, 4, 3))]
_KEY = ["TOKENS_BUCKET", "HEAD_DIM", "GROUP", "PAGE", "F16_DOT", "TRANSPOSED"]
_tuned = autotune(_CONFIGS, key=_KEY)(_prefill_attention_fp8_tma_kernel)
# the transposed loop's candidates: 64 queries a program. On an H100 at 1 x 2,048 and 8 x 2,048 tokens 64 queries, four
# warps, 3 stages ran 0.229 / 1.495 ms, 2 stages 0.239 / 1.523; 128 queries spilled (0.50-1.01 ms / 3.35-5.62 ms at
# 4 or 8 warps; bench/prefill_attention_fp8.py --sweep, BENCHMARKS.md "Prefill attention with the scores transposed")
_T_CONFIGS = [triton.Config({"BLOCK_M": 64}, num_warps=4, num_stages=st) for st in (2, 3)]
_tuned_t = autotune(_T_CONFIGS, key=_KEY)(_prefill_attention_fp8_tma_kernel)


def tma_takes(q: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor) -> bool:
    """Whether the kernel takes these FP8 pages' data ([num_blocks, page, num_kv_heads, head_dim] e4m3): a 16-bit
    model, a power-of-two page of 16..256, head_dim 64/128/256, contiguous pages, Hopper or newer (or the
    interpreter, which emulates the descriptors)."""
    page, d = kd.shape[1], kd.shape[3]
    if q.dtype not in (torch.float16, torch.bfloat16) or TensorDescriptor is None:
        return False
    if not (page & (page - 1) == 0 and 16 <= page <= 256 and d in (64, 128, 256)
            and kd.is_contiguous() and vd.is_contiguous()):
        return False
    if q.device.type == "cpu":
        return interpreting()
    return q.is_cuda and not interpreting() and torch.cuda.get_device_capability(q.device) >= (9, 0)


def _descriptor(data: torch.Tensor) -> "TensorDescriptor":
    nb, page, hkv, d = data.shape
    return TensorDescriptor(data.view(nb * page, hkv * d), [nb * page, hkv * d], [hkv * d, 1], [page, d])


def _launch(transposed, tuned, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, config=None):
    # FP8 pages through the kernel, its scores `transposed` or not (`tuned`: that variant's autotuner), where it
    # applies (tma_takes); everything else, plain pages included, as triton-v1.5's prefill_attention_fp8kv_f16.
    # config: (BLOCK_M, num_warps, num_stages) instead of the tuner's pick (bench/prefill_attention_fp8.py --sweep)
    kd, vd = page_tensors(k_cache, v_cache)
    if not isinstance(k_cache, Fp8Pages) or not tma_takes(q, kd, vd):
        return prefill_attention_fp8kv_f16(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
    q, kd, vd, ks, vs, out, b = fp8_prefill_inputs(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens)
    t, hq, d = q.shape
    if t == 0 or b == 0:
        return out
    page, hkv = kd.shape[1], kd.shape[2]
    args = (q, _descriptor(kd), _descriptor(vd), ks, vs, block_tables, cu_seqlens_q, context_lens, out,
            float(scale) * math.log2(math.e), q.stride(0), q.stride(1), ks.stride(0), ks.stride(1), ks.stride(2),
            vs.stride(0), vs.stride(1), vs.stride(2), block_tables.stride(0), out.stride(0), out.stride(1), b,
            min(next_pow2(t), 8192))
    meta = dict(HEAD_DIM=d, GROUP=hq // hkv, PAGE=page, F16_DOT=q.dtype == torch.bfloat16,
                TRANSPOSED=transposed)
    if config is not None or interpreting() or t < _TUNE_MIN_TOKENS:   # short prompts: the last candidate, no tuning
        bm, warps, stages = config or (64, 4, 3)                         # on the request path
        _prefill_attention_fp8_tma_kernel[(t // bm + b, hq)](*args, **meta, BLOCK_M=bm, num_warps=warps,
                                                             num_stages=stages)
    else:
        grid = lambda m: (t // m["BLOCK_M"] + b, hq)  # noqa: E731
        tuned[grid](*args, **meta)
    return out


def prefill_attention_fp8kv_tma(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.18: FP8 pages through the TMA kernel above where it applies (tma_takes); everything else, plain
    pages included, as triton-v1.5's prefill_attention_fp8kv_f16. q: [T, Hq, D] -> out [T, Hq, D]."""
    return _launch(False, _tuned, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)


def prefill_attention_fp8kv_tma_t(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.19: as prefill_attention_fp8kv_tma, through the kernel with the scores transposed."""
    return _launch(True, _tuned_t, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
