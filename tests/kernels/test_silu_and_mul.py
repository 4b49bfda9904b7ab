"""SiLU-and-mul (`silu_and_mul`, the MLP's gate; kernels/silu_and_mul.py): the torch reference, the Triton kernel on
CPU and GPU, and at Llama-3-8B shapes on a GPU."""
import pytest
import torch

from sits.kernels import get_kernel_set
from tests.kernels.helpers import DTYPES, REF_DTYPES, assert_verbose_allclose, check_op, check_op_on_gpu, on_gpu

REF = get_kernel_set("torch")


# ---- the torch reference against independent fp64 formulations ----

@pytest.mark.parametrize("dtype, atol, rtol", REF_DTYPES)
def test_reference_silu_and_mul(dtype, atol, rtol):
    x = torch.randn(5, 2 * 123, generator=torch.Generator().manual_seed(2)).to(dtype)
    g, u = x[:, :123].double(), x[:, 123:].double()
    assert_verbose_allclose(REF.silu_and_mul(x), g * torch.sigmoid(g) * u, atol, rtol)
    with pytest.raises(ValueError, match="even"):
        REF.silu_and_mul(torch.randn(2, 7))


# ---- Triton against the reference: CPU through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU ----

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 8), (5, 2 * 123), (2, 2 * 1500)])
def test_silu_and_mul(dev, shape, dtype):
    x = (2 * torch.randn(*shape, generator=torch.Generator().manual_seed(12))).to(dtype)
    check_op("silu_and_mul", (x,), dtype, dev)


# ---- on a GPU at Llama-3-8B shapes (marked gpu, skipped without CUDA) ----

@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_and_mul_llama_shape(dtype):
    g = torch.Generator().manual_seed(1)
    check_op_on_gpu("silu_and_mul", (torch.randn(77, 2 * 14336, generator=g).to(dtype),), dtype)
