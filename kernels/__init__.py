"""Kernels grouped into named, versioned kernel sets (see kernels/registry.py and kernels/sets.py).

No `__version__` here on purpose: transformers probes for Hugging Face's hub package, also named `kernels`, by
importing it and reading that attribute; without it, ours is recognised as "not that package". Versions live on each
KernelSet.
"""
from kernels.quant import QuantizedWeight, quantize_weight
from kernels.registry import (
    OP_NAMES,
    KernelSet,
    KernelSetError,
    UnknownKernelSetError,
    get_kernel_set,
    list_kernel_sets,
    register_kernel_set,
    unregister_kernel_set,
)
from kernels import sets as _sets  # noqa: F401  (registers the built-in sets)

__all__ = [
    "OP_NAMES", "KernelSet", "KernelSetError", "UnknownKernelSetError", "QuantizedWeight", "get_kernel_set",
    "list_kernel_sets", "quantize_weight", "register_kernel_set", "unregister_kernel_set",
]
