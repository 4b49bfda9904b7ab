"""Paged decode attention (`paged_decode_attention`, the op every kernel set must have;
kernels/paged_decode_attention.py): the torch reference against SDPA and against prefill with one token, the Triton
kernel on CPU and GPU (split KV), and large batches and a 32k context on a GPU; over FP8 pages (kernels/kv_fp8.py,
triton-v1.3's kernels/paged_decode_attention_fp8.py) the same checks against the dequantized pages."""
import pytest
import torch

from sits.kernels import get_kernel_set
from tests.kernels.helpers import (ATOL, DTYPES, REF_DTYPES, args_to, assert_close_to_fp64, assert_verbose_allclose,
                                   check_op, check_op_on_gpu, decode_args, fp8_kv, make_paged_kv, on_gpu,
                                   quantize_pages, sdpa_masked)

REF = get_kernel_set("torch")
V13 = get_kernel_set("triton-v1.3")
V15 = get_kernel_set("triton-v1.5")
V18 = get_kernel_set("triton-v1.8")
V114 = get_kernel_set("triton-v1.14")
V115 = get_kernel_set("triton-v1.15")
V126 = get_kernel_set("triton-v1.26")


def _one_dtype_on_cpu(dev, dtype):
    """v1.14, v1.15 and v1.26 differ from v1.8 only in their GPU launch configs and conversions, so under the
    interpreter (one config for every set) each is its parent bit for bit, which bf16 shows; v1.8 holds every dtype
    there, and on a GPU each set runs them all."""
    if dev == "cpu" and dtype != torch.bfloat16:
        pytest.skip("on CPU this set runs its parent's code: test_triton_v1_8_decodes_fp8_pages holds this dtype")


# ---- the torch reference against independent fp64 formulations ----

@pytest.mark.parametrize("dtype, atol, rtol", REF_DTYPES)
def test_reference_decode_attention_matches_prefill_with_one_token(dtype, atol, rtol):
    ctx = [1, 63, 64, 65, 200]
    hq, hkv, d, bs = 12, 4, 32, 64
    k_cache, v_cache, tables, ks, vs = make_paged_kv(ctx, hkv, d, bs, dtype, "cpu", seed=6)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(7)).to(dtype)
    lens = torch.tensor(ctx, dtype=torch.int32)
    out = REF.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125)
    for b in range(len(ctx)):
        assert_verbose_allclose(out[b:b + 1], sdpa_masked(q[b:b + 1], ks[b], vs[b], 0.125), atol, rtol)
    cu = torch.arange(len(ctx) + 1, dtype=torch.int32)
    assert_verbose_allclose(out, REF.prefill_attention(q, k_cache, v_cache, tables, cu, lens, 0.125), atol, rtol)


def test_reference_attention_rejects_bad_shapes():
    from sits.kernels.paged import PagedAttentionError
    kc = torch.zeros(4, 16, 3, 8)
    with pytest.raises(PagedAttentionError, match="multiple"):
        REF.paged_decode_attention(torch.zeros(1, 4, 8), kc, kc, torch.zeros(1, 2, dtype=torch.int32),
                                   torch.ones(1, dtype=torch.int32), 1.0)
    with pytest.raises(PagedAttentionError, match="context_lens"):
        REF.paged_decode_attention(torch.zeros(2, 6, 8), kc, kc, torch.zeros(2, 2, dtype=torch.int32),
                                   torch.ones(3, dtype=torch.int32), 1.0)


