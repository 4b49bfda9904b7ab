"""The inputs of one eager step (prefill chunks, then decode rows padded to a graph batch size) built on the host
with numpy in two staging buffers and sent to the device in two copies, one int64 and one int32.

Built as separate `torch.tensor(list, device=cuda)` calls (as before), an eager step made eight copies from pageable
memory, and a copy from pageable memory waits for the stream first: the step's first copy waited for the decode step
still in flight and its Python-built full-width block tables cost host time between the copies (BENCHMARKS.md "Where
the engine's time goes": an arrival step's GPU was busy 8.6 of its 19.6 ms). The staging buffers are pinned on a GPU
and new each step (PyTorch's caching host allocator reuses a pinned block only after the copies that read it have
run), so the copies are asynchronous. Every segment starts on a 64-byte boundary: Triton specializes kernels on
16-byte pointer alignment, and a segment at another offset would compile a second variant after warm-up.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sits.engine.model.layers.attention import AttentionMetadata
from sits.engine.scheduling.sequence import Sequence

_ALIGN = 16   # elements: 64 bytes of int32, 128 of int64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor        # [T] int64 (T counts the decode padding)
    positions: torch.Tensor        # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor      # [S] int64: the rows whose chunk reached its sequence's end
    sample_seqs: list[Sequence]    # their sequences, in row order


@dataclass(frozen=True, slots=True)
class StepLayout:
    """Where each field sits in a packed step's two staging buffers."""
    num_tokens: int            # T, the decode padding included
    num_prefill_tokens: int
    num_prefill_seqs: int
    num_decode_rows: int       # the padding included
    max_blocks: int            # block-table width
    num_sample_rows: int

    def offsets64(self) -> list[int]:   # ids | positions | slots | sample rows
        t = self.num_tokens
        return _offsets([t, t, t, self.num_sample_rows])

    def offsets32(self) -> list[int]:   # cu_seqlens | prefill context lens | prefill tables | decode lens | tables
        p, d, w = self.num_prefill_seqs, self.num_decode_rows, self.max_blocks
        return _offsets([p + 1, p, p * w, d, d * w])


@dataclass(slots=True)
class PackedStep:
    """An eager step's inputs on the host, in two staging buffers (pinned on a GPU): what `to_device` copies over,
    and what rank 0 sends the other tensor-parallel ranks (engine/parallel/)."""
    layout: StepLayout
    h64: torch.Tensor
    h32: torch.Tensor

    @classmethod
    def from_arrays(cls, layout: StepLayout, i64: np.ndarray, i32: np.ndarray, device: torch.device) -> "PackedStep":
        """Another rank's packed step, in staging buffers of this rank's own."""
        h64, a64 = _staging(len(i64), torch.int64, device)
        h32, a32 = _staging(len(i32), torch.int32, device)
        a64[:], a32[:] = i64, i32
        return cls(layout, h64, h32)

    def to_device(self, device: torch.device, sample_seqs: list[Sequence] | None = None) -> StepInputs:
        lay = self.layout
        o64, o32 = lay.offsets64(), lay.offsets32()
        d64 = self.h64.to(device, non_blocking=True)
        d32 = self.h32.to(device, non_blocking=True)
        t, np_, nd, w = lay.num_tokens, lay.num_prefill_seqs, lay.num_decode_rows, lay.max_blocks

        def v64(i: int, n: int) -> torch.Tensor:
            return d64[o64[i]:o64[i] + n]

        def v32(i: int, n: int) -> torch.Tensor:
            return d32[o32[i]:o32[i] + n]

        meta = AttentionMetadata(
            slot_mapping=v64(2, t),
            num_prefill_tokens=lay.num_prefill_tokens,
            cu_seqlens_q=v32(0, np_ + 1) if np_ else None,
            prefill_context_lens=v32(1, np_) if np_ else None,
            prefill_block_tables=v32(2, np_ * w).view(np_, w) if np_ else None,
            decode_context_lens=v32(3, nd) if nd else None,
            decode_block_tables=v32(4, nd * w).view(nd, w) if nd else None,
        )
        return StepInputs(v64(0, t), v64(1, t), meta, v64(3, lay.num_sample_rows), sample_seqs or [])


def build_step_inputs(prefill: list[tuple[Sequence, int]], decode: list[Sequence], pad: int, *, block_size: int,
                      max_blocks: int, device: torch.device, write_kv: bool = True) -> StepInputs:
    """pack_step, then its copy to the device."""
    packed, sample_seqs = pack_step(prefill, decode, pad, block_size=block_size, max_blocks=max_blocks,
                                    device=device, write_kv=write_kv)
    return packed.to_device(device, sample_seqs)


