"""A read-only streaming kernel: how fast this GPU reads a buffer of a given size once, the ceiling for a GEMV that
must read every weight byte (bench/kernels.py's GEMV sweep reports it next to the GEMV variants)."""
from __future__ import annotations

from kernels.triton_env import tl, triton


@triton.jit
def _stream_read_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr, INTERLEAVE: tl.constexpr):
    # program p reads ITERS blocks, every byte once: blocks p * ITERS + i (one contiguous range per program), or with
    # INTERLEAVE blocks i * programs + p (programs running together read neighbouring blocks)
    p = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(ITERS):
        blk = i * tl.num_programs(0) + p if INTERLEAVE else p * ITERS + i
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0, eviction_policy="evict_first").to(tl.int32)
    tl.store(dst_ptr + tl.program_id(0), tl.sum(acc, 0))


def stream_read(src, dst, block: int = 16384, iters: int = 1, num_warps: int = 4, interleave: bool = False):
    """Sum of int8 `src` (flat) per program into int32 `dst` (needs cdiv(numel, block * iters) entries)."""
    n = src.numel()
    grid = (triton.cdiv(n, block * iters),)
    _stream_read_kernel[grid](src, dst, n, BLOCK=block, ITERS=iters, INTERLEAVE=interleave,
                              num_warps=num_warps)
    return dst[:grid[0]]
