"""Op-level conformance at the served shapes (engine/execution/conformance.py measures at warm-up, the gate's
control_plane/analysis/conformance.py judges): every wrong fixture set (tests/fixtures/wrong_kernels.py) and the
example wrong release are caught, naming the op; good sets pass; on CPU with the tiny model (Triton sets under
TRITON_INTERPRET=1). The GPU run of the same is bench/conformance.py."""
import pytest
import torch

import tests.fixtures.wrong_kernels as wrong   # registers the bug-* sets
from sits.control_plane.analysis import Outcome
from sits.control_plane.analysis.conformance import judge
from sits.control_plane.analysis.gate_policy import ConformancePolicy
from sits.engine.config import EngineConfig
from sits.engine.llm_engine import LLMEngine
from sits.kernels import get_kernel_set, register_kernel_set, unregister_kernel_set
from sits.kernels.kv_fp8 import Fp8Pages
from tests.engine.helpers import greedy_logits

POLICY = ConformancePolicy()


def _report(kernels: str, **config) -> dict:
    engine = LLMEngine(EngineConfig(model="tiny", kernels=kernels, device="cpu", **config))
    engine.warmup()
    return engine.conformance


@pytest.fixture(scope="module")
def torch_report():
    return _report("torch")


@pytest.mark.parametrize("name,op,config", [
    ("bug-softmax-scale", "paged_decode_attention", {}),
    ("bug-context-off-by-one", "paged_decode_attention", {}),
    ("bug-rope-interleaved", "rope_and_cache", {}),
    ("bug-int8-per-tensor-scale", "linear", {"quantization": "int8"}),
])
def test_every_wrong_fixture_set_fails_naming_its_op(name, op, config, torch_report):
    assert wrong.PARENT == "torch"   # on CPU the bugs sit on the reference set: only the buggy op differs
    report = _report(name, **config)
    assert report["measured_ops"] == [op] and report["device"] == "cpu" and report["dtype"] == "float32"
    v = judge(report, torch_report, POLICY)
    assert v.outcome is Outcome.FAIL, v.reason
    assert v.judged_ops == (op,) and v.failed_cases >= 1 and {f.op for f in v.failures} == {op}
    first = v.failures[0]
    assert first.error > first.allowed and f"{op} at " in v.reason and "allowed" in v.reason


def test_per_tensor_scale_is_exact_where_weights_are_not_quantized(torch_report):
    # the bug only exists for quantized weights: on a bf16/fp32 model the op computes the parent's result
    v = judge(_report("bug-int8-per-tensor-scale"), torch_report, POLICY)
    assert v.outcome is Outcome.PASS and v.judged_ops == ("linear",) and v.cases > 0


def test_a_good_release_passes_and_says_what_it_judged(torch_report):
    v = judge(_report("torch-slow-attn"), torch_report, POLICY)
    assert v.outcome is Outcome.PASS, v.reason
    assert v.judged_ops == ("prefill_attention", "paged_decode_attention") and v.cases >= 5
    assert v.worst is not None and v.worst.error <= v.worst.allowed


def test_the_reference_set_measures_nothing(torch_report):
    assert torch_report["measured_ops"] == [] and torch_report["cases"] == []
    assert judge(torch_report, torch_report, POLICY).outcome is Outcome.PASS


def test_shapes_cover_the_served_model():
    report = _report("torch-slow-attn", max_model_len=1000)
    cases = [c["case"] for c in report["cases"]]
    decode = [c for c in cases if "context 1, 63, 64, 65" in c]
    assert decode and "heads 4/2 x 64, page 64" in decode[0]      # tiny: 4 query / 2 KV heads, head dim 64
    assert any("context 1000, 1" in c for c in cases)               # the longest context beside length 1
    assert any("/1000" in c for c in cases if "new/context" in c)   # prefill at the longest context


def test_no_conformance_flag_measures_nothing():
    assert _report("torch-slow-attn", conformance=False) is None


