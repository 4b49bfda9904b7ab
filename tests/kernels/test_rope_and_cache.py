"""RoPE fused with the KV-cache write (`rope_and_cache`; kernels/rope_and_cache.py): the torch reference against a
complex rotation, the Triton kernel on CPU and GPU (sentinel slots untouched, views of a fused qkv), and at a
Llama-3-8B shape on a GPU; the write into FP8 pages (kernels/kv_fp8.py, triton-v1.3) against e4m3's rounding bound
and the reference's own quantization."""
import pytest
import torch

from sits.kernels import get_kernel_set
from sits.kernels.kv_fp8 import FP8_MAX, Fp8Pages
from sits.kernels.rope_and_cache import write_kv_ref
from tests.kernels.helpers import (ATOL, DTYPES, REF_DTYPES, args_to, assert_close_to_fp64, assert_verbose_allclose,
                                   on_gpu, rope_tables)

REF = get_kernel_set("torch")
TRI = get_kernel_set("triton-v1")
V13 = get_kernel_set("triton-v1.3")


def _sentinel_pages(num_blocks, page, hkv, d, dev):
    """FP8 pages whose every slot holds 7.0 at scale 3.0: must survive where no slot points."""
    pages = Fp8Pages.zeros(num_blocks, page, hkv, d, dev)
    pages.data.view(torch.uint8).fill_(torch.tensor(7.0).to(torch.float8_e4m3fn).view(torch.uint8).item())
    pages.scale.fill_(3.0)
    return pages


# ---- the torch reference against independent fp64 formulations ----

def test_the_wrong_rope_example_writes_fp8_pages_as_the_reference_writes_them():
    # torch-wrong-rope's RoPE (kernels/rope_and_cache.py rope_and_cache_fixed_base_ref) on FP8 pages: bench/
    # correctness_gate.py derives it from fp8 sets; it rotates otherwise, and stores its k like the reference would
    from sits.kernels.rope_and_cache import rope_and_cache_fixed_base_ref
    t, hq, hkv, d = 5, 4, 2, 64
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    positions, slots = torch.arange(t) * 3 + 1, torch.tensor([2, 0, 7, -1, 5])
    cos, sin = rope_tables(64, d, theta=500000.0)   # Llama 3's base: the example hard-codes 10000
    kc, vc = _sentinel_pages(2, 4, hkv, d, "cpu"), _sentinel_pages(2, 4, hkv, d, "cpu")
    q_out, k_out = rope_and_cache_fixed_base_ref(q, k, v, positions, cos, sin, kc, vc, slots)
    kr, vr = _sentinel_pages(2, 4, hkv, d, "cpu"), _sentinel_pages(2, 4, hkv, d, "cpu")
    write_kv_ref(k_out, v, kr, vr, slots)
    for a, b in ((kc, kr), (vc, vr)):
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    right_q, _ = REF.rope_and_cache(q, k, v, positions, cos, sin, *(_sentinel_pages(2, 4, hkv, d, "cpu")
                                                                      for _ in range(2)), slots)
    assert not torch.allclose(q_out, right_q, atol=1e-3)   # still the wrong rotation


@pytest.mark.parametrize("dtype, atol, rtol", REF_DTYPES)
def test_reference_rope_and_cache_matches_complex_rotation_and_writes_slots(dtype, atol, rtol):
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_fp8_write_rounds_each_vector_within_e4m3s_bound(dtype):
    # per (token, kv head): scale = max|x| / 448, the largest element exact, every element within half an e4m3 step:
    # 2^-4 |x|, or 2^-10 scale among the subnormals (kernels/kv_fp8.py)
    t, hq, hkv, d = 9, 4, 2, 64
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(t, h, d, generator=g).to(dtype) for h in (hq, hkv, hkv))
    k[0, 0] = 0.0                                   # an all-zero vector: scale 1, data 0
    v[1, 1] *= 1e-3                                 # a small vector keeps its relative precision
    v[2, 0, 5] = 300.0                              # an outlier costs only its own vector's precision
    positions = torch.arange(t) * 11
    slots = torch.tensor([3, 0, 9, -1, 17, 4, 30, 31, 12])
    cos, sin = rope_tables(128, d)
    kc, vc = _sentinel_pages(4, 8, hkv, d, "cpu"), _sentinel_pages(4, 8, hkv, d, "cpu")
    _, k_out = REF.rope_and_cache(q, k, v, positions, cos, sin, kc, vc, slots)
    for pages, x in ((kc, k_out), (vc, v)):
        data, scale = pages.data.view(-1, hkv, d), pages.scale.view(-1, hkv)
        for i, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            xi = x[i].double()
            amax = xi.abs().amax(-1)
            assert torch.equal(scale[s], torch.where(amax > 0, amax.float() / FP8_MAX, 1.0)), (i, s)
            got = data[s].double() * scale[s].double()[:, None]
            bound = 2.0 ** -4 * xi.abs() + 2.0 ** -10 * scale[s].double()[:, None] + 1e-12
            assert ((got - xi).abs() <= bound).all(), (i, s, (got - xi).abs().max().item())
            assert torch.allclose(got.abs().amax(-1), amax, rtol=1e-6, atol=0), (i, s)
        untouched = sorted(set(range(32)) - {s for s in slots.tolist() if s >= 0})
        assert (data[untouched].float() == 7.0).all() and (scale[untouched] == 3.0).all()
    assert not kc.data.view(-1, hkv, d)[3, 0].float().any()   # token 0's zero k vector (rotated: still zero)


