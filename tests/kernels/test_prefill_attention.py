"""Paged prefill attention (`prefill_attention`: full prompts, prefix-cache hits, chunks; kernels/prefill_attention.py,
v1.1's TMA kernel too): the torch reference against SDPA, the Triton kernels on CPU and GPU, and long mixed batches
on a GPU; over FP8 pages (kernels/kv_fp8.py, triton-v1.3's kernels/prefill_attention_fp8.py) the same checks against
the dequantized pages."""
import pytest
import torch

from sits.kernels import get_kernel_set
from tests.kernels.helpers import (DTYPES, args_to, assert_verbose_allclose, check_op, check_op_on_gpu, fp8_kv,
                                   make_paged_kv, on_gpu, prefill_args, sdpa_masked)

REF = get_kernel_set("torch")
V13 = get_kernel_set("triton-v1.3")
V15 = get_kernel_set("triton-v1.5")


# ---- the torch reference against independent fp64 formulations ----

@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 3e-2, 3e-2)])
def test_reference_prefill_attention_with_cached_prefix_matches_sdpa(dtype, atol, rtol):
    ctx, qlens = [1, 63, 64, 65, 130], [1, 63, 10, 1, 66]  # full prefills, prefix hits, chunked continuation
    hq, hkv, d, bs = 6, 2, 16, 16
    k_cache, v_cache, tables, ks, vs = make_paged_kv(ctx, hkv, d, bs, dtype, "cpu", seed=4)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(5)).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    out = REF.prefill_attention(q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5)
    for b in range(len(ctx)):
        s, e = cu[b].item(), cu[b + 1].item()
        assert_verbose_allclose(out[s:e], sdpa_masked(q[s:e], ks[b], vs[b], d ** -0.5), atol, rtol)


@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 3e-2, 3e-2)])
def test_reference_prefill_attention_over_fp8_pages_is_attention_over_their_values(dtype, atol, rtol):
    ctx, qlens = [1, 63, 64, 65, 130], [1, 63, 10, 1, 66]
    q, k_cache, v_cache, tables, cu, lens, scale = fp8_kv(prefill_args(ctx, qlens, 6, 2, 16, dtype, seed=6))
    out = REF.prefill_attention(q, k_cache, v_cache, tables, cu, lens, scale)
    assert torch.equal(out, REF.prefill_attention(q, k_cache.dequantize(dtype), v_cache.dequantize(dtype), tables, cu,
                                                  lens, scale))
    k64, v64 = k_cache.dequantize(torch.float64), v_cache.dequantize(torch.float64)
    for b, n in enumerate(ctx):
        blocks = tables[b, :-(-n // 64)].long()
        ks, vs = (c[blocks].reshape(-1, 2, 16)[:n] for c in (k64, v64))
        s, e = cu[b].item(), cu[b + 1].item()
        assert_verbose_allclose(out[s:e], sdpa_masked(q[s:e], ks, vs, scale), atol, rtol)


# ---- Triton against the reference: CPU through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU ----

@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_full_prompts(dev, dtype, set_name):
    # context lengths 1, 63, 64, 65 in one launch; 6 query heads over 2 kv heads
    ctx = [1, 63, 64, 65]
    check_op("prefill_attention", prefill_args(ctx, ctx, 6, 2, 64, dtype, seed=20), dtype, dev,
             kernel_set=get_kernel_set(set_name))


@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_attention_prefix_hits_and_chunks(dev, dtype, set_name):
    # new tokens after a cached prefix (prefix-cache hit, chunked prefill), up to a 1000-token context
    check_op("prefill_attention", prefill_args([65, 130, 1000], [1, 66, 40], 3, 1, 64, dtype, seed=21), dtype, dev,
             kernel_set=get_kernel_set(set_name))


@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
def test_prefill_attention_both_kernels_ignore_stale_slots(dev, set_name):
    # v1's pointer-gather kernel and v1.1's TMA kernel (page-sized tiles; Hopper+, and the interpreter) on the same
    # prefix hits and chunks; the cache slots past each context hold NaN, as a recycled block may
    from sits.kernels import prefill_attention as pa
    tma = set_name == "triton-v1.1"
    ctx, qlens = [1, 64, 65, 200], [1, 64, 3, 130]
    q, k_cache, v_cache, tables, cu, lens, scale = prefill_args(ctx, qlens, 4, 2, 64, torch.bfloat16, seed=24)
    for b, n in enumerate(ctx):
        last = tables[b, (n - 1) // 64].item()
        k_cache[last, (n - 1) % 64 + 1:] = float("nan")
        v_cache[last, (n - 1) % 64 + 1:] = float("nan")
    if tma and dev == "cuda" and not pa._tma_ok(q.cuda(), k_cache.cuda(), v_cache.cuda()):
        pytest.skip("TMA needs sm_90+")
    got = check_op("prefill_attention", (q, k_cache, v_cache, tables, cu, lens, scale), torch.bfloat16, dev,
                   kernel_set=get_kernel_set(set_name))
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("page", [16, 128])
def test_prefill_attention_page_sizes(dev, page):
    # 64-token key tiles that span 4 pages (16) or half of one (128): both ways of walking the block table
    ctx, qlens = [65, 300], [65, 130]
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, 2, 32, page, torch.bfloat16, "cpu", seed=22)
    q = torch.randn(sum(qlens), 4, 32, generator=torch.Generator().manual_seed(23)).bfloat16()
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), 32 ** -0.5)
    check_op("prefill_attention", args, torch.bfloat16, dev)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_fp8_pages(dev, dtype):
    # full prompts (contexts 1, 63, 64, 65) and prefix hits / chunks up to a 1000-token context, in one launch; the
    # fp64 reference reads the same e4m3 pages
    ctx, qlens = [1, 63, 64, 65, 130, 1000], [1, 63, 64, 65, 66, 40]
    check_op("prefill_attention", fp8_kv(prefill_args(ctx, qlens, 6, 2, 64, dtype, seed=25)), dtype, dev,
             kernel_set=V13)


