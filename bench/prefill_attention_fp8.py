"""Prefill attention over FP8 KV pages by kernel set, at llama3-8b's heads (32 query / 8 kv heads, head_dim 128, pages
of 64 in shuffled blocks, block tables 128 pages wide as the engine's at max_model_len 8,192), in one run:
triton-v1.17's pointer-gather kernel (v1.5's fp16 dots), triton-v1.18's TMA kernel and triton-v1.19's with the scores
transposed (kernels/prefill_attention_fp8_tma.py), triton-v1.20's pages dequantized once into a bf16 scratch for
v1.1's kernel (kernels/prefill_attention_fp8_dequant.py), triton-v1.21's choice between v1.20's op and v1.17's by the
call's attention work, and triton-v1.1's TMA kernel over bf16 pages of the same values (what the bf16 rows run).

    python3 bench/prefill_attention_fp8.py [--shapes 1x2048,8x2048,2x8192] [--sets v1.17,v1.20,v1.21] [--json OUT.json]
    TRITON_INTERPRET=1 .venv/bin/python bench/prefill_attention_fp8.py --smoke   # CPU: v1.18-v1.20 agree with v1.17

Each op runs once first (its autotuning), its output compared with v1.17's, then timed: medians of
triton.testing.do_bench (the L2 flushed; the host's launch work counts where it outlasts the GPU's, as v1.20's two
launches and allocations can at one prompt), the GPU time alone (`graph`: 48 calls replayed from one CUDA graph) and
the host's time alone (calls enqueued behind a kernel that keeps the GPU busy: what a launch-bound step pays); then,
by the call's attention work, the GPU time v1.20's op saves against the host time it adds, and from which work on
every measured call pays (what triton-v1.21's DEQUANT_MIN_WORK should be). --sweep then times the two TMA kernels
(v1.18's and v1.19's) at every launch config of SWEEP, the tuner bypassed, and names each kernel's pick. TFLOP/s
count the causal half of the score matrix; "a step, ms": one call times llama3-8b's 32 layers (for 1 x 2,048: what a
2,048-token prefill step spends in attention). The table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HQ, HKV, D, LAYERS = 32, 8, 128, 32
TABLE_WIDTH = 128   # pages: the engine's block tables at max_model_len 8,192 (what v1.20's scratch is sized by)
SETS = (("v1.17 FP8 gather", "triton-v1.17", True), ("v1.18 FP8 TMA", "triton-v1.18", True),
        ("v1.19 FP8 TMA transposed", "triton-v1.19", True), ("v1.20 FP8 dequantized once", "triton-v1.20", True),
        ("v1.21 FP8 by work", "triton-v1.21", True), ("v1.1 bf16 TMA", "triton-v1.1", False))


# (BLOCK_M, num_warps, num_stages): both kernels' candidates and their neighbours
SWEEP = ((128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3))


def sweep(call, shape: str) -> list[dict]:
    """v1.18's and v1.19's TMA kernels at each SWEEP config on `call` (prefill_attention's arguments), and the
    config each kernel's tuner picked for this shape."""
    from bench.kernel_timings import bench
    from sits.kernels import prefill_attention_fp8_tma as m
    rows = []
    for label, transposed, tuned in (("v1.18", False, m._tuned), ("v1.19", True, m._tuned_t)):
        picked = getattr(tuned, "best_config", None)   # the main loop ran the tuned op on this shape last
        for bm, warps, stages in SWEEP:
            cfg = (bm, warps, stages)
            try:
                ms = bench(lambda: m._launch(transposed, tuned, *call, config=cfg))
            except Exception as e:   # out of shared memory or registers: that config cannot run
                print(f"  {shape} {label} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            pick = picked is not None and (picked.kwargs["BLOCK_M"], picked.num_warps, picked.num_stages) == cfg
            rows.append({"shape": shape, "kernel": label, "config": cfg, "ms": ms, "tuner_pick": pick})
            print(f"  {shape} {label} BLOCK_M {bm}, {warps} warps, {stages} stages: {ms:.3f} ms"
                  + (" (the tuner's pick)" if pick else ""), flush=True)
    return rows


def crossover(rows: list[dict], v117: str, v120: str, threshold: int) -> str:
    """Where v1.20's op pays for itself against v1.17's: the GPU time it saves (graph column) against the host time
    it adds (host column), by the call's attention work (the quantity triton-v1.21 compares with DEQUANT_MIN_WORK);
    the smallest work from which every larger measured call pays is the threshold these rows support."""
    lines = [f"\nv1.20 against v1.17 by attention work (T^2 / b x heads x head_dim; triton-v1.21 takes v1.20's op from "
             f"{threshold:.3g}): GPU time saved, host time added, us a call",
             "| sequences x tokens | attention work | GPU saved | host added | pays |", "|---|---:|---:|---:|---|"]
    paying = []
    for r in sorted(rows, key=lambda r: r["work"]):
        saved = (r["graph_ms"][v117] - r["graph_ms"][v120]) * 1e3
        added = (r["host_ms"][v120] - r["host_ms"][v117]) * 1e3
        paying.append((r["work"], saved >= added))
        lines.append(f"| {r['shape']} | {r['work']:.3g} | {saved:.1f} | {added:.1f} | "
                     f"{'yes' if saved >= added else 'no'} |")
    first = 1 + max((i for i, (_, ok) in enumerate(paying) if not ok), default=-1)   # past the last call that loses
    where = f"{paying[first][0]:.3g} on pays" if first < len(paying) else "-: none of the largest pays"
    lines.append(f"every measured call from attention work {where} for v1.20's host work")
    return "\n".join(lines)


def smoke() -> int:
    """Under TRITON_INTERPRET=1 on CPU: two prompts and a chunk over FP8 pages; v1.18's TMA kernel equals v1.17's
    (the interpreter runs both at the same tiles), v1.19's transposed one is within fp16 rounding of them, v1.20's
    (the pages dequantized to bf16 first) within bf16 rounding."""
    import torch

    from sits.kernels import get_kernel_set
    from sits.kernels.kv_fp8 import quantize_pages
    from tests.kernels.helpers import prefill_args
    q, kc, vc, *rest = prefill_args([130, 65, 300], [130, 65, 40], 4, 2, 64, torch.bfloat16, seed=5)
    args = (q, quantize_pages(kc), quantize_pages(vc), *rest)
    v117, v118, v119, v120 = (get_kernel_set(f"triton-v1.{n}").prefill_attention(*args) for n in (17, 18, 19, 20))
    same = torch.equal(v118, v117)
    err, err20 = (((v.float() - v117.float()).norm() / v117.float().norm()).item() for v in (v119, v120))
    print(f"smoke: 3 sequences over FP8 pages, v1.18's TMA kernel {'equals' if same else 'DIFFERS FROM'} v1.17's; "
          f"v1.19's transposed kernel differs from it by {err:.1e} (limit 2e-3), v1.20's dequantized pages by "
          f"{err20:.1e} (limit 2e-2)")
    return 0 if same and err < 2e-3 and err20 < 2e-2 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x2048,8x2048,2x8192", help="sequences x tokens, comma-separated")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU, under TRITON_INTERPRET=1: v1.18-v1.20 agree with v1.17")
    ap.add_argument("--sweep", action="store_true", help="also time the TMA kernels at every config of SWEEP")
    ap.add_argument("--sets", default=",".join(label.split()[0] for label, _, _ in SETS),
                    help="which columns, comma-separated (v1.17, the baseline, always first)")
    args = ap.parse_args(argv)
    if args.smoke:
        from bench.kernel_timings import run_smoke
        return run_smoke(smoke)
    chosen = {"v1.17", *args.sets.split(",")}
    unknown = chosen - {label.split()[0] for label, _, _ in SETS}
    if unknown:
        ap.error(f"--sets: no such column {', '.join(sorted(unknown))}")
    sets = [entry for entry in SETS if entry[0].split()[0] in chosen]
    fp8_sets = sum(on_fp8 for _, _, on_fp8 in sets)   # the FP8 columns come first
    import torch
    import triton
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("bench/prefill_attention_fp8.py needs a Hopper (or later) GPU (or --smoke)", file=sys.stderr)
        return 2
    from bench.kernel_timings import bench, bench_graph, host_ms, paged, rel_err
    from sits.kernels import get_kernel_set
    from sits.kernels.kv_fp8 import quantize_pages
    from sits.kernels.prefill_attention_fp8_dequant import DEQUANT_MIN_WORK, attention_work
    res = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__, "rows": [], "sweep": []}
    print(f"{res['device']}: prefill attention, {HQ}/{HKV} heads x {D}, pages of 64, bf16 queries", flush=True)
    for shape in args.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        kc, vc, tables = paged([s] * b, HKV, D, torch.bfloat16)
        tables = torch.nn.functional.pad(tables, (0, max(0, TABLE_WIDTH - tables.shape[1])))   # zeros: never read
        q = torch.randn(b * s, HQ, D, device="cuda", dtype=torch.bfloat16)
        cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        fp8 = (q, quantize_pages(kc), quantize_pages(vc), tables, cu, lens, D ** -0.5)
        plain = (q, kc, vc, tables, cu, lens, D ** -0.5)
        flops = 4 * b * HQ * s * s * D / 2
        row = {"shape": f"{b} x {s}", "ms": {}, "tflops": {}, "err": {}, "graph_ms": {}, "host_ms": {},
               "work": attention_work(q, tables)}
        base = None
        for label, name, on_fp8 in sets:
            fn = get_kernel_set(name).prefill_attention
            call = fp8 if on_fp8 else plain
            out = fn(*call)   # tunes here
            base = out if base is None else base
            row["err"][label] = rel_err(out, base)
            ms = bench(lambda fn=fn, call=call: fn(*call))
            row["ms"][label], row["tflops"][label] = ms, flops / ms / 1e9
            row["graph_ms"][label] = bench_graph([lambda fn=fn, call=call: fn(*call)])
            row["host_ms"][label] = host_ms(lambda fn=fn, call=call: fn(*call))
        res["rows"].append(row)
        if args.sweep:
            res["sweep"] += sweep(fp8, row["shape"])
        print(f"  {row['shape']}: " + ", ".join(f"{k} {row['ms'][k]:.3f} ms ({row['tflops'][k]:.0f} TFLOP/s, "
                                                f"difference {row['err'][k]:.1e})" for k in row["ms"]), flush=True)
        del kc, vc, fp8, plain, q
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    labels = [label for label, _, _ in sets]
    fp8_labels = labels[:fp8_sets]
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: prefill attention, ms a call (TFLOP/s), "
          f"a step = x {LAYERS} layers; difference from v1.17's output")
    print("| sequences x tokens | " + " | ".join(labels) + " | "
          + " | ".join(f"{k.split()[0]} / v1.17" for k in fp8_labels[1:])
          + " | a step, ms (" + " / ".join(k.split()[0] for k in fp8_labels) + ") | difference "
          + ", ".join(k.split()[0] for k in labels[1:]) + " |")
    print("|---|" + "---:|" * (len(labels) + len(fp8_labels) + 1))
    for r in res["rows"]:
        ms = [r["ms"][k] for k in labels]
        print(f"| {r['shape']} | " + " | ".join(f"{m:.3f} ({r['tflops'][k]:.0f})" for m, k in zip(ms, labels))
              + " | " + " | ".join(f"{m / ms[0]:.2f}" for m in ms[1:fp8_sets]) + " | "
              + " / ".join(f"{m * LAYERS:.1f}" for m in ms[:fp8_sets]) + " | "
              + ", ".join(f"{r['err'][k]:.1e}" for k in labels[1:]) + " |")
    print("\nGPU time alone, ms a call (48 calls replayed from one CUDA graph: no launch gaps, the L2 not flushed)")
    print("| sequences x tokens | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for r in res["rows"]:
        print(f"| {r['shape']} | " + " | ".join(f"{r['graph_ms'][k]:.3f}" for k in labels) + " |")
    print("\nhost time, ms a call (Python, checks, allocations, launches; the GPU kept busy so the host never waits):"
          " what a launch-bound step pays")
    print("| sequences x tokens | " + " | ".join(labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for r in res["rows"]:
        print(f"| {r['shape']} | " + " | ".join(f"{r['host_ms'][k]:.3f}" for k in labels) + " |")
    v117, v120 = labels[0], next((k for k in labels if k.startswith("v1.20")), None)
    if v120:
        print(crossover(res["rows"], v117, v120, DEQUANT_MIN_WORK))
    if res["sweep"]:
        shapes = list(dict.fromkeys(r["shape"] for r in res["sweep"]))
        print("\nlaunch configs of the TMA kernels, ms a call (* the tuner's pick); v1.17's gather kernel for scale")
        print("| kernel | BLOCK_M, warps, stages | " + " | ".join(shapes) + " |")
        print("|---|---|" + "---:|" * len(shapes))
        for kernel in ("v1.18", "v1.19"):
            for cfg in SWEEP:
                got = {r["shape"]: r for r in res["sweep"] if r["kernel"] == kernel and r["config"] == cfg}
                if got:
                    print(f"| {kernel} | {cfg[0]}, {cfg[1]}, {cfg[2]} | " + " | ".join(
                        f"{got[sh]['ms']:.3f}{'*' if got[sh]['tuner_pick'] else ''}" if sh in got else "-"
                        for sh in shapes) + " |")
        print("| v1.17 gather | tuned | " + " | ".join(
            f"{r['ms'][labels[0]]:.3f}" for r in res["rows"] if r["shape"] in shapes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
