"""The correctness gate's bf16 and quantized tolerances on a GPU (skipped without one). On the trained tiny checkpoint
(bench/train_tiny.py; the one in .cache/tiny-trained when it was carried, else trained here in seconds) triton-v1
against torch must pass the margin-aware defaults and torch-wrong-rope must fail them; on random weights (flat
distributions) the gate must not fail the equivalent pair: there it has too few confident positions to judge.
bench/correctness_gate.py gpu prints the same statistics for llama3-8b as well."""
import random

import pytest
import torch

from bench.correctness_gate import TRAINED, offline_replay
from sits.control_plane.analysis import CorrectnessPolicy, Outcome, compare_replays
from sits.control_plane.analysis.prompts import DEFAULT_PROMPTS
from sits.engine import LLM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if (TRAINED / "model.safetensors").is_file():
        return str(TRAINED)
    from bench.train_tiny import build
    return str(build(tmp_path_factory.mktemp("tiny-trained"), device="cuda"))


def _verdict(model, kernels, base, policy, **kw):
    canary = LLM(model=model, kernels=kernels, dtype="bfloat16")
    v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy, **kw), policy, "bfloat16")
    print(f"{model} {kernels} vs torch bf16: {v.outcome.value}: {v.reason}")
    return v


def test_triton_v1_passes_and_wrong_rope_fails_on_the_trained_model_in_bf16(trained):
    policy = CorrectnessPolicy()
    base = LLM(model=trained, kernels="torch", dtype="bfloat16")
    v = _verdict(trained, "triton-v1", base, policy, shuffle=random.Random(0), filler=2)
    assert v.outcome is Outcome.PASS, v.reason
    assert v.confident_positions >= 100 and v.drift_max > 0   # bf16 kernels differ in the last bits
    w = _verdict(trained, "torch-wrong-rope", base, policy)
    assert w.outcome is Outcome.FAIL, w.reason
    assert w.confident_drift_max > v.confident_drift_max


def test_random_weights_in_bf16_are_not_failed_for_equivalent_kernels():
    policy = CorrectnessPolicy()
    base = LLM(model="tiny", kernels="torch", dtype="bfloat16")
    v = _verdict("tiny", "triton-v1", base, policy, shuffle=random.Random(0), filler=2)
    assert v.outcome is not Outcome.FAIL, v.reason
    if v.outcome is Outcome.INCONCLUSIVE:
        assert "too few confident positions" in v.reason


def test_fp8_engines_are_judged_by_the_quantized_tolerances(trained):
    # Both engines on fp8 weights + FP8 pages: activations e4m3 from 33 rows, bf16 below, so batching moves the
    # answers; the product judges such engines by the quantized tolerances (analysis/gate_policy.py tolerances_key).
    # triton-v1.24 against itself in other batches passes them, a wrong RoPE derived from it fails them.
    from bench.correctness_gate import register_bench_sets
    from sits.control_plane.analysis.gate_policy import tolerances_key
    register_bench_sets(base="triton-v1.24")
    quantized = {"fp8 weights", "fp8 KV pages"}
    key = tolerances_key("bfloat16", quantized, quantized)
    assert key == "quantized"
    policy = CorrectnessPolicy()
    flags = dict(dtype="bfloat16", quantization="fp8", kv_cache_dtype="fp8")
    base = LLM(model=trained, kernels="triton-v1.24", **flags)
    aa = compare_replays(offline_replay(base, base, DEFAULT_PROMPTS, policy, shuffle=random.Random(0), filler=2),
                         policy, key)
    print(f"triton-v1.24 A/A, fp8: {aa.outcome.value}: {aa.reason}")
    assert aa.outcome is Outcome.PASS and aa.confident_positions >= policy.tolerances_for(key).min_confident_positions
    wrong = LLM(model=trained, kernels="bench-wrong-rope", **flags)
    w = compare_replays(offline_replay(base, wrong, DEFAULT_PROMPTS, policy, shuffle=random.Random(1), filler=2),
                        policy, key)
    print(f"wrong RoPE on triton-v1.24, fp8: {w.outcome.value}: {w.reason}")
    assert w.outcome is Outcome.FAIL and "flip_margin" in w.failed, w.reason
