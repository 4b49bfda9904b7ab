"""triton-v1 kernels against the fp64 reference, at small odd shapes (CPU: interpreter; GPU: compiled).

Criterion (flash-attention's): the kernel's max error vs the torch reference run in fp64 is at most 2x the error of
the torch reference run in the kernel's own precision, plus a small atol scaled by the output's magnitude.
"""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.triton_env import TritonUnavailableError
from tests.kernels.helpers import assert_close_to_fp64, assert_verbose_allclose, make_paged_kv, rope_tables

TRI = get_kernel_set("triton-v1")
REF = get_kernel_set("torch")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _to(args, dtype=None, device=None):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            a = a.to(device) if device is not None else a
            if dtype is not None and a.is_floating_point():
                a = a.to(dtype)
        out.append(a)
    return out


def check_op(name, args, dtype, dev, index=None, atol_scale=1.0, kernel_set=TRI):
    """Run op `name` of `kernel_set` (triton-v1) on `dev` and compare with torch-in-dtype and torch-in-fp64 (CPU)."""
    pick = (lambda r: r) if index is None else (lambda r: r[index])
    got = pick(getattr(kernel_set, name)(*_to(args, device=dev)))
    same = pick(getattr(REF, name)(*_to(args, device=dev)))
    ref64 = pick(getattr(REF, name)(*_to(args, dtype=torch.float64, device="cpu")))
    assert got.dtype == dtype and got.shape == ref64.shape
    atol = ATOL[dtype] * atol_scale * max(1.0, ref64.abs().max().item())
    assert_close_to_fp64(got, same, ref64, atol)
    return got


def test_triton_v1_is_registered():
    assert TRI.version == "1.0.0" and set(TRI.devices) == {"cuda", "cpu"}
    for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rope_and_cache", "prefill_attention",
               "paged_decode_attention", "linear"):
        assert getattr(TRI, op) is not getattr(REF, op), op


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 123), (3, 1000)])
def test_rms_norm(dev, shape, dtype):
    g = torch.Generator().manual_seed(11)
    x, r = (torch.randn(*shape, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.2 * torch.randn(shape[1], generator=g)).to(dtype)
    check_op("rms_norm", (x, w, 1e-5), dtype, dev)
    check_op("fused_add_rms_norm", (x, r, w, 1e-5), dtype, dev, index=0)
    res = check_op("fused_add_rms_norm", (x, r, w, 1e-5), dtype, dev, index=1)
    if dev == "cuda":  # same fp32 add, same round-to-nearest: bit-identical to torch
        assert torch.equal(res.cpu(), x + r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 8), (5, 2 * 123), (2, 2 * 1500)])
def test_silu_and_mul(dev, shape, dtype):
    x = (2 * torch.randn(*shape, generator=torch.Generator().manual_seed(12))).to(dtype)
    check_op("silu_and_mul", (x,), dtype, dev)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, hq, hkv, d", [(7, 6, 2, 64), (3, 5, 5, 16), (1, 3, 1, 128)])
def test_rope_and_cache(dev, t, hq, hkv, d, dtype):
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(t, h, d, generator=g).to(dtype) for h in (hq, hkv, hkv))
    positions = torch.randint(0, 300, (t,), generator=g)
    slots = torch.randperm(4 * 8, generator=g)[:t]
    slots[t // 2] = -1  # not written
    cos, sin = rope_tables(300, d)
    kc = torch.full((4, 8, hkv, d), 7.0, dtype=dtype, device=dev)  # sentinel: must survive where no slot points
    vc = kc.clone()
    args = (q, k, v, positions, cos, sin)
    q_out, k_out = TRI.rope_and_cache(*_to(args, device=dev), kc, vc, slots.to(dev))
    q64, k64 = REF.rope_and_cache(*_to(args, dtype=torch.float64), torch.zeros(4, 8, hkv, d, dtype=torch.float64),
                                  torch.zeros(4, 8, hkv, d, dtype=torch.float64), slots)
    q_same, k_same = REF.rope_and_cache(*args, torch.zeros(4, 8, hkv, d, dtype=dtype),
                                        torch.zeros(4, 8, hkv, d, dtype=dtype), slots)
    atol = ATOL[dtype] * 4
    assert_close_to_fp64(q_out, q_same, q64, atol)
    assert_close_to_fp64(k_out, k_same, k64, atol)
    flat_k, flat_v = kc.view(-1, hkv, d).cpu(), vc.view(-1, hkv, d).cpu()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k_out[i].cpu()), f"k of token {i} not in slot {s}"
            assert torch.equal(flat_v[s], v[i]), f"v of token {i} not in slot {s}"
    untouched = sorted(set(range(flat_k.shape[0])) - {s for s in slots.tolist() if s >= 0})
    assert (flat_k[untouched] == 7.0).all() and (flat_v[untouched] == 7.0).all()


