"""Triton kernels run compiled on CUDA and through Triton's interpreter on CPU.

TRITON_INTERPRET=1 only takes effect if it is set before `triton` is first imported, so it is set here, before any
kernel module is imported (kernels/triton_env.py does the same for programs). If something imported triton earlier in
this process without it (e.g. transformers in another test module), the in-process CPU kernel tests skip and
test_interpreter_subprocess.py reruns them in a fresh interpreter instead.
"""
import os
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