@pytest.mark.slow
def test_triton_sets_on_the_interpreter(torch_report):
    # triton-v1 against torch: every op judged (TRITON_INTERPRET=1 on CPU); the floor-pages example is caught
    v1 = _report("triton-v1")
    good = judge(v1, torch_report, POLICY)
    assert good.outcome is Outcome.PASS and len(good.judged_ops) == 7, good.reason
    bad = judge(_report("triton-v1-floor-pages"), v1, POLICY)   # production triton-v1: only decode attention judged
    assert bad.outcome is Outcome.FAIL and bad.judged_ops == ("paged_decode_attention",), bad.reason


def _decode_through(q, k_cache, v_cache, block_tables, context_lens, scale):
    """The reference's decode attention under another name: a release of it, correct on both page formats."""
    return get_kernel_set("torch").paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


def _rope_through(*args):
    """The reference's RoPE and KV write under another name (its FP8 write included)."""
    return get_kernel_set("torch").rope_and_cache(*args)


def _decode_without_fp8_scales(q, k_cache, v_cache, block_tables, context_lens, scale):
    """A decode attention that reads FP8 pages' e4m3 values but not their scales: right on plain pages only."""
    if isinstance(k_cache, Fp8Pages):
        ones = torch.ones_like(k_cache.scale)
        k_cache, v_cache = Fp8Pages(k_cache.data, ones), Fp8Pages(v_cache.data, ones)
    return get_kernel_set("torch").paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


@pytest.fixture(scope="module")
def fp8_decode_sets():
    torch_set = get_kernel_set("torch")
    names = {"fp8-decode-release": _decode_through, "fp8-decode-no-scales": _decode_without_fp8_scales}
    for name, fn in names.items():
        register_kernel_set(torch_set.derive(name, "0.0.1", kv_cache_dtypes=("auto", "fp8"),
                                             rope_and_cache=_rope_through, paged_decode_attention=fn))
    yield
    for name in names:
        unregister_kernel_set(name)


def test_an_fp8_kv_engine_measures_its_kv_ops_on_fp8_pages(fp8_decode_sets, torch_report):
    # served with --kv-cache-dtype fp8, the RoPE case writes FP8 pages and the decode cases read them (the fp64
    # reference reads the same ones): a release passes, and a kernel that ignores the scales fails -- where on plain
    # pages it would have passed
    good = _report("fp8-decode-release", kv_cache_dtype="fp8", max_model_len=1000)
    assert good["measured_ops"] == ["rope_and_cache", "paged_decode_attention"] and "fp8 KV pages" in good["shapes"]
    v = judge(good, torch_report, POLICY)
    assert v.outcome is Outcome.PASS and v.cases >= 4, v.reason
    rope = [c for c in good["cases"] if c["op"] == "rope_and_cache"]
    assert rope and 0 < rope[0]["reference_error"] < 0.1 * rope[0]["scale"]   # e4m3's rounding, measured
    bad = judge(_report("fp8-decode-no-scales", kv_cache_dtype="fp8", max_model_len=1000), torch_report, POLICY)
    assert bad.outcome is Outcome.FAIL and {f.op for f in bad.failures} == {"paged_decode_attention"}, bad.reason
    plain = judge(_report("fp8-decode-no-scales", max_model_len=1000), torch_report, POLICY)
    assert plain.outcome is Outcome.PASS, plain.reason


