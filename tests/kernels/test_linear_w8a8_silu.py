"""triton-v1.16's fused gate/up projection (kernels/linear_w8a8_silu.py): fp8 weights times more than SCALED_MM_MAX_M
rows through the W8A8 GEMM with the SiLU-and-mul epilogue (kernels/fp8_gemm.py SILU_EPI; the threshold is 64 under the
interpreter: conftest.py's `scaled_mm_max_m`). On CPU through Triton's
interpreter: v1.15's two ops (the W8A8 GEMM, then silu_and_mul) bit for bit in bf16 (to fp32 rounding in fp32), bias
and partial tiles included; fewer rows and other weights: v1.15's op. On a GPU at llama3-8b's gate/up shape: the two
ops' values within bf16 rounding."""
import pytest
import torch

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.linear_w8a8 import SCALED_MM_MAX_M, linear_w8a8, linear_w8a8_gemm
from sits.kernels.linear_w8a8_silu import linear_silu_and_mul_w8a8
from sits.kernels.silu_and_mul import silu_and_mul
from tests.kernels.helpers import on_gpu

V115 = get_kernel_set("triton-v1.15")
V116 = get_kernel_set("triton-v1.16")


def _gate_up(i, k, seed, device="cpu", kind="fp8"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(2 * i, k, generator=g) * k ** -0.5
    w[3] = 0.0   # a zero gate row
    return quantize_weight(w, kind).to(device), g


def test_the_set_serves_it():
    assert V116.linear_silu_and_mul is linear_silu_and_mul_w8a8
    assert V116.paged_decode_attention is V115.paged_decode_attention and V116.linear is V115.linear
    assert V115.linear_silu_and_mul is not linear_silu_and_mul_w8a8   # the released set is unchanged


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_prefill_rows_are_v115s_two_ops_bit_for_bit(dev, dtype, bias, scaled_mm_max_m):
    qw, g = _gate_up(40, 200, 11, dev)   # I = 40: a partial column tile; K = 200: a partial K tile
    m = scaled_mm_max_m + 9
    x = (torch.randn(m, 200, generator=g) * 3).to(dtype).to(dev)
    x[0] = 0.0   # a row of zeros: scale 1
    b = (torch.randn(80, generator=g)).to(dtype).to(dev) if bias else None
    got = V116.linear_silu_and_mul(x, qw, b)
    want = silu_and_mul(linear_w8a8(x, qw, b))
    assert got.shape == (m, 40) and got.dtype == dtype
    if dev == "cpu" and dtype == torch.bfloat16:
        assert torch.equal(got, want)
    elif dev == "cpu":   # fp32: the interpreter's dots are numpy's, whose BLAS may sum a column in another order
        # where it sits elsewhere in a tile (the up rows do, N columns further): on some CPUs a few products 1 ulp
        # apart, which SiLU-and-mul carries into its output
        assert (got - want).abs().max().item() <= 1e-6 * want.abs().max().item()
    else:   # the GPU's dots may sum in another order with other tiles: within bf16 rounding
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 4e-3
    assert torch.equal(V115.linear_silu_and_mul(x, qw, b), want)   # and that is what v1.15 computes


def test_a_fixed_tiling_computes_the_same(dev):
    qw, g = _gate_up(48, 128, 12, dev)
    x = torch.randn(70, 128, generator=g).to(dev)
    want = silu_and_mul(linear_w8a8_gemm(x, qw, block_m=16, block_n=32, block_k=32))
    got = linear_w8a8_gemm(x, qw, block_m=16, block_n=16, block_k=32, silu_epi=True)
    assert got.shape == (70, 48)
    assert ((got - want).norm() / want.norm()).item() < 1e-6


@pytest.mark.parametrize("rows", ["1", "33", "at the threshold"])
def test_fewer_rows_are_v115s_op(dev, rows, scaled_mm_max_m):
    m = {"1": 1, "33": 33, "at the threshold": scaled_mm_max_m}[rows]
    qw, g = _gate_up(32, 64, 13, dev)
    x = torch.randn(m, 64, generator=g).to(dev)
    assert torch.equal(V116.linear_silu_and_mul(x, qw), V115.linear_silu_and_mul(x, qw))


@pytest.mark.parametrize("kind", ["int8", None])
def test_other_weights_are_v115s_op(dev, kind, scaled_mm_max_m):
    qw, g = _gate_up(32, 64, 14, dev, kind) if kind else (torch.randn(64, 64).to(dev) * 0.1, torch.Generator())
    x = torch.randn(scaled_mm_max_m + 1, 64, generator=torch.Generator().manual_seed(15)).to(dev)
    assert torch.equal(V116.linear_silu_and_mul(x, qw), V115.linear_silu_and_mul(x, qw))


def test_a_weight_that_is_not_gate_and_up_is_refused():
    qw, _ = _gate_up(16, 32, 16)
    with pytest.raises(ValueError, match=r"\[2 x I, H\]"):
        linear_silu_and_mul_w8a8(torch.randn(600, 32), qw.__class__(qw.qweight[:31], qw.scale[:31], "fp8"))


@on_gpu
@pytest.mark.parametrize("m", [SCALED_MM_MAX_M + 64, 2048])
def test_gpu_llama3_gate_up_is_v115s_two_ops(m):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the W8A8 GEMM needs fp8 tensor cores (sm_89+)")
    qw, g = _gate_up(14336, 4096, 17, "cuda")
    x = torch.randn(m, 4096, generator=g).to("cuda", torch.bfloat16)
    got = V116.linear_silu_and_mul(x, qw)
    want = V115.linear_silu_and_mul(x, qw)
    assert got.shape == want.shape == (m, 14336)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 4e-3

