"""FastLauncher (kernels/triton_env.py): its dispatch logic on CPU with a stand-in for Triton's compiled kernel and the
CUDA device and stream given through triton_env's own current_device/current_raw_stream, and the real launch on a GPU
(the last test)."""
import pytest
import torch

from sits.kernels import get_kernel_set, quantize_weight, triton_env
from sits.kernels.triton_env import tl
from tests.kernels.helpers import ATOL, assert_close_to_fp64, check_op_on_gpu, on_gpu


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, g0, g1, g2, stream, function, packed, launch_meta, enter, exit_, *args):
        self.log.append(("run", (g0, g1, g2), args))


def _kernel(x_ptr, n, BLOCK: tl.constexpr, scale, FLAG: tl.constexpr):
    pass


class _Jit:
    fn = staticmethod(_kernel)

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append(("jit", grid, args, kw))
            return _Compiled(self.log)
        return launch


def test_first_call_compiles_through_triton_then_launches_directly(monkeypatch):
    monkeypatch.setattr(triton_env, "_fast_launch_on", lambda: True)
    monkeypatch.setattr(triton_env, "current_device", lambda: 0)            # no CUDA here: device 0,
    monkeypatch.setattr(triton_env, "current_raw_stream", lambda dev: 7)    # stream handle 7
    jit = _Jit()
    launch = triton_env.FastLauncher(jit, BLOCK=64, FLAG=True, num_warps=4)
    x = torch.zeros(64)
    launch((3,), x, 32, 0.5)
    assert jit.log == [("jit", (3,), (x, 32, 0.5), {"BLOCK": 64, "FLAG": True, "num_warps": 4})]
    launch((5, 2), x, 48, 0.25)  # same specialization (aligned tensor, n % 16 == 0): the launcher, constexprs in place
    assert jit.log[-1] == ("run", (5, 2, 1), (x, 48, 64, 0.25, True))
    launch((1,), x, 33, 0.5)  # n no longer divisible by 16: Triton compiles another kernel
    launch((1,), x[1:], 48, 0.5)  # misaligned pointer: another one again
    launch((1,), x, 1, 0.5)  # an int equal to 1 is specialized too
    assert [e[0] for e in jit.log[2:]] == ["jit", "jit", "jit"]
    assert len(launch.compiled) == 4


def test_tma_descriptors_are_specialized_by_dtype_and_block_shape(monkeypatch):
    from sits.kernels.fp8_gemm_tma import TensorDescriptor
    if TensorDescriptor is None:
        pytest.skip("this Triton has no host TMA descriptors")
    monkeypatch.setattr(triton_env, "_fast_launch_on", lambda: True)
    monkeypatch.setattr(triton_env, "current_device", lambda: 0)
    monkeypatch.setattr(triton_env, "current_raw_stream", lambda dev: 7)
    jit = _Jit()
    launch = triton_env.FastLauncher(jit, BLOCK=64, FLAG=True)
    x, y = torch.zeros(64, 32), torch.zeros(128, 32)
    d = lambda t, block: TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block)  # noqa: E731
    launch((1,), d(x, [16, 32]), 32, 0.5)
    first = d(y, [16, 32])   # another tensor and shape, the same element type and block: the compiled kernel,
    launch((1,), first, 32, 0.5)   # given the descriptor itself (Triton's launcher encodes it at each launch)
    assert jit.log[-1] == ("run", (1, 1, 1), (first, 32, 64, 0.5, True))
    launch((1,), d(x, [32, 32]), 32, 0.5)           # another block shape: Triton compiles another kernel
    launch((1,), d(x.bfloat16(), [16, 32]), 32, 0.5)   # another element type: another one again
    assert [e[0] for e in jit.log] == ["jit", "run", "jit", "jit"] and len(launch.compiled) == 3


def test_off_under_the_interpreter_or_when_disabled(monkeypatch):
    monkeypatch.setattr(triton_env, "_fast_launch_on", lambda: False)
    jit = _Jit()
    launch = triton_env.FastLauncher(jit, BLOCK=64, FLAG=False)
    for _ in range(2):
        launch((2,), torch.zeros(4), 16, 1.0)
    assert [e[0] for e in jit.log] == ["jit", "jit"] and not launch.compiled


def test_fast_caches_one_launcher_per_constexpr_set():
    jit = _Jit()
    a = triton_env.fast(jit, BLOCK=64, FLAG=True, num_warps=4)
    assert triton_env.fast(jit, BLOCK=64, FLAG=True, num_warps=4) is a
    assert triton_env.fast(jit, BLOCK=128, FLAG=True, num_warps=4) is not a


def test_launch_hooks_turn_the_fast_path_off():
    class Chain:  # Triton 3.6's HookChain: an object with a list of calls
        def __init__(self, calls):
            self.calls = calls
    assert not triton_env._hook_set(None) and not triton_env._hook_set(Chain([]))
    assert triton_env._hook_set(Chain([print])) and triton_env._hook_set(print)