def test_an_engine_flag_release_judges_every_op_under_the_new_conditions(fp8_decode_sets):
    # a rollout that only adds --kv-cache-dtype fp8: production's own set, so no op names another implementation;
    # its engine serves other data, so every measured op is judged there (before, "nothing to judge" passed a decode
    # attention that ignores the page scales)
    plain = _report("fp8-decode-no-scales", max_model_len=1000)
    assert judge(plain, plain, POLICY).judged_ops == ()
    bad = judge(_report("fp8-decode-no-scales", kv_cache_dtype="fp8", max_model_len=1000), plain, POLICY)
    assert bad.outcome is Outcome.FAIL and {f.op for f in bad.failures} == {"paged_decode_attention"}, bad.reason
    assert bad.judged_ops == ("rope_and_cache", "paged_decode_attention") and bad.unchanged_ops == ()
    assert bad.reason.endswith("every measured op judged: the canary's engine serves under other conditions than "
                               "production's (+fp8 KV pages)")
    good = judge(_report("fp8-decode-release", kv_cache_dtype="fp8", max_model_len=1000),
                 _report("fp8-decode-release", max_model_len=1000), POLICY)
    assert good.outcome is Outcome.PASS and good.judged_ops == ("rope_and_cache", "paged_decode_attention")
    assert "(+fp8 KV pages)" in good.reason


def _silu_and_mul_linear_through(x, weight, bias=None):
    """The reference's activation and linear under another name: a correct release of the fused op."""
    ref = get_kernel_set("torch")
    return ref.linear(ref.silu_and_mul(x), weight, bias)


def _silu_and_mul_linear_without_silu(x, weight, bias=None):
    """A fused op that forgets the SiLU (gate * up): the kind of bug a fusion brings."""
    i = x.shape[-1] // 2
    return get_kernel_set("torch").linear(x[..., :i] * x[..., i:], weight, bias)


def _linear_silu_and_mul_without_silu(x, weight, bias=None):
    """The epilogue fusion's version of the same bug: gate * up of the product."""
    y = get_kernel_set("torch").linear(x, weight, bias)
    i = y.shape[-1] // 2
    return y[..., :i] * y[..., i:]


def _registered_on_torch(names: dict):
    """Each name registered as the torch set with one op replaced (name -> (op, fn)) until the generator resumes."""
    torch_set = get_kernel_set("torch")
    for name, (op, fn) in names.items():
        register_kernel_set(torch_set.derive(name, "0.0.1", **{op: fn}))
    yield
    for name in names:
        unregister_kernel_set(name)


@pytest.fixture(scope="module")
def fused_sets():
    from sits.kernels.linear_silu_and_mul import linear_silu_and_mul
    from sits.kernels.silu_and_mul_linear import silu_and_mul_linear
    yield from _registered_on_torch({
        "fused-release": ("silu_and_mul_linear", _silu_and_mul_linear_through),
        "fused-no-silu": ("silu_and_mul_linear", _silu_and_mul_linear_without_silu),
        "fused-triton": ("silu_and_mul_linear", silu_and_mul_linear),
        "epilogue-no-silu": ("linear_silu_and_mul", _linear_silu_and_mul_without_silu),
        "epilogue-triton": ("linear_silu_and_mul", linear_silu_and_mul)})


def _norm_linear_through(x, weight, residual, norm_weight, eps, bias=None):
    """The reference's norm and linear under another name: a correct release of the fused norm."""
    return get_kernel_set("torch").op("add_rms_norm_linear")(x, weight, residual, norm_weight, eps, bias)


def _norm_linear_residual_dropped(x, weight, residual, norm_weight, eps, bias=None):
    """A fused norm that normalizes x + residual but hands back the residual it was given: the next layer adds the
    wrong stream (the projection itself is right)."""
    y, _ = _norm_linear_through(x, weight, residual, norm_weight, eps, bias)
    return y, (x if residual is None else residual)


def _norm_linear_without_weight(x, weight, residual, norm_weight, eps, bias=None):
    """A fused norm that forgets the norm's weight (a scale of 1 for every channel)."""
    return _norm_linear_through(x, weight, residual, torch.ones_like(norm_weight), eps, bias)


