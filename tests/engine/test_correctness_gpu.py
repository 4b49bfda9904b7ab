"""The correctness gate's bf16 tolerances on a GPU (skipped without one). On the trained tiny checkpoint
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
