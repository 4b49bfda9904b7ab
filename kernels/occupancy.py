"""How many programs of a compiled kernel a GPU holds at once, and how full their waves are (triton-v1.15's launch
rule, kernels/paged_decode_attention_fp8.py `config_by_waves`; bench/decode_attention_batch.py).

An SM holds as many programs as the scarcest of its resources allows: registers (allocated 256 a warp at a time),
shared memory (plus the 1 KB the driver reserves a block), threads and resident blocks (`programs_per_sm`, against
`sm_limits` read from torch's device properties, once a device). A launch of P programs on a GPU holding S at once
runs ceil(P / S) waves; `wave_fill` is the share of those waves' slots its programs keep busy.
"""
from __future__ import annotations

import functools

import torch


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