def test_every_constexpr_and_runtime_argument_is_accounted_for():
    with pytest.raises(TypeError, match="FLAG"):
        triton_env.FastLauncher(_Jit(), BLOCK=64)
    launch = triton_env.FastLauncher(_Jit(), BLOCK=64, FLAG=True)
    with pytest.raises(TypeError, match="2 runtime arguments given, the kernel takes 3"):
        launch((1,), torch.zeros(4), 16)


def _kernel_with_defaults(x_ptr, BLOCK: tl.constexpr, n, WIDE: tl.constexpr = False, MODE: tl.constexpr = 2):
    pass


def test_a_constexpr_left_out_takes_its_default_in_its_slot(monkeypatch):
    monkeypatch.setattr(triton_env, "_fast_launch_on", lambda: True)
    monkeypatch.setattr(triton_env, "current_device", lambda: 0)
    monkeypatch.setattr(triton_env, "current_raw_stream", lambda dev: 7)
    jit = _Jit()
    jit.fn = _kernel_with_defaults
    launch = triton_env.FastLauncher(jit, BLOCK=64, MODE=1)
    assert launch.constexprs == {"WIDE": False, "BLOCK": 64, "MODE": 1}
    x = torch.zeros(64)
    launch((1,), x, 32)
    launch((1,), x, 32)
    assert jit.log[-1] == ("run", (1, 1, 1), (x, 64, 32, False, 1))   # every slot in signature order


def test_the_gemv_launchers_build_as_fast_tuned_builds_them():
    # the GEMV's constexprs with defaults (RES_AFTER, X_BCAST, NARROW_W): each tuned variant's candidate, with the
    # flags gemv() passes, makes a launcher (the GPU path; under the interpreter gemv() launches fixed configs)
    from sits.kernels import linear_gemv as lg
    flags = dict(HAS_SCALE=True, HAS_BIAS=False, SILU_EPI=False, NORM=0, INT8_CONV=lg.INT8_CONV, EVEN_K=True)
    for loads, tuned in lg._TUNED.items():
        for cfg in tuned.configs:
            launch = triton_env.FastLauncher(lg._gemv_kernel, **cfg.all_kwargs(), **flags)
            assert launch.constexprs["X_BCAST"] == lg.LOADS[loads].get("X_BCAST", False)
            assert launch.constexprs["NARROW_W"] == lg.LOADS[loads].get("NARROW_W", False)
            assert launch.constexprs["RES_AFTER"] is False and launch.constexprs["PDL"] is False
            assert launch.num_runtime == 17
    from sits.kernels import rms_norm as rn   # as kernels/rms_norm.py's _launch builds it (PDL: benchmarks only)
    launch = triton_env.FastLauncher(rn._rms_norm_kernel, HAS_RESIDUAL=True, BLOCK_H=4096, num_warps=16)
    assert launch.constexprs["PDL"] is False and launch.constexprs["QUANT"] is False and launch.num_runtime == 12


def test_the_real_kernels_constexprs_are_found():
    # the wrappers' own launchers are checked whenever they run (the CPU kernel tests run every one of them); here:
    # the signatures of the real kernels (string annotations under the interpreter) are read right
    from sits.kernels import linear, paged_decode_attention as pda, rms_norm, rope_and_cache, silu_and_mul
    for fn in (linear._linear_kernel, pda._paged_decode_attention_kernel, pda._merge_splits_kernel,
               rms_norm._rms_norm_kernel, rope_and_cache._rope_and_cache_kernel, silu_and_mul._silu_and_mul_kernel):
        with pytest.raises(TypeError, match="must be given"):
            triton_env.FastLauncher(fn)


