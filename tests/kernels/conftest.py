"""Triton kernels run compiled on CUDA and through Triton's interpreter on CPU.

TRITON_INTERPRET=1 only takes effect if it is set before `triton` is first imported, so it is set here, before any
kernel module is imported (kernels/triton_env.py does the same for programs). If something imported triton earlier in
this process without it (e.g. transformers in another test module), the in-process CPU kernel tests skip and
test_interpreter_subprocess.py reruns them in a fresh interpreter instead.
"""
import importlib
import os
import pkgutil
import sys

import pytest
import torch

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from sits.kernels.triton_env import interpreting  # noqa: E402


def triton_device() -> str | None:
    """Where Triton kernels can run in this process: 'cuda', 'cpu' (interpreter) or None."""
    if interpreting():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return None


@pytest.fixture
def dev():
    d = triton_device()
    if d is None:
        pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process; "
                    "test_interpreter_subprocess.py runs these tests in a fresh process")
    return d


INTERPRETER_SCALED_MM_MAX_M = 64


@pytest.fixture
def scaled_mm_max_m(dev, monkeypatch) -> int:
    """SCALED_MM_MAX_M (kernels/linear_w8a8.py) for a test about the rows on either side of it: up to it the fp8 ops
    take torch._scaled_mm's route, past it the prefill W8A8 GEMM. On a GPU: 512, as shipped. Under the interpreter:
    64 in every kernel module that holds a copy of it. There a Triton program costs milliseconds whatever its size,
    and the norms and row quantizers run one program a row, so the same routes and boundaries run at an eighth of the
    rows (64 is still past WEIGHT_ONLY_MAX_M's 32: the three bands stay apart)."""
    import sits.kernels
    from sits.kernels import linear_w8a8
    if dev != "cpu":
        return linear_w8a8.SCALED_MM_MAX_M
    modules = [importlib.import_module(f"sits.kernels.{m.name}") for m in pkgutil.iter_modules(sits.kernels.__path__)]
    holders = [m for m in modules if getattr(m, "SCALED_MM_MAX_M", None) == linear_w8a8.SCALED_MM_MAX_M]
    assert INTERPRETER_SCALED_MM_MAX_M > linear_w8a8.WEIGHT_ONLY_MAX_M
    for module in holders:
        monkeypatch.setattr(module, "SCALED_MM_MAX_M", INTERPRETER_SCALED_MM_MAX_M)
    return INTERPRETER_SCALED_MM_MAX_M
