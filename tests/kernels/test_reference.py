"""The `torch` reference set against independent formulations (fp64 math, SDPA, complex rotation)."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from tests.kernels.helpers import assert_verbose_allclose, make_paged_kv, rope_tables

REF = get_kernel_set("torch")
DTYPES = [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 123), (7, 256)])
def test_rms_norm_and_fused_add(shape, dtype, atol, rtol):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(*shape, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(shape[1], generator=g)).to(dtype)
    x64 = x.double()
    want = x64 / (x64.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double()
    assert_verbose_allclose(REF.rms_norm(x, w, 1e-6), want, atol, rtol)
    out, res = REF.fused_add_rms_norm(x, r, w, 1e-6)
    assert_verbose_allclose(res, x + r, 0, 0)
    s = (x + r).double()
    assert_verbose_allclose(out, s / (s.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w.double(), atol, rtol)
    assert out.dtype == dtype and res.dtype == dtype


@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_silu_and_mul(dtype, atol, rtol):
    x = torch.randn(5, 2 * 123, generator=torch.Generator().manual_seed(2)).to(dtype)
    g, u = x[:, :123].double(), x[:, 123:].double()
    assert_verbose_allclose(REF.silu_and_mul(x), g * torch.sigmoid(g) * u, atol, rtol)
    with pytest.raises(ValueError, match="even"):
        REF.silu_and_mul(torch.randn(2, 7))


@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_rope_and_cache_matches_complex_rotation_and_writes_slots(dtype, atol, rtol):
    t, hq, hkv, d, bs = 6, 6, 2, 16, 4
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(t, h, d, generator=g).to(dtype) for h in (hq, hkv, hkv))
    positions = torch.tensor([0, 1, 2, 17, 40, 63])
    slots = torch.tensor([5, 6, -1, 0, 11, 3])
    cos, sin = rope_tables(64, d)
    kc = torch.zeros(3, bs, hkv, d, dtype=dtype)
    vc = torch.zeros_like(kc)
    q_out, k_out = REF.rope_and_cache(q, k, v, positions, cos, sin, kc, vc, slots)

    def complex_rot(x):
        z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
        z = z * torch.polar(torch.ones_like(cos[positions].double()), torch.atan2(sin[positions], cos[positions]).double())[:, None]
        return torch.cat((z.real, z.imag), -1)

    assert_verbose_allclose(q_out, complex_rot(q), atol, rtol)
    assert_verbose_allclose(k_out, complex_rot(k), atol, rtol)
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k_out[i]) and torch.equal(flat_v[s], v[i])
    written = {s for s in slots.tolist() if s >= 0}
    for s in set(range(flat_k.shape[0])) - written:
        assert not flat_k[s].any() and not flat_v[s].any(), f"slot {s} written but not in slot_mapping"


def _sdpa_masked(q, k, v, scale):
    # q: [n, Hq, D], k/v: [L, Hkv, D] contiguous; causal with the n queries at the end of the L positions.
    n, hq, _ = q.shape
    length, hkv, _ = k.shape
    k = k.repeat_interleave(hq // hkv, 1)
    v = v.repeat_interleave(hq // hkv, 1)
    mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1).double(), k.transpose(0, 1).double(),
                                       v.transpose(0, 1).double(), attn_mask=mask, scale=scale)
    return o.transpose(0, 1)


@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 3e-2, 3e-2)])
def test_prefill_attention_with_cached_prefix_matches_sdpa(dtype, atol, rtol):
    ctx, qlens = [1, 63, 64, 65, 130], [1, 63, 10, 1, 66]  # full prefills, prefix hits, chunked continuation
    hq, hkv, d, bs = 6, 2, 16, 16
    k_cache, v_cache, tables, ks, vs = make_paged_kv(ctx, hkv, d, bs, dtype, "cpu", seed=4)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(5)).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    out = REF.prefill_attention(q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5)
    for b in range(len(ctx)):
        s, e = cu[b].item(), cu[b + 1].item()
        assert_verbose_allclose(out[s:e], _sdpa_masked(q[s:e], ks[b], vs[b], d ** -0.5), atol, rtol)


@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_decode_attention_matches_prefill_with_one_token(dtype, atol, rtol):
    ctx = [1, 63, 64, 65, 200]
    hq, hkv, d, bs = 12, 4, 32, 64
    k_cache, v_cache, tables, ks, vs = make_paged_kv(ctx, hkv, d, bs, dtype, "cpu", seed=6)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(7)).to(dtype)
    lens = torch.tensor(ctx, dtype=torch.int32)
    out = REF.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    for b in range(len(ctx)):
        assert_verbose_allclose(out[b:b + 1], _sdpa_masked(q[b:b + 1], ks[b], vs[b], 0.125), atol, rtol)
    cu = torch.arange(len(ctx) + 1, dtype=torch.int32)
    assert_verbose_allclose(out, REF.prefill_attention(q, k_cache, v_cache, tables, cu, lens, 0.125), atol, rtol)


def test_attention_rejects_bad_shapes():
    from sits.kernels.paged import PagedAttentionError
    kc = torch.zeros(4, 16, 3, 8)
    with pytest.raises(PagedAttentionError, match="multiple"):
        REF.paged_decode_attention(torch.zeros(1, 4, 8), kc, kc, torch.zeros(1, 2, dtype=torch.int32),
                                   torch.ones(1, dtype=torch.int32), 1.0)
    with pytest.raises(PagedAttentionError, match="context_lens"):
        REF.paged_decode_attention(torch.zeros(2, 6, 8), kc, kc, torch.zeros(2, 2, dtype=torch.int32),
                                   torch.ones(3, dtype=torch.int32), 1.0)


@pytest.mark.parametrize("kind, rel", [("int8", 0.5 / 127), ("fp8", 2 ** -4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantized_linear(kind, rel, dtype):
    g = torch.Generator().manual_seed(8)
    w = torch.randn(37, 64, generator=g)
    w[3] = 0.0  # an all-zero row must survive
    qw = quantize_weight(w, kind)
    amax = w.abs().amax(1, keepdim=True)
    assert ((qw.dequantize() - w).abs() <= rel * amax + 1e-12).all()
    assert (qw.dequantize()[3] == 0).all()
    x = torch.randn(5, 64, generator=g).to(dtype)
    b = torch.randn(37, generator=g)
    want = F.linear(x.double(), qw.dequantize(torch.float64), b.double())
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    got = REF.linear(x, qw, b)
    assert got.dtype == dtype and got.shape == (5, 37)
    assert_verbose_allclose(got, want, tol, tol)
    assert_verbose_allclose(REF.linear(x, w.to(dtype)), F.linear(x.double(), w.to(dtype).double()), tol, tol)
    with pytest.raises(ValueError, match="does not match"):
        REF.linear(torch.randn(2, 63), qw)
