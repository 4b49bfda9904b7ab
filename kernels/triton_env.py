"""Import Triton the way this machine can run it.

On CUDA, Triton compiles kernels for the GPU. Without CUDA, Triton kernels can only run on CPU tensors through its
interpreter, which `TRITON_INTERPRET=1` selects -- and Triton reads that variable while `triton` and our kernel
modules are first imported (it decides how each @triton.jit function, tl.sum included, is built). So when no GPU is
present and the user hasn't chosen, we set it before the first import.
"""
from __future__ import annotations

import os
import sys


def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch always present in this project
        return False


if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401


class TritonUnavailableError(RuntimeError):
    """A Triton kernel was called on tensors this process cannot run it on."""


def interpreting() -> bool:
    """True when Triton's own functions were built for the interpreter (i.e. CPU tensors work)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(getattr(tl, "sum", None), InterpretedFunction) or isinstance(
        getattr(triton.language.standard, "sum", None), InterpretedFunction)


def check_device(op: str, t) -> None:
    """Raise a clear error if tensor `t` can't be processed by a Triton kernel in this process."""
    if t.device.type == "cuda":
        if interpreting():
            raise TritonUnavailableError(f"{op}: TRITON_INTERPRET=1 is set, so Triton kernels run on CPU tensors "
                                         f"only; got a {t.device} tensor")
        return
    if t.device.type == "cpu":
        if not interpreting():
            raise TritonUnavailableError(
                f"{op}: Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before `triton` is first imported "
                f"(it was imported without it); set the variable in the environment and restart")
        return
    raise TritonUnavailableError(f"{op}: Triton kernels don't support {t.device} tensors")


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def num_sms(device) -> int:
    import torch
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
