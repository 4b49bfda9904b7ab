"""The GEMV's and the norm's PDL constexpr (programmatic dependent launch; kernels/linear_gemv.py, kernels/rms_norm.py),
bench/pdl_chain.py, whose GPU run times it, and triton-v1.12, which serves it. On CPU: the bench's layer chain (PDL
off, through Triton's interpreter) computes what the ops compose to; compiled for sm_90 in a process without the
interpreter, PDL puts exactly one griddepcontrol.wait and one launch_dependents (and the GEMV's L2 prefetch) into each
kernel, and nothing without it; v1.12's ops give v1.9's bits; on an sm_90+ GPU, in a CUDA graph too."""
import pytest
import torch

from sits.kernels import get_kernel_set
from tests.kernels.helpers import compile_for_sm90

TORCH = get_kernel_set("torch")


@pytest.mark.parametrize("kind,launch", [("bf16", "fixed"), ("int8", "fixed"), ("fp8", "fixed"), ("bf16", "tuned")])
def test_the_chain_runs_each_layer_as_the_ops_compose(dev, kind, launch):
    from bench.pdl_chain import EPS, Chain
    h = 64
    configs = "tuned" if launch == "tuned" else {p: (8, 32, 1) for p in ("qkv", "o", "gate_up", "down")}
    chain = Chain(kind, device=dev, layers=2, dims=(h, 96, 80), configs=configs)
    x, r = (t.clone() for t in chain.run(False))
    xr, rr = chain.x0, chain.r0
    for w in chain.layers:   # the same layers through the reference set's ops
        h1, r1 = TORCH.fused_add_rms_norm(xr, rr, w["n1"], EPS)
        o = TORCH.linear(TORCH.linear(h1, w["qkv"])[:, :h].contiguous(), w["o"])
        h2, rr = TORCH.fused_add_rms_norm(o, r1, w["n2"], EPS)
        xr = TORCH.linear(TORCH.silu_and_mul(TORCH.linear(h2, w["gate_up"])), w["down"])
    assert x.shape == (1, h) and torch.isfinite(x).all()
    # two layers of bf16 activations rounded at other points (fused epilogue, fp32 sums): a few bf16 steps
    assert (x.float() - xr.float()).abs().max().item() <= 0.05 * xr.float().abs().max().item()
    assert (r.float() - rr.float()).abs().max().item() <= 0.05 * rr.float().abs().max().item()
    assert torch.equal(chain.run(False)[0], x)   # the same bits again
    if launch == "tuned":   # PDL asked for as the engine asks (pdl_launches(): off on CPU): the same launches
        assert torch.equal(chain.run(True)[0], x)


_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sits.kernels import linear_gemv as lg, rms_norm as rn
from sits.kernels import paged_decode_attention as pda, paged_decode_attention_fp8 as pdf, rope_and_cache as rc

def ptx(fn, sig, const, warps, pdl):
    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **const}   # as a launch
    s = dict(sig); s.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=s, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "launch_pdl": pdl})
    assert k.metadata.launch_pdl == pdl
    p = k.asm["ptx"]
    return (p.count("griddepcontrol.wait"), p.count("griddepcontrol.launch_dependents"), p.count("prefetch.global.L2"))

gsig = {n: "*bf16" for n in ("x_ptr", "scale_ptr", "bias_ptr", "out_ptr", "r_ptr", "nw_ptr", "res_ptr")}
gsig.update({"w_ptr": "*i8", "M": "i32", "N": "i32", "K": "i32", "eps": "fp32", "stride_xm": "i32",
             "stride_wn": "i32", "stride_om": "i32", "stride_rm": "i32", "stride_resm": "i32"})
nsig = {n: "*bf16" for n in ("x_ptr", "r_ptr", "w_ptr", "out_ptr", "res_out_ptr", "scale_ptr")}
nsig.update({n: "i32" for n in ("stride_x", "stride_r", "stride_o", "stride_ro", "H")}, eps="fp32")
for pdl in (False, True):
    g = dict(HAS_SCALE=True, HAS_BIAS=False, BLOCK_N=8, BLOCK_K=512, EVEN_K=True, SILU_EPI=False, INT8_CONV=2,
             NORM=0, RES_AFTER=False, X_BCAST=False, NARROW_W=False, PDL=pdl)
    print("gemv", pdl, *ptx(lg._gemv_kernel, gsig, g, 4, pdl))
    n = dict(HAS_RESIDUAL=True, BLOCK_H=4096, PDL=pdl, QUANT=False)
    print("norm", pdl, *ptx(rn._rms_norm_kernel, nsig, n, 16, pdl))

# triton-v1.13's: every other kernel of a batch-1 decode layer (pointers by name, the rest i32 or fp32)
def sig(fn, const, ptrs, floats=()):
    return {n: ptrs.get(n, "*bf16") if n.endswith("_ptr") else "fp32" if n in floats else "i32"
            for n in fn.arg_names if n not in const}

ints = {"pos_ptr": "*i64", "slot_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "bt_ptr": "*i32",
        "ctx_ptr": "*i32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32"}
