"""Kernel-set registry: named, versioned bundles of the ops the engine model calls.

A `KernelSet` is immutable. A new version of one op is released by deriving a set from an existing one and overriding
just that op (`base.derive("triton-v2", "2.0.0", prefill_attention=my_attention)`), then registering it; that new set
is what an operator canaries against production.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

OP_NAMES = (
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rope_and_cache",
    "prefill_attention",
    "paged_decode_attention",
    "linear",
)
# optional ops: one launch for what the engine otherwise does with two of the ops above (the ones named here). A set
# without it (None) runs the two; a set derived with either of the two replaced drops the inherited fusion unless it
# gives one, so a new linear or activation is what runs (derive()).
FUSED_OPS = {
    "silu_and_mul_linear": ("silu_and_mul", "linear"),   # (x [T, 2I], w [N, I], bias=None) -> linear(silu_and_mul(x))
    "linear_silu_and_mul": ("linear", "silu_and_mul"),   # (x [T, H], w [2I, H], bias=None) -> silu_and_mul(linear(x))
    # (x [T, H], w [N, H], residual [T, H] or None, norm_weight [H], eps, bias=None) -> (linear(rms_norm(h)), h),
    # h = x + residual (fused_add_rms_norm) or x (rms_norm, residual None)
    "add_rms_norm_linear": ("rms_norm", "fused_add_rms_norm", "linear"),
    # the same arguments, w = [gate; up] [2I, H] -> (linear_silu_and_mul(rms_norm(h)), h)
    "add_rms_norm_linear_silu_and_mul": ("rms_norm", "fused_add_rms_norm", "linear", "silu_and_mul",
                                         "linear_silu_and_mul"),
}


def _norm_then(project):
    """A fused norm + projection as the composition of a set's ops: `project(ks)(h, weight, bias)` after the set's
    rms_norm (residual None) or fused_add_rms_norm."""
    def compose(ks):
        def add_rms_norm_then(x, weight, residual, norm_weight, eps, bias=None):
            if residual is None:
                h, residual = ks.rms_norm(x, norm_weight, eps), x
            else:
                h, residual = ks.fused_add_rms_norm(x, residual, norm_weight, eps)
            return project(ks)(h, weight, bias), residual
        return add_rms_norm_then
    return compose


# each fused op as the composition of a set's own ops (KernelSet.op: what runs where a set has no fusion)
_COMPOSITIONS = {
    "silu_and_mul_linear": lambda ks: lambda x, weight, bias=None: ks.linear(ks.silu_and_mul(x), weight, bias),
    "linear_silu_and_mul": lambda ks: lambda x, weight, bias=None: ks.silu_and_mul(ks.linear(x, weight, bias)),
    "add_rms_norm_linear": _norm_then(lambda ks: ks.linear),
    "add_rms_norm_linear_silu_and_mul": _norm_then(lambda ks: ks.op("linear_silu_and_mul")),
}
assert set(_COMPOSITIONS) == set(FUSED_OPS)
DEVICES = ("cpu", "cuda")
# how the KV cache's pages are stored: "auto" = the model's dtype, "fp8" = e4m3 with a scale per (token, kv head)
# (kernels/kv_fp8.py); a set lists those its rope_and_cache and attention ops take (`kv_cache_dtypes`)
KV_CACHE_DTYPES = ("auto", "fp8")
KV_OPS = ("rope_and_cache", "prefill_attention", "paged_decode_attention")
# an example release that is deliberately bad, so tests and the catalogue know what to expect of it:
# "wrong" = different answers from its parent, "slow" = the same answers, slower
REGRESSIONS = ("wrong", "slow")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Comma-separated module names imported on first registry access; each registers its sets on import.
PLUGINS_ENV = "SITS_KERNEL_PLUGINS"


def _impl(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class KernelSetError(ValueError):
    """A kernel set is malformed or clashes with a registered one."""


class UnknownKernelSetError(KeyError):
    """No kernel set of that name is registered."""

    def __init__(self, name: str, known: list[str]):
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        return f"unknown kernel set {self.name!r}; known kernel sets: {', '.join(self.known) or '(none)'}"


class _Inherit:
    """Marker default of `derive(regression=...)`: keep the parent's value."""


