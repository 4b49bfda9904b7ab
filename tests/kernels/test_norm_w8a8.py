"""triton-v1.17's fused ops (kernels/norm_w8a8.py): the RMSNorm in front of the q/k/v and gate/up projections
quantizes its own output for the W8A8 GEMM (kernels/rms_norm.py `add_rms_norm_quant`). On CPU through Triton's
interpreter: the norm's e4m3 bytes and scales are quantize_rows(rms_norm(h))'s, and both fused ops give triton-v1.16's
two ops' results bit for bit, at the torch._scaled_mm rows (33 to SCALED_MM_MAX_M; the Triton GEMM on CPU) and past
them (the SiLU-and-mul epilogue; the threshold is 64 under the interpreter: conftest.py's `scaled_mm_max_m`); fewer
rows and other weights are v1.16's ops. On a GPU at llama3-8b's shapes: the same bits."""
import pytest
import torch

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.fp8_gemm import quantize_rows
from sits.kernels.linear_w8a8 import WEIGHT_ONLY_MAX_M
from sits.kernels.norm_w8a8 import add_rms_norm_linear_silu_and_mul_w8a8, add_rms_norm_linear_w8a8
from sits.kernels.rms_norm import add_rms_norm_quant, fused_add_rms_norm, rms_norm
from tests.kernels.helpers import on_gpu

V116 = get_kernel_set("triton-v1.16")
V117 = get_kernel_set("triton-v1.17")
OPS = ("add_rms_norm_linear", "add_rms_norm_linear_silu_and_mul")


def _inputs(m, h, seed, device, dtype=torch.float32, residual=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, h, generator=g) * 2).to(dtype)
    r = (torch.randn(m, h, generator=g)).to(dtype) if residual else None
    if residual and m > 1:
        r[1] = -x[1]   # h = x + residual is a row of zeros: its norm is zeros, its scale 1
    nw = (torch.randn(h, generator=g) * 0.1 + 1).to(dtype)
    return x.to(device), (r.to(device) if r is not None else None), nw.to(device), g


def _weight(n, k, g, device, kind="fp8"):
    w = torch.randn(n, k, generator=g) * k ** -0.5
    return quantize_weight(w, kind).to(device) if kind else w.to(device)


def test_the_set_serves_them():
    assert V117.add_rms_norm_linear is add_rms_norm_linear_w8a8
    assert V117.add_rms_norm_linear_silu_and_mul is add_rms_norm_linear_silu_and_mul_w8a8
    for op in ("linear", "linear_silu_and_mul", "rms_norm", "fused_add_rms_norm", "paged_decode_attention"):
        assert getattr(V117, op) is getattr(V116, op), op
    assert V116.add_rms_norm_linear is None   # the released set is unchanged


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [True, False])
def test_the_norm_quantizes_as_quantize_rows_does_after_it(dev, dtype, residual):
    x, r, nw, _ = _inputs(37, 200, 1, dev, dtype, residual)   # H = 200: a masked tail in the row's block
    xq, xs, h = add_rms_norm_quant(x, r, nw, 1e-5)
    if residual:
        want_y, want_h = fused_add_rms_norm(x, r, nw, 1e-5)
    else:
        want_y, want_h = rms_norm(x, nw, 1e-5), x
    want_q, want_s = quantize_rows(want_y)
    assert xq.dtype == torch.float8_e4m3fn and xq.shape == (37, 200) and xs.shape == (37,)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_s)
    assert torch.equal(h, want_h) and (h is x) == (not residual)
    if residual:
        assert xs[1].item() == 1.0 and not xq[1].float().any()


