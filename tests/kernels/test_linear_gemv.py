"""triton-v1.9's GEMV (kernels/linear_gemv.py): int8/fp8 weights times one row on the CUDA cores, and the fused
gate/up projection with v1.7's SiLU-and-mul epilogue. On CPU through Triton's interpreter: against fp64 within the
bound of torch's own result in x's precision, the same bits for any BLOCK_N (a row's sum never sees another row's),
more rows and plain weights routed to triton-v1.8 bit for bit; on a GPU at Llama-3-8B's four weight shapes and with
every autotuning candidate."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.linear import linear_ref
from sits.kernels.linear_gemv import (CANDIDATES, GEMV_MAX_M, LOADS, gemv, linear_gemv, linear_gemv_bcast,
                                     linear_silu_and_mul_gemv, linear_silu_and_mul_gemv_bcast)
from sits.kernels.silu_and_mul import silu_and_mul_ref
from tests.kernels.helpers import ATOL, assert_close_to_fp64, on_gpu

V18, V19, V111 = get_kernel_set("triton-v1.8"), get_kernel_set("triton-v1.9"), get_kernel_set("triton-v1.11")


def _ref64(x, w, bias=None):
    y = F.linear(x.double(), w.dequantize(torch.float64))
    return y if bias is None else y + bias.double()


def test_the_set_serves_it_and_keeps_v18s_other_ops():
    assert V19.linear is linear_gemv and V19.linear_silu_and_mul is linear_silu_and_mul_gemv
    assert set(V19.overrides) == {"linear", "linear_silu_and_mul"}
    assert all(getattr(V19, op) is getattr(V18, op) for op in V18.ops() if op not in V19.overrides)


def test_v111_serves_the_gemv_with_broadcast_x_and_keeps_v19s_other_ops():
    assert V111.linear is linear_gemv_bcast and V111.linear_silu_and_mul is linear_silu_and_mul_gemv_bcast
    assert set(V111.overrides) == {"linear", "linear_silu_and_mul"}
    assert all(getattr(V111, op) is getattr(V19, op) for op in V19.ops() if op not in V111.overrides)


@pytest.mark.parametrize("op", [linear_gemv, linear_gemv_bcast])
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,k", [(96, 160), (128, 128), (10, 100)])   # partial K and N tiles; whole ones; tiny N
def test_one_row_against_fp64(dev, op, kind, dtype, n, k):
    g = torch.Generator().manual_seed(n + k)
    w = quantize_weight(torch.randn(n, k, generator=g) * k ** -0.5, kind).to(dev)
    x = (torch.randn(1, k, generator=g) * 3).to(dtype).to(dev)
    bias = torch.randn(n, generator=g).to(dev)
    got = op(x, w, bias)
    assert got.shape == (1, n) and got.dtype == dtype
    ref64 = _ref64(x, w, bias)
    assert_close_to_fp64(got, linear_ref(x, w, bias), ref64, ATOL[dtype] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(op(x, w, bias), got)   # no atomics, no split-K: the same bits again


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_the_tile_width_does_not_change_a_rows_bits(dev, kind):
    g = torch.Generator().manual_seed(5)
    n, k = 70, 192   # N a multiple of no tile width: the last tile wraps around
    w = quantize_weight(torch.randn(n, k, generator=g) * k ** -0.5, kind).to(dev)
    x = torch.randn(1, k, generator=g).bfloat16().to(dev)
    outs = []
    for bn in (2, 4, 8, 32):
        o = torch.full((1, n), float("nan"), dtype=torch.bfloat16, device=dev)
        gemv(x, w, None, o, config=dict(BLOCK_N=bn, BLOCK_K=64))
        outs.append(o)
    assert not outs[0].isnan().any()
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert_close_to_fp64(outs[0], linear_ref(x, w), _ref64(x, w), ATOL[torch.bfloat16] * 4)


@pytest.mark.parametrize("kind", ["int8", "fp8", "plain"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("narrow", [False, True])
def test_x_loaded_as_broadcast_tiles_and_narrow_weight_loads(dev, kind, norm, narrow):
    # X_BCAST and NARROW_W (triton-v1.11 serves them without NORM) change how x and the weights reach one layout: X_BCAST alone
    # not a sum (the same bits); NARROW_W also the tile's layout, so the order of the fp32 sums (within fp64's bound)
    g = torch.Generator().manual_seed(9)
    n, k = 40, 160   # a partial K tile
    w = torch.randn(n, k, generator=g) * k ** -0.5
    w = (quantize_weight(w, kind) if kind != "plain" else w.bfloat16()).to(dev)
    x, r = (torch.randn(2, 1, k, generator=g).bfloat16().to(dev))
    nw = (1 + 0.1 * torch.randn(k, generator=g)).bfloat16().to(dev)
    outs = []
    for bcast in (False, True):
        o, res = torch.empty(1, n, dtype=torch.bfloat16, device=dev), torch.empty_like(r)
        gemv(x, w, None, o, norm=(r, nw, 1e-5, res) if norm else None,
             config=dict(BLOCK_N=8, BLOCK_K=64, X_BCAST=bcast, NARROW_W=narrow and bcast))
        outs.append((o, res))
    if narrow:   # the fp32 sums in another order, then one bf16 rounding: at most a bf16 step apart
        a, b = outs[1][0].float(), outs[0][0].float()
        assert torch.allclose(a, b, rtol=2 ** -7, atol=1e-6 * b.abs().max().item()), (a - b).abs().max()
    else:
        assert torch.equal(outs[0][0], outs[1][0])
    if norm:
        assert torch.equal(outs[0][1], outs[1][1]) and torch.equal(outs[0][1], V18.fused_add_rms_norm(x, r, nw, 1e-5)[1])


def test_more_rows_and_fp32_plain_weights_are_v18s_linear(dev):
    g = torch.Generator().manual_seed(6)
    w = quantize_weight(torch.randn(48, 64, generator=g), "int8").to(dev)
    x = torch.randn(GEMV_MAX_M + 2, 64, generator=g).bfloat16().to(dev)
    assert torch.equal(linear_gemv(x, w), V18.linear(x, w))
    x32 = torch.randn(1, 64, generator=g).to(dev)
    plain32 = torch.randn(48, 64, generator=g).to(dev)
    assert torch.equal(linear_gemv(x32, plain32), V18.linear(x32, plain32))   # fp32 plain weights: cuBLAS / torch
    mixed = torch.randn(48, 64, generator=g).half().to(dev)   # weights not in x's dtype: as v1.8 (it casts them)
    assert torch.equal(linear_gemv(x[:1], mixed), V18.linear(x[:1], mixed))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_plain_weights_in_xs_dtype_one_row_against_fp64(dev, dtype):
    g = torch.Generator().manual_seed(8)
    n, k = 72, 160
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype).to(dev)
    x = torch.randn(1, k, generator=g).to(dtype).to(dev)
    bias = torch.randn(n, generator=g).to(dtype).to(dev)
    got = linear_gemv(x, w, bias)
    ref64 = F.linear(x.double(), w.double(), bias.double())
    assert_close_to_fp64(got, linear_ref(x, w, bias), ref64, ATOL[dtype] * max(1.0, ref64.abs().max().item()))
    fused = linear_silu_and_mul_gemv(x, w, bias)
    assert torch.equal(fused, V18.silu_and_mul(got))


def test_any_leading_shape_and_strided_rows(dev):
    g = torch.Generator().manual_seed(7)
    w = quantize_weight(torch.randn(40, 64, generator=g), "fp8").to(dev)
    x = torch.randn(1, 1, 64, generator=g).to(dev)
    assert linear_gemv(x, w).shape == (1, 1, 40)
    assert torch.equal(linear_gemv(x, w)[0], linear_gemv(x[0], w))
    wide = torch.randn(1, 100, generator=g).to(dev)[:, :64]
    assert torch.equal(linear_gemv(wide, w), linear_gemv(wide.contiguous(), w))


@pytest.mark.parametrize("kind", ["int8", "fp8", "plain"])
@pytest.mark.parametrize("h,i", [(96, 40), (128, 32)])
@pytest.mark.parametrize("ks", [V19, V111], ids=lambda ks: ks.name)
def test_fused_gate_up_against_the_two_ops(dev, ks, kind, h, i):
    g = torch.Generator().manual_seed(h + i)
    w = torch.randn(2 * i, h, generator=g) * h ** -0.5
    w = (quantize_weight(w, kind) if kind != "plain" else w.bfloat16()).to(dev)
    x = (torch.randn(1, h, generator=g) * 3).bfloat16().to(dev)
    bias = torch.randn(2 * i, generator=g).to(dev)
    bias[0] = -300.0   # a saturated gate: silu -> -0
    bias = bias.bfloat16() if kind == "plain" else bias
    got = ks.linear_silu_and_mul(x, w, bias)
    assert got.shape == (1, i) and got.dtype == torch.bfloat16
    # gate and up each within one bf16 rounding of fp64, as the two ops' stored [T, 2I] output is
    gu = ks.linear(x, w, bias)
    assert torch.equal(got, V18.silu_and_mul(gu))   # as kernels/silu_and_mul.py computes it
    ref64 = silu_and_mul_ref(_ref64(x, w, bias) if kind != "plain" else F.linear(x.double(), w.double(),
                                                                                  bias.double()))
    assert_close_to_fp64(got, V18.linear_silu_and_mul(x, w, bias), ref64,
                         ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    more = (torch.randn(3, h, generator=g) * 3).bfloat16().to(dev)
    assert torch.equal(ks.linear_silu_and_mul(more, w, bias), V18.linear_silu_and_mul(more, w, bias))


def test_errors_are_clear(dev):
    w = quantize_weight(torch.randn(48, 64), "int8").to(dev)
    with pytest.raises(ValueError, match=r"does not match weight \[N, K\]"):
        linear_gemv(torch.randn(1, 63).to(dev), w)
    with pytest.raises(ValueError, match="bias"):
        linear_gemv(torch.randn(1, 64).to(dev), w, torch.zeros(5).to(dev))
    with pytest.raises(ValueError, match=r"must be \[2 x I, H\]"):
        linear_silu_and_mul_gemv(torch.randn(1, 64).to(dev), quantize_weight(torch.randn(47, 64), "int8").to(dev))


LLAMA = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
needs_fp8 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                               reason="fp8 conversion needs sm_89+")


@on_gpu
@needs_fp8
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("shape", list(LLAMA))
@pytest.mark.parametrize("ks", [V19, V111], ids=lambda ks: ks.name)
def test_gpu_at_llamas_weight_shapes(ks, kind, shape):
    n, k = LLAMA[shape]
    g = torch.Generator().manual_seed(n + k)
    w = quantize_weight(torch.randn(n, k, generator=g) * k ** -0.5, kind).to("cuda")
    x = torch.randn(1, k, generator=g).bfloat16().cuda()
    got = ks.linear(x, w)
    ref64 = _ref64(x, w)
    assert_close_to_fp64(got, linear_ref(x, w), ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(ks.linear(x, w), got)
    if shape == "gate_up" and ks is V19:   # tuned apart from the plain GEMV: its K tile, so its sum order, may differ
        fused = linear_silu_and_mul_gemv(x, w)
        ref64 = silu_and_mul_ref(ref64)
        assert_close_to_fp64(fused, V18.silu_and_mul(got), ref64,
                             ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
        o = torch.empty(1, n // 2, dtype=torch.bfloat16, device="cuda")   # at one config: the two ops' bits
        g1 = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
        gemv(x, w, None, o, silu_epi=True, config=dict(BLOCK_N=16, BLOCK_K=512, num_warps=8))
        gemv(x, w, None, g1, config=dict(BLOCK_N=16, BLOCK_K=512, num_warps=8))
        assert torch.equal(o, V18.silu_and_mul(g1))


@on_gpu
@needs_fp8
@pytest.mark.parametrize("kind", ["int8", "fp8", "plain"])
@pytest.mark.parametrize("loads", ["vector", "bcast"])   # triton-v1.9's, v1.11's (8-bit weights: bcast-narrow)
@pytest.mark.parametrize("cfg", CANDIDATES, ids=lambda c: f"N{c.kwargs['BLOCK_N']}K{c.kwargs['BLOCK_K']}w{c.num_warps}")
def test_gpu_every_autotuning_candidate(kind, loads, cfg):
    n, k = 4096, 14336
    g = torch.Generator().manual_seed(3)
    w = torch.randn(n, k, generator=g) * k ** -0.5
    w = (quantize_weight(w, kind) if kind != "plain" else w.bfloat16()).to("cuda")
    x = torch.randn(1, k, generator=g).bfloat16().cuda()
    o = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    flags = LOADS[loads + ("-narrow" if loads == "bcast" and kind != "plain" else "")]
    gemv(x, w, None, o, config=dict(**cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **flags))
    if kind == "plain":
        ref64 = F.linear(x.double(), w.double())
        assert_close_to_fp64(o, linear_ref(x, w), ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
        return
    ref64 = _ref64(x, w)
    assert_close_to_fp64(o, linear_ref(x, w), ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


@on_gpu
def test_gpu_int8_conversions_are_exact_for_every_byte_in_every_lane():
    # column j of W holds all 256 int8 values (row n: n - 128) for j in 0..3, the four lanes of a packed register;
    # x = e_j reads column j back exactly (scale 1) through each conversion
    from sits.kernels.linear_gemv import INT8_MAGIC, INT8_VIA_BF16
    q = torch.zeros(256, 64, dtype=torch.int8)
    q[:, :4] = (torch.arange(256) - 128).to(torch.int8)[:, None]
    w = quantize_weight(torch.zeros(256, 64), "int8")
    w = type(w)(q.cuda(), torch.ones(256, device="cuda"), "int8")
    for j in range(4):
        x = torch.zeros(1, 64, device="cuda", dtype=torch.float32)
        x[0, j] = 1.0
        for conv in (INT8_VIA_BF16, INT8_MAGIC):
            o = torch.empty(1, 256, device="cuda", dtype=torch.float32)
            gemv(x, w, None, o, config=dict(BLOCK_N=8, BLOCK_K=64, num_warps=4, INT8_CONV=conv))
            assert torch.equal(o[0], (torch.arange(256, device="cuda") - 128).float()), (j, conv)
