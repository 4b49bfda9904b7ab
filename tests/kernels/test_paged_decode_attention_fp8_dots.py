"""kernels/paged_decode_attention_fp8_dots.py: decode attention over FP8 pages on fp8 tensor cores (q and the softmax
weights in e4m3), in no kernel set yet. On CPU under Triton's interpreter (the e4m3 roundings done in fp32 bits, as
the GPU rounds): the kernel computes the numerics bench/kv_fp8_accuracy.py --qp models, whose accuracy against the
model is in BENCHMARKS.md "FP8 KV cache"; splits and padded heads change nothing; on a GPU at llama3-8b's shapes."""
import pytest
import torch

from bench.kv_fp8_accuracy import _decode_e4m3_qp
from sits.kernels import get_kernel_set
from sits.kernels.paged_decode_attention_fp8_dots import paged_decode_attention_fp8_dots
from tests.kernels.helpers import decode_args, fp8_kv, make_paged_kv, on_gpu

REF = get_kernel_set("torch")


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_scale", [1.0, 8.0])   # flat and peaked softmax
def test_the_kernel_computes_the_modelled_numerics(dtype, q_scale):
    q, *rest = fp8_kv(decode_args([1, 63, 64, 65, 300, 1000], 12, 4, 64, dtype, seed=60))
    args = ((q.float() * q_scale).to(dtype), *rest)
    got = paged_decode_attention_fp8_dots(*args)
    assert got.dtype == dtype and not got.isnan().any()
    model, ref = _decode_e4m3_qp(*args), REF.paged_decode_attention(*args)
    # the model takes one softmax max and one weight scale per row where the kernel has them per 64-token tile
    assert rel(got, model) < 0.015
    # e4m3's 3 mantissa bits on q and the weights: a few percent of a random, near-average output, not more
    assert rel(got, ref) < 0.08


def test_splits_and_the_head_padding_change_nothing():
    # GROUP 3 pads to 8 query rows; a split's partials merge as triton-v1's do
    args = fp8_kv(decode_args([1, 65, 500], 6, 2, 32, torch.float32, seed=61))
    one = paged_decode_attention_fp8_dots(*args, num_splits=1)
    for splits in (2, 4):
        assert rel(paged_decode_attention_fp8_dots(*args, num_splits=splits), one) < 0.02


def test_plain_pages_are_refused():
    args = decode_args([5], 4, 2, 32, torch.float32, seed=62)
    with pytest.raises(TypeError, match="FP8 pages"):
        paged_decode_attention_fp8_dots(*args)


@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_a_gpu_at_llama3_8b_shapes(dtype):
    ctx = [1, 63, 64, 65, 1000, 4096] * 11
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, 8, 128, 64, dtype, "cuda", seed=63)
    q = torch.randn(len(ctx), 32, 128, generator=torch.Generator().manual_seed(64)).to(dtype).cuda()
    args = fp8_kv((q, k_cache, v_cache, tables, torch.tensor(ctx, dtype=torch.int32, device="cuda"), 128 ** -0.5))
    got = paged_decode_attention_fp8_dots(*args)
    assert not got.isnan().any() and rel(got, REF.paged_decode_attention(*args)) < 0.08
    assert rel(got, _decode_e4m3_qp(*args)) < 0.015
    assert torch.equal(got, paged_decode_attention_fp8_dots(*args))   # repeatable bits