@pytest.mark.parametrize("rows", ["33", "at the threshold", "past it"])
@pytest.mark.parametrize("op", OPS)
def test_past_32_rows_they_are_v116s_two_ops_bit_for_bit(dev, op, rows, scaled_mm_max_m):
    m = {"33": WEIGHT_ONLY_MAX_M + 1, "at the threshold": scaled_mm_max_m, "past it": scaled_mm_max_m + 9}[rows]
    x, r, nw, g = _inputs(m, 72, 2, dev)
    w = _weight(2 * 40 if op.endswith("silu_and_mul") else 56, 72, g, dev)   # partial column and K tiles
    b = torch.randn(w.shape[0], generator=g).to(dev) if m == scaled_mm_max_m else None
    got, got_h = getattr(V117, op)(x, w, r, nw, 1e-5, b)
    want, want_h = V116.op(op)(x, w, r, nw, 1e-5, b)
    assert got.shape == want.shape and torch.equal(got, want) and torch.equal(got_h, want_h)


@pytest.mark.parametrize("op", OPS)
def test_the_first_layer_without_a_residual_and_any_leading_dims(dev, op):
    x, _, nw, g = _inputs(40, 64, 3, dev, residual=False)
    w = _weight(64, 64, g, dev)
    got, h = getattr(V117, op)(x.view(2, 20, 64), w, None, nw, 1e-5)
    want, _ = V116.op(op)(x, w, None, nw, 1e-5)
    assert got.shape == (2, 20, want.shape[-1]) and torch.equal(got.view_as(want), want) and h.shape == (2, 20, 64)


@pytest.mark.parametrize("m", [1, WEIGHT_ONLY_MAX_M])
@pytest.mark.parametrize("kind", ["fp8", "int8", None])
def test_fewer_rows_and_other_weights_are_v116s_ops(dev, m, kind):
    x, r, nw, g = _inputs(m if kind == "fp8" else 40, 64, 4, dev)
    for op in OPS:
        w = _weight(64, 64, g, dev, kind)
        got, got_h = getattr(V117, op)(x, w, r, nw, 1e-5)
        want, want_h = V116.op(op)(x, w, r, nw, 1e-5)
        assert torch.equal(got, want) and torch.equal(got_h, want_h), op


def test_bad_shapes_are_refused():
    x, r, nw, g = _inputs(40, 64, 5, "cpu")
    w = _weight(63, 64, g, "cpu")
    with pytest.raises(ValueError, match=r"\[2 x I, H\]"):
        add_rms_norm_linear_silu_and_mul_w8a8(x, w, r, nw, 1e-5)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm_linear_w8a8(x, w, r[:39], nw, 1e-5)
    with pytest.raises(ValueError, match="does not match"):
        add_rms_norm_linear_w8a8(x, _weight(64, 48, g, "cpu"), r, nw, 1e-5)
    with pytest.raises(ValueError, match="bias"):
        add_rms_norm_linear_w8a8(x, w, r, nw, 1e-5, torch.zeros(7))


@on_gpu
@pytest.mark.parametrize("m", [64, 256, 2048])
def test_gpu_llama3_shapes_are_v116s_bits(m):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the W8A8 GEMM needs fp8 tensor cores (sm_89+)")
    x, r, nw, g = _inputs(m, 4096, 6, "cuda", torch.bfloat16)
    for op, n in (("add_rms_norm_linear", 6144), ("add_rms_norm_linear_silu_and_mul", 2 * 14336)):
        w = _weight(n, 4096, g, "cuda")
        want, want_h = V116.op(op)(x, w, r, nw, 1e-5)   # first: the GEMMs tune here, both sets share the winner
        got, got_h = getattr(V117, op)(x, w, r, nw, 1e-5)
        assert torch.equal(got_h, want_h), op
        assert torch.equal(got, want), (op, ((got.float() - want.float()).norm() / want.float().norm()).item())


def test_the_benchmarks_smoke_run_compares_the_sets(capsys, dev, scaled_mm_max_m):
    # bench/fp8_fronts.py times v1.15, v1.16 and v1.17 on a GPU; on CPU its smoke run holds them to the same bits, on
    # either side of SCALED_MM_MAX_M (lowered here)
    from bench import fp8_fronts
    if dev != "cpu":
        pytest.skip("the smoke run needs Triton's interpreter")
    assert fp8_fronts.smoke(rows=(40, scaled_mm_max_m + 8)) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.count("agree bit for bit") == 4
