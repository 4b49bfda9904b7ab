"""How many programs of a compiled kernel a GPU holds at once, how full their waves are, and the launch rule built on
them (`WavesRule`: triton-v1.15's and v1.26's decode attention over FP8 pages, kernels/paged_decode_attention_fp8.py;
bench/decode_attention_batch.py).

An SM holds as many programs as the scarcest of its resources allows: registers (allocated 256 a warp at a time),
shared memory (plus the 1 KB the driver reserves a block), threads and resident blocks (`programs_per_sm`, against
`sm_limits` read from torch's device properties, once a device). A launch of P programs on a GPU holding S at once
runs ceil(P / S) waves; `wave_fill` is the share of those waves' slots its programs keep busy. A `WavesRule`
picks between two launch configs of one launch (an object with `grid`, `out`, `meta` and `compile(config)`, as
kernels/paged_decode_attention_fp8.py's DecodeLaunch) the one whose programs fill more of their waves.
"""
from __future__ import annotations

import functools
import math

import torch

from sits.kernels.triton_env import num_sms

# Warp schedulers an SM has (sm_70 .. sm_90): WavesRule counts an SM's programs in whole rounds of them.
# Fitted with triton-v1.15 to bench/decode_attention_batch.py on an H100 (2026-12-06), 8-256 sequences of 2,048-2,560
# tokens: the compiled decode kernels hold 10 one-warp and 3 four-warp programs an SM. Counting one-warp programs in
# whole rounds of the four schedulers (10 -> 8) and taking the config whose programs fill more of their waves picks the
# faster config at all ten batch sizes measured: one warp at 16-128 and 256 sequences (1,024 and 2,048 programs, won by
# 3-10 %), four at 96, 160, 192 and 224 (768-1,792 programs, won by 10 %, 14 %, 21 % and 7 %); the plain count (10)
# picked one warp at 160, 14 % slower.
SCHEDULERS_PER_SM = 4
_PER_SM: dict = {}   # (device, the launch's constexprs, a config) -> programs an SM holds (0: does not fit)


def programs_per_sm(regs: int, shared: int, num_warps: int, limits: dict) -> int:
    """How many programs of a kernel one SM holds at once: its registers a thread (allocated 256 a warp at a time),
    shared memory a program (plus the 1 KB the driver reserves for each), and warps, against the SM's `limits`
    (regs, shared, threads, blocks: an SM's registers, bytes of shared memory, threads and resident blocks)."""
    warp_regs = -(-max(regs, 1) * 32 // 256) * 256
    fits = [limits["blocks"], limits["threads"] // (32 * num_warps), limits["regs"] // (warp_regs * num_warps)]
    if shared:
        fits.append(limits["shared"] // (shared + 1024))
    return max(0, min(fits))


@functools.cache
def sm_limits(device) -> dict | None:
    """The `limits` programs_per_sm takes, from torch's properties of a CUDA device; None where torch lacks one."""
    p = torch.cuda.get_device_properties(device)
    names = dict(regs="regs_per_multiprocessor", shared="shared_memory_per_multiprocessor",
                 threads="max_threads_per_multi_processor")
    limits = {k: getattr(p, a, None) for k, a in names.items()}
    if None in limits.values():
        return None
    # resident blocks an SM: 32 on the data-center parts (sm_80, sm_90, sm_100); elsewhere 16, the fewest of the
    # others (sm_86; sm_89 holds 24): a bound that only one-warp programs with few registers could reach
    return {**limits, "blocks": 32 if (p.major, p.minor) in ((8, 0), (9, 0), (10, 0)) else 16}


def wave_fill(programs: int, slots: int) -> float:
    """The share of `slots` (programs the whole GPU holds at once) that `programs` keep busy, over every wave they
    take: 1.0 when they fill whole waves, 0.55 when 1.1 waves' worth leaves the second wave nine-tenths empty."""
    if programs <= 0 or slots <= 0:
        return 0.0
    return programs / (-(-programs // slots) * slots)


class WavesRule:
    """A launch rule between two configs of one kernel: `one_warp` (configs[0]), or `four_warps` (configs[1]) where
    the launch's programs fill more of its waves: each config's programs an SM come from its compiled kernel
    (registers, shared memory) and the device's limits, counted in whole rounds of the SM's warp schedulers
    (SCHEDULERS_PER_SM), the launch's programs from its grid. configs[0] where the device's limits or a kernel's
    registers are unknown. `rule(launch)` picks once per grid and constexprs (a dict lookup on later calls)."""

    def __init__(self, one_warp: dict, four_warps: dict):
        self.configs = (one_warp, four_warps)
        self._picked: dict = {}   # (device, grid, the launch's constexprs) -> the pick

    def __call__(self, launch) -> dict:
        key = (launch.out.device, launch.grid, *launch.meta.values())
        picked = self._picked.get(key)
        if picked is None:
            picked = self._picked[key] = _pick_by_waves(launch, self.configs)
        return picked


def _pick_by_waves(launch, configs: tuple[dict, dict]) -> dict:
    dev = launch.out.device
    limits = sm_limits(dev)
    per_sm = [programs_per_sm_of(launch, c, limits) if limits else None for c in configs]
    if None in per_sm:
        return configs[0]
    programs = math.prod(launch.grid)
    fills = []
    for c, per in zip(configs, per_sm):
        warps = per * c["num_warps"] // SCHEDULERS_PER_SM * SCHEDULERS_PER_SM
        fills.append(wave_fill(programs, warps // c["num_warps"] * num_sms(dev)))
    return configs[1] if fills[1] > fills[0] else configs[0]


def programs_per_sm_of(launch, config: dict, limits: dict) -> int | None:
    """How many programs of the launch's kernel at `config`, with the launch's constexprs, one SM holds (0: it does
    not fit; None: this Triton does not say how many registers it takes)."""
    key = (launch.out.device, *launch.meta.items(), *config.items())
    if key not in _PER_SM:   # compiled (or found in Triton's cache) without a launch
        from triton.runtime.errors import OutOfResources
        kernel = launch.compile(config)
        try:
            kernel._init_handles()   # loads it: its registers a thread are known from here (Triton 3.x)
            _PER_SM[key] = programs_per_sm(kernel.n_regs, kernel.metadata.shared, config["num_warps"], limits)
        except OutOfResources:
            _PER_SM[key] = 0
        except AttributeError:
            _PER_SM[key] = None
    return _PER_SM[key]
