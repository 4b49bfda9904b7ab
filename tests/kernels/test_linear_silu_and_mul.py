"""triton-v1.7's fused op (kernels/linear_silu_and_mul.py): SiLU-and-mul in the gate/up projection's epilogue. On CPU
through Triton's interpreter it gives triton-v1.5's two ops (linear, then silu_and_mul) bit for bit, wherever it
fuses (int8/fp8 weights up to 32 rows, fp16 dots for fp8 up to 16, whole and partial K and N tiles, bias, split-K)
and where it does not (more rows, plain weights); on a GPU, at Llama-3-8B's gate/up projection, against fp64 within
the bound of those two ops."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.linear_silu_and_mul import linear_silu_and_mul
from sits.kernels.linear_w8a8 import WEIGHT_ONLY_MAX_M
from sits.kernels.silu_and_mul import silu_and_mul_ref
from tests.kernels.helpers import ATOL, assert_close_to_fp64, on_gpu

V15, V17 = get_kernel_set("triton-v1.5"), get_kernel_set("triton-v1.7")


def _two_ops(x, w, bias=None):
    return V15.silu_and_mul(V15.linear(x, w, bias))


def test_the_set_serves_it_and_keeps_v15s_other_ops():
    assert V17.linear_silu_and_mul is linear_silu_and_mul and V17.overrides == ("linear_silu_and_mul",)
    assert all(getattr(V17, op) is getattr(V15, op) for op in V15.ops())
    assert V17.silu_and_mul_linear is None and V15.linear_silu_and_mul is None   # v1.6's fusion is not in it


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("m", [1, 5, 16, 17, WEIGHT_ONLY_MAX_M, WEIGHT_ONLY_MAX_M + 1])
@pytest.mark.parametrize("h,i", [(96, 40), (128, 32)])   # partial K and N tiles; whole ones
def test_cpu_is_v15s_two_ops_bit_for_bit(dev, kind, m, h, i):
    g = torch.Generator().manual_seed(m * 7 + h)
    w = quantize_weight(torch.randn(2 * i, h, generator=g) * h ** -0.5, kind).to(dev)
    x = (torch.randn(m, h, generator=g) * 3).bfloat16().to(dev)
    bias = torch.randn(2 * i, generator=g).to(dev)
    bias[0] = -300.0   # a saturated gate in column 0: silu -> -0 (up to its rounding)
    got = linear_silu_and_mul(x, w, bias)
    assert got.shape == (m, i) and got.dtype == torch.bfloat16
    assert torch.equal(got, _two_ops(x, w, bias))


def test_any_leading_shape_and_strided_rows(dev):
    g = torch.Generator().manual_seed(3)
    w = quantize_weight(torch.randn(48, 64, generator=g), "int8").to(dev)
    # bf16, as the model runs: in fp32 the interpreter's dots (numpy's BLAS) may sum a gate or up column 1 ulp apart
    # where it sits elsewhere in the tile, on some CPUs
    x = torch.randn(2, 3, 64, generator=g).bfloat16().to(dev)
    assert torch.equal(linear_silu_and_mul(x, w), _two_ops(x, w))
    assert linear_silu_and_mul(x, w).shape == (2, 3, 24)
    wide = torch.randn(4, 100, generator=g).bfloat16().to(dev)[:, :64]   # rows of stride 100
    assert torch.equal(linear_silu_and_mul(wide, w), _two_ops(wide.contiguous(), w))


def test_plain_weights_are_v15s_two_ops(dev):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(48, 64, generator=g).to(dev)
    x = torch.randn(3, 64, generator=g).to(dev)
    assert torch.equal(linear_silu_and_mul(x, w), _two_ops(x, w))


def test_errors_are_clear(dev):
    w = quantize_weight(torch.randn(48, 64), "int8").to(dev)
    with pytest.raises(ValueError, match=r"does not match weight \[N, K\]"):
        linear_silu_and_mul(torch.randn(3, 63).to(dev), w)
    with pytest.raises(ValueError, match=r"must be \[2 x I, H\]"):
        linear_silu_and_mul(torch.randn(3, 64).to(dev), quantize_weight(torch.randn(47, 64), "int8").to(dev))
    with pytest.raises(ValueError, match="bias"):
        linear_silu_and_mul(torch.randn(3, 64).to(dev), w, torch.zeros(5).to(dev))


@on_gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 conversion needs sm_89+")
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("m", [1, 16, WEIGHT_ONLY_MAX_M, 64])
def test_gpu_at_the_llama_gate_up_projection(kind, m):
    g = torch.Generator().manual_seed(m)
    w = quantize_weight(torch.randn(2 * 14336, 4096, generator=g) * 4096 ** -0.5, kind).to("cuda")
    x = torch.randn(m, 4096, generator=g).bfloat16().cuda()
    got = linear_silu_and_mul(x, w)
    ref64 = silu_and_mul_ref(F.linear(x.double(), w.dequantize(torch.float64)))
    same = _two_ops(x, w)
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(linear_silu_and_mul(x, w), got)   # split-K partials summed in order: the same bits again
