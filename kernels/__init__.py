"""Kernels grouped into named, versioned kernel sets (see kernels/registry.py and kernels/sets.py).

Importing the package imports no kernel and no torch: the names below load on first use (PEP 562), and the registry
registers the built-in sets (then SITS_KERNEL_PLUGINS) the first time it is asked for a set. So a process that only
names kernel sets (the engine's API front, sits.kernels.catalog.identity) stays light.

No `__version__` here on purpose: transformers probes for Hugging Face's hub package, also named `kernels`, by
importing it and reading that attribute; without it, ours is recognised as "not that package". Versions live on each
KernelSet.
"""
import importlib
import sys

if __name__ == "kernels":   # not `sits.kernels`: see _hand_over_the_name below
    def _hand_over_the_name() -> None:
        """Python was started in a checkout's root without -P, so the root is on sys.path and `import kernels` found
        this folder. The name belongs to Hugging Face's package (transformers requires it); SITS's kernel sets are
        `sits.kernels`. Load the other `kernels` in this module's place, as if the root were not on the path."""
        import importlib.machinery
        import importlib.util
        import os
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        spec = importlib.machinery.PathFinder.find_spec(
            "kernels", [p for p in sys.path if os.path.abspath(p or os.curdir) != root])
        if spec is None:
            raise ImportError("No module named 'kernels' besides this checkout's folder, which is SITS's "
                              "`sits.kernels` (import it by that name)", name="kernels")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kernels"] = module   # the import statement returns what sys.modules holds after this file ran
        spec.loader.exec_module(module)

    _hand_over_the_name()

_EXPORTS = {
    "QuantizedWeight": "sits.kernels.quant", "quantize_weight": "sits.kernels.quant",
    **{name: "sits.kernels.registry" for name in ("OP_NAMES", "FUSED_OPS", "KernelSet", "KernelSetError",
                                             "UnknownKernelSetError", "get_kernel_set", "list_kernel_sets",
                                             "register_kernel_set", "unregister_kernel_set")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
