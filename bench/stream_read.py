"""A read-only streaming kernel: how fast this GPU reads a buffer of a given size once. It is the practical ceiling
for a GEMV, which must read every weight byte; bench/kernel_timings.py times it on the GEMV's weights, the same way."""
from __future__ import annotations

from sits.kernels.triton_env import tl, triton


@triton.jit
def _stream_read_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    # program p sums bytes [p * BLOCK, (p + 1) * BLOCK): every byte is read once, all loads issued at once
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first")
    tl.store(dst_ptr + tl.program_id(0), tl.sum(x.to(tl.int32), 0))


def stream_read(src, dst, block: int = 16384, num_warps: int = 8):
    """Per-program sums of int8 `src` (flat) into int32 `dst` (needs cdiv(numel, block) entries); returns them."""
    programs = triton.cdiv(src.numel(), block)
    if dst.numel() < programs:
        raise ValueError(f"stream_read: dst holds {dst.numel()} sums, needs {programs}")
    _stream_read_kernel[(programs,)](src, dst, src.numel(), BLOCK=block, num_warps=num_warps)
    return dst[:programs]
