"""triton-v1.9's linear at batch 1: a GEMV on the CUDA cores, without tensor cores or shared memory.

At one row the weight-only kernel of kernels/linear.py pads x to a 16-row MMA tile and moves every weight tile
through shared memory (cp.async -> ldmatrix -> convert -> HMMA); on the H200 it streamed int8 weights at 68-75 % of
the copy rate and fp8 at 57 %, while a kernel that only reads the same bytes reached 92 % (BENCHMARKS.md "Kernels",
docs/benchmarks-history.md: the dependent chain's latency at 1.7 warps a scheduler, not the conversion). One output
row needs no MMA: here each program owns BLOCK_N weight rows, loads [BLOCK_N, BLOCK_K] tiles straight into registers
(K contiguous, 16-byte loads), converts them and accumulates w * x elementwise in fp32 ([BLOCK_N, BLOCK_K]
partial sums), and reduces over K once at the end. No split-K: programs of few rows (BLOCK_N 4-16) give even the
narrow projections (N 4096) hundreds of programs, so there are no partials, counters or second pass, and the result
does not depend on how many programs run.

Numerics: int8 and e4m3 weights and bf16/fp16 activations are exact in fp32, their products too (8 x 11 significand
bits), so only the fp32 sums round -- in another order than the MMA's (or cuBLAS's, for plain weights), so the result
matches theirs to fp32 rounding before the one rounding to x's dtype, not bit for bit; it is the same for any
BLOCK_N. The per-channel scale and the bias apply once after the reduction, as there. Conversions, all exact: int8
by byte permute into the mantissa of 2^23 (`int8x4_to_f32`: 9 instructions for 4 values, 2-4 % faster on an H100
than Triton's int8 -> bf16 -> fp32, whose int8 GEMV had lost to the MMA kernel at the H200's two large projections;
Triton's direct int8 -> fp32 is a quarter-rate I2F), e4m3 through fp16 (cvt.rn.f16x2.e4m3x2, one instruction a
pair), bf16/fp16 by a shift.

Measured (BENCHMARKS.md "A GEMV for batch 1"): a batch-1 step's linears on an H100 int8 3.06 -> 2.69 ms, fp8 3.34 ->
2.65, bf16 (cuBLAS) 5.17 -> 4.74, 91-98 % of a kernel that only reads the weights; batch-1 decode 245 -> 274 tok/s
int8, 229 -> 277 fp8, 158 -> 179 bf16. At 2-4 rows the GEMV, which runs M programs per weight tile (neighbours in
launch order, so the tile's re-reads come from the L2), took 1.5-3.4x the MMA kernel's time on the H200: it serves
GEMV_MAX_M = 1 row. Everything else -- more rows, fp32 plain weights, GPUs without fp8 conversion for fp8 weights --
is triton-v1.5's linear unchanged. The fused gate/up projection (linear_silu_and_mul) uses the same GEMV with
triton-v1.7's epilogue: output rows 2j and 2j + 1 of a tile are gate row j and up row j, and the tile writes
silu(gate) * up of the pair rounded to x's dtype, as kernels/silu_and_mul.py would.

triton-v1.12 launches the same GEMV (and kernels/rms_norm.py's norm) with programmatic dependent launch on sm_90+
(`linear_gemv_pdl`): the same values bit for bit, the gap between one kernel's end and the next one's start overlapped
with the next one's launch and its first weight tile's trip to the L2.
"""
from __future__ import annotations

import torch

from sits.kernels import linear as _lin
from sits.kernels.linear_fp8_f16 import linear_fp8_f16
from sits.kernels.linear_silu_and_mul import linear_silu_and_mul
from sits.kernels.quant import QuantizedWeight
from sits.kernels.triton_env import (autotune, check_device, fast_tuned, gdc_launch_dependents, gdc_wait, interpreting,
                                     pdl_launch, pdl_launches, tl, triton)

GEMV_MAX_M = 1   # rows served by the GEMV; more: triton-v1.5's linear (the MMA kernel reads the weights once for all)
INT8_DIRECT, INT8_VIA_BF16, INT8_MAGIC = 0, 1, 2   # how an int8 weight becomes fp32 (constexpr INT8_CONV)