def test_rope_and_cache_takes_views_of_a_fused_qkv(dev):
    # the model passes q/k/v as strided views into its fused qkv projection (no copies)
    t, hq, hkv, d = 5, 4, 2, 64
    g = torch.Generator().manual_seed(17)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=g)
    q, k, v = (qkv[:, a * d:b * d].view(t, b - a, d) for a, b in ((0, hq), (hq, hq + hkv), (hq + hkv, hq + 2 * hkv)))
    assert not q.is_contiguous() and not v.is_contiguous()
    positions = torch.arange(t) * 7
    slots = torch.arange(t) * 3
    cos, sin = rope_tables(64, d)
    caches = [torch.zeros(2, 8, hkv, d, device=dev) for _ in range(4)]
    q_out, k_out = TRI.rope_and_cache(*_to((q, k, v, positions, cos, sin), device=dev), *caches[:2], slots.to(dev))
    q_ref, k_ref = REF.rope_and_cache(*_to((q.contiguous(), k.contiguous(), v.contiguous(), positions, cos, sin),
                                           device=dev), *caches[2:], slots.to(dev))
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0], caches[2], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[1], caches[3])  # v is copied as is

def _prefill_args(ctx, qlens, hq, hkv, d, dtype, seed):
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cpu", seed=seed)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    return q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5


@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention_full_prompts(dev, dtype, set_name):
    # context lengths 1, 63, 64, 65 in one launch; 6 query heads over 2 kv heads
    ctx = [1, 63, 64, 65]
    check_op("prefill_attention", _prefill_args(ctx, ctx, 6, 2, 64, dtype, seed=20), dtype, dev,
             kernel_set=get_kernel_set(set_name))


@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_attention_prefix_hits_and_chunks(dev, dtype, set_name):
    # new tokens after a cached prefix (prefix-cache hit, chunked prefill), up to a 1000-token context
    check_op("prefill_attention", _prefill_args([65, 130, 1000], [1, 66, 40], 3, 1, 64, dtype, seed=21), dtype, dev,
             kernel_set=get_kernel_set(set_name))


@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
def test_prefill_attention_both_kernels_ignore_stale_slots(dev, set_name):
    # v1's pointer-gather kernel and v1.1's TMA kernel (page-sized tiles; Hopper+, and the interpreter) on the same
    # prefix hits and chunks; the cache slots past each context hold NaN, as a recycled block may
    from sits.kernels import prefill_attention as pa
    tma = set_name == "triton-v1.1"
    ctx, qlens = [1, 64, 65, 200], [1, 64, 3, 130]
    q, k_cache, v_cache, tables, cu, lens, scale = _prefill_args(ctx, qlens, 4, 2, 64, torch.bfloat16, seed=24)
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