@dataclass(frozen=True, slots=True)
class KernelSet:
    name: str
    version: str  # semver
    devices: tuple[str, ...]  # subset of ("cpu", "cuda")
    description: str
    rms_norm: Callable
    fused_add_rms_norm: Callable
    silu_and_mul: Callable
    rope_and_cache: Callable
    prefill_attention: Callable
    paged_decode_attention: Callable
    linear: Callable
    silu_and_mul_linear: Callable | None = None   # FUSED_OPS
    linear_silu_and_mul: Callable | None = None   # FUSED_OPS
    add_rms_norm_linear: Callable | None = None   # FUSED_OPS
    add_rms_norm_linear_silu_and_mul: Callable | None = None   # FUSED_OPS
    # the ops never wait on the GPU from the host and launch the same kernels for the same shapes, so the engine may
    # capture decode steps in CUDA graphs (engine/execution/cuda_graphs.py); derived sets inherit it
    graph_safe: bool = False
    # None for a real release; "wrong" or "slow" for an example regression (REGRESSIONS); derived sets inherit it
    regression: str | None = None
    # the KV-cache page formats its KV_OPS take (KV_CACHE_DTYPES, "auto" always among them); see derive()
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    # the set this one was derived from (None for a root set) and the ops it replaced; both filled by derive()
    parent: str | None = None
    overrides: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise KernelSetError(f"kernel set name {self.name!r} must match {_NAME.pattern}")
        if not isinstance(self.version, str) or not _SEMVER.match(self.version):
            raise KernelSetError(f"kernel set {self.name!r}: version {self.version!r} is not semver (e.g. '1.2.0')")
        devices = tuple(self.devices)
        if not devices or any(d not in DEVICES for d in devices) or len(set(devices)) != len(devices):
            raise KernelSetError(f"kernel set {self.name!r}: devices {self.devices!r} must be a non-empty subset of {DEVICES}")
        object.__setattr__(self, "devices", devices)
        if not isinstance(self.graph_safe, bool):
            raise KernelSetError(f"kernel set {self.name!r}: graph_safe must be a boolean")
        if self.regression is not None and self.regression not in REGRESSIONS:
            raise KernelSetError(f"kernel set {self.name!r}: regression {self.regression!r} must be None or one of "
                                 f"{REGRESSIONS}")
        if self.parent is not None and (not isinstance(self.parent, str) or not _NAME.match(self.parent)):
            raise KernelSetError(f"kernel set {self.name!r}: parent {self.parent!r} must be a kernel set name")
        overrides = tuple(self.overrides)
        if any(op not in OP_NAMES and op not in FUSED_OPS for op in overrides) or len(set(overrides)) != len(overrides):
            raise KernelSetError(f"kernel set {self.name!r}: overrides {self.overrides!r} must be distinct op names "
                                 f"from {OP_NAMES + tuple(FUSED_OPS)}")
        object.__setattr__(self, "overrides", overrides)
        kv = tuple(self.kv_cache_dtypes)
        if "auto" not in kv or any(k not in KV_CACHE_DTYPES for k in kv) or len(set(kv)) != len(kv):
            raise KernelSetError(f"kernel set {self.name!r}: kv_cache_dtypes {self.kv_cache_dtypes!r} must be distinct "
                                 f"values from {KV_CACHE_DTYPES}, 'auto' among them")
        object.__setattr__(self, "kv_cache_dtypes", kv)
        for op in OP_NAMES:
            if not callable(getattr(self, op)):
                raise KernelSetError(f"kernel set {self.name!r}: op {op!r} is not callable")
        for op in FUSED_OPS:
            if getattr(self, op) is not None and not callable(getattr(self, op)):
                raise KernelSetError(f"kernel set {self.name!r}: fused op {op!r} must be callable or None")

    def ops(self) -> dict[str, Callable]:
        """Every op the set has: OP_NAMES, then the FUSED_OPS it provides."""
        return {op: getattr(self, op) for op in (*OP_NAMES, *FUSED_OPS) if getattr(self, op) is not None}

    def op(self, name: str) -> Callable:
        """The op `name`; for a fused op (FUSED_OPS) the set does not provide, the composition of the ops it fuses,
        this set's own (e.g. linear(silu_and_mul(x), weight, bias)): what the engine runs in its place."""
        fn = getattr(self, name)
        return _COMPOSITIONS[name](self) if fn is None else fn

    def supports(self, device: str) -> bool:
        """`device` like "cuda", "cuda:1" or "cpu"."""
        return str(device).split(":")[0] in self.devices

    def catalogue_entry(self) -> dict:
        """What the control plane's kernel catalogue reads (kernels/catalog.py; plain JSON types): the ops as the
        names of their implementations (two sets share an op exactly when they share this)."""
        return {"name": self.name, "version": self.version, "devices": list(self.devices),
                "description": self.description, "cuda_graphs": self.graph_safe, "parent": self.parent,
                "overrides": list(self.overrides), "regression": self.regression,
                "kv_cache_dtypes": list(self.kv_cache_dtypes),
                "ops": {op: _impl(fn) for op, fn in self.ops().items()}}

    def derive(self, name: str, version: str, *, description: str | None = None,
               devices: tuple[str, ...] | None = None, graph_safe: bool | None = None,
               regression: str | None | type[_Inherit] = _Inherit,
               kv_cache_dtypes: tuple[str, ...] | None = None, **ops: Callable) -> KernelSet:
        """A new set with this set's ops except the ones given (keyword = op name). A replaced op must be as
        capturable as the ones it replaces, or pass graph_safe=False. `regression` is inherited unless given
        (None clears it). `kv_cache_dtypes` is inherited while no KV op (KV_OPS) is replaced, else ("auto",) unless
        given: a replaced attention or cache write claims no page format beyond the plain one on its own. The new set
        records this one as its parent and the replaced ops as its overrides. A fused op (FUSED_OPS) is inherited
        unless one of the ops it fuses is replaced: then the set has none (None) unless one is given."""
        unknown = sorted(set(ops) - set(OP_NAMES) - set(FUSED_OPS))
        if unknown:
            raise KernelSetError(f"unknown op(s) {unknown}; ops are {list(OP_NAMES)}, fused ops {list(FUSED_OPS)}")
        given = tuple(op for op in (*OP_NAMES, *FUSED_OPS) if op in ops)
        for fused, parts in FUSED_OPS.items():   # a replaced part runs: the inherited fusion would bypass it
            if fused not in ops and set(parts) & set(ops):
                ops[fused] = None
        if description is None:
            changed = ", ".join(sorted(given)) or "no ops"
            description = f"{self.name} {self.version} with {changed} replaced"
        if kv_cache_dtypes is None:
            kv_cache_dtypes = ("auto",) if set(ops) & set(KV_OPS) else self.kv_cache_dtypes
        return dataclasses.replace(self, name=name, version=version, description=description,
                                   kv_cache_dtypes=tuple(kv_cache_dtypes),
                                   devices=self.devices if devices is None else tuple(devices),
                                   graph_safe=self.graph_safe if graph_safe is None else graph_safe,
                                   regression=self.regression if regression is _Inherit else regression,
                                   parent=self.name, overrides=given, **ops)


