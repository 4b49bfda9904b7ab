"""triton-v1.20's prefill attention over FP8 KV pages: the pages a prefill reads dequantized once into a 16-bit
scratch cache, then triton-v1.1's TMA kernel over bf16 (fp16) pages.

Three FP8 prefill kernels have been measured on an H100 (BENCHMARKS.md "Prefill attention with the scores transposed"):
v1.17's pointer gather, v1.18's TMA loads and v1.19's transposed loop, all at 55-65 % of v1.1's bf16 kernel on the same
values (0.190 / 0.208 / 0.232 ms a llama3-8b layer at 1 x 2,048 tokens against 0.118). What costs them is on the chip:
every query tile converts every e4m3 K and V tile of its keys to fp16 and puts it back in shared memory for the
tensor cores -- at llama3-8b's 4 query heads a kv head and 64-query tiles, a 2,048-token prompt converts each key ~64
times. Prefill attention is compute-bound and its pages are few (a 2,048-token prompt's K and V of one layer: 4 MB of
e4m3), so here each page is converted once per call instead: one launch writes the prefill's pages, dequantized as
the torch reference dequantizes them (e4m3 x scale in fp32, rounded to q's dtype), into a scratch [pages, page, kv
heads, head_dim] cache laid out sequence by sequence, and v1.1's kernel (prefill_attention.prefill_attention_tma)
attends over it through a block table that numbers the scratch pages in order. The extra traffic is one read of the
FP8 pages and one write of 16-bit pages (12 MB at 1 x 2,048, a few microseconds), against ~2 ms of a 2,048-token step
that the FP8 kernels lose to conversions.

The scratch is [sequences x block-table width] pages (the ops get no host copy of the context lengths, and reading
them would stop the host for the GPU every layer): a sequence's pages past its context are left unwritten and never
read, and slots past the context in its last page are written as zeros. Where that would exceed SCRATCH_MAX_BYTES
(many prefill sequences in one step, or very wide block tables), and for fp32 models, triton-v1.5's kernel runs
instead (v1.17's op: the same function, converted per tile). Plain pages go to v1.1's kernel as in every set since.

triton-v1.21 takes this path only for calls with enough attention work to pay for it (`prefill_attention_fp8kv_
dequant_large`): v1.20's second launch, two allocations and second set of argument checks cost the host time a call
whatever the call's size, which a launch-bound step (short prompts, small models) pays in full, while what the
dequantized pages save grows with the square of the prompt. The host has no copy of the context lengths, so the
choice is made on a lower bound of the work it knows: `attention_work` (T new tokens over b sequences attend at least
T^2 / b query-key pairs, times the query heads and head_dim). Below DEQUANT_MIN_WORK the call runs v1.17's op.
"""
from __future__ import annotations

import functools

import torch

from sits.kernels.kv_fp8 import Fp8Pages, kernel_page_args, page_tensors
from sits.kernels.paged import check_prefill_args
from sits.kernels.prefill_attention import prefill_attention_tma
from sits.kernels.prefill_attention_fp8 import prefill_attention_fp8kv_f16
from sits.kernels.triton_env import check_device, next_pow2, tl, triton

# The scratch cache's largest size (K and V together). llama3-8b (8 kv heads x 128, pages of 64, bf16): 256 KB a page
# of K and V, so 1,024 pages -- eight prefill sequences a step at the engine's default max_model_len of 8,192 (block
# tables 128 pages wide). The engine's activation headroom (engine/execution/model_runner.py) holds the torch
# reference's score matrix, which the Triton sets never build: 4 GB at 2,048 tokens of that model.
SCRATCH_MAX_BYTES = 256 * 2**20

# triton-v1.21's threshold on attention_work. Measured on an H100 (bench/prefill_attention_fp8.py; BENCHMARKS.md
# "triton-v1.21"), v1.20's op adds 26-164 us of host work a call and saves 8 us of GPU time at 1 x 256 llama3-8b
# tokens, 22 at 1 x 1,024 (2^32), 68 at 1 x 2,048 (2^34): alone, with the host waiting on nothing else, it pays from
# 2^34. But a step with 2^32 of attention work carries >= 1,024 tokens x heads x head_dim through its linears too
# (llama3-8b: ~0.4 ms a layer at fp8 rates), so the host runs ahead of the GPU and only the GPU time counts; and the
# 256 x 2048/512 row's prefill chunks (2,048 tokens less the decoding sequences) lie between 2^32 and 2^34. Small
# models never reach it: the tiny model's 4 heads x 64 need 4,096 tokens a call, twice the default step.
DEQUANT_MIN_WORK = 2**32


@triton.jit
def _dequantize_page(data_ptr, scale_ptr, out_ptr, blk, kv_head, offs_s, valid, offs_d, mask_d,
                     stride_b, stride_s, stride_h, stride_sb, stride_ss, stride_sh):
    # one [PAGE, HEAD_DIM] page of one kv head: e4m3 x its token's scale in fp32, rounded to the scratch's dtype
    mask = valid[:, None] & mask_d[None, :]
    x = tl.load(data_ptr + blk * stride_b + offs_s[:, None] * stride_s + kv_head * stride_h + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr + blk * stride_sb + offs_s * stride_ss + kv_head * stride_sh, mask=valid, other=0.0)
    tl.store(out_ptr, (x * s[:, None]).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne"),
             mask=mask_d[None, :])


