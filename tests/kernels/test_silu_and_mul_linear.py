"""triton-v1.6's fused op (kernels/silu_and_mul_linear.py): SiLU-and-mul in the down projection's prologue. On CPU
through Triton's interpreter it gives triton-v1.5's two ops (silu_and_mul, then linear) bit for bit, wherever it
fuses (int8/fp8 weights up to 32 rows, fp16 dots for fp8 up to 16, whole and partial K tiles, bias, split-K) and where
it does not (more rows, plain weights); on a GPU, at Llama-3-8B's down projection, against fp64 within the bound
of those two ops."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.linear_w8a8 import WEIGHT_ONLY_MAX_M
from sits.kernels.silu_and_mul import silu_and_mul_ref
from sits.kernels.silu_and_mul_linear import silu_and_mul_linear
from tests.kernels.helpers import ATOL, assert_close_to_fp64, on_gpu

V15, V16 = get_kernel_set("triton-v1.5"), get_kernel_set("triton-v1.6")


def _two_ops(x, w, bias=None):
    return V15.linear(V15.silu_and_mul(x), w, bias)


def test_the_set_serves_it_and_keeps_v15s_other_ops():
    assert V16.silu_and_mul_linear is silu_and_mul_linear and V16.overrides == ("silu_and_mul_linear",)
    assert all(getattr(V16, op) is getattr(V15, op) for op in V15.ops())
    assert V15.silu_and_mul_linear is None   # the released set is unchanged


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("m", [1, 5, 16, 17, WEIGHT_ONLY_MAX_M, WEIGHT_ONLY_MAX_M + 1])
@pytest.mark.parametrize("i", [96, 128])   # a partial last K tile, whole tiles
def test_cpu_is_v15s_two_ops_bit_for_bit(dev, kind, m, i):
    g = torch.Generator().manual_seed(m * 7 + i)
    w = quantize_weight(torch.randn(40, i, generator=g) * i ** -0.5, kind).to(dev)
    x = (torch.randn(m, 2 * i, generator=g) * 3).bfloat16().to(dev)
    x[0, :i] = -30.0   # a saturated gate: silu -> -0 (up to its rounding)
    bias = torch.randn(40, generator=g).to(dev)
    got = silu_and_mul_linear(x, w, bias)
    assert got.shape == (m, 40) and got.dtype == torch.bfloat16
    assert torch.equal(got, _two_ops(x, w, bias))


def test_any_leading_shape_and_strided_rows(dev):
    g = torch.Generator().manual_seed(3)
    w = quantize_weight(torch.randn(24, 64, generator=g), "int8").to(dev)
    x = torch.randn(2, 3, 2 * 64, generator=g).to(dev)
    assert torch.equal(silu_and_mul_linear(x, w), _two_ops(x, w))
    wide = torch.randn(4, 200, generator=g).to(dev)[:, :128]   # rows of stride 200
    assert torch.equal(silu_and_mul_linear(wide, w), _two_ops(wide.contiguous(), w))


def test_plain_weights_are_v15s_two_ops(dev):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(24, 64, generator=g).to(dev)
    x = torch.randn(3, 128, generator=g).to(dev)
    assert torch.equal(silu_and_mul_linear(x, w), _two_ops(x, w))


def test_errors_are_clear(dev):
    w = quantize_weight(torch.randn(24, 64), "int8").to(dev)
    with pytest.raises(ValueError, match=r"must be \[\.\.\., 2 x I\] for weight \[N, I\]"):
        silu_and_mul_linear(torch.randn(3, 127).to(dev), w)
    with pytest.raises(ValueError, match=r"2 x I"):
        silu_and_mul_linear(torch.randn(3, 64).to(dev), w)   # [gate | up] of 32: not the weight's 64
    with pytest.raises(ValueError, match="bias"):
        silu_and_mul_linear(torch.randn(3, 128).to(dev), w, torch.zeros(5).to(dev))


@on_gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 conversion needs sm_89+")
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("m", [1, 16, WEIGHT_ONLY_MAX_M, 64])
def test_gpu_at_the_llama_down_projection(kind, m):
    g = torch.Generator().manual_seed(m)
    w = quantize_weight(torch.randn(4096, 14336, generator=g) * 14336 ** -0.5, kind).to("cuda")
    x = torch.randn(m, 2 * 14336, generator=g).bfloat16().cuda()
    got = silu_and_mul_linear(x, w)
    ref64 = F.linear(silu_and_mul_ref(x.double()), w.dequantize(torch.float64))
    same = _two_ops(x, w)
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(silu_and_mul_linear(x, w), got)   # split-K partials summed in order: the same bits again
