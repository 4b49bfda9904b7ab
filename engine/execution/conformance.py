"""Op-level conformance: every op of the serving kernel set that is not the reference set's own (`torch`), run on fresh
random inputs at the served model's shapes, on the device that serves, against the reference in fp64 and in the
serving precision.

The engine measures at start-up (LLMEngine.warmup) and reports; it does not judge. Each case records the kernel's
largest error against the fp64 reference and the reference's own error in the serving precision (what "as exact as
the torch implementation" means for these inputs), so the control plane's correctness gate judges with its policy
(`error <= k * reference_error + atol * max(1, scale)`, control_plane/analysis/conformance.py) — the kernel tests'
criterion (tests/kernels/helpers.py, assert_close_to_fp64) at the shapes that actually serve. It needs no meaningful
weights: every input is random, so it judges a kernel on random llama3-8b exactly as on a trained model.

Shapes come from the served model and engine: query/KV head counts and head dim, the page size, the rows a step
carries (1 up to max_num_batched_tokens), decode batches up to max_num_seqs, context lengths 1, a partly filled last
page, exactly one page, one past it and the longest (max_model_len), prefill with and without a cached prefix, every
distinct linear shape (quantized like the served weights), the model's own RoPE tables. An engine serving FP8 KV pages
(`kv_cache_dtype="fp8"`) measures its KV ops on FP8 pages: the RoPE case writes them (compared as their values) and
the attention cases read pages quantized once, which the fp64 reference reads too. With fp8 weights the serving
precision includes e4m3 activations (W8A8: kernels/fp8_gemm.py from 64 rows, kernels/linear_w8a8.py from 33): a linear
case's reference error is the larger of the torch reference's and that of the same product with x rounded to e4m3
per row (`linear_w8a8_ref`), so a W8A8 kernel is held to W8A8's rounding, not to exact activations.
A fused op (kernels.FUSED_OPS, e.g. `silu_and_mul_linear`) is measured against the reference set's composition of the
ops it fuses (`KernelSet.op`), with the same allowance.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from sits import kernels
from sits.kernels.kv_fp8 import Fp8Pages, quantize_pages
from sits.kernels.linear_w8a8 import linear_w8a8_ref
from sits.kernels.quant import QuantizedWeight, quantize_weight

log = logging.getLogger(__name__)

REFERENCE = "torch"
# largest fp64 attention score matrix (query rows x keys x heads) the reference builds per case: 256 MiB
MAX_SCORE_ELEMENTS = 1 << 25
# under the Triton interpreter (CPU) a kernel runs a Python loop per block: rows are capped there (tests only)
CPU_MAX_ROWS = 64


@dataclass(frozen=True, slots=True)
class Shapes:
    hidden: int
    intermediate: int
    vocab: int
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    max_num_seqs: int
    max_tokens: int          # rows a step carries (max_num_batched_tokens)
    max_model_len: int
    eps: float
    quantization: str | None
    tied_embeddings: bool
    kv_cache_dtype: str = "auto"   # "fp8": the KV ops' cases write and read FP8 pages, as the engine serves them

    def describe(self) -> str:
        return (f"heads {self.q_heads}/{self.kv_heads} x {self.head_dim}, hidden {self.hidden}, intermediate "
                f"{self.intermediate}, vocab {self.vocab}, page {self.block_size}, up to {self.max_num_seqs} seqs, "
                f"{self.max_tokens} tokens a step, context {self.max_model_len}"
                + (f", {self.quantization} weights" if self.quantization else "")
                + (", fp8 KV pages" if self.kv_cache_dtype == "fp8" else ""))


def shapes_of(runner) -> Shapes:
    """The shapes a ModelRunner serves (one rank's share of the heads and intermediate size under tensor
    parallelism: every rank runs the same ops at these shapes)."""
    cfg, config, layer = runner.model.cfg, runner.config, runner.model.layers[0]
    return Shapes(hidden=cfg.hidden_size, intermediate=layer.intermediate, vocab=cfg.vocab_size,
                  q_heads=layer.hq, kv_heads=layer.hkv, head_dim=cfg.head_dim,
                  block_size=runner.block_size, max_num_seqs=config.max_num_seqs,
                  max_tokens=config.max_num_batched_tokens, max_model_len=runner.max_model_len,
                  eps=cfg.rms_norm_eps, quantization=config.quantization, tied_embeddings=cfg.tie_word_embeddings,
                  kv_cache_dtype=config.kv_cache_dtype)


def op_identity(fn) -> str:
    """What implements an op (module.qualname): two sets whose op has the same identity run the same code."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class _Inputs:
    """Random tensors on one device from one seeded generator."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def normal(self, *shape: int, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float64) * std + mean

    def randint(self, low: int, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.gen, device=self.device)

    def perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen, device=self.device)


def _max_error(out, ref64) -> float:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref64 if isinstance(ref64, (tuple, list)) else (ref64,)
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o = o.detach().to(torch.float64)
        if o.shape != r.shape:
            return float("inf")
        if not bool(torch.isfinite(o).all()):
            return float("inf")
        if o.numel():
            worst = max(worst, (o - r).abs().max().item())
    return worst


def _scale(ref64) -> float:
    refs = ref64 if isinstance(ref64, (tuple, list)) else (ref64,)
    return max((r.abs().max().item() for r in refs if r.numel()), default=0.0)


def _cast(args, dtype: torch.dtype):
    """Floating-point tensors to dtype (fresh copies: kernels may write their inputs, e.g. the KV cache); FP8 pages
    copied as they are (e4m3 and fp32 scales whatever the compute dtype)."""
    return [a.clone() if isinstance(a, Fp8Pages) else
            a.to(dtype).clone() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def _pages(cache: torch.Tensor, s: Shapes):
    """A case's fp64 cache as the engine's pages hold it: itself, or quantized to FP8 pages."""
    return quantize_pages(cache) if s.kv_cache_dtype == "fp8" else cache


def _values(cache) -> torch.Tensor:
    """What a written cache holds, comparable across precisions: the tensor, or FP8 pages' values in fp64."""
    return cache.dequantize(torch.float64) if isinstance(cache, Fp8Pages) else cache


