"""RMSNorm and add + RMSNorm (`rms_norm`, `fused_add_rms_norm`; kernels/rms_norm.py): the torch reference, the Triton
kernel on CPU and GPU, and at Llama-3-8B shapes on a GPU."""
import pytest
import torch

from sits.kernels import get_kernel_set
from tests.kernels.helpers import (DTYPES, REF_DTYPES, assert_verbose_allclose, check_op, check_op_on_gpu,
                                   on_gpu)

REF = get_kernel_set("torch")


# ---- the torch reference against independent fp64 formulations ----

@pytest.mark.parametrize("dtype, atol, rtol", REF_DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 123), (7, 256)])
def test_reference_rms_norm_and_fused_add(shape, dtype, atol, rtol):
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


# ---- Triton against the reference: CPU through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU ----

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


# ---- on a GPU at Llama-3-8B shapes (marked gpu, skipped without CUDA) ----

@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_llama_shapes(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(333, 4096, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(4096, generator=g)).to(dtype)
    check_op_on_gpu("rms_norm", (x, w, 1e-5), dtype)
    check_op_on_gpu("fused_add_rms_norm", (x, r, w, 1e-5), dtype)