def test_fast_tuned_tunes_once_then_launches_the_winner_with_derived_constexprs(monkeypatch):
    monkeypatch.setattr(triton_env, "_fast_launch_on", lambda: True)
    monkeypatch.setattr(triton_env, "current_device", lambda: 0)            # no CUDA here: device 0,
    monkeypatch.setattr(triton_env, "current_raw_stream", lambda dev: 7)    # stream handle 7
    jit = _Jit()

    class Best:  # triton.Config's interface
        kwargs = {"BLOCK": 32}

        def all_kwargs(self):
            return {"BLOCK": 32, "num_warps": 2}

    class Autotuned:
        best_config = Best()
        calls = []

        def __getitem__(self, grid):
            return lambda *args, **kw: self.calls.append((grid, args, kw))

    tuned = Autotuned()
    grid = lambda c: (c["BLOCK"] // 8,)  # noqa: E731
    x = torch.zeros(64)
    key = ("shape", 1)
    assert triton_env.tuned_launcher(tuned, key) is None
    for _ in range(3):
        triton_env.fast_tuned(tuned, jit, key, grid, x, 32, 0.5,
                              derived=lambda best: {"FLAG": best.kwargs["BLOCK"] > 16})
    assert len(tuned.calls) == 1  # tuned once
    launcher = triton_env.tuned_launcher(tuned, key)
    assert launcher.constexprs == {"BLOCK": 32, "num_warps": 2, "FLAG": True}
    assert jit.log[0][0] == "jit" and jit.log[-1] == ("run", (4, 1, 1), (x, 32, 32, 0.5, True))


@on_gpu
def test_fast_launch_repeats_match_the_reference_and_respecialize(monkeypatch):
    """Repeated eager calls (the engine's decode loop) run through FastLauncher after the first: every call must
    still match the reference, and an argument with another specialization (a misaligned view, M = 1 vs 5) must get
    its own compiled kernel instead of reusing one built for 16-byte-aligned pointers."""
    from sits.kernels import linear as lin
    from sits.kernels.triton_env import tuned_launcher
    # launchers of their own: another test of this process may have launched the same kernel at this shape with
    # other weights (the launcher is keyed by shape, and compiles once per specialization of what it is given)
    monkeypatch.setattr(triton_env, "_LAUNCHERS", {})
    TRI, REF = get_kernel_set("triton-v1"), get_kernel_set("torch")
    g = torch.Generator().manual_seed(11)
    n, k = 4096, 4096
    qw = quantize_weight(torch.randn(n, k, generator=g) * 0.02, "int8").to("cuda")
    buf = torch.randn(8 * k + 1, generator=g).bfloat16().cuda()
    tol = ATOL[torch.bfloat16]
    for m in (1, 5, 1, 5):
        for x in (buf[:m * k].view(m, k), buf[1:1 + m * k].view(m, k)):  # aligned, then 2 bytes off
            assert x.is_contiguous()
            ref64 = REF.linear(x.double(), qw)
            assert_close_to_fp64(TRI.linear(x, qw), REF.linear(x, qw), ref64, tol * max(1.0, ref64.abs().max().item()))
    dev = torch.device("cuda", torch.cuda.current_device())
    launcher = tuned_launcher(lin._linear_small_m, (dev, n, k, torch.bfloat16, False, "tf32", False, False, False))
    # M=1 vs M=5 (an int arg equal to 1 is specialized) x aligned vs not: four kernels, each reused on the repeats
    assert len(launcher.compiled) == 4
    h = torch.randn(3, 4096, generator=g).bfloat16().cuda()
    w = (1 + 0.1 * torch.randn(4096, generator=g)).bfloat16().cuda()
    for _ in range(3):
        check_op_on_gpu("rms_norm", (h, w, 1e-5), torch.bfloat16)
        check_op_on_gpu("fused_add_rms_norm", (h, h.flip(0), w, 1e-5), torch.bfloat16)
        check_op_on_gpu("silu_and_mul", (torch.randn(5, 2 * 1024, generator=g).bfloat16(),), torch.bfloat16)


def test_fast_tuned_waits_for_the_callers_stream_before_tuning_only(monkeypatch):
    # Triton benchmarks candidates on a side stream that does not wait for the caller's: kernels still queued there
    # would race them on shared split-K lock counters and on freshly reused memory. The first call of a key waits
    # for the caller's stream (not inside a capture); later calls launch without waiting.
    monkeypatch.setattr(triton_env, "_fast_launch_on", lambda: False)
    waited = []
    monkeypatch.setattr(triton_env, "_wait_for_stream", waited.append)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    class OnCuda:   # a stand-in for a CUDA tensor (no GPU here)
        device = torch.device("cuda", 1)

    class Best:
        kwargs = {"BLOCK": 32}

        def all_kwargs(self):
            return {"BLOCK": 32}

    class Autotuned:
        best_config = Best()
        calls = []

        def __getitem__(self, grid):
            return lambda *args, **kw: self.calls.append(args)

    jit = _Jit()
    tuned = Autotuned()
    x = OnCuda()
    for _ in range(3):
        triton_env.fast_tuned(tuned, jit, ("k", 1), (1,), x, 32, 0.5, FLAG=True)
    assert waited == [torch.device("cuda", 1)] and len(tuned.calls) == 1
    capturing[0] = True    # inside a capture it cannot wait
    triton_env.fast_tuned(tuned, jit, ("k", 2), (1,), x, 32, 0.5, FLAG=True)
    assert waited == [torch.device("cuda", 1)] and len(tuned.calls) == 2
    triton_env.fast_tuned(tuned, jit, ("k", 3), (1,), torch.zeros(4), 32, 0.5, FLAG=True)   # CPU tensors: nothing
    assert len(waited) == 1 and len(tuned.calls) == 3
