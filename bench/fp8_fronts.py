"""The fp8 projections' fronts by kernel set, at llama3-8b's shapes and decode-batch and prefill row counts, in one
run: the RMSNorm (with its residual add) then the q/k/v projection [6,144, 4,096]; the norm, the gate/up projection
[28,672, 4,096] and SiLU-and-mul.

    python3 bench/fp8_fronts.py [--sets triton-v1.15,triton-v1.16,triton-v1.17] [--rows 64,256,512,1024,2048]
                                [--json OUT.json]
    TRITON_INTERPRET=1 .venv/bin/python bench/fp8_fronts.py --smoke   # CPU: the sets agree bit for bit

Each set runs what its engine runs there (KernelSet.op: its fused op, or its norm then its projection): with fp8
weights past 32 rows triton-v1.15 runs the norm, quantize_rows and the W8A8 GEMM (torch._scaled_mm up to 512 rows),
then SiLU-and-mul; triton-v1.16 the SiLU-and-mul in the GEMM's epilogue past 512 rows (kernels/linear_w8a8_silu.py);
triton-v1.17 a norm that quantizes its own output (kernels/norm_w8a8.py). Each op runs once first (autotuning at that
row count; the W8A8 GEMM tunes once per weight shape, here at the first row count past 512 as in the engine's
warm-up), its output is compared with the first set's, then it is timed as a CUDA graph of calls on four sets of
weights and inputs (the weights L2-cold, as in a step; no Python launch overhead, as in the engine's graphs). "a
step, ms": the per-call time times llama3-8b's 32 layers. The table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, QKV, I, LAYERS, COPIES = 4096, 6144, 14336, 32, 4
FRONTS = (("qkv", "add_rms_norm_linear", QKV), ("gate/up", "add_rms_norm_linear_silu_and_mul", 2 * I))


def _ops(names: list[str], op: str) -> dict:
    from sits.kernels import get_kernel_set
    return {name: get_kernel_set(name).op(op) for name in names}


def smoke(names=("triton-v1.15", "triton-v1.16", "triton-v1.17"), rows=(40, 520)) -> int:
    """Under TRITON_INTERPRET=1 on CPU: small shapes at 40 rows (torch._scaled_mm's rows on a GPU) and 520 (the GEMM
    tuned for prefill; a test that lowers SCALED_MM_MAX_M passes fewer), bf16, every set's front bit for bit the
    first one's."""
    import torch

    from sits.kernels import quantize_weight
    g = torch.Generator().manual_seed(0)
    bad = 0
    for front, op, n in (("qkv", "add_rms_norm_linear", 48), ("gate/up", "add_rms_norm_linear_silu_and_mul", 96)):
        qw = quantize_weight(torch.randn(n, 64, generator=g) * 0.125, "fp8")
        nw = (torch.randn(64, generator=g) * 0.1 + 1).to(torch.bfloat16)
        for m in rows:
            x, r = (torch.randn(2, m, 64, generator=g).to(torch.bfloat16))
            outs = {name: fn(x, qw, r, nw, 1e-5) for name, fn in _ops(list(names), op).items()}
            first = next(iter(outs.values()))
            same = all(torch.equal(o[0], first[0]) and torch.equal(o[1], first[1]) for o in outs.values())
            bad += not same
            print(f"smoke: {front} front, {m} rows x [{n}, 64]: {', '.join(outs)} "
                  f"{'agree bit for bit' if same else 'DIFFER'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="triton-v1.15,triton-v1.16,triton-v1.17")
    ap.add_argument("--rows", default="64,256,512,1024,2048")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU, under TRITON_INTERPRET=1: the sets agree")
    args = ap.parse_args(argv)
    names = [s for s in args.sets.split(",") if s]
    if args.smoke:
        from bench.kernel_timings import run_smoke
        return run_smoke(lambda: smoke(names))
    import torch
    import triton
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("bench/fp8_fronts.py needs a CUDA GPU with fp8 tensor cores (or --smoke)", file=sys.stderr)
        return 2
    from bench.kernel_timings import bench_graph, rel_err
    from sits.kernels import quantize_weight
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__, "sets": names, "rows": []}
    print(f"{res['device']}: llama3-8b's norm + projection fronts, fp8 weights, x bf16; sets {', '.join(names)}",
          flush=True)
    nw = (torch.randn(H, device="cuda", generator=g) * 0.1 + 1).to(torch.bfloat16)
    for front, op, n in FRONTS:
        ws = [quantize_weight(torch.randn(n, H, device="cuda", generator=g) * H ** -0.5, "fp8") for _ in range(COPIES)]
        fns = _ops(names, op)
        for m in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(2, m, H, device="cuda", generator=g).to(torch.bfloat16) for _ in range(COPIES)]
            row = {"front": front, "rows": m, "us": {}, "err": {}}
            first = None
            for name, fn in fns.items():
                out = fn(xs[0][0], ws[0], xs[0][1], nw, 1e-5)   # tunes here, once per row count
                first = first if first is not None else out
                row["err"][name] = max(rel_err(out[0], first[0]), rel_err(out[1], first[1]))
                calls = [lambda fn=fn, x=x, w=w: fn(x[0], w, x[1], nw, 1e-5) for x, w in zip(xs, ws)]
                row["us"][name] = bench_graph(calls) * 1e3
            res["rows"].append(row)
            print(f"  {front} {m} rows: " + ", ".join(f"{k} {v:.1f} us (difference {row['err'][k]:.1e})"
                                                     for k, v in row["us"].items()), flush=True)
            del xs
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    base = names[0]
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: norm + projection fronts, fp8 weights, "
          f"us a call (a step: x {LAYERS} layers, ms; relative difference from {base})")
    print("| front | rows | " + " | ".join(names) + f" | a step, ms: {' / '.join(names)} | difference |")
    print("|---|---:|" + "---:|" * len(names) + "---:|---:|")
    for r in res["rows"]:
        us = [r["us"][k] for k in names]
        print(f"| {r['front']} | {r['rows']} | " + " | ".join(f"{u:.1f}" for u in us) + " | "
              + " / ".join(f"{u * LAYERS / 1e3:.2f}" for u in us) + " | "
              + ", ".join("same bits" if r["err"][k] == 0 else f"{r['err'][k]:.1e}" for k in names[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
