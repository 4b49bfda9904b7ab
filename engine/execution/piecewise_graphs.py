"""Steps with prefill tokens replayed piece by piece from CUDA graphs, attention run eagerly between the pieces.

A step that prefills cannot replay a decode graph (engine/execution/cuda_graphs.py): its attention depends on how its
tokens split into sequences. Launched kernel by kernel from Python it is host-bound when it is small: an "arrival" step
(128 sequences decoding, one short prompt) took 19.6 ms on an H200 with the GPU busy 8.6 ms (BENCHMARKS.md "Where the
engine's time goes"). Everything outside attention treats tokens row by row, so, as vLLM v1 does with its piecewise
graphs, that part is captured per padded token count and only attention runs eagerly:

    graph 0: embedding, layer 0's input norm and q/k/v projection
    eager:   layer i's RoPE + KV write + prefill and decode attention on the real rows -> one static buffer
    graph i + 1: layer i's output projection, norm and MLP, then layer i + 1's input norm and q/k/v projection
                 (the last: the final norm)

- Token counts (real rows: prefill tokens, then the padded decode rows) are padded to the smallest of `SIZES` that
  holds them, up to the step budget; larger steps are compute-bound and run eagerly as before. Padding rows carry
  token 0 through the row-wise pieces and never reach attention, the KV cache or the sampler.
- The pieces of a size read and write one set of static buffers (token ids, qkv, attention output, residual, final
  hidden states), so a size holds one set, not one per layer; its graphs are captured in the order they replay,
  into a memory pool of their own, after one eager pass of the same pieces (Triton compiles and autotunes there,
  never inside a capture).
- Only for `graph_safe` kernel sets, on CUDA, wherever decode steps use graphs (on by default; `--no-piecewise-graphs`
  turns it off).
  A capture that fails turns it off for the runner (logged); steps then run eagerly. So does a captured piece that
  disagrees with the same piece run eagerly (`verify`, after the warm-up's captures; the decode graphs are checked
  alike).

capture=False runs the same static-buffer path eagerly (tests on CPU check it against the model's forward).
"""
from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

from sits.engine.execution.cuda_graphs import disagreements
from sits.engine.model.layers.attention import AttentionMetadata

log = logging.getLogger("sits.engine")

SIZES = (16, 32, 64, 96, 128, 192, 256, 384, 512)


def piecewise_sizes(max_tokens: int) -> tuple[int, ...]:
    """The padded token counts captured for steps of at most `max_tokens` tokens (never above SIZES[-1])."""
    return tuple(s for s in SIZES if s < max_tokens) + ((max_tokens,) if max_tokens <= SIZES[-1] else ())


class _Pieces:
    """One padded token count: its static buffers (every piece reads and writes these, so a size holds one set, not
    one per layer) and its graphs in replay order."""

    def __init__(self, size: int, model, device: torch.device):
        layer, h, dt = model.layers[0], model.cfg.hidden_size, model.dtype
        self.size = size
        self.ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.qkv = torch.zeros(size, (layer.hq + 2 * layer.hkv) * layer.d, dtype=dt, device=device)
        self.attn = torch.zeros(size, layer.hq * layer.d, dtype=dt, device=device)
        self.res = torch.zeros(size, h, dtype=dt, device=device)
        self.out = torch.zeros(size, h, dtype=dt, device=device)   # the final norm's output
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.pool = None