# ---- Triton against the reference: CPU through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU ----

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
    q_out, k_out = TRI.rope_and_cache(*args_to(args, device=dev), kc, vc, slots.to(dev))
    q64, k64 = REF.rope_and_cache(*args_to(args, dtype=torch.float64), torch.zeros(4, 8, hkv, d, dtype=torch.float64),
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
    q_out, k_out = TRI.rope_and_cache(*args_to((q, k, v, positions, cos, sin), device=dev), *caches[:2], slots.to(dev))
    q_ref, k_ref = REF.rope_and_cache(*args_to((q.contiguous(), k.contiguous(), v.contiguous(), positions, cos, sin),
                                           device=dev), *caches[2:], slots.to(dev))
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0], caches[2], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[1], caches[3])  # v is copied as is


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, hq, hkv, d", [(7, 6, 2, 64), (3, 5, 5, 16), (1, 3, 1, 128)])
def test_rope_and_cache_fp8(dev, t, hq, hkv, d, dtype):
    g = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(t, h, d, generator=g).to(dtype) for h in (hq, hkv, hkv))
    positions = torch.randint(0, 300, (t,), generator=g)
    slots = torch.randperm(4 * 8, generator=g)[:t]
    if t > 1:
        slots[t // 2] = -1  # not written (a single token is)
    cos, sin = rope_tables(300, d)
    kc, vc = _sentinel_pages(4, 8, hkv, d, dev), _sentinel_pages(4, 8, hkv, d, dev)
    args = (q, k, v, positions, cos, sin)
    q_out, k_out = V13.rope_and_cache(*args_to(args, device=dev), kc, vc, slots.to(dev))
    kr, vr = _sentinel_pages(4, 8, hkv, d, "cpu"), _sentinel_pages(4, 8, hkv, d, "cpu")
    q_same, k_same = REF.rope_and_cache(*args, kr, vr, slots)
    q64, k64 = REF.rope_and_cache(*args_to(args, dtype=torch.float64), _sentinel_pages(4, 8, hkv, d, "cpu"),
                                  _sentinel_pages(4, 8, hkv, d, "cpu"), slots)
    atol = ATOL[dtype] * 4
    assert_close_to_fp64(q_out, q_same, q64, atol)
    assert_close_to_fp64(k_out, k_same, k64, atol)
    # the pages: the kernel's dequantized values at most ~2x the reference's own quantization error from the exact
    # rotated k (and v); in fp32, where both quantize the same numbers, the same bytes and scales
    written = slots[slots >= 0]
    rows = (slots >= 0).nonzero().flatten()
    for got, same, exact in ((kc, kr, k64), (vc, vr, v.double())):
        deq = got.to("cpu").dequantize(torch.float64).view(-1, hkv, d)[written]
        deq_same = same.dequantize(torch.float64).view(-1, hkv, d)[written]
        assert_close_to_fp64(deq, deq_same, exact[rows], atol)
        if dtype == torch.float32:
            assert torch.equal(got.data.cpu().view(torch.uint8), same.data.view(torch.uint8))
            assert torch.equal(got.scale.cpu(), same.scale)
        untouched = sorted(set(range(32)) - set(written.tolist()))
        assert (got.data.cpu().view(-1, hkv, d)[untouched].float() == 7.0).all()
        assert (got.scale.view(-1, hkv)[untouched] == 3.0).all()


def test_rope_and_cache_fp8_rounds_like_torch_at_every_e4m3_value(dev):
    # v vectors whose largest element is 448 have scale 1: the kernel stores e4m3(x) of the other elements exactly as
    # torch's conversion does (ties to even) for every finite e4m3 value, each midpoint and the floats beside them --
    # under the interpreter through the kernel's own rounding (its fp32 -> e4m3 conversion drops carries)
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    values = torch.cat([grid, mids, mids.nextafter(torch.tensor(-1e9)), mids.nextafter(torch.tensor(1e9))])
    d = 128
    t = -(-values.numel() // (d - 1))
    v = torch.zeros(t * (d - 1))
    v[:values.numel()] = values
    v = torch.cat([torch.full((t, 1), FP8_MAX), v.view(t, d - 1)], dim=1).clamp(-FP8_MAX, FP8_MAX)[:, None, :]
    q, k = torch.randn(t, 1, d), torch.randn(t, 1, d)
    cos, sin = rope_tables(t, d)
    kc, vc = Fp8Pages.zeros(t, 1, 1, d, dev), Fp8Pages.zeros(t, 1, 1, d, dev)
    V13.rope_and_cache(*args_to((q, k, v, torch.arange(t), cos, sin), device=dev), kc, vc, torch.arange(t).to(dev))
    assert (vc.scale.cpu() == 1.0).all()
    got, want = vc.data.cpu().view(torch.uint8).view(t, d), v.view(t, d).to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (got != want).nonzero()
    assert not len(bad), [(v.view(t, d)[i, j].item(), got[i, j].item(), want[i, j].item()) for i, j in bad[:8].tolist()]


# ---- on a GPU at Llama-3-8B shapes (marked gpu, skipped without CUDA) ----

@on_gpu
def test_rope_and_cache_llama_shape():
    t, hq, hkv, d = 300, 32, 8, 128
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(t, h, d, generator=g).bfloat16().cuda() for h in (hq, hkv, hkv))
    pos = torch.randint(0, 8192, (t,), generator=g).cuda()
    slots = torch.randperm(64 * 64, generator=g)[:t].cuda()
    cos, sin = (c.cuda() for c in rope_tables(8192, d, 500000.0))
    kc, vc = torch.zeros(64, 64, hkv, d, dtype=torch.bfloat16, device="cuda"), None
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    qo, ko = TRI.rope_and_cache(q, k, v, pos, cos, sin, kc, vc, slots)
    qr, kr = REF.rope_and_cache(q, k, v, pos, cos, sin, kc2, vc2, slots)
    # both compute in fp32 and round once: identical up to fp32 rounding of the products
    assert (qo.float() - qr.float()).abs().max() <= 2 ** -6
    assert (kc.float() - kc2.float()).abs().max() <= 2 ** -6 and torch.equal(vc, vc2)


@on_gpu
def test_rope_and_cache_fp8_llama_shape():
    t, hq, hkv, d = 300, 32, 8, 128
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(t, h, d, generator=g).bfloat16().cuda() for h in (hq, hkv, hkv))
    pos = torch.randint(0, 8192, (t,), generator=g).cuda()
    slots = torch.randperm(64 * 64, generator=g)[:t].cuda()
    cos, sin = (c.cuda() for c in rope_tables(8192, d, 500000.0))
    kc, vc, kr, vr = (Fp8Pages.zeros(64, 64, hkv, d, "cuda") for _ in range(4))
    qo, ko = V13.rope_and_cache(q, k, v, pos, cos, sin, kc, vc, slots)
    qr, kr_out = REF.rope_and_cache(q, k, v, pos, cos, sin, kr, vr, slots)
    assert (qo.float() - qr.float()).abs().max() <= 2 ** -6
    # v is quantized from the same numbers with the GPU's e4m3 rounding (cvt.rn.satfinite, ties to even, as torch's),
    # but Triton divides fp32 with div.full (within 2 ulp, not IEEE): a value on a rounding boundary may land one e4m3
    # step away, and a scale one fp32 ulp (the H200 run of 2026-12-04 was not byte for byte); k from a rotation that
    # may differ by one bf16 ulp (FMA contraction), and with it a vector's scale
    torch.testing.assert_close(vc.scale, vr.scale, rtol=2 ** -22, atol=0)
    same_v = (vc.data.view(torch.uint8) == vr.data.view(torch.uint8)).float().mean().item()
    assert same_v >= 0.99, same_v
    step = 2.0 ** (torch.floor(torch.log2(vr.data.float().abs().clamp(min=2 ** -6))) - 3)   # e4m3's spacing there
    assert ((vc.data.float() - vr.data.float()).abs() <= step).all()
    same_k = (kc.data.view(torch.uint8) == kr.data.view(torch.uint8)).float().mean().item()
    assert same_k >= 0.95, same_k
    torch.testing.assert_close(kc.scale, kr.scale, rtol=2 ** -7, atol=0)


