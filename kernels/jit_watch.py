"""Counts Triton JIT compilations and autotuner benchmark runs in this process.

`LLMEngine.warmup()` is meant to leave nothing to compile or tune while serving; `JitWatch` is how a test or a
benchmark checks that: every kernel binary Triton builds (or loads from its on-disk cache) after an in-memory cache
miss passes `knobs.runtime.jit_post_compile_hook`, and every candidate config the autotuner times passes
`Autotuner._bench`.

    with JitWatch() as w:
        llm.generate(...)
    assert w.compiles == [] and w.autotune_runs == 0
"""
from __future__ import annotations

import time

from sits.kernels.triton_env import triton


class JitWatch:
    def __init__(self):
        self.compiles: list[str] = []  # kernel names, one entry per compilation
        self.autotune_runs = 0  # candidate configs timed by an autotuner
        self.autotune_s = 0.0   # wall time spent timing them (their compilations included)
        self.autotune_by_kernel: dict[str, list] = {}  # kernel name -> [runs, seconds]
        self._saved = None

    def __enter__(self) -> "JitWatch":
        from triton import knobs
        from triton.runtime.autotuner import Autotuner
        self._knobs, self._autotuner = knobs.runtime, Autotuner
        prev_hook = knobs.runtime.jit_post_compile_hook
        prev_bench = Autotuner._bench
        self._saved = (prev_hook, prev_bench)
        watch = self

        def hook(*args, **kwargs):
            watch.compiles.append(getattr(kwargs.get("fn"), "name", None) or str(kwargs.get("repr")))
            return prev_hook(*args, **kwargs) if prev_hook else None

        def bench(self, *args, **kwargs):
            watch.autotune_runs += 1
            t0 = time.perf_counter()
            try:
                return prev_bench(self, *args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                watch.autotune_s += dt
                per = watch.autotune_by_kernel.setdefault(getattr(self.base_fn, "__name__", "?"), [0, 0.0])
                per[0] += 1
                per[1] += dt

        knobs.runtime.jit_post_compile_hook = hook
        Autotuner._bench = bench
        return self

    def __exit__(self, *exc) -> None:
        prev_hook, prev_bench = self._saved
        self._knobs.jit_post_compile_hook = prev_hook
        self._autotuner._bench = prev_bench

    def summary(self) -> str:
        names: dict[str, int] = {}
        for n in self.compiles:
            names[n] = names.get(n, 0) + 1
        return (f"{len(self.compiles)} compilations {names or ''}, {self.autotune_runs} autotune benchmark runs "
                f"({self.autotune_s:.1f} s)")


__all__ = ["JitWatch", "triton"]