def _decode_args(ctx, hq, hkv, d, dtype, seed):
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cpu", seed=seed)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(ctx, dtype=torch.int32), d ** -0.5


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention(dev, dtype):
    check_op("paged_decode_attention", _decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=30), dtype, dev)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_paged_decode_attention_splits(dev, num_splits):
    from sits.kernels.paged_decode_attention import paged_decode_attention
    args = _decode_args([1, 65, 1000], 6, 3, 32, torch.bfloat16, seed=31)
    got = paged_decode_attention(*_to(args, device=dev), num_splits=num_splits)
    same = REF.paged_decode_attention(*args)
    ref64 = REF.paged_decode_attention(*_to(args, dtype=torch.float64))
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16])


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 33])  # decode-like (padded 16-row tiles) and prefill-like M
def test_quantized_linear(dev, kind, dtype, m):
    g = torch.Generator().manual_seed(40)
    qw = quantize_weight(torch.randn(37, 100, generator=g), kind).to(dev)  # odd N and K (masked tiles)
    x = torch.randn(m, 100, generator=g).to(dtype)
    bias = torch.randn(37, generator=g)
    got = TRI.linear(x.to(dev), qw, bias.to(dev))
    same = REF.linear(x.to(dev), qw, bias.to(dev))
    ref64 = REF.linear(x.double(), qw.to("cpu"), bias.double())
    assert got.shape == (m, 37) and got.dtype == dtype
    assert_close_to_fp64(got, same, ref64, ATOL[dtype] * max(1.0, ref64.abs().max().item()))
    no_bias = TRI.linear(x.to(dev), qw)
    assert_close_to_fp64(no_bias, REF.linear(x.to(dev), qw), REF.linear(x.double(), qw.to("cpu")),
                         ATOL[dtype] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("split_k", [1, 3, 8])
def test_quantized_linear_split_k(dev, split_k):
    # K=100 in 32-wide steps: uneven splits, and with 8 splits the last four get no k at all
    from sits.kernels.linear import linear_with_config
    g = torch.Generator().manual_seed(41)
    qw = quantize_weight(torch.randn(50, 100, generator=g), "int8").to(dev)
    x = torch.randn(5, 100, generator=g).to(torch.bfloat16)
    bias = torch.randn(50, generator=g)
    ref64 = REF.linear(x.double(), qw.to("cpu"), bias.double())
    same = REF.linear(x.to(dev), qw, bias.to(dev))
    for _ in range(2):  # the second launch relies on the first having reset its tile counters
        got = linear_with_config(x.to(dev), qw, bias.to(dev), block_m=16, block_n=16, block_k=32, split_k=split_k)
        assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_many_rows_dequantize_then_matmul(dev, kind, monkeypatch):
    # triton-v1.2: from DEQUANT_MIN_M rows on, the weight is dequantized into a scratch buffer and multiplied by
    # cuBLAS (CPU: torch); below it, v1's kernel
    from sits.kernels import linear_dequant as lin
    v12 = get_kernel_set("triton-v1.2")
    assert v12.linear is lin.linear_dequant_many_rows and v12.parent == "triton-v1.1"
    monkeypatch.setattr(lin, "DEQUANT_MIN_M", 8)
    calls = []
    monkeypatch.setattr(lin, "dequantize_into_scratch",
                        lambda w, dt, f=lin.dequantize_into_scratch: calls.append(w.shape) or f(w, dt))
    g = torch.Generator().manual_seed(42)
    big = quantize_weight(torch.randn(37, 100, generator=g), kind).to(dev)
    small = quantize_weight(torch.randn(20, 100, generator=g), kind).to(dev)
    bias = torch.randn(37, generator=g)
    tol = ATOL[torch.bfloat16]
    for m, w, b in ((9, big, bias), (9, small, None), (9, big, None), (7, big, bias)):  # the scratch is reused
        x = torch.randn(m, 100, generator=g).to(torch.bfloat16)
        ref64 = REF.linear(x.double(), w.to("cpu"), None if b is None else b.double())
        same = REF.linear(x.to(dev), w, None if b is None else b.to(dev))
        got = v12.linear(x.to(dev), w, None if b is None else b.to(dev))
        assert got.shape == (m, w.shape[0]) and got.dtype == torch.bfloat16
        assert_close_to_fp64(got, same, ref64, tol * max(1.0, ref64.abs().max().item()))
    native_fp8 = kind == "fp8" and dev != "cpu" and torch.cuda.get_device_capability() >= (8, 9)
    assert len(calls) == (0 if native_fp8 else 3)  # 7 rows: v1's kernel; fp8 tensor cores: the W8A8 kernel
    # the dequantized weight is q * scale rounded once to nearest, as the torch reference's dequantize does (Triton's
    # interpreter rounds bf16 toward zero whatever the kernel asks: within one bf16 ulp there)
    got, want = lin.dequantize_into_scratch(small, torch.bfloat16).cpu(), small.dequantize(torch.bfloat16).cpu()
    if dev == "cpu":
        assert ((got.float() - want.float()).abs() <= want.float().abs() * 2 ** -7).all()
    else:
        assert torch.equal(got, want)


def test_plain_linear_is_cublas_exact(dev):
    x, w = torch.randn(3, 40, device=dev), torch.randn(24, 40, device=dev)
    assert torch.equal(TRI.linear(x, w), F.linear(x, w))


def test_kernels_reject_unsupported_device():
    x = torch.empty(2, 8, device="meta")
    with pytest.raises(TritonUnavailableError, match="meta"):
        TRI.rms_norm(x, torch.empty(8, device="meta"), 1e-5)


def test_verbose_check_reports_indices():
    a = torch.zeros(3, 4)
    b = a.clone()
    b[1, 2] = 1.0
    with pytest.raises(AssertionError, match=r"\(1, 2\)"):
        assert_verbose_allclose(a, b, 1e-3, 0.0)
