"""Import Triton the way this machine can run it.

On CUDA, Triton compiles kernels for the GPU. Without CUDA, Triton kernels can only run on CPU tensors through its
interpreter, which `TRITON_INTERPRET=1` selects -- and Triton reads that variable while `triton` and our kernel
modules are first imported (it decides how each @triton.jit function, tl.sum included, is built). So when no GPU is
present and the user hasn't chosen, we set it before the first import.
"""
from __future__ import annotations

import os
import re
import sys
import threading

import torch


def _cuda_available() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - a broken CUDA setup
        return False


if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401
try:  # programmatic dependent launch's device side (sm_90+): the kernels' PDL constexprs (pdl_launch below)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402,F401
except ImportError:  # a Triton without it: a kernel compiled with PDL=True fails to compile; pdl_supported() is False
    gdc_launch_dependents = gdc_wait = None


class TritonUnavailableError(RuntimeError):
    """A Triton kernel was called on tensors this process cannot run it on."""


_INTERPRETING: bool | None = None


def interpreting() -> bool:
    """True when Triton's own functions were built for the interpreter (i.e. CPU tensors work). Fixed once `triton`
    is imported, so it is computed once."""
    global _INTERPRETING
    if _INTERPRETING is None:
        from triton.runtime.interpreter import InterpretedFunction
        _INTERPRETING = isinstance(getattr(tl, "sum", None), InterpretedFunction) or isinstance(
            getattr(triton.language.standard, "sum", None), InterpretedFunction)
    return _INTERPRETING


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


# Programmatic dependent launch (PDL, sm_90+). A kernel with a `PDL` constexpr launched with it (`launch_pdl=True`)
# may start while the kernel before it in the stream still runs; it must call gdc_wait() -- the earlier grid done, its
# writes visible -- before it reads or writes anything an earlier kernel writes or reads, and lets the next kernel
# launch early with gdc_launch_dependents(). A kernel without PDL support is launched as always (it waits for the whole
# earlier kernel), so any mix is safe. Kernel sets choose: their ops run their parent's inside `pdl_launches()`, and
# the launch sites of kernels that support it add `pdl_launch(device)` to their launch options.
_PDL: dict = {}   # CUDA device index -> whether programmatic dependent launch works there
_SCOPE = threading.local()   # .pdl: inside pdl_launches() on this thread
_PDL_ON: dict = {"PDL": True, "launch_pdl": True}
_PDL_OFF: dict = {}


def pdl_supported(device) -> bool:
    """Whether kernels on `device` may launch with programmatic dependent launch (`launch_pdl=True` and their PDL
    constexpr): a CUDA GPU of sm_90 or later, a Triton with griddepcontrol, not the interpreter."""
    if device.type != "cuda" or gdc_wait is None or interpreting():
        return False
    index = device.index if device.index is not None else current_device()
    if index not in _PDL:
        _PDL[index] = torch.cuda.get_device_capability(index) >= (9, 0)
    return _PDL[index]


class pdl_launches:
    """Within it (on this thread), kernels that support programmatic dependent launch launch with it where
    pdl_supported(): triton-v1.12's and v1.13's ops run v1.9's inside one. Nests; cheap (no generator)."""
    __slots__ = ("_prev",)

    def __enter__(self) -> None:
        self._prev = getattr(_SCOPE, "pdl", False)
        _SCOPE.pdl = True

    def __exit__(self, *exc) -> None:
        _SCOPE.pdl = self._prev


def pdl_launch(device) -> dict:
    """The launch options of a kernel with a `PDL` constexpr: PDL and launch_pdl on inside pdl_launches() where
    pdl_supported(device), else none (its default launch). Read-only: pass it on with **."""
    return _PDL_ON if getattr(_SCOPE, "pdl", False) and pdl_supported(device) else _PDL_OFF


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program `pid` over an M x N output in BLOCK_M x BLOCK_N tiles, GROUP_M row tiles at a time
    (grouped ordering: programs that run together share weight column tiles in the L2)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % group) % group_m, (pid % group) // group_m


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def num_sms(device) -> int:
    import torch
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


# Milliseconds of GPU time per replay when an autotuner times its candidates inside CUDA graphs (Triton's default is
# 100, and do_bench_cudagraph replays 10 times: ~1 s a candidate whatever the kernel's length). Since decode steps are
# tuned at real context lengths, llama3-8b's 7 graph sizes x 5 decode-attention candidates took 50-55 s of a 79-92 s
# cold bf16 warm-up on the H200 (BENCHMARKS.md "Offline throughput"); 20 ms still averages every candidate over 25+
# calls a replay at those lengths. Measured with it: that tuning 25.4 s, the warm-up 56.4 s, the same decode step.
GRAPH_TUNE_REP_MS = 20


