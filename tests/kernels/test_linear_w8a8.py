"""triton-v1.4's linear (kernels/linear_w8a8.py): fp8 weights by row count -- v1.3's weight-only kernel for few rows,
then e4m3 activations (one scale per row) times the fp8 weights. On CPU through Triton's interpreter (the Triton W8A8
GEMM at every W8A8 row count), bit-exact against the torch twin of the same math; on a GPU, at Llama-3-8B shapes
(torch._scaled_mm, then the Triton GEMM), against fp64 within the bound of that math done in torch; everything that is
not an fp8 weight is triton-v1.3's linear unchanged."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.fp8_gemm import quantize_rows
from sits.kernels.linear_dequant import linear_dequant_many_rows
from sits.kernels.linear_w8a8 import (SCALED_MM_MAX_M, WEIGHT_ONLY_MAX_M, linear_w8a8, linear_w8a8_gemm,
                                      linear_w8a8_ref)
from tests.kernels.helpers import ATOL, assert_close_to_fp64, assert_verbose_allclose, on_gpu

V14 = get_kernel_set("triton-v1.4")


def _fp8(n, k, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k ** -0.5
    w[1] = 0.0  # an all-zero weight row
    return quantize_weight(w, "fp8").to(device), g


def test_the_set_serves_it():
    assert V14.linear is linear_w8a8
    assert get_kernel_set("triton-v1.3").linear is linear_dequant_many_rows   # the released set is unchanged
    assert V14.kv_cache_dtypes == ("auto", "fp8")


@pytest.mark.parametrize("m", [1, WEIGHT_ONLY_MAX_M, WEIGHT_ONLY_MAX_M + 1, 70])
def test_cpu_is_the_torch_twin_bit_for_bit(dev, m):
    qw, g = _fp8(40, 200, 7, dev)   # odd K: a partial last tile
    x = torch.randn(m, 200, generator=g).to(dev)
    x[0] = 0.0   # a row of zeros: scale 1, output 0 (+ bias)
    bias = torch.randn(40, generator=g).to(dev)
    got = linear_w8a8(x, qw, bias)
    assert got.shape == (m, 40) and got.dtype == torch.float32
    if m <= WEIGHT_ONLY_MAX_M:   # v1.3's weight-only kernel: x exact
        assert torch.equal(got, linear_dequant_many_rows(x, qw, bias))
    else:
        assert_verbose_allclose(got, linear_w8a8_ref(x, qw, bias), 1e-5, 1e-5)
    assert torch.equal(got[0], bias)
    fixed = linear_w8a8_gemm(x, qw, bias, block_m=16, block_n=16, block_k=32)   # another tiling, the same math
    assert_verbose_allclose(fixed, linear_w8a8_ref(x, qw, bias), 1e-5, 1e-5)


def test_the_activation_rounding_is_e4m3s(dev):
    # values just below a power of two round up into the next binade (the carry the interpreter's cast drops)
    # and subnormals (below 2^-6) to multiples of 2^-9; every value of e4m3's range, against torch's cast
    x = torch.tensor([[127.9, -127.9, 447.0, 1.0, -3.3e-3, 0.0, 250.0, 15.99]], device=dev)
    xq, xs = quantize_rows(x)
    assert torch.equal(xs, torch.tensor([447.0 / 448.0], device=dev))
    want = (x / xs[:, None]).to(torch.float8_e4m3fn)
    assert torch.equal(xq.view(torch.uint8), want.view(torch.uint8))
    sweep = torch.cat([torch.linspace(-448, 448, 4001), torch.linspace(-0.03, 0.03, 999)]).to(dev)[None, :]
    xq, xs = quantize_rows(sweep)
    assert xs.item() == 1.0
    assert torch.equal(xq.float(), sweep.to(torch.float8_e4m3fn).float())   # (-0 may come out +0: the same product)


def test_what_is_not_an_fp8_weight_is_v13s_linear(dev):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 64, generator=g).to(dev)
    plain = torch.randn(24, 64, generator=g).to(dev)
    q8 = quantize_weight(plain.cpu(), "int8").to(dev)
    for w in (plain, q8):
        assert torch.equal(linear_w8a8(x, w), linear_dequant_many_rows(x, w))


def test_errors_are_clear():
    qw, _ = _fp8(8, 32, 1)
    with pytest.raises(ValueError, match="does not match"):
        linear_w8a8(torch.randn(40, 31), qw)
    with pytest.raises(ValueError, match="fp8 QuantizedWeight"):
        linear_w8a8_gemm(torch.randn(2, 32), torch.randn(8, 32), block_m=16, block_n=16, block_k=32)


def test_fp8_activations_cost_what_e4m3_costs():
    # the accuracy W8A8 trades: e4m3 activations (3 mantissa bits) against the same fp8 weights with exact activations
    qw, g = _fp8(256, 1024, 5)
    x = torch.randn(64, 1024, generator=g)
    exact = F.linear(x.double(), qw.dequantize(torch.float64))
    rel = ((linear_w8a8_ref(x, qw).double() - exact).norm() / exact.norm()).item()
    assert 0.01 < rel < 0.04   # e4m3's unit roundoff is 2^-4: ~2.5 % rms; not free, which is why the set is canaried


# ---- GPU: Llama-3-8B shapes, the autotuned paths ----

LLAMA = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@on_gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 tensor cores need sm_89+")
@pytest.mark.parametrize("m", [1, WEIGHT_ONLY_MAX_M, WEIGHT_ONLY_MAX_M + 1, 300, SCALED_MM_MAX_M + 1, 2048])
@pytest.mark.parametrize("n, k", LLAMA)
def test_gpu_w8a8_at_llama_shapes(m, n, k):
    qw, g = _fp8(n, k, 11, "cuda")
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    bias = torch.randn(n, generator=g).cuda()
    got = linear_w8a8(x, qw, bias)
    ref64 = F.linear(x.double(), qw.dequantize(torch.float64), bias.double())
    same = linear_w8a8_ref(x, qw, bias)   # e4m3 activations, one scale per row: what the bound allows
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(linear_w8a8(x, qw, bias), got)   # again (the tuned launcher, cuBLASLt): the same bits
    if m > WEIGHT_ONLY_MAX_M:   # the same math: apart from an activation the GPU's division puts one e4m3 step away
        # (about 1 in 400,000 outputs at K 14336 on the H200), the products differ only in summation order
        far = ((got.float() - same.float()).abs() > 2e-2 + 2e-2 * same.float().abs()).float().mean().item()
        assert far < 1e-4, far


# ---- triton-v1.5 (kernels/linear_fp8_f16.py): few rows of a bf16 model through fp16 dots ----

@pytest.mark.parametrize("m", [1, 5, 16, 17, WEIGHT_ONLY_MAX_M])   # 17 and 32: v1.4's path
@pytest.mark.parametrize("x_scale", [1.0, 1e6])   # 1e6: past fp16's range, lowered per row and tile in-kernel
def test_v15_fp16_gemv(dev, m, x_scale):
    from sits.kernels.linear_fp8_f16 import linear_fp8_f16
    qw, g = _fp8(40, 200, 9, dev)
    x = (torch.randn(m, 200, generator=g) * x_scale).bfloat16().to(dev)
    bias = torch.randn(40, generator=g).to(dev)
    got = linear_fp8_f16(x, qw, bias)
    ref64 = F.linear(x.double().cpu(), qw.dequantize(torch.float64).cpu(), bias.double().cpu())
    same = linear_dequant_many_rows(x, qw, bias)   # v1.4's kernel below 33 rows: bf16 dots
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


def test_v15_is_v14_beyond_its_rows_and_dtypes(dev):
    from sits.kernels.linear_fp8_f16 import linear_fp8_f16
    qw, g = _fp8(24, 64, 10, dev)
    from sits.kernels.linear_fp8_f16 import F16_DOT_MAX_M
    for x in (torch.randn(40, 64, generator=g).bfloat16(), torch.randn(F16_DOT_MAX_M + 1, 64, generator=g).bfloat16(),
              torch.randn(3, 64, generator=g),
              torch.randn(3, 64, generator=g).half()):
        x = x.to(dev)
        assert torch.equal(linear_fp8_f16(x, qw), linear_w8a8(x, qw))
    assert get_kernel_set("triton-v1.5").linear is linear_fp8_f16


@on_gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 conversion needs sm_89+")
@pytest.mark.parametrize("m", [1, 16, WEIGHT_ONLY_MAX_M])
@pytest.mark.parametrize("n, k", LLAMA)
def test_gpu_v15_fp16_gemv_at_llama_shapes(m, n, k):
    from sits.kernels.linear_fp8_f16 import linear_fp8_f16
    qw, g = _fp8(n, k, 13, "cuda")
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    got = linear_fp8_f16(x, qw)
    ref64 = F.linear(x.double(), qw.dequantize(torch.float64))
    assert_close_to_fp64(got, linear_dequant_many_rows(x, qw), ref64,
                         ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(linear_fp8_f16(x, qw), got)   # split-K partials summed in order: the same bits again
