"""Decode steps replayed from CUDA graphs.

A decode step launches ~10 kernels per layer (≈ 330 for llama3-8b); launched one by one from Python, the host takes
3-10x longer than the GPU needs (BENCHMARKS.md, "Engine decode"). Here a decode-only step's forward pass is captured
once per padded batch size and replayed with a single launch.

- Batch sizes: 1, 2, 4, 8, then steps of 8-32 up to min(max_num_seqs, 256); a step with n sequences replays the
  graph of the smallest size >= n. Padding rows write no KV (slot -1) and attend to one cached token; their outputs
  are dropped. Larger decode batches, and steps with prefill tokens, run eagerly.
- `LLMEngine.warmup()` (the server runs it before /readyz turns 200) captures every size; otherwise a graph is
  captured on the first step that needs it. Each capture follows one eager forward of that size on the capture
  stream (Triton compiles and autotunes there, never inside a capture). All graphs share one memory pool. Then
  `verify()` replays each graph against the eager forward on the same inputs and turns graphs off if one disagrees.
- Inputs live in static device buffers, filled with one host-to-device copy per step (from a pinned buffer). Block
  tables are kept at the full width (max_model_len / block_size), so a graph never depends on how long the contexts
  are, in persistent rows, one per sequence, of which a step sends only the entries that changed (a new block every
  64 tokens); the graph gathers the batch's rows.
- Only kernel sets that declare `graph_safe` are captured: their ops never wait on the GPU from the host and launch
  the same kernels for the same shapes. A capture that fails anyway turns graphs off for the runner (logged), and
  the engine goes on eagerly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from sits.engine.model.layers.attention import AttentionMetadata

log = logging.getLogger("sits.engine")

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The padded batch sizes captured for an engine that runs at most `max_num_seqs` sequences per step."""
    cap = min(max_num_seqs, GRAPH_BATCH_SIZES[-1])
    return tuple(b for b in GRAPH_BATCH_SIZES if b < cap) + (cap,)


@dataclass(slots=True)
class DecodeStep:
    """One decode step's inputs on the host (DecodeGraphs.plan): what replay() copies to the device, and what rank 0
    sends the other tensor-parallel ranks (engine/parallel/)."""
    b: int              # padded batch size: the graph replayed
    n: int              # real rows
    u: int              # block-table entries updated
    num_prev: int       # > 0: the input tokens are gathered from the previous step's num_prev tokens on the device
    host: torch.Tensor  # [5 b + 2 u + n] int64: ids | positions | slots | lens | rows, the updates, the gather index