class PiecewiseGraphs:
    def __init__(self, model, kv_caches, *, max_tokens: int, device: torch.device, capture: bool = True):
        self.model, self.kv_caches = model, kv_caches
        self.device = device
        self.capture = capture
        self.sizes = piecewise_sizes(max_tokens)
        self._pieces: dict[int, _Pieces] = {}
        self.stream = torch.cuda.Stream(device) if capture else None
        self.failed: str | None = None  # why piecewise graphs were turned off

    def size_for(self, num_tokens: int) -> int | None:
        """The padded size a step of `num_tokens` rows replays, None when it runs eagerly."""
        if self.failed is not None:
            return None
        return next((s for s in self.sizes if s >= num_tokens), None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The model's forward over the step's T rows (size_for(T) is not None) -> final hidden states [T, H]."""
        t = input_ids.shape[0]
        size = self.size_for(t)
        p = self._pieces.get(size)
        if p is None:
            p = self._prepare(size)
            if p is None:   # capture failed: this step runs eagerly
                return self.model.forward(input_ids, positions, self.kv_caches, meta)
        p.ids[:t].copy_(input_ids)
        layers, m = self.model.layers, self.model
        self._run(p, 0)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(layers, self.kv_caches)):
            p.attn[:t].copy_(layer.attention(p.qkv[:t], positions, m.cos, m.sin, k_cache, v_cache, meta))
            self._run(p, i + 1)
        return p.out[:t]

    def capture_all(self) -> None:
        """Capture every size now, largest first (the engine's warm-up does this, so no request waits for one)."""
        for size in reversed(self.sizes):
            if self.failed is not None:
                return
            if size not in self._pieces:
                self._prepare(size)

    @torch.inference_mode()
    def verify(self) -> str | None:
        """Replay every captured piece of every size once on seeded inputs (token ids, attention output, residual)
        and compare what it writes with the same piece run eagerly on the same static buffers. A piece that disagrees
        by more than rounding (cuBLAS may pick other kernels inside a capture) is a fault of the capture (a buffer it
        recorded and someone freed, a launch it missed): piecewise graphs are turned off, as after a failed capture,
        and steps with prefill run eagerly. Returns why, or None. Checked once, after the warm-up's captures
        (ModelRunner.capture_decode_graphs); the buffers' contents are not kept (every step writes them first)."""
        if not self.capture or self.failed is not None:
            return self.failed
        gen = torch.Generator(self.device).manual_seed(0)
        vocab = self.model.embed_tokens.shape[0]
        for size, p in sorted(self._pieces.items()):
            if not p.graphs:
                continue
            bufs = (p.ids, p.qkv, p.attn, p.res, p.out)
            p.ids.copy_(torch.randint(vocab, (size,), generator=gen, device=self.device))
            for b in (p.attn, p.res, p.qkv, p.out):
                b.copy_(torch.randn(b.shape, generator=gen, device=self.device, dtype=torch.float32).to(b.dtype))
            for i, graph in enumerate(p.graphs):
                inputs = [b.clone() for b in bufs]
                self._piece(p, i)
                want = [b.clone() for b in bufs]
                for b, x in zip(bufs, inputs):
                    b.copy_(x)
                graph.replay()
                for name, bad in zip(("ids", "qkv", "attn", "res", "out"), disagreements(list(zip(want, bufs)))):
                    if bad is not None:
                        diff, scale = bad
                        self.failed = (f"piece {i} of the {size}-token piecewise graphs disagrees with the eager "
                                       f"piece on the same inputs ({name}: largest difference {diff:.3g}, eager "
                                       f"values up to {scale:.3g})")
                        log.error("%s; steps with prefill run eagerly from now on", self.failed)
                        return self.failed
        return None

    # ---- the pieces ----
    def _piece(self, p: _Pieces, i: int) -> None:
        """Piece i from the static buffers into them: 0 = embedding + layer 0's qkv; i = layer i - 1's output
        projection and MLP, then layer i's qkv (the last: the final norm)."""
        layers, m = self.model.layers, self.model
        if i == 0:
            qkv, res = layers[0].qkv(F.embedding(p.ids, m.embed_tokens), None)
        else:
            hidden, res = layers[i - 1].after_attention(p.attn, p.res)
            if i == len(layers):
                p.out.copy_(m.norm(hidden, res)[0])
                return
            qkv, res = layers[i].qkv(hidden, res)
        p.qkv.copy_(qkv)
        if res is not p.res:   # the fused add + norm may have updated the residual in place
            p.res.copy_(res)

    def _run(self, p: _Pieces, i: int) -> None:
        if p.graphs:
            p.graphs[i].replay()
        else:   # capture=False: the same pieces, eagerly
            self._piece(p, i)

    def _prepare(self, size: int) -> _Pieces | None:
        p = _Pieces(size, self.model, self.device)
        n = len(self.model.layers) + 1
        if not self.capture:
            self._pieces[size] = p
            return p
        t0 = time.perf_counter()
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        try:
            with torch.cuda.stream(self.stream):
                for i in range(n):   # compiles and autotunes every kernel for this size, outside the captures
                    self._piece(p, i)
            self.stream.synchronize()
            p.pool = torch.cuda.graph_pool_handle()
            for i in range(n):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=p.pool, stream=self.stream, capture_error_mode="thread_local"):
                    self._piece(p, i)
                p.graphs.append(g)
            with torch.cuda.stream(self.stream):   # a graph's first launch uploads it: here, not in a request's step
                for g in p.graphs:                 # (the pieces only read and write this size's static buffers)
                    g.replay()
            self.stream.synchronize()
        except Exception as e:  # noqa: BLE001 -- a set that is not capturable after all: go on eagerly
            self.failed = f"{type(e).__name__}: {e}"
            log.warning("piecewise CUDA graph capture of a %d-token step failed (%s); steps with prefill run "
                        "eagerly from now on", size, self.failed)
            torch.cuda.synchronize(self.device)
            main.wait_stream(self.stream)
            return None
        main.wait_stream(self.stream)
        self._pieces[size] = p
        log.info("captured %d piecewise CUDA graphs for %d-token steps in %.2f s", n, size, time.perf_counter() - t0)
        return p
