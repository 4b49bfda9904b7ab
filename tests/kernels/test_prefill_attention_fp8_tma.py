"""triton-v1.18's and triton-v1.19's prefill attention over FP8 pages through TMA (kernels/prefill_attention_fp8_tma.py;
v1.19 computes the scores transposed). On CPU through Triton's interpreter (which emulates the descriptors): against
the fp64 reference on the same e4m3 pages, full prompts, prefix hits and chunks, partial pages, q past fp16's range
(stale NaN slots: test_prefill_attention.py); v1.18 against triton-v1.17's pointer-gather kernel bit for bit (the
interpreter runs both at the same tiles; on a GPU to fp16 rounding), v1.19 against v1.18 to fp16 rounding (the same
products, summed in another order); plain pages and fp32 models are v1.17's op bit for bit. On a GPU at llama3-8b's
heads: the same checks at full size."""
import pytest
import torch

from sits.kernels import get_kernel_set
from sits.kernels.prefill_attention_fp8_tma import prefill_attention_fp8kv_tma, prefill_attention_fp8kv_tma_t, tma_takes
from tests.kernels.conftest import triton_device
from tests.kernels.helpers import (args_to, check_op, check_op_on_gpu, compile_for_sm90, fp8_kv,
                                  llama3_mixed_fp8_prefill, on_gpu, prefill_args)

V117 = get_kernel_set("triton-v1.17")
V118 = get_kernel_set("triton-v1.18")
V119 = get_kernel_set("triton-v1.19")
TMA_SETS = pytest.mark.parametrize("kset", [V118, V119], ids=["v1.18", "v1.19"])
CTX, QLENS = [1, 63, 64, 65, 130, 300], [1, 63, 64, 65, 66, 40]   # full prompts; a prefix hit; a chunk


def test_the_set_serves_it():
    assert V118.prefill_attention is prefill_attention_fp8kv_tma and V118.kv_cache_dtypes == ("auto", "fp8")
    assert V118.overrides == ("prefill_attention",)
    assert V117.prefill_attention is not prefill_attention_fp8kv_tma   # the released set is unchanged
    assert V119.prefill_attention is prefill_attention_fp8kv_tma_t and V119.kv_cache_dtypes == ("auto", "fp8")
    assert V119.overrides == ("prefill_attention",) and V119.parent == "triton-v1.18"
    assert V118.prefill_attention is prefill_attention_fp8kv_tma   # v1.18 released unchanged beside it


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_pages_against_the_fp64_reference_and_v117(dev, dtype):
    args = args_to(fp8_kv(prefill_args(CTX, QLENS, 6, 2, 64, dtype, seed=41)), device=dev)
    assert tma_takes(args[0], args[1].data, args[2].data)
    got = check_op("prefill_attention", args, dtype, dev, kernel_set=V118)
    want = V117.prefill_attention(*args)
    if dev == "cpu":   # the interpreter runs both kernels at 64 x 64 tiles: the same arithmetic in the same order
        assert torch.equal(got, want)
    else:              # 128 queries a program here, 64 x 128 tiles there: the online softmax rescales elsewhere
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_v119s_transposed_scores_against_the_fp64_reference_and_v118(dev, dtype):
    args = args_to(fp8_kv(prefill_args(CTX, QLENS, 6, 2, 64, dtype, seed=41)), device=dev)
    got = check_op("prefill_attention", args, dtype, dev, kernel_set=V119)
    want = V118.prefill_attention(*args)
    # the same products and scales, summed in another order (K Q^T instead of Q K^T): fp16 rounding apart
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-3


@TMA_SETS
def test_q_past_fp16s_range_is_lowered_into_it(dev, kset):
    q, *rest = fp8_kv(prefill_args(CTX, QLENS, 4, 2, 64, torch.bfloat16, seed=42))
    got = check_op("prefill_attention", ((q.float() * 3e5).bfloat16(), *rest), torch.bfloat16, dev, kernel_set=kset)
    assert torch.isfinite(got).all()


@TMA_SETS
def test_plain_pages_and_fp32_models_are_v117s_op(dev, kset):
    plain = args_to(prefill_args([65, 130], [65, 66], 4, 2, 64, torch.bfloat16, seed=44), device=dev)
    assert torch.equal(kset.prefill_attention(*plain), V117.prefill_attention(*plain))
    fp32 = args_to(fp8_kv(prefill_args([65, 130], [65, 66], 4, 2, 64, torch.float32, seed=45)), device=dev)
    assert not tma_takes(fp32[0], fp32[1].data, fp32[2].data)
    assert torch.equal(kset.prefill_attention(*fp32), V117.prefill_attention(*fp32))


def test_pages_it_cannot_describe_go_to_v117s_kernel(dev):
    q, k_cache, v_cache, *rest = fp8_kv(prefill_args([65], [65], 4, 2, 64, torch.bfloat16, seed=46))
    odd = type(k_cache)(k_cache.data[:, :, :, :48], k_cache.scale)   # head_dim 48, not contiguous
    assert not tma_takes(q[..., :48], odd.data, odd.data)


@on_gpu
@TMA_SETS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_llama3_heads_long_mixed_batch(dtype, kset):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the TMA kernel needs Hopper or later")
    args = llama3_mixed_fp8_prefill(dtype, seed=47)
    check_op_on_gpu("prefill_attention", args, dtype, kernel_set=kset)
    got, want = kset.prefill_attention(*args), V117.prefill_attention(*args)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-3


def test_the_benchmarks_smoke_run_compares_the_two_kernels(capsys):
    # bench/prefill_attention_fp8.py times v1.17's and v1.18's kernels on a GPU; on CPU its smoke run holds them equal
    from bench import prefill_attention_fp8
    if triton_device() != "cpu":
        pytest.skip("the smoke run needs Triton's interpreter")
    assert prefill_attention_fp8.smoke() == 0, capsys.readouterr().out


_COMPILE = r"""
from bench import kernel_resources as kr   # first: it imports Triton before the kernels (no interpreter)
for name in ("v1.18", "v1.19"):   # each set's candidates at llama3-8b's heads, a bf16 model
    _, fn, ptrs, fixed, candidates = kr._kernels()[name]
    for kw, warps, stages in candidates:
        p = kr.compile_sm90(fn, ptrs, {**fixed, **kw}, warps, stages).asm["ptx"]
        print("config", name, kw["BLOCK_M"], warps, "tma" if "cp.async.bulk.tensor" in p else "no-tma",
              "cvt" if "cvt.rn.f16x2.e4m3x2" in p else "no-cvt", "wgmma" if "wgmma" in p else "no-wgmma",
              "ptx-local" if "st.local" in p else "no-ptx-local")
"""


def test_every_candidate_compiles_for_sm90_to_tma_loads_e4m3_conversions_and_wgmma():
    # no GPU needed: Triton compiles for Hopper here (as test_pdl.py does); what the interpreter cannot show. No
    # local memory in the PTX Triton writes; ptxas may still spill registers (BENCHMARKS.md "FP8 prefill fronts")
    lines = [line for line in compile_for_sm90(_COMPILE).split("\n") if line.startswith("config")]
    assert len(lines) == 6 and all(line.endswith("tma cvt wgmma no-ptx-local") for line in lines), lines
    assert sum(" v1.19 " in line for line in lines) == 2, lines