@pytest.mark.parametrize("dtype, atol, rtol", REF_DTYPES)
def test_reference_decode_attention_over_fp8_pages_is_attention_over_their_values(dtype, atol, rtol):
    ctx = [1, 63, 64, 65, 200]
    q, k_cache, v_cache, tables, lens, scale = fp8_kv(decode_args(ctx, 12, 4, 32, dtype, seed=8))
    out = REF.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
    # the pages' values gathered the way the reference gathers them: the same numbers exactly
    assert torch.equal(out, REF.paged_decode_attention(q, k_cache.dequantize(dtype), v_cache.dequantize(dtype),
                                                       tables, lens, scale))
    k64, v64 = k_cache.dequantize(torch.float64), v_cache.dequantize(torch.float64)
    for b, n in enumerate(ctx):
        blocks = tables[b, :-(-n // 64)].long()
        ks, vs = (c[blocks].reshape(-1, 4, 32)[:n] for c in (k64, v64))
        assert_verbose_allclose(out[b:b + 1], sdpa_masked(q[b:b + 1], ks, vs, scale), atol, rtol)


# ---- Triton against the reference: CPU through Triton's interpreter (TRITON_INTERPRET=1), compiled on a GPU ----

@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention(dev, dtype):
    check_op("paged_decode_attention", decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=30), dtype, dev)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_paged_decode_attention_splits(dev, num_splits):
    from sits.kernels.paged_decode_attention import paged_decode_attention
    args = decode_args([1, 65, 1000], 6, 3, 32, torch.bfloat16, seed=31)
    got = paged_decode_attention(*args_to(args, device=dev), num_splits=num_splits)
    same = REF.paged_decode_attention(*args)
    ref64 = REF.paged_decode_attention(*args_to(args, dtype=torch.float64))
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention_fp8_pages(dev, dtype):
    # the reference in fp64 reads the same e4m3 pages: this is the kernel's error, not the quantization's
    check_op("paged_decode_attention", fp8_kv(decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=32)), dtype,
             dev, kernel_set=V13)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_paged_decode_attention_fp8_splits(dev, num_splits):
    from sits.kernels.paged_decode_attention_fp8 import paged_decode_attention_fp8kv
    args = fp8_kv(decode_args([1, 65, 1000], 6, 3, 32, torch.bfloat16, seed=33))
    got = paged_decode_attention_fp8kv(*args_to(args, device=dev), num_splits=num_splits)
    same = REF.paged_decode_attention(*args)
    ref64 = REF.paged_decode_attention(*args_to(args, dtype=torch.float64))
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16])