fp8 = dict(ints, k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv", k_scale_ptr="*fp32", v_scale_ptr="*fp32",
           kc_ptr="*fp8e4nv", vc_ptr="*fp8e4nv", ks_ptr="*fp32", vs_ptr="*fp32")
attn = dict(HEAD_DIM=128, HEAD_DIM_P=128, GROUP=4, GROUP_P=16, PAGE=64, BLOCK_N=64, NUM_SPLITS=8, DOT_F32=False,
            DOT_PRECISION="tf32")
rope = dict(HALF=64, HALF_P=64, HQ_P=32, HKV_P=8)
for pdl in (False, True):
    for name, fn, const, ptrs, floats in (
            ("rope", rc._rope_and_cache_kernel, rope, ints, ()),
            ("rope-fp8", rc._rope_and_cache_fp8_kernel, dict(rope, ROUND_E4M3=False), fp8, ()),
            ("attention", pda._paged_decode_attention_kernel, attn, ints, ("qk_scale",)),
            ("attention-fp8", pdf._paged_decode_attention_fp8_kernel,
             dict(attn, F16_DOT=True, STAGED=True, HEADS_FIRST=True), fp8, ("qk_scale",)),
            ("merge", pda._merge_splits_kernel, dict(HEAD_DIM=128, HEAD_DIM_P=128, NUM_SPLITS=8), ints, ())):
        c = dict(const, PDL=pdl)
        print(name, pdl, *ptx(fn, sig(fn, c, ptrs, floats), c, 4, pdl))
