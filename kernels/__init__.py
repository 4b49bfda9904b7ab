"""Kernels grouped into named, versioned kernel sets (see kernels/registry.py and kernels/sets.py).

Importing the package imports no kernel and no torch: the names below load on first use (PEP 562), and the registry
registers the built-in sets (then SITS_KERNEL_PLUGINS) the first time it is asked for a set. So a process that only
names kernel sets (the engine's API front, kernels.catalog.identity) stays light.

No `__version__` here on purpose: transformers probes for Hugging Face's hub package, also named `kernels`, by
importing it and reading that attribute; without it, ours is recognised as "not that package". Versions live on each
KernelSet.
"""
import importlib

_EXPORTS = {
    "QuantizedWeight": "kernels.quant", "quantize_weight": "kernels.quant",
    **{name: "kernels.registry" for name in ("OP_NAMES", "KernelSet", "KernelSetError", "UnknownKernelSetError",
                                             "get_kernel_set", "list_kernel_sets", "register_kernel_set",
                                             "unregister_kernel_set")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
