"""Benchmark every triton-v1 kernel on the GPU next to what a user would use instead, against the roofline measured in
the same run (device-to-device copy bandwidth, bf16 matmul rate), and record the results in BENCHMARKS.md.

    python3 bench/kernel_timings.py [--json OUT.json] [--markdown BENCHMARKS.md] [--quick]
    python3 bench/kernel_timings.py --from-json OUT.json --markdown BENCHMARKS.md   # rewrite the section, no GPU needed

Each kernel's output is checked against the torch reference before it is timed. Times are medians of
triton.testing.do_bench (which flushes the L2 before every call).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SECTION = "## Kernels (H200)"


def run_smoke(smoke) -> int:
    """A bench script's --smoke: `smoke()`, its CPU check under Triton's interpreter; refused (2) without it."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("--smoke runs under TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    return smoke()


def bench(fn) -> float:
    """Median milliseconds."""
    import triton
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_graph(calls, reps: int = 15) -> float:
    """Median ms per call for kernels of a few microseconds: `calls` (each on its own buffers, so the set is far
    larger than the L2) are captured round-robin in one CUDA graph and replayed, so Python launch overhead is out."""
    import statistics

    import torch
    for c in calls:
        c()  # compile / autotune outside the capture
    torch.cuda.synchronize()
    n = len(calls) * max(1, 48 // len(calls))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            calls[i % len(calls)]()
    g.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / n)
    return statistics.median(times)


def host_ms(fn, calls: int = 64, reps: int = 9) -> float:
    """Median host milliseconds a call of `fn`: `calls` calls enqueued behind a kernel that keeps the GPU busy
    (torch.cuda._sleep) so that the host never waits for it -- Python, argument checks, allocations, launches: what
    a launch-bound step pays for the op whatever its kernels take. Python's garbage collector is held off while
    timing: in the first measurement columns running the same code differed by 50-100 us, and its pauses are one
    suspect (not yet checked on a GPU)."""
    import gc
    import statistics
    import time

    import torch
    fn()
    torch.cuda.synchronize()
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            torch.cuda._sleep(200_000_000)   # ~0.1 s at the H100's clocks: longer than the calls' host work
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / calls)
            torch.cuda.synchronize()
    finally:
        gc.enable()
    return statistics.median(times)


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()


