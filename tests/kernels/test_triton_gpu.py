"""triton-v1 (and v1.1's prefill) at full size on a GPU (skipped without CUDA): Llama-3-8B shapes, long contexts,
fp8 tensor cores."""
import pytest
import torch

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.linear import FP8_NATIVE_MIN_M, linear_fp8_w8a8_ref
from tests.kernels.helpers import assert_close_to_fp64, make_paged_kv

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
TRI = get_kernel_set("triton-v1")
REF = get_kernel_set("torch")
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _cast(args, dtype):
    return [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def check(name, args, dtype, atol_scale=1.0, kernel_set=TRI):
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    got = getattr(kernel_set, name)(*args)
    same = getattr(REF, name)(*args)
    ref64 = getattr(REF, name)(*_cast(args, torch.float64))
    got, same, ref64 = (r[0] if isinstance(r, tuple) else r for r in (got, same, ref64))
    assert_close_to_fp64(got, same, ref64, ATOL[dtype] * atol_scale * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norms_and_activation_llama_shapes(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(333, 4096, generator=g).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(4096, generator=g)).to(dtype)
    check("rms_norm", (x, w, 1e-5), dtype)
    check("fused_add_rms_norm", (x, r, w, 1e-5), dtype)
    check("silu_and_mul", (torch.randn(77, 2 * 14336, generator=g).to(dtype),), dtype)


@pytest.mark.parametrize("set_name", ["triton-v1", "triton-v1.1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_prefill_attention_long_mixed_batch(dtype, d, set_name):
    ctx = [1, 63, 64, 65, 1000, 3000, 4096]
    qlens = [1, 63, 64, 1, 1000, 1000, 2048]  # full prompts, decode-like, prefix-cache hits / chunks
    hq, hkv = 32, 8
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cuda", seed=2)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(3)).to(dtype)
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    check("prefill_attention", (q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5),
          dtype, kernel_set=get_kernel_set(set_name))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("ctx", [[1, 63, 64, 65, 1000, 4096] * 11, [32768]])
def test_paged_decode_attention_batches(dtype, ctx):
    hq, hkv, d = 32, 8, 128
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cuda", seed=4)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(5)).to(dtype)
    check("paged_decode_attention", (q, k_cache, v_cache, tables, torch.tensor(ctx, dtype=torch.int32), d ** -0.5),
          dtype)


def test_rope_and_cache_llama_shape():
    from tests.kernels.helpers import rope_tables
    t, hq, hkv, d = 300, 32, 8, 128
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(t, h, d, generator=g).bfloat16().cuda() for h in (hq, hkv, hkv))
    pos = torch.randint(0, 8192, (t,), generator=g).cuda()
    slots = torch.randperm(64 * 64, generator=g)[:t].cuda()
    cos, sin = (c.cuda() for c in rope_tables(8192, d, 500000.0))
    kc, vc = torch.zeros(64, 64, hkv, d, dtype=torch.bfloat16, device="cuda"), None
    vc = torch.zeros_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    qo, ko = TRI.rope_and_cache(q, k, v, pos, cos, sin, kc, vc, slots)
    qr, kr = REF.rope_and_cache(q, k, v, pos, cos, sin, kc2, vc2, slots)
    # both compute in fp32 and round once: identical up to fp32 rounding of the products
    assert (qo.float() - qr.float()).abs().max() <= 2 ** -6
    assert (kc.float() - kc2.float()).abs().max() <= 2 ** -6 and torch.equal(vc, vc2)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("m", [1, 7, 16, 24, 48, 64, 80])  # small, both mid (32/64-row tile) and large-M kernels
@pytest.mark.parametrize("n, k", [(14336, 4096), (4096, 14336)])
def test_weight_only_linear_llama_shapes(kind, m, n, k):
    g = torch.Generator().manual_seed(7)
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, kind).to("cuda")
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    got = TRI.linear(x, qw)
    # from FP8_NATIVE_MIN_M rows on, fp8 weights take the W8A8 path, which also quantizes x: its own torch twin
    same = linear_fp8_w8a8_ref(x, qw) if kind == "fp8" and m >= FP8_NATIVE_MIN_M else REF.linear(x, qw)
    ref64 = REF.linear(x.double(), qw)
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("m", [511, 512, 2048])  # v1's kernel below DEQUANT_MIN_M, dequantize + cuBLAS from it
@pytest.mark.parametrize("n, k", [(14336, 4096), (4096, 14336)])
def test_v1_2_many_rows_llama_shapes(m, n, k):
    from sits.kernels.linear_dequant import DEQUANT_MIN_M
    assert DEQUANT_MIN_M == 512
    g = torch.Generator().manual_seed(10)
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, "int8").to("cuda")
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    bias = torch.randn(n, generator=g).cuda()
    got = get_kernel_set("triton-v1.2").linear(x, qw, bias)
    ref64 = REF.linear(x.double(), qw, bias.double())
    assert_close_to_fp64(got, REF.linear(x, qw, bias), ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("m, block_m, split_k", [(16, 16, 2), (16, 16, 4), (16, 16, 8), (24, 32, 4), (48, 64, 2)])
@pytest.mark.parametrize("n, k", [(14336, 4096), (4096, 14336)])
def test_weight_only_linear_split_k(m, block_m, split_k, n, k):
    # every split-K config autotuning may pick, repeated: a missing release/acquire between the splits' partials
    # and the last split's sum would show up as a wrong or run-to-run varying result
    from sits.kernels.linear import linear_with_config
    g = torch.Generator().manual_seed(9)
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, "int8").to("cuda")
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    same = REF.linear(x, qw)
    ref64 = REF.linear(x.double(), qw)
    first = None
    for _ in range(5):
        got = linear_with_config(x, qw, block_m=block_m, block_n=64, block_k=256, split_k=split_k, num_stages=3)
        assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
        first = got if first is None else first
        assert torch.equal(got, first)  # the partials are summed in split order: deterministic


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="fp8 tensor cores need sm_89+")
@pytest.mark.parametrize("m", [FP8_NATIVE_MIN_M, 300, 2048])
def test_fp8_native_w8a8_linear(m):
    # the native path also quantizes activations per token; its "same precision" torch twin does the same math
    g = torch.Generator().manual_seed(8)
    n, k = 4096, 4096
    w = torch.randn(n, k, generator=g) * 0.02
    qw = quantize_weight(w, "fp8").to("cuda")
    x = torch.randn(m, k, generator=g).bfloat16().cuda()
    bias = torch.randn(n, generator=g).cuda()
    got = TRI.linear(x, qw, bias)
    same = linear_fp8_w8a8_ref(x, qw, bias)
    ref64 = REF.linear(x.double(), qw, bias.double())
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