"""


def test_pdl_compiles_to_one_wait_and_one_early_launch_for_sm90():
    lines = compile_for_sm90(_COMPILE).split("\n")
    assert "gemv False 0 0 0" in lines and "norm False 0 0 0" in lines
    assert "gemv True 1 1 1" in lines and "norm True 1 1 0" in lines
    for name in ("rope", "rope-fp8", "attention", "attention-fp8", "merge"):
        assert f"{name} False 0 0 0" in lines and f"{name} True 1 1 0" in lines, (name, lines)


# triton-v1.12 serves the PDL launches: v1.9's ops otherwise -------------------------------------------------------
def test_v112_launches_v19s_gemv_and_norm_with_pdl():
    from sits.kernels import linear_gemv as lg, rms_norm as rn
    v112 = get_kernel_set("triton-v1.12")
    assert (v112.linear, v112.linear_silu_and_mul) == (lg.linear_gemv_pdl, lg.linear_silu_and_mul_gemv_pdl)
    assert (v112.rms_norm, v112.fused_add_rms_norm) == (rn.rms_norm_pdl, rn.fused_add_rms_norm_pdl)
    v19 = get_kernel_set("triton-v1.9")
    for op in ("paged_decode_attention", "prefill_attention", "rope_and_cache", "silu_and_mul"):
        assert getattr(v112, op) is getattr(v19, op), op


def test_v113_adds_rope_and_decode_attention_to_v112s_pdl_launches():
    from sits.kernels import paged_decode_attention_fp8 as pdf, rope_and_cache as rc
    v112, v113 = get_kernel_set("triton-v1.12"), get_kernel_set("triton-v1.13")
    assert (v113.rope_and_cache, v113.paged_decode_attention) == (rc.rope_and_cache_pdl, pdf.paged_decode_attention_pdl)
    for op in ("linear", "linear_silu_and_mul", "rms_norm", "fused_add_rms_norm", "prefill_attention", "silu_and_mul"):
        assert getattr(v113, op) is getattr(v112, op), op
    v19 = get_kernel_set("triton-v1.9")
    assert v113.kv_cache_dtypes == v19.kv_cache_dtypes


def test_pdl_is_only_for_cuda_gpus_of_sm90_on(monkeypatch):
    from sits.kernels import triton_env
    assert not triton_env.pdl_supported(torch.device("cpu"))
    if triton_env.interpreting() or triton_env.gdc_wait is None:   # and no CUDA GPU either way
        assert not triton_env.pdl_supported(torch.device("cuda", 0))
    # the capability rule, as a compiled Triton with griddepcontrol sees it
    monkeypatch.setattr(triton_env, "interpreting", lambda: False)
    monkeypatch.setattr(triton_env, "gdc_wait", triton_env.gdc_wait or (lambda: None))
    monkeypatch.setattr(triton_env, "_PDL", {})
    for cap, want in (((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i, c=cap: c)
        triton_env._PDL.clear()
        assert triton_env.pdl_supported(torch.device("cuda", 0)) is want, cap


@pytest.mark.gpu   # and on CPU, through the interpreter
@pytest.mark.parametrize("kind", ["bf16", "int8", "fp8"])
def test_v112s_ops_give_v19s_bits(dev, kind):
    """Where PDL is off (the CPU, GPUs before sm_90) v1.12 is v1.9's launches; where it is on, the same kernels and
    sums: bit for bit either way, one row and (past the GEMV) several."""
    from sits.kernels import quantize_weight
    if kind == "fp8" and dev == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 weights need sm_89+")
    v19, v112 = get_kernel_set("triton-v1.9"), get_kernel_set("triton-v1.12")
    g = torch.Generator().manual_seed(3)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    x = torch.randn(3, 128, generator=g).to(dev, dt)
    r = torch.randn(3, 128, generator=g).to(dev, dt)
    nw = (1 + 0.1 * torch.randn(128, generator=g)).to(dev, dt)
    w = torch.randn(96, 128, generator=g).to(dev, dt)
    weight = w if kind == "bf16" else quantize_weight(w, kind)
    if kind == "bf16" and dt == torch.float32:
        weight = w.to(torch.bfloat16).to(dt)
    for rows in (1, 3):
        xs, rs = x[:rows], r[:rows]
        assert torch.equal(v112.linear(xs, weight), v19.linear(xs, weight)), rows
        assert torch.equal(v112.linear_silu_and_mul(xs, weight), v19.linear_silu_and_mul(xs, weight)), rows
        assert torch.equal(v112.rms_norm(xs, nw, 1e-5), v19.rms_norm(xs, nw, 1e-5)), rows
        for a, b in zip(v112.fused_add_rms_norm(xs, rs, nw, 1e-5), v19.fused_add_rms_norm(xs, rs, nw, 1e-5)):
            assert torch.equal(a, b), rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs a CUDA GPU of sm_90+ (programmatic dependent launch)")
def test_v112s_decode_layer_in_a_cuda_graph_launches_with_pdl_and_gives_v19s_bits():
    """A batch-1 layer's norm -> GEMV -> norm -> fused gate/up -> down chain captured in one CUDA graph with v1.12's
    ops: each launch compiled with launch_pdl (the FastLauncher keeps it), the graph's result v1.9's bits on every
    replay (a kernel that read its input before the earlier one's writes landed would differ)."""
    from sits.kernels import triton_env
    v19, v112 = get_kernel_set("triton-v1.9"), get_kernel_set("triton-v1.12")
    g = torch.Generator(device="cuda").manual_seed(5)
    h, inter = 4096, 14336
    w = {k: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g) / 64
         for k, s in (("qkv", (h, h)), ("gate_up", (2 * inter, h)), ("down", (h, inter)))}
    nw = torch.ones(h, device="cuda", dtype=torch.bfloat16)
    x0 = torch.randn(1, h, device="cuda", dtype=torch.bfloat16, generator=g)

    def layer(ks, x):
        hn, r = ks.fused_add_rms_norm(x, x, nw, 1e-5)
        o = ks.linear(hn, w["qkv"])
        hn, r = ks.fused_add_rms_norm(o, r, nw, 1e-5)
        return ks.linear(ks.linear_silu_and_mul(hn, w["gate_up"]), w["down"]) + r

    outs = {}
    for name, ks in (("v1.9", v19), ("v1.12", v112)):
        layer(ks, x0)   # tunes and compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(ks, x0)
        got = []
        for _ in range(20):
            graph.replay()
            got.append(y.clone())
        torch.cuda.synchronize()
        assert all(torch.equal(a, got[0]) for a in got), name
        outs[name] = got[0]
    assert torch.equal(outs["v1.12"], outs["v1.9"])
    pdl = [ln for key, ln in triton_env._LAUNCHERS.items() if ln.constexprs.get("launch_pdl")]
    assert pdl and all(k.metadata.launch_pdl for ln in pdl for k in ln.compiled.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="needs a CUDA GPU of sm_90+ (programmatic dependent launch)")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_v112_and_v113_decode_as_v19_through_the_engine(kv_cache_dtype):
    """The tiny model in bf16 through LLM.generate with its decode CUDA graphs (every kernel of a batch-1 layer
    launched with PDL under v1.13): greedy tokens and logprobs as v1.9's, one prompt (the GEMV's batch 1) and four.
    A kernel reading its input before the earlier kernel's writes landed would change them."""
    from sits.engine import LLM, SamplingParams
    prompts = ["The canary compares latency histograms", "Paged attention reads the KV cache",
               "a b c d e f g h i j", "Gray releases of GPU kernels, step by step"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1)
    got = {}
    for kernels in ("triton-v1.9", "triton-v1.12", "triton-v1.13"):
        llm = LLM(model="tiny", kernels=kernels, device="cuda", dtype="bfloat16", kv_cache_dtype=kv_cache_dtype)
        got[kernels] = [llm.generate(prompts[:1], params, use_tqdm=False)[0],
                        *llm.generate(prompts, params, use_tqdm=False)]
        del llm
        torch.cuda.empty_cache()
    for kernels in ("triton-v1.12", "triton-v1.13"):
        for ref, out in zip(got["triton-v1.9"], got[kernels]):
            assert out.token_ids == ref.token_ids and len(out.token_ids) == 24, kernels
            worst = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(ref.logprobs, out.logprobs))
            assert worst <= 1e-5, (kernels, worst)