@triton.jit
def _dequantize_pages_kernel(
    k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, cu_q_ptr, ctx_ptr, k_out_ptr, v_out_ptr,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh, stride_bt, num_kv_heads,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, PAGE: tl.constexpr,
):
    # grid: (sequences, block-table width, kv heads); program (i, j, h) writes page j of sequence i's kv head h into
    # the scratch's page i * width + j, if the sequence has new tokens and its context reaches that page
    seq = tl.program_id(0)
    j = tl.program_id(1)
    kv_head = tl.program_id(2)
    width = tl.num_programs(1)
    ctx = tl.load(ctx_ptr + seq)
    new = tl.load(cu_q_ptr + seq + 1) - tl.load(cu_q_ptr + seq)
    if (new > 0) & (j * PAGE < ctx):
        blk = tl.load(bt_ptr + seq.to(tl.int64) * stride_bt + j).to(tl.int64)
        offs_s = tl.arange(0, PAGE)
        valid = j * PAGE + offs_s < ctx   # slots past the context (stale, maybe NaN) are written as zeros
        offs_d = tl.arange(0, HEAD_DIM_P)
        mask_d = offs_d < HEAD_DIM
        page = (seq.to(tl.int64) * width + j) * PAGE
        dst = ((page + offs_s[:, None]) * num_kv_heads + kv_head) * HEAD_DIM + offs_d[None, :]
        _dequantize_page(k_ptr, ks_ptr, k_out_ptr + dst, blk, kv_head, offs_s, valid, offs_d, mask_d,
                         stride_kb, stride_ks, stride_kh, stride_ksb, stride_kss, stride_ksh)
        _dequantize_page(v_ptr, vs_ptr, v_out_ptr + dst, blk, kv_head, offs_s, valid, offs_d, mask_d,
                         stride_vb, stride_vs, stride_vh, stride_vsb, stride_vss, stride_vsh)


@functools.lru_cache(maxsize=16)
def _scratch_table(b: int, width: int, device: torch.device) -> torch.Tensor:
    """The scratch's block table: sequence i's page j is scratch page i * width + j."""
    return torch.arange(b * width, dtype=torch.int32, device=device).view(b, width)


def scratch_bytes(q: torch.Tensor, block_tables: torch.Tensor, kd: torch.Tensor) -> int:
    """What the scratch cache (K and V) of this call would take."""
    _, page, hkv, d = kd.shape
    return 2 * block_tables.shape[0] * block_tables.shape[1] * page * hkv * d * q.element_size()


def dequantize_prefill_pages(q, k_cache: Fp8Pages, v_cache: Fp8Pages, block_tables, cu_seqlens_q, context_lens,
                             b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k scratch, v scratch, their block table): the pages of the `b` sequences with new tokens, dequantized to q's
    dtype, one launch for both caches."""
    kd, vd, ks, vs = k_cache.data, v_cache.data, k_cache.scale, v_cache.scale
    _, page, hkv, d = kd.shape
    width = block_tables.shape[1]
    k_out = torch.empty(b * width, page, hkv, d, dtype=q.dtype, device=q.device)
    v_out = torch.empty_like(k_out)
    _dequantize_pages_kernel[(b, width, hkv)](
        kd, vd, ks, vs, block_tables, cu_seqlens_q, context_lens, k_out, v_out,
        kd.stride(0), kd.stride(1), kd.stride(2), vd.stride(0), vd.stride(1), vd.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2), block_tables.stride(0),
        hkv, HEAD_DIM=d, HEAD_DIM_P=max(16, next_pow2(d)), PAGE=page, num_warps=4)
    return k_out, v_out, _scratch_table(b, width, q.device)


def prefill_attention_fp8kv_dequant(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.20: FP8 pages dequantized once into a 16-bit scratch cache, then v1.1's kernel over it; fp32 models
    and calls whose scratch would pass SCRATCH_MAX_BYTES as triton-v1.5 (v1.17); plain pages as v1.1."""
    if not isinstance(k_cache, Fp8Pages) and not isinstance(v_cache, Fp8Pages):
        return prefill_attention_tma(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
    kd, vd = page_tensors(k_cache, v_cache)   # both caches FP8, or say so
    if q.dtype not in (torch.float16, torch.bfloat16) or scratch_bytes(q, block_tables, kd) > SCRATCH_MAX_BYTES:
        return prefill_attention_fp8kv_f16(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
    b = check_prefill_args(q, kd, vd, block_tables, cu_seqlens_q, context_lens)
    check_device("prefill_attention", q)
    kernel_page_args("prefill_attention", k_cache, v_cache)   # a GPU that converts e4m3, pages contiguous
    if q.shape[0] == 0 or b == 0:
        return torch.empty_like(q)
    if q.stride(-1) != 1:
        q = q.contiguous()
    k16, v16, table = dequantize_prefill_pages(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, b)
    return prefill_attention_tma(q, k16, v16, table, cu_seqlens_q, context_lens, scale)


def attention_work(q: torch.Tensor, block_tables: torch.Tensor) -> int:
    """A lower bound, known on the host, of a prefill call's query-key products times head_dim: T new tokens over b
    sequences (b the block table's rows) have sum T_i^2 >= T^2 / b query-key pairs in their causal squares -- prefix
    hits and chunks only add keys -- times the query heads and head_dim."""
    t, hq, d = q.shape
    return t * t // max(1, block_tables.shape[0]) * hq * d


def prefill_attention_fp8kv_dequant_large(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    """triton-v1.21: v1.20's op (pages dequantized once) for calls with at least DEQUANT_MIN_WORK of attention work,
    v1.17's (converted per tile) below it, where v1.20's host work outweighs what it saves on the GPU."""
    if isinstance(k_cache, Fp8Pages) and attention_work(q, block_tables) < DEQUANT_MIN_WORK:
        return prefill_attention_fp8kv_f16(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
    return prefill_attention_fp8kv_dequant(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)
