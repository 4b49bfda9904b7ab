"""triton-v1.20's prefill attention over FP8 pages (kernels/prefill_attention_fp8_dequant.py): the pages dequantized
once into a 16-bit scratch cache, then triton-v1.1's kernel over it. On CPU through Triton's interpreter: the scratch
holds the torch reference's dequantized values (to one bf16 ulp there: the interpreter rounds bf16 toward zero) and
zeros past each context; the op against the fp64 reference on the same e4m3 pages (full prompts, prefix hits, chunks,
partial pages; stale NaN slots: test_prefill_attention.py) and equal to v1.1's kernel run on the reference's
dequantized pages; fp32 models, plain pages and calls past the scratch limit are the other sets' ops bit for bit.
triton-v1.21: v1.20's op from DEQUANT_MIN_WORK of attention work on, v1.17's below, bit for bit either way. On a GPU
at llama3-8b's heads: a long mixed batch against the fp64 reference and v1.17, and v1.21's choice at the threshold."""
import pytest
import torch

from sits.kernels import get_kernel_set
from sits.kernels import prefill_attention_fp8_dequant as m
from sits.kernels.prefill_attention import prefill_attention_tma
from tests.kernels.helpers import (args_to, check_op, check_op_on_gpu, fp8_kv, llama3_mixed_fp8_prefill, on_gpu,
                                  prefill_args)

V11 = get_kernel_set("triton-v1.1")
V117 = get_kernel_set("triton-v1.17")
V120 = get_kernel_set("triton-v1.20")
V121 = get_kernel_set("triton-v1.21")
CTX, QLENS = [1, 63, 64, 65, 130, 300], [1, 63, 64, 65, 66, 40]   # full prompts; a prefix hit; a chunk


def test_the_set_serves_it():
    assert V120.prefill_attention is m.prefill_attention_fp8kv_dequant and V120.kv_cache_dtypes == ("auto", "fp8")
    assert V120.overrides == ("prefill_attention",) and V120.parent == "triton-v1.17"
    assert V117.prefill_attention is not m.prefill_attention_fp8kv_dequant   # the released set is unchanged