@triton.jit
def int8x4_to_f32(w):
    """Four int8 values (one 32-bit register) to fp32, exactly, in 9 instructions: each biased byte b + 128 goes
    into the low mantissa byte of 2^23 (0x4B0000xx, one byte permute) and 2^23 + 128 is subtracted. Triton's own
    int8 -> fp32 conversion is a quarter-rate I2F; through bf16 it takes two instructions a byte, then one more."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t, c; xor.b32 t, $4, 0x80808080; mov.b32 c, 0x4B000000; "
        "prmt.b32 $0, t, c, 0x7540; prmt.b32 $1, t, c, 0x7541; prmt.b32 $2, t, c, 0x7542; prmt.b32 $3, t, c, 0x7543; "
        "sub.f32 $0, $0, 0f4B000080; sub.f32 $1, $1, 0f4B000080; sub.f32 $2, $2, 0f4B000080; "
        "sub.f32 $3, $3, 0f4B000080; }",
        "=r,=r,=r,=r,r", [w.to(tl.uint8, bitcast=True)], dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr, r_ptr, nw_ptr, res_ptr, M, N, K, eps,
                 stride_xm, stride_wn, stride_om, stride_rm, stride_resm,
                 HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, SILU_EPI: tl.constexpr, INT8_CONV: tl.constexpr, NORM: tl.constexpr,
                 RES_AFTER: tl.constexpr = False, X_BCAST: tl.constexpr = False, NARROW_W: tl.constexpr = False,
                 PDL: tl.constexpr = False):
    # grid: (cdiv(N, BLOCK_N) * M,). Program p computes output row p % M, columns (p // M) * BLOCK_N + [0, BLOCK_N).
    # NORM (triton-v1.10, kernels/norm_linear.py): 0 = x as given; 1 = rms_norm(x) with weight nw; 2 = the residual
    # add first, h = x + r rounded to x's dtype (the programs of the first N tile store it to res), then rms_norm(h).
    # Every program walks all of K, so it sums h^2 as it goes and scales its dot products by 1/rms once at the end.
    # The first tile's programs store h in the main loop, masked off elsewhere (measured on the H200 and tested on the
    # GPU); RES_AFTER: in a loop of their own after the dot products instead (6 instructions fewer in the main loop
    # of sm_90 SASS; on the H200 faster at some launch configs, slower at others: bench/norm_gemv_rows.py).
    # X_BCAST: x (and r, nw) loaded as [BLOCK_N, BLOCK_K] tiles whose rows repeat the same K offsets. The default
    # loads [BLOCK_K] vectors and moves them into the weight tile's layout through shared memory: in sm_90 SASS
    # compiled here, 2-4 barriers an iteration of the main loop for three of the five candidates with bf16 weights
    # and 2-8 for every candidate with int8 or fp8 weights. With X_BCAST the bf16 loops have none (the x tile takes
    # the weight tile's layout: the same 16-byte loads); int8/fp8 loops get more (x's 16-byte loads cover half the
    # K span of a weight load). NARROW_W: weight loads of 8 elements a thread (8 bytes for int8/fp8, as x's 16-byte
    # loads): with X_BCAST no int8/fp8 candidate's loop has a barrier, at one instruction more to 12 fewer, twice the
    # weight load instructions. (With NORM, X_BCAST repeats the norm's work on every row of the tile: 2.5x the loop.)
    # triton-v1.11 serves X_BCAST (8-bit weights: with NARROW_W) without NORM: linear_gemv_bcast. Timed on the H200
    # (bench/gemv_rows.py --sweep candidates): 0-0.6 us a call faster at best, batch-1 decode unchanged -- the
    # barriers cost nothing measurable (BENCHMARKS.md "A GEMV for batch 1").
    # PDL (triton-v1.12, bench/pdl_chain.py; launched with launch_pdl=True, sm_90+): programmatic dependent launch.
    # The program may start while the kernel before it still runs: it asks the L2 for its first weight tile (one
    # prefetch a 128-byte line: the weights are no earlier kernel's output), waits for the earlier kernel's writes
    # (griddepcontrol.wait: the earlier grid done, its memory visible) before it reads x, r or anything else, and
    # lets the next kernel launch once its main loop is done (that kernel waits likewise before it reads our output).
    pid = tl.program_id(0)
    pid_m = pid % M
    pid_n = pid // M
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = rn % N   # weight rows past N wrap around (valid addresses); their outputs are not stored
    if SILU_EPI:      # tile columns 2j, 2j + 1 = gate row j, up row j (W = [gate; up], N = 2 I)
        offs_n = offs_n // 2 + (offs_n % 2) * (N // 2)
    offs_k = tl.arange(0, BLOCK_K)
    if X_BCAST:   # x's K offsets for every row of the tile
        kx = offs_k[None, :] + 0 * offs_n[:, None]
    else:
        kx = offs_k
    x_ptrs = x_ptr + pid_m.to(tl.int64) * stride_xm + kx
    if NARROW_W:
        w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + tl.max_contiguous(offs_k, 8)[None, :]
    else:
        w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if PDL:
        LINE: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth   # elements a 128-byte line
        LINES: tl.constexpr = (BLOCK_K + LINE - 1) // LINE   # (at least one: a tile narrower than a line)
        first = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (tl.arange(0, LINES) * LINE)[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [first], dtype=tl.int32,
                                  is_pure=False, pack=1)
        gdc_wait()
    if NORM == 2:
        r_ptrs = r_ptr + pid_m.to(tl.int64) * stride_rm + kx
        res_ptrs = res_ptr + pid_m.to(tl.int64) * stride_resm + kx
        # the columns this program stores h at: all (first tile, its first row with X_BCAST) or none
        res_k = (pid_n == 0).to(tl.int32) * K
        if X_BCAST:
            res_k = res_k * (tl.arange(0, BLOCK_N)[:, None] == 0).to(tl.int32)
    if NORM > 0:
        nw_ptrs = nw_ptr + kx
        sumsq = tl.zeros(kx.shape, dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = (k0 + kx) < K
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")   # weights stream through once
            x = tl.load(x_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(k0 + offs_k[None, :]) < K, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=mask_k, other=0.0)
        if NORM == 2:   # h = x + r rounded as kernels/rms_norm.py rounds it (the sum in fp32)
            r = tl.load(r_ptrs, mask=mask_k, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
            if not RES_AFTER:
                tl.store(res_ptrs, x, mask=(k0 + kx) < res_k)
                res_ptrs += BLOCK_K
            r_ptrs += BLOCK_K
        xf = x.to(tl.float32)
        if NORM > 0:
            sumsq += xf * xf
            xf = xf * tl.load(nw_ptrs, mask=mask_k, other=0.0).to(tl.float32)
            nw_ptrs += BLOCK_K
        if not X_BCAST:
            xf = xf[None, :]
        if w_ptr.dtype.element_ty == tl.int8 and INT8_CONV == 2:
            wf = int8x4_to_f32(w)
        elif w_ptr.dtype.element_ty == tl.int8 and INT8_CONV == 1:   # (Triton's interpreter casts int8 to bf16
            wf = w.to(tl.bfloat16).to(tl.float32)                      # wrong: there it converts directly)
        elif w_ptr.dtype.element_ty == tl.float8e4nv:
            wf = w.to(tl.float16).to(tl.float32)
        else:
            wf = w.to(tl.float32)
        acc += wf * xf
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if PDL:
        gdc_launch_dependents()
    y = tl.sum(acc, 1)
    if NORM > 0:   # sum_k W[n, k] (h_k nw_k) / rms(h): the norm is a scale of the row, applied once here
        # (with X_BCAST every row of sumsq holds the same sums: one per output row)
        y = y * (1.0 / tl.sqrt(tl.sum(sumsq, len(sumsq.shape) - 1) / K + eps))
    if NORM == 2 and RES_AFTER:
        if pid_n == 0:
            xr_ptrs = x_ptr + pid_m.to(tl.int64) * stride_xm + offs_k
            r_ptrs = r_ptr + pid_m.to(tl.int64) * stride_rm + offs_k
            for k0 in range(0, K, BLOCK_K):
                mask_k = (k0 + offs_k) < K
                h = tl.load(xr_ptrs, mask=mask_k, other=0.0).to(tl.float32) + \
                    tl.load(r_ptrs, mask=mask_k, other=0.0).to(tl.float32)
                tl.store(res_ptrs, h.to(x_ptr.dtype.element_ty), mask=mask_k)
                xr_ptrs += BLOCK_K
                r_ptrs += BLOCK_K
                res_ptrs += BLOCK_K
    if HAS_SCALE:
        y = y * tl.load(scale_ptr + offs_n)   # per-output-channel scale, once per output
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + offs_n).to(tl.float32)
    out_row = out_ptr + pid_m.to(tl.int64) * stride_om
    if SILU_EPI:
        gu = y.to(out_ptr.dtype.element_ty).to(tl.float32)   # the [gate | up] output, rounded as stored
        g, u = tl.split(tl.reshape(gu, [BLOCK_N // 2, 2]))
        rj = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_row + rj, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=rj < N // 2)
    else:
        tl.store(out_row + rn, y.to(out_ptr.dtype.element_ty), mask=rn < N)


def _cfg(bn: int, bk: int, warps: int, stages: int = 1) -> triton.Config:
    return triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)


# Autotuning candidates (each costs a compilation and a timing per shape in a cold warm-up; 25-30 tuning runs, 6-8 s
# of an engine's warm-up on the H100): the best fixed config of each of llama3-8b's four weight shapes in a sweep of
# 38 (bench/gemv_rows.py on the H200, int8, fp8 and bf16 weights: BENCHMARKS.md "A GEMV for batch 1"); stages made no
# difference (no pipelined loads).
CANDIDATES = [_cfg(16, 512, 8), _cfg(8, 1024, 4), _cfg(16, 256, 4), _cfg(8, 512, 4), _cfg(4, 2048, 4)]
INT8_CONV = INT8_MAGIC   # measured against INT8_VIA_BF16: bench/gemv_rows.py --sweep candidates
_even_k = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})


def _tuned(**loads) -> object:
    """The GEMV autotuned over CANDIDATES, each with the constexprs `loads` (how x and the weights are loaded)."""
    configs = [triton.Config({**c.kwargs, **loads}, num_warps=c.num_warps, num_stages=c.num_stages)
               for c in CANDIDATES]
    return autotune(configs, key=["N", "K", "SILU_EPI", "NORM"], use_cuda_graph=True, warmup=5, rep=25)(
        _even_k(_gemv_kernel))


# how each set loads x: triton-v1.9's vectors moved into the weight layout; triton-v1.11's broadcast tiles (X_BCAST,
# 8-bit weights with 8-byte loads too: NARROW_W), no barrier in the main loop
LOADS = {"vector": {}, "bcast": {"X_BCAST": True}, "bcast-narrow": {"X_BCAST": True, "NARROW_W": True}}
_TUNED = {name: _tuned(**flags) for name, flags in LOADS.items()}
_gemv_tuned = _TUNED["vector"]


def _supported(x: torch.Tensor, weight) -> bool:
    """The GEMV serves int8/fp8 weights with bf16/fp16/fp32 activations and plain weights in x's dtype (bf16/fp16),
    on CUDA (fp8: sm_89+) or on CPU under Triton's interpreter."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if isinstance(weight, QuantizedWeight):
        ok = weight.kind == "int8" or x.device.type == "cpu" or torch.cuda.get_device_capability(x.device) >= (8, 9)
    elif isinstance(weight, torch.Tensor):
        ok = weight.dtype == x.dtype and x.dtype != torch.float32 and weight.dim() == 2 and weight.stride(-1) == 1
    else:
        return False
    if x.device.type == "cpu":
        return ok and interpreting()
    return ok and x.is_cuda and not interpreting()


