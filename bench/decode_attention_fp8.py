"""Decode attention over FP8 KV pages on the GPU: the kernels of triton-v1.3 / v1.5 / v1.8 against bf16 pages, then a
sweep of triton-v1.8's launch configs (BLOCK_N, warps, stages, KV splits), in TB/s of the bytes it must read.

    python3 bench/decode_attention_fp8.py [--json OUT.json] [--shapes 256x2304,32x2304] [--quick]

Why: on the H200 a decode step at 256 sequences of ~2,300 tokens with FP8 pages spent 25.6 of its 31.9 ms in
_paged_decode_attention_fp8_kernel, reading its pages at 37 % of the copy rate, where the bf16 kernel reads twice the
bytes near the copy rate (BENCHMARKS.md "FP8 end to end"). llama3-8b's attention shape: 32 query heads, 8 kv heads,
head_dim 128, pages of 64 tokens in shuffled blocks. Every config's output is checked against v1.5's. triton-v1.8
runs a sequence's kv heads in neighbouring programs (HEADS_FIRST) and converts each e4m3 tile where its load left
it (paged_decode_attention_fp8.e4m3_to_f16): at its best config each change is also timed alone. The sweep of v1.3's
and v1.5's configs is in BENCHMARKS.md "FP8 decode attention" (2026-12-04). Last,
kernels/paged_decode_attention_fp8_dots.py (fp8 tensor cores, in no kernel set yet) over a sweep of its own.
Times: medians of triton.testing.do_bench (L2 flushed; the pages are far larger than the L2 anyway).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.kernel_timings import bench, paged, rel_err  # noqa: E402

HQ, HKV, D = 32, 8, 128
SWEEP = [(bn, w, st) for bn in (64, 128, 256) for w in (4, 8) for st in (2, 3)]
DOTS_SWEEP = [(bn, w, st) for bn in (128, 64) for w in (4, 8) for st in (2, 3)]
TOP_AT_MORE_SPLITS = 3   # the fastest configs at the default split count are timed again at 2x and 4x (--quick: 2x)


def fp8_pages(cache):
    from sits.kernels.kv_fp8 import Fp8Pages, quantize
    data, scale = quantize(cache)
    return Fp8Pages(data, scale)


def shape_rows(b: int, ctx: int, quick: bool) -> dict:
    import torch

    from sits.kernels.paged_decode_attention import choose_num_splits, paged_decode_attention
    from sits.kernels.paged_decode_attention_fp8 import (DecodeLaunch, paged_decode_attention_fp8kv,
                                                         paged_decode_attention_fp8kv_f16,
                                                         paged_decode_attention_fp8kv_staged)
    kc, vc, tables = paged([ctx] * b, HKV, D, torch.bfloat16)
    q = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    bf16_bytes = 2 * b * ctx * HKV * D * 2
    fp8_bytes = 2 * b * ctx * HKV * (D + 4)   # e4m3 values and one fp32 scale per (token, kv head)
    row = {"shape": f"{b} x {ctx}", "bf16_bytes": bf16_bytes, "fp8_bytes": fp8_bytes}
    row["bf16_ms"] = bench(lambda: paged_decode_attention(q, kc, vc, tables, lens, scale))
    k8, v8 = fp8_pages(kc), fp8_pages(vc)
    del kc, vc
    torch.cuda.empty_cache()
    ref = paged_decode_attention_fp8kv_f16(q, k8, v8, tables, lens, scale)
    row["v13_ms"] = bench(lambda: paged_decode_attention_fp8kv(q, k8, v8, tables, lens, scale))
    row["v15_ms"] = bench(lambda: paged_decode_attention_fp8kv_f16(q, k8, v8, tables, lens, scale))
    v18 = paged_decode_attention_fp8kv_staged(q, k8, v8, tables, lens, scale)
    row["v18_err"] = rel_err(v18, ref)
    row["v18_ms"] = bench(lambda: paged_decode_attention_fp8kv_staged(q, k8, v8, tables, lens, scale))
    auto = choose_num_splits(b, HKV, q.device)
    row["auto_splits"] = auto

    def timed(rows: list, what: str, cfg: dict, call) -> None:
        """Check `call` against v1.5's output, time it, append the row (or why it failed) and print it."""
        try:
            err = rel_err(call(), ref)
            ms = bench(call)
        except Exception as e:  # noqa: BLE001 - a config that does not compile (shared memory) is a row too
            rows.append({**cfg, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            print(f"  {row['shape']:>12} {what:<16} {cfg}: {rows[-1]['error']}", flush=True)
            return
        rows.append({**cfg, "ms": ms, "tbs": fp8_bytes / ms / 1e9, "rel_err": err})
        print(f"  {row['shape']:>12} {what:<16} splits={cfg['splits']:<3} BLOCK_N={cfg['block_n']:<4} "
              f"w{cfg['warps']} s{cfg['stages']}  {ms * 1e3:8.1f} us  {fp8_bytes / ms / 1e9:5.2f} TB/s  "
              f"err {err:.1e}", flush=True)

    def run(rows, sp, bn, w, st, staged=True, heads_first=True, k=k8, v=v8, what=None):
        launch = DecodeLaunch.prepare(q, k, v, tables, lens, scale, sp, f16_dot=True, staged=staged,
                                      heads_first=heads_first)

        def call():
            launch.run(BLOCK_N=bn, num_warps=w, num_stages=st)
            return launch.merge()
        what = what or ("v1.8" if staged and heads_first else "staged only" if staged
                        else "heads first only" if heads_first else "v1.5")
        timed(rows, what, {"splits": sp, "block_n": bn, "warps": w, "stages": st, "staged": staged,
                           "heads_first": heads_first}, call)

    sweep = []
    for bn, w, st in SWEEP if not quick else SWEEP[:4]:
        run(sweep, auto, bn, w, st)
    top = sorted((c for c in sweep if "ms" in c), key=lambda c: c["ms"])[:TOP_AT_MORE_SPLITS]
    for mult in (2,) if quick else (2, 4):
        for c in top:
            run(sweep, auto * mult, c["block_n"], c["warps"], c["stages"])
    # which of v1.8's two changes does what: each alone, and neither (v1.5's kernel), at v1.8's best config
    best = min((c for c in sweep if "ms" in c), key=lambda c: c["ms"])
    best_cfg = (best["splits"], best["block_n"], best["warps"], best["stages"])
    for staged, heads_first in ((True, False), (False, True), (False, False)):
        run(sweep, *best_cfg, staged, heads_first)
    # a page format question, not a kernel one: the scales stored head-major ([blocks, kv heads, page], each head's
    # 64 scales in 256 contiguous bytes) instead of [blocks, page, kv heads] (one 4-byte scale per 32-byte sector)
    from sits.kernels.kv_fp8 import Fp8Pages
    k8h, v8h = (Fp8Pages(p.data, p.scale.permute(0, 2, 1).contiguous().permute(0, 2, 1)) for p in (k8, v8))
    head_major = []
    run(head_major, *best_cfg, k=k8h, v=v8h, what="v1.8, head-major")
    row["head_major_scales"] = head_major[0]
    # kernels/paged_decode_attention_fp8_dots.py (in no set yet): the products on fp8 tensor cores, q and the weights
    # in e4m3, so its error against v1.5 is e4m3's rounding (a few 1e-2 on random data), not fp32's
    from sits.kernels.paged_decode_attention_fp8_dots import paged_decode_attention_fp8_dots
    dots = []
    for sp in (auto, auto * 2):
        for bn, w, st in DOTS_SWEEP if not quick else DOTS_SWEEP[:2]:
            timed(dots, "fp8 dots", {"splits": sp, "block_n": bn, "warps": w, "stages": st},
                  lambda sp=sp, bn=bn, w=w, st=st: paged_decode_attention_fp8_dots(
                      q, k8, v8, tables, lens, scale, num_splits=sp, block_n=bn, num_warps=w, num_stages=st))
    row["dots"] = dots
    row["sweep"] = sweep
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--shapes", default="256x2304,32x2304", help="BATCHxCONTEXT, comma-separated")
    ap.add_argument("--quick", action="store_true", help="four configs; the best three again at 2x the splits")
    args = ap.parse_args(argv)
    import torch
    import triton
    if not torch.cuda.is_available():
        print("bench/decode_attention_fp8.py needs a CUDA GPU", file=sys.stderr)
        return 2
    res = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__}
    n = 1 << 30
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    res["copy_tbs"] = 2 * n * 2 / bench(lambda: dst.copy_(src)) / 1e9
    del src, dst
    rows = []
    for spec in args.shapes.split(","):
        b, ctx = (int(x) for x in spec.lower().split("x"))
        rows.append(shape_rows(b, ctx, args.quick))
        torch.cuda.empty_cache()
    res["rows"] = rows
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    copy = res["copy_tbs"]
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}, copy {copy:.2f} TB/s; "
          f"llama3-8b attention (H{HQ}/{HKV} D{D}), one layer:")
    print("| batch x ctx | bf16 pages us (TB/s) | v1.3 FP8 us (TB/s) | v1.5 FP8 us (TB/s) | v1.8 FP8 us (TB/s) "
          "| best v1.8 config | us (TB/s) | fp8 dots, best config: us (TB/s), err | FP8 bytes at copy us |")
    print("|---|---:|---:|---:|---:|---|---:|---|---:|")
    for r in rows:
        ok = [c for c in r["sweep"] if "ms" in c and c["rel_err"] < 1e-2 and c["staged"] and c["heads_first"]]
        best = min(ok, key=lambda c: c["ms"]) if ok else None
        cfg = (f"splits {best['splits']} BLOCK_N {best['block_n']} w{best['warps']} s{best['stages']}" if best
               else "none")

        def cell(ms, nbytes):
            return f"{ms * 1e3:.0f} ({nbytes / ms / 1e9:.2f})"
        d_ok = [c for c in r.get("dots", []) if "ms" in c]
        d = min(d_ok, key=lambda c: c["ms"]) if d_ok else None
        dots = (f"splits {d['splits']} BLOCK_N {d['block_n']} w{d['warps']} s{d['stages']}: "
                f"{cell(d['ms'], r['fp8_bytes'])}, {d['rel_err']:.1e}" if d else "-")
        print(f"| {r['shape']} | {cell(r['bf16_ms'], r['bf16_bytes'])} | {cell(r['v13_ms'], r['fp8_bytes'])} | "
              f"{cell(r['v15_ms'], r['fp8_bytes'])} | {cell(r['v18_ms'], r['fp8_bytes'])} "
              f"(err {r['v18_err']:.1e}) | {cfg} | "
              f"{cell(best['ms'], r['fp8_bytes']) if best else '-'} | {dots} | "
              f"{r['fp8_bytes'] / copy / 1e9 * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
