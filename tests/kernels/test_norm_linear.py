"""triton-v1.10's fused ops (kernels/norm_linear.py): the RMSNorm and its residual add inside the batch-1 GEMV of
the q/k/v and gate/up projections. On CPU through Triton's interpreter: the projection against fp64 within the bound
of the two ops' own result (norm kernel, then v1.9's GEMV), the residual output the norm kernel's bit for bit, the
same bits for any tile width (every program sums h^2 itself; only the first tile stores h), more rows routed to
v1.9's two ops bit for bit; on a GPU at Llama-3-8B's two normed projections and with every autotuning candidate."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import QuantizedWeight, get_kernel_set, quantize_weight
from sits.kernels.linear_gemv import CANDIDATES, GEMV_MAX_M, gemv
from sits.kernels.norm_linear import add_rms_norm_linear, add_rms_norm_linear_silu_and_mul
from sits.kernels.silu_and_mul import silu_and_mul_ref
from tests.kernels.helpers import ATOL, assert_close_to_fp64, on_gpu

V19, V110 = get_kernel_set("triton-v1.9"), get_kernel_set("triton-v1.10")
EPS = 1e-5
FUSED = {"add_rms_norm_linear": add_rms_norm_linear,
         "add_rms_norm_linear_silu_and_mul": add_rms_norm_linear_silu_and_mul}


def _weight(kind, n, k, g, dtype=torch.bfloat16):
    w = torch.randn(n, k, generator=g) * k ** -0.5
    return quantize_weight(w, kind) if kind != "plain" else w.to(dtype)


def _inputs(m, k, g, dtype, dev):
    x = (torch.randn(m, k, generator=g) * 2).to(dtype).to(dev)
    r = (torch.randn(m, k, generator=g) * 2).to(dtype).to(dev)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(dtype).to(dev)
    return x, r, nw


def _ref64(op, x, w, residual, nw, bias=None):
    """fp64 of the op: h = x + residual as the norm kernel rounds it (x's dtype), the norm and the projection exact."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    h = h.double()
    normed = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * nw.double()
    wd = w.dequantize(torch.float64) if isinstance(w, QuantizedWeight) else w.double()
    y = F.linear(normed, wd) + (0 if bias is None else bias.double())
    return silu_and_mul_ref(y) if op.endswith("silu_and_mul") else y


def test_the_set_serves_them_and_keeps_v19s_other_ops():
    assert V110.add_rms_norm_linear is add_rms_norm_linear
    assert V110.add_rms_norm_linear_silu_and_mul is add_rms_norm_linear_silu_and_mul
    assert set(V110.overrides) == set(FUSED) and V110.parent == "triton-v1.9"
    assert all(getattr(V110, op) is getattr(V19, op) for op in V19.ops())
    assert V110.graph_safe and V110.kv_cache_dtypes == V19.kv_cache_dtypes


@pytest.mark.parametrize("op", list(FUSED))
@pytest.mark.parametrize("kind", ["int8", "fp8", "plain"])
@pytest.mark.parametrize("with_residual", [True, False])
def test_one_row_against_fp64_and_the_residual_bit_for_bit(dev, op, kind, with_residual):
    g = torch.Generator().manual_seed(len(op) + len(kind))
    k, n = 160, 96   # a partial K tile; N a multiple of 2 for the gate/up pairs
    w = _weight(kind, n, k, g).to(dev)
    x, r, nw = _inputs(1, k, g, torch.bfloat16, dev)
    residual = r if with_residual else None
    bias = torch.randn(n, generator=g).to(dev)
    got, res = FUSED[op](x, w, residual, nw, EPS, bias)
    two_ops, two_res = V19.op(op)(x, w, residual, nw, EPS, bias)   # the norm kernel, then v1.9's GEMV
    assert got.shape == two_ops.shape and got.dtype == torch.bfloat16
    assert torch.equal(res, two_res)   # h = x + residual, rounded as the norm kernel rounds it (or x itself)
    ref64 = _ref64(op, x, w, residual, nw, bias)
    assert_close_to_fp64(got, two_ops, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(FUSED[op](x, w, residual, nw, EPS, bias)[0], got)   # the same bits again


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_activation_dtypes(dev, dtype):
    g = torch.Generator().manual_seed(11)
    w = _weight("int8", 64, 128, g).to(dev)
    x, r, nw = _inputs(1, 128, g, dtype, dev)
    got, res = add_rms_norm_linear(x, w, r, nw, EPS)
    two_ops, two_res = V19.op("add_rms_norm_linear")(x, w, r, nw, EPS)
    assert torch.equal(res, two_res) and got.dtype == dtype
    ref64 = _ref64("add_rms_norm_linear", x, w, r, nw)
    assert_close_to_fp64(got, two_ops, ref64, ATOL[dtype] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("res_after", [False, True])   # h stored in the main loop (the default) or after it
@pytest.mark.parametrize("silu_epi", [False, True])
def test_the_tile_width_changes_no_bits_and_every_tile_leaves_the_residual_whole(dev, silu_epi, res_after):
    g = torch.Generator().manual_seed(5)
    n, k = 72, 192   # N a multiple of no tile width but 2 (the last tile wraps around)
    w = _weight("fp8", n, k, g).to(dev)
    x, r, nw = _inputs(1, k, g, torch.bfloat16, dev)
    outs, residuals = [], []
    for bn in (2, 4, 8, 32):
        o = torch.full((1, n // 2 if silu_epi else n), float("nan"), dtype=torch.bfloat16, device=dev)
        res = torch.full_like(r, float("nan"))
        gemv(x, w, None, o, silu_epi=silu_epi, norm=(r, nw, EPS, res),
             config=dict(BLOCK_N=bn, BLOCK_K=64, RES_AFTER=res_after))
        outs.append(o)
        residuals.append(res)
    assert not outs[0].isnan().any() and not residuals[0].isnan().any()
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    h = V19.fused_add_rms_norm(x, r, nw, EPS)[1]   # (under the interpreter fp32 -> bf16 does not round as torch's)
    assert all(torch.equal(res, h) for res in residuals)


@pytest.mark.parametrize("op", list(FUSED))
def test_more_rows_are_v19s_two_ops_bit_for_bit(dev, op):
    g = torch.Generator().manual_seed(6)
    w = _weight("int8", 48, 64, g).to(dev)
    x, r, nw = _inputs(GEMV_MAX_M + 2, 64, g, torch.bfloat16, dev)
    for residual in (r, None):
        got, res = FUSED[op](x, w, residual, nw, EPS)
        two_ops, two_res = V19.op(op)(x, w, residual, nw, EPS)
        assert torch.equal(got, two_ops) and torch.equal(res, two_res)


def test_leading_shapes_and_strided_rows(dev):
    g = torch.Generator().manual_seed(7)
    w = _weight("int8", 40, 64, g).to(dev)
    x, r, nw = _inputs(1, 64, g, torch.bfloat16, dev)
    got, res = add_rms_norm_linear(x[None], w, r[None], nw, EPS)
    assert got.shape == (1, 1, 40) and res.shape == (1, 1, 64)
    assert torch.equal(got[0], add_rms_norm_linear(x, w, r, nw, EPS)[0])
    wide_x = torch.cat([x, x], 1)[:, :64]   # rows with a stride past their width
    assert torch.equal(add_rms_norm_linear(wide_x, w, r, nw, EPS)[0], add_rms_norm_linear(x, w, r, nw, EPS)[0])


def test_errors_are_clear(dev):
    w = quantize_weight(torch.randn(48, 64), "int8").to(dev)
    x, r, nw = _inputs(1, 64, torch.Generator().manual_seed(1), torch.bfloat16, dev)
    with pytest.raises(ValueError, match="and residual"):
        add_rms_norm_linear(x, w, r[:, :32], nw, EPS)
    with pytest.raises(ValueError, match="norm weight"):
        add_rms_norm_linear(x, w, r, nw[:32], EPS)
    with pytest.raises(ValueError, match="does not match weight"):
        add_rms_norm_linear(x[:, :32], w, None, nw[:32], EPS)
    with pytest.raises(ValueError, match=r"must be \[2 x I, H\]"):
        add_rms_norm_linear_silu_and_mul(x, quantize_weight(torch.randn(47, 64), "int8").to(dev), r, nw, EPS)


LLAMA = {"add_rms_norm_linear": 6144, "add_rms_norm_linear_silu_and_mul": 28672}   # q/k/v, gate/up rows (K 4096)
needs_fp8 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                               reason="fp8 conversion needs sm_89+")


@on_gpu
@needs_fp8
@pytest.mark.parametrize("kind", ["int8", "fp8", "plain"])
@pytest.mark.parametrize("op", list(FUSED))
def test_gpu_at_llamas_shapes(kind, op):
    g = torch.Generator().manual_seed(3)
    w = _weight(kind, LLAMA[op], 4096, g).to("cuda")
    x, r, nw = _inputs(1, 4096, g, torch.bfloat16, "cuda")
    got, res = FUSED[op](x, w, r, nw, EPS)
    two_ops, two_res = V19.op(op)(x, w, r, nw, EPS)
    assert torch.equal(res, two_res)
    ref64 = _ref64(op, x, w, r, nw)
    assert_close_to_fp64(got, two_ops, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    assert torch.equal(FUSED[op](x, w, r, nw, EPS)[0], got)


@on_gpu
@needs_fp8
@pytest.mark.parametrize("cfg", CANDIDATES, ids=lambda c: f"N{c.kwargs['BLOCK_N']}K{c.kwargs['BLOCK_K']}w{c.num_warps}")
def test_gpu_every_autotuning_candidate(cfg):
    g = torch.Generator().manual_seed(4)
    w = _weight("fp8", 6144, 4096, g).to("cuda")
    x, r, nw = _inputs(1, 4096, g, torch.bfloat16, "cuda")
    o = torch.empty(1, 6144, dtype=torch.bfloat16, device="cuda")
    res = torch.empty_like(r)
    gemv(x, w, None, o, norm=(r, nw, EPS, res),
         config=dict(**cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    two_ops, two_res = V19.op("add_rms_norm_linear")(x, w, r, nw, EPS)
    assert torch.equal(res, two_res)
    ref64 = _ref64("add_rms_norm_linear", x, w, r, nw)
    assert_close_to_fp64(o, two_ops, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