_lock = threading.RLock()
_registry: dict[str, KernelSet] = {}
_plugins_loaded = False


def register_kernel_set(kernel_set: KernelSet, *, replace: bool = False) -> KernelSet:
    """Add `kernel_set` to the registry. Registering a different set under a taken name needs replace=True."""
    if not isinstance(kernel_set, KernelSet):
        raise KernelSetError(f"expected a KernelSet, got {type(kernel_set).__name__}")
    with _lock:
        old = _registry.get(kernel_set.name)
        if old is not None and old is not kernel_set and not replace:
            raise KernelSetError(f"kernel set {kernel_set.name!r} is already registered (version {old.version})")
        _registry[kernel_set.name] = kernel_set
    return kernel_set


def unregister_kernel_set(name: str) -> None:
    with _lock:
        if name not in _registry:
            raise UnknownKernelSetError(name, sorted(_registry))
        del _registry[name]


def _load_plugins() -> None:
    """The built-in sets (kernels/sets.py), then the plugins SITS_KERNEL_PLUGINS names, once, on first use: importing
    the `kernels` package alone imports no kernel (nor torch)."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        importlib.import_module("sits.kernels.sets")
        for mod in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
            try:
                importlib.import_module(mod)
            except ImportError as e:
                raise KernelSetError(f"{PLUGINS_ENV} names {mod!r}, which cannot be imported ({e}): put the "
                                     "directory that holds it on PYTHONPATH (docs/kernels.md)") from e


def list_kernel_sets() -> list[str]:
    _load_plugins()
    with _lock:
        return list(_registry)


def get_kernel_set(name: str) -> KernelSet:
    _load_plugins()
    with _lock:
        try:
            return _registry[name]
        except (KeyError, TypeError):
            raise UnknownKernelSetError(name, list(_registry)) from None