def test_fp8_pages_dequantize_exactly_on_cpu_and_gather_repeated_blocks_once():
    # the CPU path looks every byte up in a table instead of torch's element-by-element e4m3 conversion: the same
    # values for every finite byte; take_blocks dequantizes each distinct block once and still returns one per index
    from sits.kernels.kv_fp8 import FP8_DTYPE, dequantize, take_blocks
    codes = torch.arange(256, dtype=torch.uint8)
    finite = ~torch.isnan(codes.view(FP8_DTYPE).to(torch.float32))
    data = codes[finite].view(FP8_DTYPE).reshape(1, 1, 2, 127)
    scale = torch.tensor([[[0.5, 3.0]]])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        want = (data.to(torch.float64) * scale.to(torch.float64)[..., None]).to(dtype)
        assert torch.equal(dequantize(data, scale, dtype), want), dtype
    g = torch.Generator().manual_seed(3)
    pages = Fp8Pages(torch.randn(6, 4, 2, 8, generator=g).mul(50).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE),
                     torch.rand(6, 4, 2, generator=g) + 0.1)
    index = torch.tensor([[3, 0, 0, 0], [5, 3, 1, 0]])   # padding repeats block 0
    got = take_blocks(pages, index, torch.float32)
    assert got.shape == (2, 4, 4, 2, 8)
    assert torch.equal(got, pages.dequantize(torch.float32)[index])