@pytest.mark.parametrize("q_scale", [1.0, 3e5])   # 3e5: past fp16's range, lowered by a power of two in-kernel
def test_triton_v1_5_prefills_over_fp8_pages_with_fp16_dots(dev, q_scale):
    ctx, qlens = [1, 63, 64, 65, 130, 300], [1, 63, 64, 65, 66, 40]
    q, *rest = fp8_kv(prefill_args(ctx, qlens, 6, 2, 64, torch.bfloat16, seed=27))
    args = ((q.float() * q_scale).bfloat16(), *rest)
    got = check_op("prefill_attention", args, torch.bfloat16, dev, kernel_set=V15)
    assert not got.isnan().any()
    other = args_to((q, *rest), dtype=torch.float32, device=dev)   # fp32 models: v1.3's kernel unchanged
    assert torch.equal(V15.prefill_attention(*other), V13.prefill_attention(*other))


@pytest.mark.parametrize("set_name", ["triton-v1.3", "triton-v1.18", "triton-v1.19", "triton-v1.20", "triton-v1.21"])
def test_prefill_attention_fp8_ignores_stale_slots(dev, set_name):
    # the slots past each context hold e4m3 NaNs and NaN scales, as a recycled block may (the sets: pointer gather,
    # TMA, scores transposed, pages dequantized once)
    ctx, qlens = [1, 64, 65, 200], [1, 64, 3, 130]
    q, k_cache, v_cache, tables, cu, lens, scale = fp8_kv(prefill_args(ctx, qlens, 4, 2, 64, torch.bfloat16, seed=26))
    for b, n in enumerate(ctx):
        last = tables[b, (n - 1) // 64].item()
        for pages in (k_cache, v_cache):
            pages.data.view(torch.uint8)[last, (n - 1) % 64 + 1:] = 0x7F   # NaN in e4m3fn
            pages.scale[last, (n - 1) % 64 + 1:] = float("nan")
    got = check_op("prefill_attention", (q, k_cache, v_cache, tables, cu, lens, scale), torch.bfloat16, dev,
                   kernel_set=get_kernel_set(set_name))
    assert torch.isfinite(got).all()


def test_triton_v1_3_prefills_plain_pages_with_triton_v1_2s_kernel(dev):
    # --kv-cache-dtype auto on triton-v1.3 is v1.2's prefill (v1.1's TMA kernel), bit for bit
    args = args_to(prefill_args([65, 130], [65, 66], 4, 2, 64, torch.bfloat16, seed=27), device=dev)
    assert torch.equal(V13.prefill_attention(*args), get_kernel_set("triton-v1.2").prefill_attention(*args))


# ---- on a GPU at Llama-3-8B shapes (marked gpu, skipped without CUDA) ----

@on_gpu
@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_prefill_attention_long_mixed_batch(dtype, d, set_name):
    ctx = [1, 63, 64, 65, 1000, 3000, 4096]
    qlens = [1, 63, 64, 1, 1000, 1000, 2048]  # full prompts, decode-like, prefix-cache hits / chunks
    hq, hkv = 32, 8
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cuda", seed=2)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(3)).to(dtype)
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    args = (q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5)
    check_op_on_gpu("prefill_attention", args, dtype, kernel_set=get_kernel_set(set_name))


@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_prefill_attention_fp8_long_mixed_batch(dtype, d):
    ctx = [1, 63, 64, 65, 1000, 3000, 4096]
    qlens = [1, 63, 64, 1, 1000, 1000, 2048]
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, 8, d, 64, dtype, "cuda", seed=8)
    q = torch.randn(sum(qlens), 32, d, generator=torch.Generator().manual_seed(9)).to(dtype)
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    args = fp8_kv((q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5))
    check_op_on_gpu("prefill_attention", args, dtype, kernel_set=V13)
    if dtype == torch.bfloat16:
        check_op_on_gpu("prefill_attention", args, dtype, kernel_set=V15)