@dataclass(slots=True)
class _Case:
    op: str
    case: str
    args: list                          # fp64 tensors (and ints/floats/index tensors): cast per precision
    outputs: Callable[[object, list], object] = lambda result, args: result   # what to compare of a call
    quantize: str | None = None         # linear: args[1] is served quantized ("int8"/"fp8"), as the engine does


def _paged(inp: _Inputs, context_lens: list[int], s: Shapes, extra_blocks: int = 2):
    """fp64 K/V caches with each sequence's pages scattered over shuffled blocks, and the block tables (-1 padded)."""
    bs = s.block_size
    pages = [-(-n // bs) for n in context_lens]
    total = sum(pages) + extra_blocks
    order = inp.perm(total)
    tables = torch.full((len(context_lens), max(pages) + 1), -1, dtype=torch.int32, device=inp.device)
    used = 0
    for i, n in enumerate(pages):
        tables[i, :n] = order[used:used + n].to(torch.int32)
        used += n
    k = inp.normal(total, bs, s.kv_heads, s.head_dim)
    v = inp.normal(total, bs, s.kv_heads, s.head_dim)
    return k, v, tables


def _rows(s: Shapes, device: torch.device) -> list[int]:
    """Rows a step can carry: one token, a few, a prefill chunk, the quantized-linear path switch, the whole budget."""
    rows = sorted({1, 7, 64, 512, 513, s.max_tokens} & set(range(1, s.max_tokens + 1)))
    return [r for r in rows if r <= CPU_MAX_ROWS] if device.type == "cpu" else rows


def cases(s: Shapes, inp: _Inputs, cos: torch.Tensor, sin: torch.Tensor, device: torch.device) -> Iterator[_Case]:
    rows, bs = _rows(s, device), s.block_size
    tmax = rows[-1]
    for t in rows:
        yield _Case("rms_norm", f"{t} x {s.hidden}", [inp.normal(t, s.hidden), inp.normal(s.hidden, std=0.1, mean=1),
                                                      s.eps])
        yield _Case("fused_add_rms_norm", f"{t} x {s.hidden}",
                    [inp.normal(t, s.hidden), inp.normal(t, s.hidden), inp.normal(s.hidden, std=0.1, mean=1), s.eps])
        yield _Case("silu_and_mul", f"{t} x {2 * s.intermediate}", [inp.normal(t, 2 * s.intermediate)])

    # RoPE + KV write: positions from 0 to the longest, the model's own tables, one padding slot (-1)
    t = min(tmax, 97)
    blocks = -(-(t + 1) // bs) + 1
    positions = torch.cat([torch.tensor([0, s.max_model_len - 1], device=device),
                           inp.randint(0, s.max_model_len, t - 2)]) if t >= 2 else \
        torch.zeros(t, dtype=torch.int64, device=device)
    slots = inp.perm(blocks * bs)[:t].to(torch.int64)
    if t >= 3:
        slots[t // 2] = -1
    yield _Case("rope_and_cache", f"{t} tokens, positions 0..{s.max_model_len - 1}, q {s.q_heads} / kv {s.kv_heads} "
                f"heads x {s.head_dim}",
                [inp.normal(t, s.q_heads, s.head_dim), inp.normal(t, s.kv_heads, s.head_dim),
                 inp.normal(t, s.kv_heads, s.head_dim), positions.to(torch.int64), cos, sin,
                 _pages(torch.zeros(blocks, bs, s.kv_heads, s.head_dim, dtype=torch.float64, device=device), s),
                 _pages(torch.zeros(blocks, bs, s.kv_heads, s.head_dim, dtype=torch.float64, device=device), s),
                 slots],
                outputs=lambda result, args: (result[0], result[1], _values(args[6]), _values(args[7])))

    # prefill: (new tokens, context) per sequence -- length 1, a partly filled last page, one past a page, a chunk
    # after a cached prefix; then the longest context with as many new tokens as the fp64 reference affords
    scale = s.head_dim ** -0.5
    short = [(1, 1), (max(bs - 1, 1), max(bs - 1, 1)), (bs + 1, bs + 1), (min(bs, tmax), 2 * bs + 5)]
    longest_new = max(1, min(tmax, MAX_SCORE_ELEMENTS // (s.q_heads * s.max_model_len)))
    for seqs in (short, [(longest_new, s.max_model_len)]):
        seqs = [(min(n, tmax), ctx) for n, ctx in seqs]
        k, v, tables = _paged(inp, [ctx for _, ctx in seqs], s)
        k, v = _pages(k, s), _pages(v, s)
        cu = torch.tensor([0] + [n for n, _ in seqs], device=device).cumsum(0).to(torch.int32)
        lens = torch.tensor([ctx for _, ctx in seqs], dtype=torch.int32, device=device)
        yield _Case("prefill_attention", "new/context " + ", ".join(f"{n}/{ctx}" for n, ctx in seqs)
                    + f", heads {s.q_heads}/{s.kv_heads} x {s.head_dim}, page {bs}",
                    [inp.normal(int(cu[-1]), s.q_heads, s.head_dim), k, v, tables, cu, lens, scale])

    # decode: odd lengths in one batch, the longest beside length 1, and a wide batch of short ones
    wide = min(s.max_num_seqs, 64)
    for lens_list in ([1, max(bs - 1, 1), bs, bs + 1, 3 * bs + 17], [s.max_model_len, 1],
                      (inp.randint(1, 4 * bs + 1, wide).tolist())):
        k, v, tables = _paged(inp, lens_list, s)
        k, v = _pages(k, s), _pages(v, s)
        lens = torch.tensor(lens_list, dtype=torch.int32, device=device)
        shown = ", ".join(map(str, lens_list)) if len(lens_list) <= 6 else f"{len(lens_list)} seqs of 1..{4 * bs}"
        yield _Case("paged_decode_attention", f"context {shown}, heads {s.q_heads}/{s.kv_heads} x {s.head_dim}, "
                    f"page {bs}", [inp.normal(len(lens_list), s.q_heads, s.head_dim), k, v, tables, lens, scale])

    # every distinct linear of the model, weights quantized as served; the LM head (model dtype) on sampled rows
    linears = {(s.hidden, (s.q_heads + 2 * s.kv_heads) * s.head_dim), (s.q_heads * s.head_dim, s.hidden),
               (s.hidden, 2 * s.intermediate), (s.intermediate, s.hidden)}
    for k_in, n_out in sorted(linears):
        w = inp.normal(n_out, k_in, std=k_in ** -0.5)
        for t in rows:
            yield _Case("linear", f"{t} x {k_in} -> {n_out}" + (f" ({s.quantization})" if s.quantization else ""),
                        [inp.normal(t, k_in), w], quantize=s.quantization)
    # the fused activation + down projection (FUSED_OPS): the MLP's [gate | up] rows into the down weight
    w = inp.normal(s.hidden, s.intermediate, std=s.intermediate ** -0.5)
    for t in rows:
        yield _Case("silu_and_mul_linear", f"{t} x {2 * s.intermediate} -> {s.hidden}"
                    + (f" ({s.quantization})" if s.quantization else ""),
                    [inp.normal(t, 2 * s.intermediate), w], quantize=s.quantization)
    # ... and into the gate/up projection: the post-attention hidden state into [gate; up]
    w = inp.normal(2 * s.intermediate, s.hidden, std=s.hidden ** -0.5)
    for t in rows:
        yield _Case("linear_silu_and_mul", f"{t} x {s.hidden} -> {2 * s.intermediate} -> {s.intermediate}"
                    + (f" ({s.quantization})" if s.quantization else ""),
                    [inp.normal(t, s.hidden), w], quantize=s.quantization)
    # the norm (with the residual add) in front of the q/k/v and the gate/up projections; without a residual (the
    # first layer) at one row and the most
    for op, n_out in (("add_rms_norm_linear", (s.q_heads + 2 * s.kv_heads) * s.head_dim),
                      ("add_rms_norm_linear_silu_and_mul", 2 * s.intermediate)):
        w = inp.normal(n_out, s.hidden, std=s.hidden ** -0.5)
        for t in rows:
            for residual in (True, False) if t in (1, tmax) else (True,):
                yield _Case(op, f"{t} x {s.hidden}" + (" + residual" if residual else "") + f" -> {n_out}"
                            + (f" ({s.quantization})" if s.quantization else ""),
                            [inp.normal(t, s.hidden), w, inp.normal(t, s.hidden) if residual else None,
                             inp.normal(s.hidden, std=0.1, mean=1), s.eps], quantize=s.quantization)
    w = inp.normal(s.vocab, s.hidden, std=s.hidden ** -0.5)
    for t in sorted({1, min(s.max_num_seqs, tmax)}):
        yield _Case("linear", f"{t} x {s.hidden} -> {s.vocab} (LM head)", [inp.normal(t, s.hidden), w])


def _served(case: _Case, dtype: torch.dtype) -> _Case:
    """A linear case (or a fused op's: the weight is always the second argument) with its weight quantized from the
    model dtype, as the engine loads it: every precision then multiplies the same quantized values (the fp64
    reference included)."""
    if case.quantize is None:
        return case
    args = list(case.args)
    args[1] = quantize_weight(args[1].to(dtype), case.quantize)
    return _Case(case.op, case.case, args, case.outputs)


def _fp8_weight(case: _Case) -> bool:
    """A linear, or a fused op with a linear in it (its second argument the weight), on fp8 weights."""
    if case.op != "linear" and "linear" not in kernels.FUSED_OPS.get(case.op, ()):
        return False
    w = case.args[1]
    return isinstance(w, QuantizedWeight) and w.kind == "fp8"


def _run(fn, case: _Case, dtype: torch.dtype):
    args = _cast(case.args, dtype)
    return case.outputs(fn(*args), args)


def measure(kernel_set, shapes: Shapes, device: torch.device, dtype: torch.dtype, cos: torch.Tensor,
            sin: torch.Tensor, *, seed: int | None = None, reference=None) -> dict:
    """The conformance report of `kernel_set` at `shapes` (JSON-able; see the module docstring)."""
    reference = reference or kernels.get_kernel_set(REFERENCE)
    # the reference at an fp8 model's serving precision: its linear with x rounded to e4m3 per row (W8A8), its
    # fused ops composed with that linear
    w8a8_reference = reference.derive("w8a8-reference", "0.0.0", linear=linear_w8a8_ref)
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    t0 = time.perf_counter()
    ops = {op: op_identity(fn) for op, fn in kernel_set.ops().items()}
    measured = [op for op in ops if getattr(kernel_set, op) is not getattr(reference, op)]
    report = {"kernel_set": kernel_set.name, "kernel_version": kernel_set.version, "reference": reference.name,
              "device": str(device), "dtype": str(dtype).removeprefix("torch."), "seed": seed,
              "shapes": shapes.describe(), "ops": ops, "measured_ops": measured, "cases": [], "seconds": 0.0}
    if not measured:
        return report
    inp = _Inputs(device, seed)
    with torch.inference_mode():
        for case in cases(shapes, inp, cos.to(torch.float32), sin.to(torch.float32), device):
            if case.op not in measured:
                continue
            c0 = time.perf_counter()
            row = {"op": case.op, "case": case.case}
            case = _served(case, dtype)
            try:
                ref = reference.op(case.op)   # a fused op: the reference's composition of what it fuses
                ref64 = _run(ref, case, torch.float64)
                ref64 = tuple(r.to(torch.float64) for r in ref64) if isinstance(ref64, tuple) else ref64.double()
                same = _run(ref, case, dtype)
                row["reference_error"] = _max_error(same, ref64)
                if _fp8_weight(case):   # an fp8 model's serving precision: e4m3 activations
                    row["reference_error"] = max(row["reference_error"],
                                                 _max_error(_run(w8a8_reference.op(case.op), case, dtype), ref64))
                row["scale"] = _scale(ref64)
            except Exception as e:   # noqa: BLE001  (a shape the reference cannot take is a bug of this module)
                log.exception("conformance: the reference %s failed on %s", case.op, case.case)
                row["error"], row["exception"] = None, f"reference failed: {type(e).__name__}: {e}"
                report["cases"].append(row)
                continue
            try:
                row["error"] = _max_error(_run(getattr(kernel_set, case.op), case, dtype), ref64)
            except Exception as e:   # noqa: BLE001  (the kernel cannot serve this shape: that is the finding)
                row["error"], row["exception"] = None, f"{type(e).__name__}: {str(e)[:300]}"
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            row["seconds"] = round(time.perf_counter() - c0, 4)
            report["cases"].append(row)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    report["seconds"] = round(time.perf_counter() - t0, 3)
    return report


def measure_runner(runner, *, seed: int | None = None) -> dict:
    """measure() for what a ModelRunner serves (its set, shapes, device, dtype and RoPE tables)."""
    model = runner.model
    return measure(runner.kernel_set, shapes_of(runner), runner.device, runner.dtype, model.cos, model.sin,
                   seed=seed)
