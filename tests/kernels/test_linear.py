"""Linear layers with INT8/FP8 weights (`linear`; kernels/linear.py, v1.2's kernels/linear_dequant.py): the torch
reference against fp64 matmul, the Triton kernels on CPU and GPU (split K, dequantize then cuBLAS from many rows),
and Llama-3-8B shapes, split-K configs and fp8 tensor cores on a GPU."""
import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set, quantize_weight
from sits.kernels.fp8_gemm import FP8_NATIVE_MIN_M, linear_fp8_w8a8_ref
from tests.kernels.helpers import ATOL, DTYPES, assert_close_to_fp64, assert_verbose_allclose, on_gpu

REF = get_kernel_set("torch")
TRI = get_kernel_set("triton-v1")


# ---- the torch reference against independent fp64 formulations ----

@pytest.mark.parametrize("kind, rel", [("int8", 0.5 / 127), ("fp8", 2 ** -4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_quantized_linear(kind, rel, dtype):
    g = torch.Generator().manual_seed(8)
    w = torch.randn(37, 64, generator=g)
    w[3] = 0.0  # an all-zero row must survive
    qw = quantize_weight(w, kind)
    amax = w.abs().amax(1, keepdim=True)
    assert ((qw.dequantize() - w).abs() <= rel * amax + 1e-12).all()
    assert (qw.dequantize()[3] == 0).all()
    x = torch.randn(5, 64, generator=g).to(dtype)
    b = torch.randn(37, generator=g)
    want = F.linear(x.double(), qw.dequantize(torch.float64), b.double())
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    got = REF.linear(x, qw, b)
    assert got.dtype == dtype and got.shape == (5, 37)
    assert_verbose_allclose(got, want, tol, tol)
    assert_verbose_allclose(REF.linear(x, w.to(dtype)), F.linear(x.double(), w.to(dtype).double()), tol, tol)
    with pytest.raises(ValueError, match="does not match"):
        REF.linear(torch.randn(2, 63), qw)


# ---- Triton against the reference: CPU through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU ----

@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 33])  # decode-like (padded 16-row tiles) and prefill-like M
def test_quantized_linear(dev, kind, dtype, m):
    g = torch.Generator().manual_seed(40)
    qw = quantize_weight(torch.randn(37, 100, generator=g), kind).to(dev)  # odd N and K (masked tiles)
    x = torch.randn(m, 100, generator=g).to(dtype)
    bias = torch.randn(37, generator=g)
    got = TRI.linear(x.to(dev), qw, bias.to(dev))
    same = REF.linear(x.to(dev), qw, bias.to(dev))
    ref64 = REF.linear(x.double(), qw.to("cpu"), bias.double())
    assert got.shape == (m, 37) and got.dtype == dtype
    assert_close_to_fp64(got, same, ref64, ATOL[dtype] * max(1.0, ref64.abs().max().item()))
    no_bias = TRI.linear(x.to(dev), qw)
    assert_close_to_fp64(no_bias, REF.linear(x.to(dev), qw), REF.linear(x.double(), qw.to("cpu")),
                         ATOL[dtype] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("split_k", [1, 3, 8])
def test_quantized_linear_split_k(dev, split_k):
    # K=100 in 32-wide steps: uneven splits, and with 8 splits the last four get no k at all
    from sits.kernels.linear import linear_with_config
    g = torch.Generator().manual_seed(41)
    qw = quantize_weight(torch.randn(50, 100, generator=g), "int8").to(dev)
    x = torch.randn(5, 100, generator=g).to(torch.bfloat16)
    bias = torch.randn(50, generator=g)
    ref64 = REF.linear(x.double(), qw.to("cpu"), bias.double())
    same = REF.linear(x.to(dev), qw, bias.to(dev))
    for _ in range(2):  # the second launch relies on the first having reset its tile counters
        got = linear_with_config(x.to(dev), qw, bias.to(dev), block_m=16, block_n=16, block_k=32, split_k=split_k)
        assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_many_rows_dequantize_then_matmul(dev, kind, monkeypatch):
    # triton-v1.2: from DEQUANT_MIN_M rows on, the weight is dequantized into a scratch buffer and multiplied by
    # cuBLAS (CPU: torch); below it, v1's kernel
    from sits.kernels import linear_dequant as lin
    v12 = get_kernel_set("triton-v1.2")
    assert v12.linear is lin.linear_dequant_many_rows and v12.parent == "triton-v1.1"
    monkeypatch.setattr(lin, "DEQUANT_MIN_M", 8)
    calls = []
    monkeypatch.setattr(lin, "dequantize_into_scratch",
                        lambda w, dt, f=lin.dequantize_into_scratch: calls.append(w.shape) or f(w, dt))
    g = torch.Generator().manual_seed(42)
    big = quantize_weight(torch.randn(37, 100, generator=g), kind).to(dev)
    small = quantize_weight(torch.randn(20, 100, generator=g), kind).to(dev)
    bias = torch.randn(37, generator=g)
    tol = ATOL[torch.bfloat16]
    for m, w, b in ((9, big, bias), (9, small, None), (9, big, None), (7, big, bias)):  # the scratch is reused
        x = torch.randn(m, 100, generator=g).to(torch.bfloat16)
        ref64 = REF.linear(x.double(), w.to("cpu"), None if b is None else b.double())
        same = REF.linear(x.to(dev), w, None if b is None else b.to(dev))
        got = v12.linear(x.to(dev), w, None if b is None else b.to(dev))
        assert got.shape == (m, w.shape[0]) and got.dtype == torch.bfloat16
        assert_close_to_fp64(got, same, ref64, tol * max(1.0, ref64.abs().max().item()))
    native_fp8 = kind == "fp8" and dev != "cpu" and torch.cuda.get_device_capability() >= (8, 9)
    assert len(calls) == (0 if native_fp8 else 3)  # 7 rows: v1's kernel; fp8 tensor cores: the W8A8 kernel
    # the dequantized weight is q * scale rounded once to nearest, as the torch reference's dequantize does (Triton's
    # interpreter rounds bf16 toward zero whatever the kernel asks: within one bf16 ulp there)
    got, want = lin.dequantize_into_scratch(small, torch.bfloat16).cpu(), small.dequantize(torch.bfloat16).cpu()
    if dev == "cpu":
        assert ((got.float() - want.float()).abs() <= want.float().abs() * 2 ** -7).all()
    else:
        assert torch.equal(got, want)


def test_plain_linear_is_cublas_exact(dev):
    x, w = torch.randn(3, 40, device=dev), torch.randn(24, 40, device=dev)
    assert torch.equal(TRI.linear(x, w), F.linear(x, w))


# ---- on a GPU at Llama-3-8B shapes (marked gpu, skipped without CUDA) ----

@on_gpu
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


@on_gpu
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


@on_gpu
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


def test_an_outgrown_split_k_lock_buffer_stays_allocated_for_the_graphs_that_captured_it(monkeypatch):
    # a CUDA graph records the address of its stream's lock buffer: when a later launch needs more tiles and the
    # stream gets a larger buffer, the old one must stay allocated, or the graph counts in memory that later
    # allocations overwrite (the engine's batch-1 decode graph did, BENCHMARKS.md "Fused decode layers")
    import gc
    import weakref

    from sits.kernels import linear as lin
    monkeypatch.setattr(lin, "_LOCKS", {})
    monkeypatch.setattr(lin, "_RETIRED", [])
    cpu = torch.device("cpu")
    small = lin._split_k_locks(cpu, 300)
    assert small.numel() == 1024 and lin._split_k_locks(cpu, 1024) is small   # enough: the same buffer
    grown = lin._split_k_locks(cpu, 1792)
    assert grown is not small and grown.numel() == 2048 and not grown.any()
    kept = weakref.ref(small)
    del small
    gc.collect()
    assert kept() is not None, "the outgrown buffer was freed while a graph may still use it"
    assert lin._split_k_locks(cpu, 5) is grown


@on_gpu
def test_a_graph_captured_before_its_streams_lock_buffer_grows_still_computes_right():
    # the engine's sequence, small: a batch-1 step's split-K linear captured on a stream, then a 64-row launch on
    # the same stream that needs more split-K tiles than its lock buffer holds, then allocations that reuse freed
    # memory; the graph's replays must still give the eager result, bit for bit
    from sits.kernels.linear import _LOCKS, linear_with_config
    g = torch.Generator().manual_seed(11)
    qw = quantize_weight(torch.randn(4096, 14336, generator=g) * 0.02, "int8").to("cuda")
    x = torch.randn(1, 14336, generator=g).bfloat16().cuda()
    wide = quantize_weight(torch.randn(28672, 4096, generator=g) * 0.02, "int8").to("cuda")
    xw = torch.randn(64, 4096, generator=g).bfloat16().cuda()
    want = linear_with_config(x, qw, split_k=4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        linear_with_config(x, qw, split_k=4)   # compiles; the side stream's lock buffer, outside the capture
        key = (str(x.device), torch.cuda.current_stream().cuda_stream)
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        got = linear_with_config(x, qw, split_k=4)
    before = _LOCKS.get(key)
    with torch.cuda.stream(side):   # 64 rows x 28672 columns in 16 x 16 tiles: more than the buffer held
        linear_with_config(xw, wide, block_m=16, block_n=16, block_k=64, split_k=2, num_stages=2)
    side.synchronize()
    assert before is None or _LOCKS.get(key) is not before   # the stream's buffer did grow
    with torch.cuda.stream(side):   # the caching allocator hands a block freed on a stream to that stream's requests
        junk = [torch.full((n,), 3, dtype=torch.int32, device="cuda") for n in (1024, 2048) for _ in range(64)]
    torch.cuda.synchronize()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)
    del junk


@on_gpu
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