def padded_batch_size(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest captured size >= n, or None when n is larger than every size."""
    for b in sizes:
        if b >= n:
            return b
    return None


# a graph's output may differ from the eager forward's by rounding (cuBLAS may pick other kernels inside a capture);
# a broken graph differs by far more (garbage tiles, non-finite values)
VERIFY_TOLERANCE = 0.05   # of the eager values' largest magnitude


def disagreements(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[float, float] | None]:
    """For each (eager, replayed) pair of tensors: None when the replay agrees within VERIFY_TOLERANCE (or the eager
    values are not finite: no reference to compare with), else (largest difference, eager values' largest magnitude).
    One copy to the host for all pairs (DecodeGraphs.verify, PiecewiseGraphs.verify)."""
    stats = torch.stack([torch.stack((w.float().abs().max(), (g.float() - w.float()).abs().max(),
                                      torch.isfinite(w).all().float(), torch.isfinite(g).all().float()))
                         for w, g in pairs]).tolist()
    return [None if not want_finite or (got_finite and diff <= VERIFY_TOLERANCE * max(scale, 1e-6))
            else (diff, scale) for scale, diff, want_finite, got_finite in stats]


class DecodeGraphs:
    """Runs decode-only forward passes through static buffers, replaying one CUDA graph per padded batch size.

    capture=False runs the same padded, static-buffer path eagerly (tests on CPU check that path with it)."""

    def __init__(self, model, kv_caches, *, max_num_seqs: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device, capture: bool = True, num_blocks: int | None = None):
        self.model, self.kv_caches = model, kv_caches
        self.block_size = block_size
        self.num_blocks = num_blocks  # the KV cache's blocks: the tuning forward's contexts (tuning_inputs)
        self.device = device
        self.capture = capture
        self.sizes = graph_batch_sizes(max_num_seqs)
        b = self.sizes[-1]
        w = max_blocks_per_seq
        # per step, one host-to-device copy of [ids | positions | slots | context lens | table rows] of the padded
        # batch, then the block-table entries that changed since the last step: [flat index | block id] x U
        # (+ b: where each row's input token sits in the previous step's sampled tokens, when they stay on the GPU)
        self.stage = torch.zeros(6 * b + 2 * b * w, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        # two pinned staging buffers, used in turn: with a step launched one ahead (engine/execution/async_decode.py)
        # the previous step's copy may not have run yet when the next one is staged
        self.hosts = [torch.zeros(self.stage.numel(), dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._host_flip = 0
        self.lens = torch.ones(b, dtype=torch.int32, device=device)
        # persistent tables: one row per sequence while it decodes here (row b: zeros, for padding rows), updated
        # incrementally; the graph gathers the batch's rows into `tables`
        self.table_rows = torch.zeros(b + 1, w, dtype=torch.int32, device=device)
        self.tables = torch.zeros(b, w, dtype=torch.int32, device=device)
        self._rows: dict[int, list] = {}  # seq_id -> [row, the seq's block_table list, entries written]
        self._free_rows = list(range(b - 1, -1, -1))
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # size -> (graph, its output)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.stream = torch.cuda.Stream(device) if capture else None
        self.failed: str | None = None  # why graphs were turned off

    def usable(self, seqs) -> bool:
        """Whether run(seqs) can take this decode step: graphs not turned off, a size for the batch, tables that
        fit, and every sequence at its last token (a 1-token chunk in the middle of a prompt samples nothing)."""
        return (self.failed is None and padded_batch_size(len(seqs), self.sizes) is not None
                and all(s.num_computed_tokens + 1 == len(s.token_ids) and len(s.block_table) <= self.tables.shape[1]
                        for s in seqs))

    def run(self, seqs, ids_from: tuple[torch.Tensor, list[int]] | None = None) -> torch.Tensor:
        """Forward one decode token of each sequence (at position num_computed_tokens); returns the final hidden
        states [len(seqs), H]. The token is token_ids[num_computed_tokens], or with `ids_from` = (tokens on the
        device, index of each row in them) taken on the device (engine/execution/async_decode.py: not on the host yet).
        Caller checks usable(seqs) first (or, with ids_from, what async_decode checks)."""
        return self.replay(self.plan(seqs, ids_from), ids_from[0] if ids_from else None)

    def plan(self, seqs, ids_from: tuple[torch.Tensor, list[int]] | None = None) -> "DecodeStep":
        """The host half of run(): the step's inputs in the next pinned staging buffer (and the rows' bookkeeping)."""
        n = len(seqs)
        b = padded_batch_size(n, self.sizes)
        bs, w = self.block_size, self.table_rows.shape[1]
        pad = b - n
        rows_of = self._rows
        if len(rows_of) > n or any(s.seq_id not in rows_of for s in seqs):
            self._release_absent({s.seq_id for s in seqs})
        ids, pos, slots, lens, rows, upd_at, upd_val = [], [], [], [], [], [], []
        for s in seqs:
            p = s.num_computed_tokens
            bt = s.block_table
            ids.append(0 if ids_from else s.token_ids[p])
            pos.append(p)
            slots.append(bt[p // bs] * bs + p % bs)
            lens.append(p + 1)
            entry = rows_of.get(s.seq_id)
            if entry is None or entry[1] is not bt:  # new here, or its table was replaced (preempted, readmitted)
                row = entry[0] if entry is not None else self._free_rows.pop()
                entry = rows_of[s.seq_id] = [row, bt, 0]
                upd_at += range(row * w + len(bt), row * w + w)  # clear what an earlier owner left
                upd_val += [0] * (w - len(bt))
            row, _, done = entry
            if done < len(bt):  # blocks appended since the last step
                upd_at += range(row * w + done, row * w + len(bt))
                upd_val += bt[done:]
                entry[2] = len(bt)
            rows.append(row)
        u = len(upd_at)
        flat = ids + [0] * pad + pos + [0] * pad + slots + [-1] * pad + lens + [1] * pad + rows + [b] * pad
        host = self.next_host()
        host_np = host.numpy()
        host_np[:5 * b] = flat
        if u:
            host_np[5 * b:5 * b + u] = upd_at
            host_np[5 * b + u:5 * b + 2 * u] = upd_val
        k = 5 * b + 2 * u
        if ids_from:
            host_np[k:k + n] = ids_from[1]
        return DecodeStep(b, n, u, ids_from[0].numel() if ids_from else 0, host[:k + n])

    def next_host(self) -> torch.Tensor:
        """The pinned staging buffer a step fills next (two, in turn)."""
        host = self.hosts[self._host_flip]
        self._host_flip ^= 1
        return host

    def replay(self, step: "DecodeStep", ids: torch.Tensor | None = None) -> torch.Tensor:
        """The device half of run(): copy the step's inputs over, update the block-table rows, gather the input tokens
        from `ids` (the previous step's tokens, when step.num_prev) and replay (or capture first) the size's graph."""
        b, n, u = step.b, step.n, step.u
        k = 5 * b + 2 * u
        st = self.stage
        st[:k + n].copy_(step.host, non_blocking=True)
        if u:
            self.table_rows.view(-1).index_copy_(0, st[5 * b:5 * b + u], st[5 * b + u:k].to(torch.int32))
        if step.num_prev:
            torch.index_select(ids, 0, st[k:k + n], out=st[:n])
        if self.capture and self.failed is None and b not in self.graphs:
            self._capture(b)
        if b in self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:
            out = self._forward(b)
        return out[:n]

    def _release_absent(self, live: set[int]) -> None:
        for sid in [sid for sid in self._rows if sid not in live]:
            self._free_rows.append(self._rows.pop(sid)[0])

    def capture_all(self) -> None:
        """Capture every size now, largest first (the shared pool is sized by the first): the engine's warm-up does
        this, so no request waits for a capture."""
        for b in reversed(self.sizes):
            if self.failed is not None:
                return
            if b not in self.graphs:
                self._capture(b)

    def verify(self) -> str | None:
        """Replay every captured graph on the inputs its capture tuned with (each row a context of its own blocks,
        nothing written) and compare with the eager forward of the same static buffers. A graph that disagrees is
        a fault of the capture (a buffer it recorded and someone freed, a launch it missed): graphs are turned off
        for the runner, as after a failed capture, and the engine goes on eagerly. Returns why, or None. Checked
        once, after the warm-up's captures (LLMEngine.warmup); the tables' rows are restored."""
        if not self.capture or self.failed is not None:
            return self.failed
        for b in sorted(self.graphs):
            saved, saved_rows = self.stage[:5 * b].clone(), self.table_rows[:b].clone()
            try:
                self.tuning_inputs(b)
                want = self._forward(b).clone()
                graph, out = self.graphs[b]
                graph.replay()
                got = out.clone()
            finally:
                self.stage[:5 * b].copy_(saved)
                self.table_rows[:b].copy_(saved_rows)
            bad = disagreements([(want, got)])[0]
            if bad is not None:
                diff, scale = bad
                self.failed = (f"the decode graph of batch size {b} disagrees with the eager forward on the same "
                               f"inputs (largest difference {diff:.3g}, eager output up to {scale:.3g})")
                log.error("%s; decode runs eagerly from now on", self.failed)
                return self.failed
        return None

    def _forward(self, b: int) -> torch.Tensor:
        st = self.stage
        self.lens[:b].copy_(st[3 * b:4 * b])  # int64 -> int32 on the device (inside the graph when captured)
        torch.index_select(self.table_rows, 0, st[4 * b:5 * b], out=self.tables[:b])  # the batch's table rows
        meta = AttentionMetadata(slot_mapping=st[2 * b:3 * b], num_prefill_tokens=0, cu_seqlens_q=None,
                                 prefill_context_lens=None, prefill_block_tables=None,
                                 decode_context_lens=self.lens[:b], decode_block_tables=self.tables[:b])
        return self.model.forward(st[:b], st[b:2 * b], self.kv_caches, meta)

    def _capture(self, b: int) -> None:
        t0 = time.perf_counter()
        saved = self.stage[:5 * b].clone()  # this step's inputs; capture runs on dummy ones
        saved_rows = self.table_rows[:b].clone()   # rows of live sequences when a size is captured while serving
        ctx = self.tuning_inputs(b)
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        try:
            with torch.cuda.stream(self.stream):
                self._forward(b)  # compiles and autotunes every kernel for this size, outside the capture
            self.stream.synchronize()
            self.table_rows[:b].copy_(saved_rows)
            self._stage_dummies(b)   # the capture records launches, not values: one-token dummies will do
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                out = self._forward(b)
        except Exception as e:  # noqa: BLE001 -- a set that is not capturable after all: go on eagerly
            self.failed = f"{type(e).__name__}: {e}"
            log.warning("CUDA graph capture of a %d-sequence decode step failed (%s); decode runs eagerly from now on",
                        b, self.failed)
            torch.cuda.synchronize(self.device)
            self.stage[:5 * b].copy_(saved)
            self.table_rows[:b].copy_(saved_rows)
            main.wait_stream(self.stream)
            return
        main.wait_stream(self.stream)
        self.stage[:5 * b].copy_(saved)
        self.graphs[b] = (graph, out)
        log.info("captured the decode CUDA graph for batch size %d in %.2f s (kernels tuned at %d-token contexts)", b,
                 time.perf_counter() - t0, ctx)

    def _stage_dummies(self, b: int) -> None:
        """b one-token rows on the padding row's (zero) table, writing nothing (slots -1)."""
        self.stage[:5 * b].copy_(torch.tensor([0] * 2 * b + [-1] * b + [1] * b + [self.sizes[-1]] * b,
                                              dtype=torch.int64))

    def tuning_inputs(self, b: int) -> int:
        """Stage the inputs of the eager forward that compiles and autotunes a b-row step's kernels: each row a context
        of its own blocks, as long as the cache holds for b rows (at most the table width), so that decode attention
        is tuned at the lengths it serves. One-token dummies had tuned it to a config that is 1.4-2x slower at 2,300
        tokens (BENCHMARKS.md "FP8 decode attention"). Rows 0..b-1 of table_rows are overwritten (the caller keeps
        and restores them); nothing is written to the cache (slots -1), what the blocks hold is read and dropped.
        Returns the context length (1 without num_blocks)."""
        n = min(self.table_rows.shape[1], (self.num_blocks or 0) // b)
        if n == 0:
            self._stage_dummies(b)
            return 1
        ctx = n * self.block_size
        self.table_rows[:b].zero_()
        self.table_rows[:b, :n].copy_(torch.arange(b * n, dtype=torch.int32, device=self.device).view(b, n))
        self.stage[:5 * b].copy_(torch.tensor([0] * 2 * b + [-1] * b + [ctx] * b + list(range(b)),
                                              dtype=torch.int64))
        return ctx