@pytest.fixture(scope="module")
def norm_sets():
    from sits.kernels.norm_linear import add_rms_norm_linear, add_rms_norm_linear_silu_and_mul
    yield from _registered_on_torch({
        "norm-release": ("add_rms_norm_linear", _norm_linear_through),
        "norm-residual-dropped": ("add_rms_norm_linear", _norm_linear_residual_dropped),
        "norm-unweighted": ("add_rms_norm_linear", _norm_linear_without_weight),
        "norm-triton": ("add_rms_norm_linear", add_rms_norm_linear),
        "norm-epilogue-triton": ("add_rms_norm_linear_silu_and_mul", add_rms_norm_linear_silu_and_mul)})


@pytest.mark.parametrize("name,op,outcome", [
    ("fused-release", "silu_and_mul_linear", Outcome.PASS), ("fused-no-silu", "silu_and_mul_linear", Outcome.FAIL),
    ("fused-triton", "silu_and_mul_linear", Outcome.PASS),
    ("epilogue-no-silu", "linear_silu_and_mul", Outcome.FAIL),
    ("epilogue-triton", "linear_silu_and_mul", Outcome.PASS),
    ("norm-release", "add_rms_norm_linear", Outcome.PASS),
    ("norm-residual-dropped", "add_rms_norm_linear", Outcome.FAIL),
    ("norm-unweighted", "add_rms_norm_linear", Outcome.FAIL),
    ("norm-triton", "add_rms_norm_linear", Outcome.PASS),
    ("norm-epilogue-triton", "add_rms_norm_linear_silu_and_mul", Outcome.PASS)])
def test_a_fused_op_is_judged_against_the_reference_composition(fused_sets, norm_sets, torch_report, name, op,
                                                                 outcome):
    # int8 weights: the Triton fusions (triton-v1.6's prologue, v1.7's epilogue, v1.10's norm in the GEMV, under the
    # interpreter here) run at their row counts; a fused norm is judged on both its outputs
    report = _report(name, quantization="int8")
    assert report["measured_ops"] == [op]
    assert op in report["ops"] and op not in torch_report["ops"]
    v = judge(report, torch_report, POLICY)
    assert v.outcome is outcome, v.reason
    # rows 1, 7 (fused) and 64 on CPU; a fused norm also at rows 1 and 64 without a residual
    assert v.judged_ops == (op,) and v.cases >= (5 if op.startswith("add_rms_norm") else 3)
    if outcome is Outcome.FAIL:
        assert f"{op} at " in v.reason


@pytest.mark.parametrize("op", ["silu_and_mul_linear", "linear_silu_and_mul", "add_rms_norm_linear",
                                "add_rms_norm_linear_silu_and_mul"])
def test_the_model_runs_the_fused_op_where_a_set_has_one(op):
    # the engine calls the set's fused op (one call per layer and step) and answers as the reference does; a fused
    # norm has no residual in the first layer's attention block only
    calls = []
    composed = get_kernel_set("torch").op(op)

    def counted(x, weight, *rest, **kw):
        calls.append(op.startswith("add_rms_norm") and rest[0] is None)
        return composed(x, weight, *rest, **kw)
    register_kernel_set(get_kernel_set("torch").derive("fused-counted", "0.0.1", **{op: counted}))
    try:
        prompts = {"a": [5, 17, 99, 3], "b": list(range(70))}   # b: past one page
        ref, got = greedy_logits("torch", prompts, "cpu", steps=4), greedy_logits("fused-counted", prompts, "cpu",
                                                                                   steps=4)
    finally:
        unregister_kernel_set("fused-counted")
    n_layers = LLMEngine(EngineConfig(model="tiny", device="cpu", conformance=False)).model_runner.model_config \
        .num_hidden_layers
    assert len(calls) >= 4 * n_layers and len(calls) % n_layers == 0
    assert sum(calls) == (len(calls) // n_layers if op == "add_rms_norm_linear" else 0)
    for rid in prompts:
        assert got[rid][1] == ref[rid][1]
        assert all(torch.equal(a, b) for a, b in zip(got[rid][0], ref[rid][0]))