@pytest.mark.parametrize("q_scale", [1.0, 3e5])   # 3e5: past fp16's range, lowered by a power of two in-kernel
@pytest.mark.parametrize("num_splits", [1, 8])
def test_triton_v1_5_decodes_fp8_pages_with_fp16_dots(dev, num_splits, q_scale):
    from sits.kernels.paged_decode_attention_fp8 import paged_decode_attention_fp8kv_f16
    q, *rest = fp8_kv(decode_args([1, 63, 65, 1000], 8, 2, 64, torch.bfloat16, seed=35))
    args = ((q.float() * q_scale).bfloat16(), *rest)
    got = paged_decode_attention_fp8kv_f16(*args_to(args, device=dev), num_splits=num_splits)
    same = REF.paged_decode_attention(*args)
    ref64 = REF.paged_decode_attention(*args_to(args, dtype=torch.float64))
    assert got.dtype == torch.bfloat16 and not got.isnan().any()
    assert_close_to_fp64(got, same, ref64, ATOL[torch.bfloat16] * max(1.0, ref64.abs().max().item()))
    # float32 and float16 models run v1.3's kernel unchanged
    for dtype in (torch.float32, torch.float16):
        other = args_to((q, *rest), dtype=dtype, device=dev)
        assert torch.equal(V15.paged_decode_attention(*other), V13.paged_decode_attention(*other))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_v1_8_decodes_fp8_pages(dev, dtype):
    # on a GPU e4m3_to_f16's asm converts the tiles where they are loaded (llama3-8b's shapes, past _TUNE_MIN_BLOCKS:
    # test_paged_decode_attention_fp8_batches); the interpreter cannot run asm, so on CPU v1.8 is v1.5, bit for bit
    args = fp8_kv(decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=36))
    check_op("paged_decode_attention", args, dtype, dev, kernel_set=V18)
    if dev == "cpu":
        assert torch.equal(V18.paged_decode_attention(*args), V15.paged_decode_attention(*args))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_v1_14_decodes_fp8_pages(dev, dtype):
    # one warp a program on 32-token tiles (V114_CONFIG; on a GPU at llama3-8b's shapes: the batches test below); the
    # interpreter runs one config for every set, so on CPU v1.14 is v1.8 bit for bit; plain pages are triton-v1's
    _one_dtype_on_cpu(dev, dtype)
    args = fp8_kv(decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=37))
    check_op("paged_decode_attention", args, dtype, dev, kernel_set=V114)
    if dev == "cpu":
        assert torch.equal(V114.paged_decode_attention(*args), V18.paged_decode_attention(*args))
    plain = args_to(decode_args([1, 65, 300], 6, 2, 64, dtype, seed=38), device=dev)
    assert torch.equal(V114.paged_decode_attention(*plain), get_kernel_set("triton-v1").paged_decode_attention(*plain))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_v1_15_decodes_fp8_pages(dev, dtype):
    # v1.14's kernel at the config its WavesRule picks a launch (on a GPU at llama3-8b's shapes: the batches test
    # below); the interpreter runs one config for every set, so on CPU v1.15 is v1.14 bit for bit
    _one_dtype_on_cpu(dev, dtype)
    args = fp8_kv(decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=39))
    check_op("paged_decode_attention", args, dtype, dev, kernel_set=V115)
    if dev == "cpu":
        assert torch.equal(V115.paged_decode_attention(*args), V114.paged_decode_attention(*args))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_v1_26_decodes_fp8_pages(dev, dtype):
    # v1.15's rule and kernel with the key tile converted in the q.k dot's operand layout (STAGE_K=False, which only
    # differs where the asm conversion runs: on a GPU, the batches test below); the interpreter runs one config for
    # every set, so on CPU v1.26 is v1.15 bit for bit; plain pages are triton-v1's
    _one_dtype_on_cpu(dev, dtype)
    from sits.kernels import paged_decode_attention_fp8 as fp8
    assert V126.parent == "triton-v1.25" and V126.paged_decode_attention is fp8.paged_decode_attention_k_in_dot
    assert V126.linear_silu_and_mul is get_kernel_set("triton-v1.25").linear_silu_and_mul
    assert [c["STAGE_K"] for c in fp8.V126_CONFIGS] == [False, False]
    assert [{k: v for k, v in c.items() if k != "STAGE_K"} for c in fp8.V126_CONFIGS] == list(fp8.V115_CONFIGS)
    args = fp8_kv(decode_args([1, 63, 64, 65, 1000], 12, 4, 64, dtype, seed=40))
    check_op("paged_decode_attention", args, dtype, dev, kernel_set=V126)
    if dev == "cpu":
        assert torch.equal(V126.paged_decode_attention(*args), V115.paged_decode_attention(*args))
    plain = args_to(decode_args([1, 65, 300], 6, 2, 64, dtype, seed=41), device=dev)
    assert torch.equal(V126.paged_decode_attention(*plain), get_kernel_set("triton-v1").paged_decode_attention(*plain))