def paged(ctx, hkv, d, dtype, page=64, seed=0):
    """A paged cache holding ctx tokens per sequence in shuffled blocks, plus the same K/V contiguous [B, Hkv, L, D]."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    nb = [-(-n // page) for n in ctx]
    total = sum(nb)
    k_cache = torch.randn(total, page, hkv, d, device="cuda", dtype=dtype, generator=g)
    v_cache = torch.randn(total, page, hkv, d, device="cuda", dtype=dtype, generator=g)
    perm = torch.randperm(total, device="cuda", generator=g)
    tables = torch.zeros(len(ctx), max(nb), dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(nb):
        tables[i, :n] = perm[used:used + n].int()
        used += n
    return k_cache, v_cache, tables


def contiguous(cache, tables, length):
    # [B, Hkv, L, D] from the paged cache (all sequences of equal length)
    b = tables.shape[0]
    nb = -(-length // cache.shape[1])
    return cache[tables[:, :nb].long()].reshape(b, nb * cache.shape[1], *cache.shape[2:])[:, :length].transpose(1, 2)


def roofline(res):
    import torch
    n = 1 << 30  # 2 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    res["copy_tbs"] = 2 * n * 2 / ms / 1e9
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: a @ b)
    res["bf16_matmul_tflops"] = 2 * 8192 ** 3 / ms / 1e9


def prefill(res, quick):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sits.kernels import prefill_attention as pa
    from sits.kernels.prefill_attention import prefill_attention, prefill_attention_tma
    rows = []
    shapes = [(2, 8192, 32, 32)] + ([] if quick else [(8, 2048, 32, 32), (2, 8192, 32, 8)])
    for b, s, hq, hkv in shapes:
        d = 128
        kc, vc, tables = paged([s] * b, hkv, d, torch.bfloat16)
        q = torch.randn(b * s, hq, d, device="cuda", dtype=torch.bfloat16)
        cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        flops = 4 * b * hq * s * s * d / 2
        fn = lambda: prefill_attention_tma(q, kc, vc, tables, cu, lens, d ** -0.5)  # noqa: E731 (triton-v1.1)
        qs = q.view(b, s, hq, d).transpose(1, 2)
        ks, vs = contiguous(kc, tables, s), contiguous(vc, tables, s)
        gqa = hq != hkv
        want = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=gqa)
        err = rel_err(fn().view(b, s, hq, d).transpose(1, 2), want)
        row = {"shape": f"B{b} S{s} H{hq}/{hkv} D{d}", "triton_tflops": flops / bench(fn) / 1e9, "rel_err": err}
        fn()
        tma = pa._tma_ok(q, kc, vc)
        row["triton_config"] = ("tma " if tma else "") + _config_name(
            (pa._prefill_attention_tma_tuned if tma else pa._prefill_attention_tuned).best_config)
        if tma:  # triton-v1's pointer-gather kernel (what v1.1 falls back to off Hopper), same run
            row["triton_gather_tflops"] = flops / bench(
                lambda: prefill_attention(q, kc, vc, tables, cu, lens, d ** -0.5)) / 1e9
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ms = bench(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=gqa))
                row[f"sdpa_{name}_tflops"] = flops / ms / 1e9
            except RuntimeError as e:  # e.g. FLASH without GQA support in this torch
                row[f"sdpa_{name}_tflops"] = None
                row[f"sdpa_{name}_error"] = str(e).splitlines()[0][:120]
        rows.append(row)
        del kc, vc, q, ks, vs, want
    res["prefill"] = rows


def decode(res, quick):
    import torch
    import torch.nn.functional as F

    from sits.kernels.paged_decode_attention import paged_decode_attention
    rows = []
    for b, s in [(64, 4096), (1, 32768)] + ([] if quick else [(32, 2048), (1, 8192)]):
        hq, hkv, d = 32, 8, 128
        copies = max(1, min(6, (512 << 20) // (2 * b * s * hkv * d * 2)))  # >= 512 MiB of KV in rotation (L2: 60)
        sets = []
        for c in range(copies):
            kc, vc, tables = paged([s] * b, hkv, d, torch.bfloat16, seed=1 + c)
            q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
            sets.append((q, kc, vc, tables, contiguous(kc, tables, s).contiguous(), contiguous(vc, tables, s).contiguous()))
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        nbytes = 2 * b * s * hkv * d * 2
        q, kc, vc, tables, ks, vs = sets[0]
        err = rel_err(paged_decode_attention(q, kc, vc, tables, lens, d ** -0.5),
                      F.scaled_dot_product_attention(q[:, :, None], ks, vs, enable_gqa=True)[:, :, 0])
        tri = [lambda t=t: paged_decode_attention(t[0], t[1], t[2], t[3], lens, d ** -0.5) for t in sets]
        sdp = [lambda t=t: F.scaled_dot_product_attention(t[0][:, :, None], t[4], t[5], enable_gqa=True) for t in sets]
        rows.append({"shape": f"B{b} ctx{s} H{hq}/{hkv} D{d}", "triton_tbs": nbytes / bench_graph(tri) / 1e9,
                     "sdpa_contiguous_tbs": nbytes / bench_graph(sdp) / 1e9,
                     "triton_eager_tbs": nbytes / bench(tri[0]) / 1e9, "rel_err": err})
        del sets
    res["decode"] = rows


def elementwise(res):
    import torch
    import torch.nn.functional as F

    from sits.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from sits.kernels.silu_and_mul import silu_and_mul
    t, h, i = 16384, 4096, 14336
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(h, device="cuda", dtype=torch.bfloat16)
    rows = []
    nb = 2 * t * h * 2
    rows.append({"op": f"rms_norm [{t}x{h}]", "triton_tbs": nb / bench(lambda: rms_norm(x, w, 1e-5)) / 1e9,
                 "torch_tbs": nb / bench(lambda: F.rms_norm(x, (h,), w, 1e-5)) / 1e9,
                 "rel_err": rel_err(rms_norm(x, w, 1e-5), F.rms_norm(x.float(), (h,), w.float(), 1e-5))})

    def torch_fused():
        s = x + r
        return F.rms_norm(s, (h,), w, 1e-5), s
    nb = 4 * t * h * 2
    rows.append({"op": f"fused_add_rms_norm [{t}x{h}]",
                 "triton_tbs": nb / bench(lambda: fused_add_rms_norm(x, r, w, 1e-5)) / 1e9,
                 "torch_tbs": nb / bench(torch_fused) / 1e9,
                 "rel_err": rel_err(fused_add_rms_norm(x, r, w, 1e-5)[0], torch_fused()[0])})
    del x, r
    tt = 4096
    xi = torch.randn(tt, 2 * i, device="cuda", dtype=torch.bfloat16)
    nb = 3 * tt * i * 2
    ref = lambda: F.silu(xi[:, :i]) * xi[:, i:]  # noqa: E731
    rows.append({"op": f"silu_and_mul [{tt}x{2 * i}]", "triton_tbs": nb / bench(lambda: silu_and_mul(xi)) / 1e9,
                 "torch_tbs": nb / bench(ref) / 1e9, "rel_err": rel_err(silu_and_mul(xi), ref())})
    res["elementwise"] = rows


def int8_gemv(res, quick):
    import torch
    import torch.nn.functional as F

    from sits.kernels import quantize_weight
    from sits.kernels.linear import autotuner_for, linear, linear_ref
    rows = []
    for n, k in [(14336, 4096), (4096, 14336)]:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        wb = [w * (1 + 0.01 * c) for c in range(4)]  # 4 x 117 MB bf16 for the cuBLAS baseline
        for kind in ("int8", "fp8"):
            qws = [quantize_weight(w * (1 + 0.01 * c), kind) for c in range(8)]  # 8 x 59 MB: past the L2
            read_us = 1e3 * _read_only_ms(qws)
            for m in ([1, 16] if quick else [1, 4, 16, 32, 64]):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                nbytes = n * k + 4 * n + 2 * m * (k + n)
                err = rel_err(linear(x, qws[0]), linear_ref(x, qws[0]))
                config = _config_name(autotuner_for(m).best_config)
                ms = bench_graph([lambda q=q: linear(x, q) for q in qws])
                rows.append({"op": f"{kind} W [{n}x{k}] M={m}", "triton_tbs": nbytes / ms / 1e9, "triton_us": 1e3 * ms,
                             "read_only_us": read_us,
                             "bf16_cublas_us": 1e3 * bench_graph([lambda w=w: F.linear(x, w) for w in wb]),
                             "triton_eager_us": 1e3 * bench(lambda: linear(x, qws[0])), "rel_err": err,
                             "triton_config": config})
            del qws
        del w, wb
    res["wq_gemv"] = rows


def _read_only_ms(qws) -> float:
    """ms per call to read the quantized weights' bytes once and do nothing else (bench/stream_read.py), timed like
    the GEMV: the ceiling a GEMV over these weights can approach."""
    import torch

    from bench.stream_read import stream_read
    flat = [q.qweight.view(torch.int8).view(-1) for q in qws]
    dst = torch.empty(flat[0].numel() // 16384 + 1, dtype=torch.int32, device=flat[0].device)
    if stream_read(flat[0], dst).sum().item() != flat[0].to(torch.int64).sum().item():
        raise RuntimeError("stream_read: wrong sum")
    return bench_graph([lambda f=f: stream_read(f, dst) for f in flat])


def fp8_gemm(res):
    import torch

    from sits.kernels import quantize_weight
    from sits.kernels.fp8_gemm import _linear_fp8, linear_fp8_w8a8_ref, quantize_fp8_rows
    from sits.kernels.linear import linear
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) * 0.02
    qw = quantize_weight(w, "fp8")
    flops = 2 * n ** 3
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    aq, sa = quantize_fp8_rows(a)

    def gemm_only():
        import triton
        grid = lambda c: (triton.cdiv(n, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"]),)  # noqa: E731
        _linear_fp8[grid](aq, qw.qweight, sa, qw.scale, qw.scale, out, n, n, n, aq.stride(0), qw.qweight.stride(0),
                          out.stride(0), HAS_BIAS=False)
    row = {"op": "fp8 GEMM 8192^3", "rel_err": rel_err(linear(a, qw), linear_fp8_w8a8_ref(a, qw)),
           "triton_with_act_quant_tflops": flops / bench(lambda: linear(a, qw)) / 1e9,
           "triton_gemm_only_tflops": flops / bench(gemm_only) / 1e9,
           "torch_bf16_tflops": flops / bench(lambda: a @ w.t()) / 1e9}
    try:
        wt = qw.qweight.t()  # [K, N] column-major, as cuBLASLt wants
        ms = bench(lambda: torch._scaled_mm(aq, wt, scale_a=sa[:, None], scale_b=qw.scale[None, :],
                                            out_dtype=torch.bfloat16))
        row["torch_scaled_mm_tflops"] = flops / ms / 1e9
    except Exception as e:  # noqa: BLE001 - report, don't fail the run
        row["torch_scaled_mm_tflops"] = None
        row["torch_scaled_mm_error"] = str(e).splitlines()[0][:120]
    res["fp8_gemm"] = row


def _config_name(c) -> str:
    kw = {k: v for k, v in c.kwargs.items() if k != "GROUP_M"}
    short = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "SPLIT_K": "splitK"}
    return " ".join(f"{short.get(k, k)}{v}" for k, v in kw.items()) + f" w{c.num_warps} s{c.num_stages}"


def _gemv_variants(lin) -> list[dict]:
    """linear_with_config keyword sets: the autotuner's candidates."""
    return [dict(block_m=c.kwargs["BLOCK_M"], block_n=c.kwargs["BLOCK_N"], block_k=c.kwargs["BLOCK_K"],
                 split_k=c.kwargs["SPLIT_K"], num_warps=c.num_warps, num_stages=c.num_stages) for c in lin._SMALL_M]