def test_fast_launch_repeats_match_the_reference_and_respecialize():
    """Repeated eager calls (the engine's decode loop) run through FastLauncher after the first: every call must
    still match the reference, and an argument with another specialization (a misaligned view, M = 1 vs 5) must get
    its own compiled kernel instead of reusing one built for 16-byte-aligned pointers."""
    from sits.kernels import linear as lin
    from sits.kernels.triton_env import tuned_launcher
    g = torch.Generator().manual_seed(11)
    n, k = 4096, 4096
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, "int8").to("cuda")
    buf = torch.randn(8 * k + 1, generator=g).bfloat16().cuda()
    tol = ATOL[torch.bfloat16]
    for m in (1, 5, 1, 5):
        for x in (buf[:m * k].view(m, k), buf[1:1 + m * k].view(m, k)):  # aligned, then 2 bytes off
            assert x.is_contiguous()
            ref64 = REF.linear(x.double(), qw)
            assert_close_to_fp64(TRI.linear(x, qw), REF.linear(x, qw), ref64, tol * max(1.0, ref64.abs().max().item()))
    dev = torch.device("cuda", torch.cuda.current_device())
    launcher = tuned_launcher(lin._linear_small_m, (dev, n, k, torch.bfloat16, False, "tf32"))
    # M=1 vs M=5 (an int arg equal to 1 is specialized) x aligned vs not: four kernels, each reused on the repeats
    assert len(launcher.compiled) == 4
    h = torch.randn(3, 4096, generator=g).bfloat16().cuda()
    w = (1 + 0.1 * torch.randn(4096, generator=g)).bfloat16().cuda()
    for _ in range(3):
        check("rms_norm", (h, w, 1e-5), torch.bfloat16)
        check("fused_add_rms_norm", (h, h.flip(0), w, 1e-5), torch.bfloat16)
        check("silu_and_mul", (torch.randn(5, 2 * 1024, generator=g).bfloat16(),), torch.bfloat16)
