"""The correctness gate's bf16 tolerances on a GPU (skipped without one): triton-v1 against torch on the tiny model
in bf16 must pass the default policy (their drift is the kind the tolerances exist for), and the measured drift is
printed so the tolerances can be re-derived (bench/correctness_gate.py gpu measures llama3-8b as well)."""
import random

import pytest
import torch

from bench.correctness_gate import offline_replay
from control_plane.analysis import CorrectnessPolicy, Outcome, compare_replays
from control_plane.analysis.prompts import DEFAULT_PROMPTS
from engine import LLM

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_triton_v1_vs_torch_bf16_drift_is_within_the_bf16_tolerances():
    policy = CorrectnessPolicy()
    base = LLM(model="tiny", kernels="torch", dtype="bfloat16")
    canary = LLM(model="tiny", kernels="triton-v1", dtype="bfloat16")
    v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy, shuffle=random.Random(0), filler=2),
                        policy, "bfloat16")
    print(f"triton-v1 vs torch bf16: identical {v.identical_fraction:.0%}, top-1 {v.top1_agreement:.1%}, drift mean "
          f"{v.drift_mean:.3g} max {v.drift_max:.3g}, diverged {v.diverged}")
    assert v.outcome is Outcome.PASS, v.reason
    assert v.drift_max > 0   # bf16 kernels do differ in the last bits: a zero would mean the same kernels ran
    wrong = LLM(model="tiny", kernels="torch-wrong-rope", dtype="bfloat16")
    w = compare_replays(offline_replay(base, wrong, DEFAULT_PROMPTS, policy), policy, "bfloat16")
    print(f"torch-wrong-rope vs torch bf16: {w.outcome.value} {w.reason}")
    assert w.drift_max > v.drift_max