def autotune(configs, key, **kwargs):
    """`triton.autotune` whose winners persist on disk: a later process on the same machine loads the timings from
    Triton's cache (keyed by Triton's version, the GPU architecture, the kernel's source, the candidates and the
    tuning key; `use_device_cache_dir` adds the GPU's name and driver) instead of benchmarking every candidate
    again. Candidates timed in CUDA graphs (`use_cuda_graph=True`) replay GRAPH_TUNE_REP_MS unless `rep` is given."""
    if kwargs.get("use_cuda_graph"):
        kwargs.setdefault("rep", GRAPH_TUNE_REP_MS)
    return triton.autotune(configs, key=key, cache_results=True, **kwargs)


def _driver_version() -> str:
    try:  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ..."
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
        return next(w for w in words if w[:1].isdigit() and "." in w)
    except (OSError, StopIteration):
        return f"cuda{torch.version.cuda}"


# Bumped when the engine changes the inputs it autotunes on, so that winners persisted from the old ones are not
# reused: 2 = decode steps tuned at real context lengths (engine/execution/cuda_graphs.py tuning_inputs), not on
# one-token dummies.
TUNING_REVISION = 2


def use_device_cache_dir(device) -> str | None:
    """Point Triton's on-disk cache (compiled kernels and autotuning results) at a directory of this GPU model and
    driver under the usual one (TRITON_CACHE_DIR, else ~/.triton/cache), so a node with another GPU or driver never
    reuses timings measured elsewhere (nor timings of an older TUNING_REVISION). Call before the first compile; a
    no-op off CUDA. Returns the directory."""
    if getattr(device, "type", device) != "cuda" or interpreting():
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", torch.cuda.get_device_name(device)).strip("-")
    tag = f"sits-{name}-driver-{_driver_version()}-tune{TUNING_REVISION}"
    base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    if os.path.basename(os.path.normpath(base)) != tag:  # a child process inherits the already-keyed directory
        os.environ["TRITON_CACHE_DIR"] = os.path.join(base, tag)
    return os.environ["TRITON_CACHE_DIR"]


FAST_LAUNCH_ENV = "SITS_TRITON_FAST_LAUNCH"  # "0" turns the fast path off (every launch through Triton's own)


def _is_constexpr(annotation) -> bool:
    # annotations are strings in modules with `from __future__ import annotations`
    return annotation is tl.constexpr or (isinstance(annotation, str) and annotation.split(".")[-1] == "constexpr")


def _spec_key(a):
    # what Triton 3.x specializes a runtime argument on: a tensor's dtype and 16-byte alignment, an int's value 1,
    # divisibility by 16 and width; a host TMA descriptor's element type, block shape and padding (Triton's launcher
    # encodes the descriptor itself at each launch); floats and None are not specialized
    if hasattr(a, "block_shape") and hasattr(a, "base"):   # triton.tools.tensor_descriptor.TensorDescriptor
        return "desc", a.base.dtype, tuple(a.block_shape), getattr(a, "padding", None)
    if hasattr(a, "data_ptr"):
        return a.dtype, a.data_ptr() % 16 == 0
    if isinstance(a, bool):
        return "b", a
    if isinstance(a, int):
        return "i", a == 1, a % 16 == 0, -2**31 <= a < 2**31
    if isinstance(a, float):
        return "f"
    if a is None:
        return None
    raise TypeError(type(a).__name__)  # not taken by the fast path


def current_device() -> int:
    """The current CUDA device's index, at the cost of one C call (torch.cuda.current_device() checks more)."""
    return torch._C._cuda_getDevice()


def current_raw_stream(device: int) -> int:
    """The current stream of `device` as the raw handle a compiled Triton kernel's launcher takes."""
    return torch._C._cuda_getCurrentRawStream(device)