def gemv(x2: torch.Tensor, weight, bias, out: torch.Tensor, *, silu_epi: bool = False, norm: tuple | None = None,
         config: dict | None = None, bcast: bool = False) -> None:
    """out = x2 W^T (+ b) for few rows: x2 [M, K] with unit column stride, W a QuantizedWeight or a plain [N, K]
    tensor with unit column stride, out [M, N] (or [M, N / 2] with silu_epi). norm = (r2, norm_weight, eps, res_out):
    x2 is first normalized, out = rms_norm(h) W^T with h = x2 + r2 (r2 [M, K], stored to res_out [M, K]), or h = x2
    where r2 is None (res_out unused). config: BLOCK_N, BLOCK_K (+ num_warps, num_stages, INT8_CONV) for a fixed
    launch (benchmark sweeps); None = autotuned on the GPU, wide tiles under the interpreter. bcast: x
    loaded as broadcast tiles in the weight tile's layout, 8-bit weights with 8-byte loads (triton-v1.11). Inside
    pdl_launches() the autotuned launch uses programmatic dependent launch (triton-v1.12; a fixed config passes PDL
    and launch_pdl itself)."""
    m, k = x2.shape
    n = weight.shape[0]
    quantized = isinstance(weight, QuantizedWeight)
    w = weight.qweight if quantized else weight
    scale = weight.scale if quantized else w
    has_bias = bias is not None
    b = bias.contiguous() if has_bias else scale
    r2, nw, eps, res = norm if norm is not None else (None, x2, 0.0, None)
    norm_kind = 0 if norm is None else (1 if r2 is None else 2)
    r2 = x2 if r2 is None else r2
    res = x2 if res is None else res
    args = (x2, w, scale, b, out, r2, nw, res, m, n, k, float(eps), x2.stride(0), w.stride(0), out.stride(0),
            r2.stride(0), res.stride(0))
    flags = dict(HAS_SCALE=quantized, HAS_BIAS=has_bias, SILU_EPI=silu_epi, NORM=norm_kind)
    loads = "vector" if not bcast else ("bcast-narrow" if quantized else "bcast")
    if config is None and interpreting():
        # the interpreter's cost is per program and per op, nearly whatever a tile's size: wide tiles, yet at least
        # two N tiles and two K steps, so CPU runs still cover the loop, the masked K tail and the wrap of a last N
        # tile (the tiny model's batch-1 int8 decode through v1.9: 12.6 -> 6.4 CPU-s from 32 x 64 tiles); no asm
        bn = 2 if n < 32 else min(128, triton.next_power_of_2(n) // 2)
        bk = max(32, min(512, triton.next_power_of_2(k // 2 + 1) // 2))
        config = dict(BLOCK_N=bn, BLOCK_K=bk, INT8_CONV=INT8_DIRECT, **LOADS[loads])
    if config is None:
        launch = pdl_launch(x2.device)
        key = (x2.device, n, k, x2.dtype, w.dtype, has_bias, silu_epi, norm_kind, bool(launch))
        grid = lambda c: (triton.cdiv(n, c["BLOCK_N"]) * m,)  # noqa: E731
        # PDL tunes as the plain launch does (the autotuner's cache is shared: the same winner), launched its own way
        fast_tuned(_TUNED[loads], _gemv_kernel, key, grid, *args, **flags, **launch, INT8_CONV=INT8_CONV,
                   derived=lambda best: {"EVEN_K": k % best.kwargs["BLOCK_K"] == 0})
        return
    c = dict(config)
    c.setdefault("INT8_CONV", INT8_DIRECT if interpreting() else INT8_CONV)
    return _gemv_kernel[(triton.cdiv(n, c["BLOCK_N"]) * m,)](*args, **flags, EVEN_K=k % c["BLOCK_K"] == 0, **c)


def _rows(x: torch.Tensor, k: int) -> int:
    return x.numel() // k if k and x.shape[-1] == k else 0


def _run(x: torch.Tensor, weight, bias, n_out: int, silu_epi: bool, bcast: bool) -> torch.Tensor:
    return _lin.through_rows(x, n_out, lambda x2, out: gemv(x2, weight, bias, out, silu_epi=silu_epi, bcast=bcast))


def _linear(x: torch.Tensor, weight, bias, bcast: bool) -> torch.Tensor:
    m = _rows(x, weight.shape[1]) if len(weight.shape) == 2 else 0
    if not (0 < m <= GEMV_MAX_M) or not _supported(x, weight):
        return linear_fp8_f16(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear", x)
    return _run(x, weight, bias, weight.shape[0], False, bcast)


def _linear_silu_and_mul(x: torch.Tensor, weight, bias, bcast: bool) -> torch.Tensor:
    _lin.check_gate_up("linear_silu_and_mul", weight)
    m = _rows(x, weight.shape[1])
    if not (0 < m <= GEMV_MAX_M) or not _supported(x, weight):
        return linear_silu_and_mul(x, weight, bias)
    _lin.check_linear_args(x, weight, bias)
    check_device("linear_silu_and_mul", x)
    return _run(x, weight, bias, weight.shape[0] // 2, True, bcast)


def linear_gemv(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = x W^T (+ b): int8/fp8 weights, or plain bf16/fp16 weights, times up to GEMV_MAX_M rows through the GEMV;
    everything else as triton-v1.5 (kernels/linear_fp8_f16.py)."""
    return _linear(x, weight, bias, False)


def linear_silu_and_mul_gemv(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """y = silu_and_mul(x W^T (+ b)), W = [gate; up] [2I, H] -> [..., I]: up to GEMV_MAX_M rows through the GEMV
    with triton-v1.7's epilogue (int8/fp8 or plain bf16/fp16 weights); more rows as triton-v1.7's fused op
    (kernels/linear_silu_and_mul.py)."""
    return _linear_silu_and_mul(x, weight, bias, False)


def linear_gemv_bcast(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.11's linear: linear_gemv with x loaded as broadcast tiles (8-bit weights: 8-byte loads)."""
    return _linear(x, weight, bias, True)


def linear_silu_and_mul_gemv_bcast(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.11's fused gate/up projection: linear_silu_and_mul_gemv with x loaded as broadcast tiles."""
    return _linear_silu_and_mul(x, weight, bias, True)


def linear_gemv_pdl(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.12's linear: linear_gemv inside pdl_launches(), so at one row on sm_90+ the GEMV starts while the
    kernel before it finishes and waits for that kernel's writes before it reads x (more rows: v1.5's kernels)."""
    with pdl_launches():
        return linear_gemv(x, weight, bias)


def linear_silu_and_mul_gemv_pdl(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    """triton-v1.12's fused gate/up projection: linear_silu_and_mul_gemv inside pdl_launches()."""
    with pdl_launches():
        return linear_silu_and_mul_gemv(x, weight, bias)