def pack_step(prefill: list[tuple[Sequence, int]], decode: list[Sequence], pad: int, *, block_size: int,
              max_blocks: int, device: torch.device, write_kv: bool = True) -> tuple[PackedStep, list[Sequence]]:
    """`prefill`: (sequence, new tokens) chunks; `decode`: one new token each, followed by `pad` dummy rows (token 0
    at position 0, no KV slot, context 1, block table of zeros). With write_kv=False no token gets a KV slot
    (warm-up). Block tables are [rows, max_blocks], whatever each sequence holds, so kernels see one stride.
    Returns the packed step and the sequences that sample, in row order."""
    bs, w = block_size, max_blocks
    chunks = prefill + [(s, 1) for s in decode]
    t = sum(n for _, n in chunks) + pad
    sample_rows: list[int] = []
    sample_seqs: list[Sequence] = []
    row = 0
    for s, n in chunks:
        row += n
        if s.num_computed_tokens + n == len(s.token_ids):
            sample_rows.append(row - 1)
            sample_seqs.append(s)
    np_ = len(prefill)
    nd = len(decode) + pad if decode or pad else 0
    layout = StepLayout(num_tokens=t, num_prefill_tokens=sum(n for _, n in prefill), num_prefill_seqs=np_,
                        num_decode_rows=nd, max_blocks=w, num_sample_rows=len(sample_rows))

    # int64: ids, positions, slots, sample rows
    o64 = layout.offsets64()
    h64, a64 = _staging(o64[-1], torch.int64, device)
    ids, pos, slots = (a64[o64[i]:o64[i] + t] for i in range(3))
    off = 0
    for s, n in prefill:
        start = s.num_computed_tokens
        ids[off:off + n] = s.token_ids[start:start + n]
        p = np.arange(start, start + n, dtype=np.int64)
        pos[off:off + n] = p
        if write_kv:
            slots[off:off + n] = np.asarray(s.block_table, dtype=np.int64)[p // bs] * bs + p % bs
        off += n
    if decode:
        d = len(decode)
        dpos = [s.num_computed_tokens for s in decode]
        ids[off:off + d] = [s.token_ids[p] for s, p in zip(decode, dpos)]
        pos[off:off + d] = dpos
        if write_kv:
            slots[off:off + d] = [s.block_table[p // bs] * bs + p % bs for s, p in zip(decode, dpos)]
        off += d
    if not write_kv:
        slots[:off] = -1
    ids[off:], pos[off:], slots[off:] = 0, 0, -1
    a64[o64[3]:o64[3] + len(sample_rows)] = sample_rows

    # int32: cu_seqlens, prefill context lens, prefill block tables, decode context lens, decode block tables
    o32 = layout.offsets32()
    h32, a32 = _staging(o32[-1], torch.int32, device)
    if np_:
        lens = [n for _, n in prefill]
        a32[o32[0]] = 0
        np.cumsum(lens, out=a32[o32[0] + 1:o32[0] + 1 + np_])
        a32[o32[1]:o32[1] + np_] = [s.num_computed_tokens + n for s, n in prefill]
        _fill_tables(a32[o32[2]:o32[2] + np_ * w].reshape(np_, w), [s for s, _ in prefill])
    if nd:
        a32[o32[3]:o32[3] + nd] = [s.num_computed_tokens + 1 for s in decode] + [1] * pad
        _fill_tables(a32[o32[4]:o32[4] + nd * w].reshape(nd, w), decode)
    return PackedStep(layout, h64, h32), sample_seqs


def _offsets(sizes: list[int]) -> list[int]:
    """Start of each segment, each on an _ALIGN boundary, then the total length."""
    out, at = [], 0
    for n in sizes:
        out.append(at)
        at += _aligned(n)
    return out + [max(at, _ALIGN)]


def _staging(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, np.ndarray]:
    """A new host tensor (pinned when the step runs on a GPU) and its numpy view, zeroed."""
    h = torch.zeros(n, dtype=dtype, pin_memory=device.type == "cuda")
    return h, h.numpy()


def _fill_tables(out: np.ndarray, seqs: list[Sequence]) -> None:
    """Row i = seqs[i]'s block table, zeros after it (rows past len(seqs) stay zero: padding)."""
    for i, s in enumerate(seqs):
        bt = s.block_table
        out[i, :len(bt)] = bt