def _exact(dev, dtype) -> bool:
    """Does the kernel's rounding to dtype match torch's here? Triton's interpreter rounds fp32 to bf16 toward zero
    whatever the kernel asks (as in test_linear.py's dequantized weights): within one bf16 ulp on CPU."""
    return dev != "cpu" or dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_scratch_holds_the_references_values_sequence_by_sequence(dev, dtype):
    q, kc, vc, tables, cu, lens, _ = args_to(fp8_kv(prefill_args(CTX, QLENS, 4, 2, 64, dtype, seed=61)), device=dev)
    k16, v16, table = m.dequantize_prefill_pages(q, kc, vc, tables, cu, lens, len(CTX))
    width = tables.shape[1]
    assert k16.dtype == dtype and k16.shape == (len(CTX) * width, *kc.data.shape[1:])
    assert torch.equal(table.cpu(), torch.arange(len(CTX) * width, dtype=torch.int32).view(len(CTX), width))
    for pages, scratch in ((kc, k16), (vc, v16)):
        want = pages.dequantize(dtype)
        for i, n in enumerate(CTX):
            for j in range(-(-n // 64)):
                got, ref = scratch[i * width + j], want[tables[i, j].long()]
                used = min(64, n - j * 64)
                if _exact(dev, dtype):   # e4m3 x scale in fp32, rounded to nearest as torch rounds
                    assert torch.equal(got[:used], ref[:used]), (i, j)
                else:
                    assert ((got[:used].float() - ref[:used].float()).abs()
                            <= ref[:used].float().abs() * 2 ** -7).all(), (i, j)
                assert not got[used:].any(), (i, j)                  # zeros past the context


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_pages_against_the_fp64_reference_and_v11_on_the_dequantized_pages(dev, dtype):
    args = args_to(fp8_kv(prefill_args(CTX, QLENS, 6, 2, 64, dtype, seed=62)), device=dev)
    got = check_op("prefill_attention", args, dtype, dev, kernel_set=V120)
    q, kc, vc, *rest = args
    # v1.1's kernel over the reference's dequantized pages: the same kernel on the same values, so the same bits
    same = V11.prefill_attention(q, kc.dequantize(dtype), vc.dequantize(dtype), *rest)
    if _exact(dev, dtype):
        assert torch.equal(got, same)
    else:
        assert ((got.float() - same.float()).norm() / same.float().norm()).item() < 1e-2
    want = V117.prefill_attention(*args)   # converted per tile, scales on the scores: other rounding
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-2


def test_sequences_without_new_tokens_in_the_batch(dev):
    # prefill metadata may list a sequence with no new tokens: nothing of it is attended, the others are right
    ctx, qlens = [130, 65, 200], [0, 65, 0]
    args = args_to(fp8_kv(prefill_args(ctx, qlens, 4, 2, 64, torch.bfloat16, seed=64)), device=dev)
    check_op("prefill_attention", args, torch.bfloat16, dev, kernel_set=V120)


def test_fp32_models_plain_pages_and_large_calls_go_to_the_other_sets_ops(dev, monkeypatch):
    plain = args_to(prefill_args([65, 130], [65, 66], 4, 2, 64, torch.bfloat16, seed=65), device=dev)
    assert torch.equal(V120.prefill_attention(*plain), prefill_attention_tma(*plain))
    fp32 = args_to(fp8_kv(prefill_args([65, 130], [65, 66], 4, 2, 64, torch.float32, seed=66)), device=dev)
    assert torch.equal(V120.prefill_attention(*fp32), V117.prefill_attention(*fp32))
    big = args_to(fp8_kv(prefill_args([65, 130], [65, 66], 4, 2, 64, torch.bfloat16, seed=67)), device=dev)
    width = big[3].shape[1]   # sequences x the block table's width, whatever their contexts use: K and V in bf16
    assert m.scratch_bytes(big[0], big[3], big[1].data) == 2 * 2 * width * 64 * 2 * 64 * 2
    monkeypatch.setattr(m, "SCRATCH_MAX_BYTES", m.scratch_bytes(big[0], big[3], big[1].data) - 1)
    assert torch.equal(V120.prefill_attention(*big), V117.prefill_attention(*big))


def test_mixed_caches_are_refused(dev):
    q, kc, vc, *rest = fp8_kv(prefill_args([65], [65], 4, 2, 64, torch.bfloat16, seed=68))
    with pytest.raises(Exception, match="both be Fp8Pages or both be tensors"):
        V120.prefill_attention(q, kc, vc.dequantize(torch.bfloat16), *rest)


def test_v121_is_v120_with_a_threshold():
    assert V121.prefill_attention is m.prefill_attention_fp8kv_dequant_large and V121.parent == "triton-v1.20"
    assert V121.overrides == ("prefill_attention",) and V121.kv_cache_dtypes == ("auto", "fp8")


def test_attention_work_is_a_lower_bound_the_host_knows():
    q = torch.empty(300, 4, 64)
    # 300 new tokens over 3 sequences: at least 3 x 100^2 query-key pairs, x 4 heads x 64
    assert m.attention_work(q, torch.empty(3, 8)) == 300 * 300 // 3 * 4 * 64
    assert m.attention_work(q[:0], torch.empty(0, 8)) == 0
    for lens in ([100, 100, 100], [1, 1, 298], [150, 150, 0]):   # any split of the 300 tokens attends at least that
        assert sum(n * n for n in lens) * 4 * 64 >= m.attention_work(q, torch.empty(3, 8))
    # llama3-8b's heads: the threshold sits between short prompts and 2,048-token ones
    llama = torch.empty(2048, 32, 128)
    assert m.attention_work(llama[:256], torch.empty(1, 128)) < m.DEQUANT_MIN_WORK
    assert m.attention_work(llama, torch.empty(1, 128)) >= m.DEQUANT_MIN_WORK
    # the tiny model (4 heads x 64): a whole default step of 2,048 prompt tokens stays with v1.17's kernel
    assert m.attention_work(torch.empty(2048, 4, 64), torch.empty(1, 64)) < m.DEQUANT_MIN_WORK


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_v121_runs_v120_from_the_threshold_and_v117_below_it(dev, dtype, monkeypatch):
    args = args_to(fp8_kv(prefill_args(CTX, QLENS, 4, 2, 64, dtype, seed=70)), device=dev)
    work = m.attention_work(args[0], args[3])
    v117, v120 = V117.prefill_attention(*args), V120.prefill_attention(*args)
    assert not torch.equal(v117, v120)   # the two ops round differently, so the test can tell which one ran
    monkeypatch.setattr(m, "DEQUANT_MIN_WORK", work)
    assert torch.equal(V121.prefill_attention(*args), v120)
    monkeypatch.setattr(m, "DEQUANT_MIN_WORK", work + 1)
    assert torch.equal(V121.prefill_attention(*args), v117)
    plain = args_to(prefill_args([65, 130], [65, 66], 4, 2, 64, dtype, seed=71), device=dev)
    assert torch.equal(V121.prefill_attention(*plain), prefill_attention_tma(*plain))   # plain pages: v1.1 always


@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_llama3_heads_long_mixed_batch(dtype):
    args = llama3_mixed_fp8_prefill(dtype, seed=69)
    check_op_on_gpu("prefill_attention", args, dtype, kernel_set=V120)
    got, want = V120.prefill_attention(*args), V117.prefill_attention(*args)
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-2
