"""Runs the CPU (interpreter) kernel tests in a fresh process when this one can't (see conftest.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.conftest import triton_device

ROOT = Path(__file__).resolve().parents[2]
# one file per op: the reference, Triton on CPU and on a GPU (Liger-Kernel's test/transformers/test_<op>.py)
OPS = ("rms_norm", "silu_and_mul", "rope_and_cache", "prefill_attention", "paged_decode_attention", "linear")


@pytest.mark.skipif(triton_device() is not None, reason="kernel tests run in this process")
def test_kernel_tests_in_fresh_interpreter_process():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu",
         *(f"tests/kernels/test_{op}.py" for op in OPS), "tests/kernels/test_engine_triton.py",
         "tests/kernels/test_triton_example_sets.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.strip().splitlines()[-1], proc.stdout[-2000:]