def _mid_m_variants(lin, m: int) -> list[dict]:
    """The 17..64-row candidates for m rows."""
    return [dict(block_m=c.kwargs["BLOCK_M"], block_n=c.kwargs["BLOCK_N"], block_k=c.kwargs["BLOCK_K"],
                 split_k=c.kwargs["SPLIT_K"], num_warps=c.num_warps, num_stages=c.num_stages)
            for c in lin._MID_M[32 if m <= 32 else 64]]


def _gemv_name(kw) -> str:
    return f"M{kw['block_m']} N{kw['block_n']} K{kw['block_k']} splitK{kw['split_k']} w{kw['num_warps']} " \
           f"s{kw['num_stages']}"


def sweeps(res, parts=("gemv", "prefill", "decode")):
    """Variants timed one by one: what the autotuners pick from (GEMV tiles and split-K, prefill tiles), and the
    decode split counts."""
    import torch
    import torch.nn.functional as F

    from sits.kernels import quantize_weight
    from sits.kernels import linear as lin
    from sits.kernels import prefill_attention as pa
    from sits.kernels.paged_decode_attention import paged_decode_attention
    rows = []
    for n, k in ([(14336, 4096), (4096, 14336)] if "gemv" in parts else []):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        qws = [quantize_weight(w * (1 + 0.01 * c), "int8") for c in range(8)]  # past the L2, as in the GEMV table
        for m in (1, 16, 32, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = lin.linear_ref(x, qws[0])
            for kw in (_gemv_variants(lin) if m <= 16 else _mid_m_variants(lin, m)):
                row = {"case": f"int8 [{n}x{k}] M={m}", "variant": _gemv_name(kw)}
                try:
                    row["rel_err"] = rel_err(lin.linear_with_config(x, qws[0], **kw), ref)
                    ms = bench_graph([lambda q=q: lin.linear_with_config(x, q, **kw) for q in qws])
                    row.update(us=1e3 * ms, tbs=(n * k + 4 * n) / ms / 1e9)
                except Exception as e:  # noqa: BLE001
                    row["error"] = str(e)[:100]
                rows.append(row)
        del w, qws
    if "prefill" in parts:
        b, s_, hq, hkv, d = 2, 8192, 32, 32, 128
        kc, vc, tables = paged([s_] * b, hkv, d, torch.bfloat16)
        q = torch.randn(b * s_, hq, d, device="cuda", dtype=torch.bfloat16)
        cu = torch.arange(0, b * s_ + 1, s_, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), s_, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        ref = F.scaled_dot_product_attention(q.view(b, s_, hq, d).transpose(1, 2), contiguous(kc, tables, s_),
                                             contiguous(vc, tables, s_), is_causal=True).transpose(1, 2)
        ref = ref.reshape(b * s_, hq, d)
        args = (q, kc, vc, tables, cu, lens, out, d ** -0.5 * math.log2(math.e), q.stride(0), q.stride(1),
                kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), tables.stride(0),
                out.stride(0), out.stride(1), b, 8192)
        flops = 4 * b * hq * s_ * s_ * d / 2
        descs = (pa._page_descriptor(kc), pa._page_descriptor(vc))
        targs = (q, *descs, tables, cu, lens, out, d ** -0.5 * math.log2(math.e), q.stride(0), q.stride(1),
                 tables.stride(0), out.stride(0), out.stride(1), b, 8192)
        variants = [(c, "", pa._prefill_attention_kernel, args,
                     dict(HEAD_DIM_P=d, DOT_PRECISION="tf32")) for c in pa._CONFIGS]
        variants += [(c, "tma ", pa._prefill_attention_tma_kernel, targs, {}) for c in pa._TMA_CONFIGS]
        for c, tag, kernel, kargs, extra in variants:
            row = {"case": f"prefill B{b} S{s_} H{hq}/{hkv} D{d}", "variant": tag + _config_name(c)}
            try:
                def fn(c=c, kernel=kernel, kargs=kargs, extra=extra):
                    kernel[(b * s_ // c.kwargs["BLOCK_M"] + b, hq)](
                        *kargs, HEAD_DIM=d, GROUP=hq // hkv, PAGE=64, DOT_F32=False, **extra, **c.kwargs,
                        num_warps=c.num_warps, num_stages=c.num_stages)
                out.fill_(float("nan"))  # every output element must be written by the variant itself
                fn()
                row["rel_err"] = rel_err(out, ref)
                row["tflops"] = flops / bench(fn) / 1e9
            except Exception as e:  # noqa: BLE001
                row["error"] = str(e)[:100]
            rows.append(row)
        del kc, vc, q, out
    for b, s, splits in ((1, 32768, (8, 16, 32, 64, 128)), (64, 4096, (1, 2, 4))) if "decode" in parts else ():
        kc, vc, tables = paged([s] * b, 8, 128, torch.bfloat16, seed=1)
        q = torch.randn(b, 32, 128, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        for sp in splits:
            ms = bench_graph([lambda: paged_decode_attention(q, kc, vc, tables, lens, 128 ** -0.5, num_splits=sp)])
            rows.append({"case": f"decode B{b} ctx{s}", "variant": f"splits={sp}", "us": 1e3 * ms,
                         "tbs": 2 * b * s * 8 * 128 * 2 / ms / 1e9})
        del kc, vc
    res["sweeps"] = rows
    for r in rows:
        perf = f"{r['tflops']:6.0f} TFLOP/s" if "tflops" in r else f"{r.get('us', float('nan')):8.1f} us " \
               f"{r.get('tbs', 0):6.2f} TB/s"
        print(f"{r['case']:28s} {r['variant']:40s} {perf} err {r.get('rel_err', float('nan')):.2g} "
              f"{r.get('error', '')}")


def verdicts(res) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) per issue-4 target."""
    out = []
    p = next((r for r in res.get("prefill", []) if r["shape"].startswith("B2 S8192 H32/32")), None)
    if p:
        fl = p.get("sdpa_flash_tflops") or 0
        out.append(("prefill B2 H32 S8k D128 causal >= 400 TFLOP/s and > SDPA FLASH",
                    f"{p['triton_tflops']:.0f} (FLASH {fl:.0f}, cuDNN {p.get('sdpa_cudnn_tflops') or 0:.0f})",
                    p["triton_tflops"] >= 400 and p["triton_tflops"] > fl))
    for shape, target in (("B64 ctx4096", 3.6), ("B1 ctx32768", 2.5)):
        d = next((r for r in res.get("decode", []) if r["shape"].startswith(shape)), None)
        if d:
            out.append((f"decode {shape} 32q/8kv >= {target} TB/s", f"{d['triton_tbs']:.2f} TB/s "
                        f"(SDPA contiguous {d['sdpa_contiguous_tbs']:.2f})", d["triton_tbs"] >= target))
    for r in res.get("elementwise", []):
        frac = r["triton_tbs"] / res["copy_tbs"]
        out.append((f"{r['op'].split()[0]} >= 80% of copy bandwidth", f"{100 * frac:.0f}%", frac >= 0.8))
    for r in res.get("wq_gemv", []):
        if r["op"].startswith("int8") and int(r["op"].split("M=")[1]) <= 16:  # the target is for M = 1..16
            frac = r["triton_tbs"] / res["copy_tbs"]
            ceiling = f" (read-only stream {100 * r['triton_us'] / r['read_only_us'] * frac:.0f}%)" \
                if r.get("read_only_us") else ""
            out.append((f"{r['op']} >= 75% of bandwidth", f"{100 * frac:.0f}%{ceiling}", frac >= 0.75))
    f = res.get("fp8_gemm")
    if f:
        ratio = f["triton_with_act_quant_tflops"] / f["torch_bf16_tflops"]
        out.append(("fp8 GEMM 8192^3 >= 1.3x torch bf16", f"{ratio:.2f}x ({f['triton_with_act_quant_tflops']:.0f} "
                    f"vs {f['torch_bf16_tflops']:.0f} TFLOP/s)", ratio >= 1.3))
    return out


def _fmt(v):
    if v is None:
        return "n/a"
    if not isinstance(v, float):
        return str(v)
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.2g}"


def markdown(res, notes: str = "") -> str:
    lines = [SECTION, "",
             f"Measured {res['date']} on {res['device']} (torch {res['torch']}, triton {res['triton']}) by "
             f"`python3 bench/kernel_timings.py`. Large kernels: medians of `triton.testing.do_bench` (L2 flushed before each "
             f"call). Decode attention and GEMV (a few to tens of microseconds): median per call of a CUDA graph that "
             f"replays ~48 calls round-robin over several copies of the inputs (> 400 MB, so the 60 MB L2 can't hold "
             f"them), for Triton and for the torch baseline alike -- the kernel time an engine replaying CUDA graphs "
             f"sees (SITS's engine replays decode steps from CUDA graphs: see Engine decode); `*_eager_*` "
             f"columns are single eager calls incl. Python launch overhead; `read_only_us` is a kernel that only reads "
             f"the same weight bytes (bench/stream_read.py), timed the same way: the ceiling a GEMV can approach. "
             f"Every kernel's output is checked against "
             f"torch before it is timed (rel_err = ||out - ref|| / ||ref||).", "",
             f"Roofline in the same run: copy {res['copy_tbs']:.2f} TB/s (read+write), bf16 matmul 8192^3 "
             f"{res['bf16_matmul_tflops']:.0f} TFLOP/s.", ""]
    for key, title in (("prefill", "Prefill attention (paged cache, causal, bf16), TFLOP/s"),
                       ("decode", "Paged decode attention (bf16), effective TB/s through the block tables"),
                       ("elementwise", "Norm / activation (bf16), TB/s"),
                       ("wq_gemv", "Weight-only quantized GEMV (bf16 activations), TB/s over weight bytes")):
        rows = res.get(key)
        if not rows:
            continue
        cols = [c for c in rows[0] if not c.endswith("_error")]
        lines += [f"**{title}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
        lines.append("")
    f = res.get("fp8_gemm")
    if f:
        lines += ["**FP8 (e4m3) W8A8 GEMM 8192^3**, TFLOP/s", "",
                  "| " + " | ".join(k for k in f if not k.endswith("_error")) + " |", "|" + "---|" * len(
                      [k for k in f if not k.endswith("_error")]),
                  "| " + " | ".join(_fmt(v) for k, v in f.items() if not k.endswith("_error")) + " |", ""]
    sw = res.get("sweeps")
    if sw:
        lines += ["**Variant sweeps** (GEMV: CUDA graph over 8 weight copies, as in the GEMV table; prefill: "
                  "do_bench; decode: CUDA graph, one input set)", "",
                  "| case | variant | us | TB/s | TFLOP/s | rel_err |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['case']} | {r['variant']} | {_fmt(r.get('us'))} | {_fmt(r.get('tbs'))} | "
                  f"{_fmt(r.get('tflops'))} | {r.get('error') or _fmt(r.get('rel_err'))} |" for r in sw]
        lines.append("")
    lines += ["**Targets (issue 4)**", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'yes' if ok else 'NO'} |" for t, m, ok in verdicts(res)]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


def update_markdown(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else ""
    start = text.find(SECTION)
    if start < 0:
        text = (text.rstrip() + "\n\n" if text.strip() else "") + section
    else:
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    path.write_text(text)


def table(res) -> str:
    lines = [f"{'target':62s} {'measured':44s} met"]
    lines += [f"{t[:62]:62s} {m[:44]:44s} {'yes' if ok else 'NO'}" for t, m, ok in verdicts(res)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the raw results here")
    ap.add_argument("--markdown", type=Path, help="update the 'Kernels (H200)' section of this file")
    ap.add_argument("--from-json", type=Path, help="don't measure; render these results")
    ap.add_argument("--notes", type=Path, help="a file whose text is appended to the section")
    ap.add_argument("--quick", action="store_true", help="only the shapes with targets")
    ap.add_argument("--only", default="", help="comma list of: roofline,prefill,decode,elementwise,gemv,fp8,sweeps "
                    "(sweeps = sweep-gemv,sweep-prefill,sweep-decode)")
    args = ap.parse_args(argv)
    if args.from_json:
        res = json.loads(args.from_json.read_text())
    else:
        import torch
        import triton
        if not torch.cuda.is_available():
            print("bench/kernel_timings.py needs a CUDA GPU", file=sys.stderr)
            return 2
        res = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "triton": triton.__version__}
        only = set(filter(None, args.only.split(","))) or {"roofline", "prefill", "decode", "elementwise", "gemv",
                                                           "fp8", "sweeps"}
        parts = tuple(p for p in ("gemv", "prefill", "decode") if "sweeps" in only or f"sweep-{p}" in only)
        if parts:
            only.add("sweeps")
        steps = [("roofline", lambda: roofline(res)), ("prefill", lambda: prefill(res, args.quick)),
                 ("decode", lambda: decode(res, args.quick)), ("elementwise", lambda: elementwise(res)),
                 ("gemv", lambda: int8_gemv(res, args.quick)), ("fp8", lambda: fp8_gemm(res)),
                 ("sweeps", lambda: sweeps(res, parts))]
        for name, step in steps:
            if name in only:
                try:
                    step()
                except Exception as e:  # noqa: BLE001 - keep the other benchmarks' results
                    res.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:400]
                    print(f"[{name}] failed: {e}", file=sys.stderr)
                torch.cuda.empty_cache()
                print(f"[{name}] done", json.dumps({k: v for k, v in res.items() if k not in ("date",)},
                                                    default=str)[-600:], flush=True)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
    notes = args.notes.read_text() if args.notes else ""
    if args.markdown:
        update_markdown(args.markdown, markdown(res, notes))
    if "copy_tbs" in res:
        print(markdown(res, notes))
        print(table(res))
    if res.get("errors"):
        print("errors:", json.dumps(res["errors"], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