@pytest.mark.parametrize("programs, per_sm, want", [
    # the H100's compiled kernels: 10 one-warp programs an SM (counted as 8: two rounds of its four schedulers) and 3
    # four-warp ones, 132 SMs; bench/decode_attention_batch.py's winners there
    (1024, (10, 3), "one warp"),     # 16-128 sequences: fills 0.97 / 0.86; one warp won by 3-10 %
    (2048, (10, 3), "one warp"),     # 256: 0.97 / 0.86
    (768, (10, 3), "four warps"),    # 96: 0.73 / 0.97, four warps won by 10 %
    (1280, (10, 3), "four warps"),   # 160: 0.61 / 0.81, by 14 % (the plain count, 10, would fill 0.97 with one warp)
    (1536, (10, 3), "four warps"),   # 192: 0.73 / 0.97, by 21 %
    (1792, (10, 3), "four warps"),   # 224: 0.85 / 0.91, by 7 %
    (768, (3, 3), "four warps"),     # one warp counted as 0 programs an SM (fewer than a round of schedulers)
    (768, (10, 0), "one warp"),      # four warps do not fit
])
def test_triton_v1_15_picks_the_config_whose_waves_fill_the_gpu(monkeypatch, programs, per_sm, want):
    from sits.kernels import occupancy as occ
    one, four = {"num_warps": 1, "BLOCK_N": 32}, {"num_warps": 4, "BLOCK_N": 128}

    class Launch:   # what a WavesRule reads of a DecodeLaunch: its grid, its output's device, its constexprs
        grid, out, meta = (8, programs // 8, 1), torch.empty(0), {}
    monkeypatch.setattr(occ, "sm_limits", lambda dev: {"regs": 65536})
    monkeypatch.setattr(occ, "num_sms", lambda dev: 132)
    monkeypatch.setattr(occ, "programs_per_sm_of",
                        lambda launch, config, limits: per_sm[0] if config is one else per_sm[1])
    rule = occ.WavesRule(one, four)
    picked = rule(Launch())
    assert picked is (one if want == "one warp" else four)
    monkeypatch.setattr(occ, "num_sms", lambda dev: 1 / 0)
    assert rule(Launch()) is picked   # once per grid and constexprs: later calls look it up
    monkeypatch.setattr(occ, "sm_limits", lambda dev: None)   # limits unknown: the one-warp config
    assert occ.WavesRule(one, four)(Launch()) is one
    monkeypatch.setattr(occ, "sm_limits", lambda dev: {"regs": 65536})
    monkeypatch.setattr(occ, "programs_per_sm_of", lambda launch, config, limits: None)   # registers unknown
    assert occ.WavesRule(one, four)(Launch()) is one


def test_programs_per_sm_of_compiles_the_launch_at_the_config_once(monkeypatch):
    # occupancy.programs_per_sm_of asks the launch to compile itself at a config and counts from the compiled
    # kernel's registers and shared memory, once per device, constexprs and config
    from sits.kernels import occupancy as occ
    compiled = []

    class Kernel:
        n_regs, metadata = 186, type("Meta", (), {"shared": 20 * 1024})

        def _init_handles(self):
            pass

    class Launch:
        out, meta = torch.empty(0), {"HEAD_DIM": 128}

        def compile(self, config):
            compiled.append(config)
            return Kernel()
    monkeypatch.setattr(occ, "_PER_SM", {})
    limits = {"regs": 65536, "shared": 233472, "threads": 2048, "blocks": 32}
    cfg = {"num_warps": 1, "BLOCK_N": 32, "STAGE_K": False}
    assert occ.programs_per_sm_of(Launch(), cfg, limits) == 10   # 233,472 / (20,480 + 1,024) shared memory
    assert occ.programs_per_sm_of(Launch(), cfg, limits) == 10 and compiled == [cfg]


@on_gpu
def test_triton_v1_15_picks_on_this_gpu_as_the_h100_measured():
    # v1.15's WavesRule with the compiled kernels' registers and shared memory and this device's limits, at llama3-8b's
    # shapes (32 / 8 heads, head_dim 128, bf16 q): where the H100's sweep had four warps win (96 and 192 sequences),
    # (96-224 sequences) those, elsewhere one warp (bench/decode_attention_batch.py); with the H100's / H200's 132 SMs
    from sits.kernels import paged_decode_attention_fp8 as fp8
    from sits.kernels.triton_env import num_sms
    if num_sms(torch.device("cuda")) != 132:
        pytest.skip("the H100's measured winners hold for its 132 SMs")
    k_cache, v_cache, tables, _, _ = make_paged_kv([64], 8, 128, 64, torch.bfloat16, "cuda", seed=8)
    k8, v8 = quantize_pages(k_cache), quantize_pages(v_cache)
    picked = {}
    for b in (16, 64, 96, 128, 160, 192, 224, 256):
        q = torch.randn(b, 32, 128, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((b,), 64, dtype=torch.int32, device="cuda")
        launch = fp8.DecodeLaunch.prepare(q, k8, v8, tables.expand(b, -1), lens, 0.088, None, f16_dot=True,
                                          staged=True, heads_first=True)
        picked[b] = fp8.v115_config(launch)["num_warps"]
        # triton-v1.26's configs compile to the same registers and shared memory, so the rule picks alike
        assert fp8.v126_config(launch)["num_warps"] == picked[b]
    assert picked == {16: 1, 64: 1, 96: 4, 128: 1, 160: 4, 192: 4, 224: 4, 256: 1}, picked


def test_triton_v1_3_decodes_plain_pages_with_triton_v1s_kernel(dev):
    # --kv-cache-dtype auto on triton-v1.3 is triton-v1's decode, bit for bit
    args = args_to(decode_args([1, 65, 300], 6, 2, 64, torch.bfloat16, seed=34), device=dev)
    assert torch.equal(V13.paged_decode_attention(*args), get_kernel_set("triton-v1").paged_decode_attention(*args))


# ---- on a GPU at Llama-3-8B shapes (marked gpu, skipped without CUDA) ----

@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("ctx", [[1, 63, 64, 65, 1000, 4096] * 11, [32768]])
def test_paged_decode_attention_batches(dtype, ctx):
    hq, hkv, d = 32, 8, 128
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cuda", seed=4)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(5)).to(dtype)
    args = (q, k_cache, v_cache, tables, torch.tensor(ctx, dtype=torch.int32), d ** -0.5)
    check_op_on_gpu("paged_decode_attention", args, dtype)


@on_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ctx", [[1, 63, 64, 65, 1000, 4096] * 11, [32768]])
def test_paged_decode_attention_fp8_batches(dtype, ctx):
    hq, hkv, d = 32, 8, 128
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cuda", seed=6)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(7)).to(dtype)
    args = fp8_kv((q, k_cache, v_cache, tables, torch.tensor(ctx, dtype=torch.int32), d ** -0.5))
    check_op_on_gpu("paged_decode_attention", args, dtype, kernel_set=V13)
    if dtype == torch.bfloat16:
        check_op_on_gpu("paged_decode_attention", args, dtype, kernel_set=V15)
    # triton-v1.8: the tiles converted where they are loaded (e4m3_to_f16's asm), its own launch config
    check_op_on_gpu("paged_decode_attention", args, dtype, kernel_set=V18)
    # triton-v1.14: the same kernel at one warp a program (V114_CONFIG), against the reference and against v1.8
    check_op_on_gpu("paged_decode_attention", args, dtype, kernel_set=V114)
    if dtype == torch.bfloat16:
        on_cuda = args_to(args, device="cuda")
        got, v18 = V114.paged_decode_attention(*on_cuda), V18.paged_decode_attention(*on_cuda)
        # tiles of 32 tokens move the running max, so p rounds to fp16 at other points: a few bf16 ulps apart (4.8e-4
        # measured at 256 x 2,304; one ulp on every element would be ~2e-3)
        assert ((got.float() - v18.float()).norm() / v18.float().norm()).item() < 2e-3
    # triton-v1.15: each launch at v1.14's config or v1.8's, so its values are one of theirs, bit for bit
    check_op_on_gpu("paged_decode_attention", args, dtype, kernel_set=V115)
    on_cuda = args_to(args, device="cuda")
    got = V115.paged_decode_attention(*on_cuda)
    assert any(torch.equal(got, ks.paged_decode_attention(*on_cuda)) for ks in (V114, V18))
    # triton-v1.26: v1.15's configs with the key tile converted in the q.k dot's operand layout (STAGE_K=False):
    # exact conversions and v1.15's tiles, so v1.15's values within a few bf16 ulps (the measured run: 4.9e-4 from
    # v1.13's at 256 x 2,048-2,560, as v1.14's own; one ulp on every element would be ~2e-3)
    check_op_on_gpu("paged_decode_attention", args, dtype, kernel_set=V126)
    got, v115 = V126.paged_decode_attention(*on_cuda).float(), V115.paged_decode_attention(*on_cuda).float()
    assert ((got - v115).norm() / v115.norm()).item() < 2e-3