class FastLauncher:
    """Launches one @triton.jit kernel with fixed constexprs and launch options at a fraction of Triton's per-call
    cost (JITFunction.run binds and specializes every argument and builds a cache key on each call: tens of
    microseconds, more than a decode-size kernel runs). The first call for a given argument specialization goes
    through Triton, which compiles and returns the kernel; later calls with the same specialization call its launcher
    directly. Off under the interpreter, when a launch hook is set (profilers), or with SITS_TRITON_FAST_LAUNCH=0."""

    def __init__(self, fn, **constexprs):
        import inspect
        self.fn = fn
        params = inspect.signature(getattr(fn, "fn", fn)).parameters
        names = list(params)
        # the launcher fills every constexpr slot itself: one left out takes its default, else it is an error
        defaults = {n: p.default for n, p in params.items() if _is_constexpr(p.annotation) and n not in constexprs
                    and p.default is not inspect.Parameter.empty}
        constexprs = {**defaults, **constexprs}
        missing = [n for n, p in params.items() if _is_constexpr(p.annotation) and n not in constexprs]
        if missing:
            raise TypeError(f"FastLauncher: constexpr(s) {missing} of {names} must be given")
        self.constexprs = constexprs
        # every argument in signature order, constexprs filled in; runtime arguments go to `runtime_at` per call
        self.template = [constexprs.get(n) for n in names]
        self.runtime_at = [i for i, n in enumerate(names) if n not in constexprs]
        self.num_runtime = len(self.runtime_at)
        self.compiled: dict = {}

    def __call__(self, grid, *args) -> None:
        if len(args) != self.num_runtime:
            raise TypeError(f"FastLauncher: {len(args)} runtime arguments given, the kernel takes {self.num_runtime}")
        if not _fast_launch_on():
            self.fn[grid](*args, **self.constexprs)
            return
        dev = current_device()
        try:
            key = (dev, *map(_spec_key, args))
        except TypeError:
            self.fn[grid](*args, **self.constexprs)
            return
        kernel = self.compiled.get(key)
        if kernel is None:  # Triton compiles (or finds) the kernel for this specialization and launches it
            self.compiled[key] = self.fn[grid](*args, **self.constexprs)
            return
        full = self.template.copy()
        for i, a in zip(self.runtime_at, args):
            full[i] = a
        g = tuple(grid) + (1, 1)
        kernel.run(g[0], g[1], g[2], current_raw_stream(dev), kernel.function,
                   kernel.packed_metadata, None, None, None, *full)


_FAST_ON: bool | None = None  # the env switch and the interpreter check, read once
_RUNTIME_KNOBS = None  # triton.knobs.runtime (its launch hooks), once the fast path is on


def _hook_set(hook) -> bool:
    # Triton 3.6 keeps launch hooks in a HookChain (never None; empty when unused); older versions use None
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


def _fast_launch_on() -> bool:
    global _FAST_ON, _RUNTIME_KNOBS
    if _FAST_ON is None:
        _FAST_ON = os.environ.get(FAST_LAUNCH_ENV, "1") != "0" and not interpreting()
        if _FAST_ON:
            from triton import knobs
            _RUNTIME_KNOBS = knobs.runtime
    if not _FAST_ON:
        return False
    return not (_hook_set(_RUNTIME_KNOBS.launch_enter_hook) or _hook_set(_RUNTIME_KNOBS.launch_exit_hook))


_LAUNCHERS: dict = {}


def fast(fn, **constexprs) -> FastLauncher:
    """The FastLauncher of `fn` with these constexprs / launch options (one per distinct set, kept for the process):
    `fast(kernel, BLOCK=64, num_warps=4)(grid, *runtime_args)` launches like `kernel[grid](*runtime_args, ...)`."""
    key = (fn, *constexprs.items())
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        launcher = _LAUNCHERS[key] = FastLauncher(fn, **constexprs)
    return launcher


def tuned_launcher(autotuned, key) -> FastLauncher | None:
    """The launcher `fast_tuned` keeps for `key`, once it has tuned it (its `constexprs` hold the winning config)."""
    return _LAUNCHERS.get((autotuned, key))


def settle_before_tuning(args) -> None:
    """Wait for the caller's CUDA stream before an autotuner may benchmark on `args`' buffers.

    Triton times the candidates on a fresh side stream that does not wait for the caller's stream, on the caller's
    buffers: the output and the fp32 partials, allocated on the caller's stream (where memory freed a moment ago may
    still be read by its queued kernels), and a split-K kernel's lock counters, which every split-K launch of that
    stream shares (kernels/linear.py). Kernels still queued there would race the candidates on them. Tuning runs once
    per key, outside CUDA graph captures (engine/execution/cuda_graphs.py), so the wait costs nothing that counts;
    inside a capture it cannot wait and does not."""
    dev = next((a.device for a in args if isinstance(getattr(a, "device", None), torch.device)
                and a.device.type == "cuda"), None)
    if dev is not None and not torch.cuda.is_current_stream_capturing():
        _wait_for_stream(dev)


def _wait_for_stream(device: torch.device) -> None:
    torch.cuda.current_stream(device).synchronize()


def fast_tuned(autotuned, fn, key, grid, *args, derived=None, **constexprs) -> None:
    """Launch autotuned kernel `autotuned` (a triton.autotune over `fn`): the first call for `key` tunes through
    Triton's autotuner; later calls launch the winner through a FastLauncher. `grid`: a tuple, or a function of the
    config's meta-parameters; `derived(config)`: constexprs that wrappers such as triton.heuristics compute from
    the config (the launcher calls `fn` itself, without them)."""
    launcher = _LAUNCHERS.get((autotuned, key))
    if launcher is None:
        settle_before_tuning(args)
        autotuned[grid](*args, **constexprs)
        best = autotuned.best_config
        _LAUNCHERS[(autotuned, key)] = FastLauncher(fn, **best.all_kwargs(), **(derived(best) if derived else {}),
                                                    **constexprs)
        return
    launcher(grid(launcher.constexprs) if callable(grid) else grid, *args)
