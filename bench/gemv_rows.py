"""triton-v1.9's GEMV (kernels/linear_gemv.py) against triton-v1.8's linear at llama3-8b's four weight shapes, and
the read-only ceiling of the same bytes.

    python3 bench/gemv_rows.py [--kinds int8,fp8,bf16] [--rows 1,2,4] [--sweep full|candidates|none]
                               [--budget-s 300] [--json OUT]

Per shape and weight kind: triton-v1.8's linear (the MMA weight-only kernel, autotuned; bf16 weights: cuBLAS),
triton-v1.9's (the GEMV, autotuned over its candidates), a sweep of fixed GEMV launch configs (full: BLOCK_N, BLOCK_K,
warps, stages; candidates: the autotuner's, int8 with each weight conversion: through bf16 and the byte-permute one),
and a kernel that only reads the weight bytes (bench/stream_read.py): the ceiling a GEMV can approach. With
`--sweep candidates` each candidate also runs with x loaded as broadcast tiles in the weight tile's layout (the
kernel's X_BCAST; int8/fp8 weights with 8-byte weight loads too, NARROW_W): no barrier in the main loop.
The fused gate/up projection (v1.7's epilogue) against v1.8's too, and 2-4 rows at each shape's best config.
Times: microseconds per call from a CUDA graph replaying calls round-robin over weight copies past the L2
(bench/kernel_timings.py's `bench_graph`); every output is checked against v1.8's (rel. error) before it is timed.
The step columns sum a decode step's 32 layers (qkv, o, gate/up, down). Each swept config is also timed on one
weight tensor replayed, as the autotuner times its candidates (from the L2 where the weights fit): the table
`timing from the L2` shows which config that picks and what it costs past the L2. A table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # llama3-8b [N, K]
LAYERS = 32
PAST_L2 = 256 * 2**20   # bytes of weight copies per timing: well past the H200's 60 MB L2


def sweep_configs(elem_bytes: int) -> list[dict]:
    """Launch configs whose fp32 partial sums are 16-64 a thread and whose K tile is 256+ bytes of a weight row."""
    out = []
    for bn, bk, warps, stages in itertools.product((4, 8, 16, 32), (256, 512, 1024, 2048), (4, 8), (1, 2)):
        per_thread = bn * bk // (32 * warps)
        if 16 <= per_thread <= 64 and bk * elem_bytes >= 256:
            out.append(dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages))
    return out


def candidate_configs(kind: str) -> list[dict]:
    """The autotuner's candidates as fixed configs; int8 once per weight conversion (through bf16, byte permute),
    and once per way of loading x: vectors moved into the weight tile's layout (the kernel's default), or broadcast
    tiles in it (X_BCAST; with int8/fp8 weights with 8-byte weight loads too, NARROW_W)."""
    from sits.kernels import linear_gemv as lg
    convs = (lg.INT8_VIA_BF16, lg.INT8_MAGIC) if kind == "int8" else (lg.INT8_CONV,)
    loads = ({}, {"X_BCAST": True} if kind == "bf16" else {"X_BCAST": True, "NARROW_W": True})
    return [dict(**c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages, INT8_CONV=v, **how)
            for c in lg.CANDIDATES for v in convs for how in loads]


def _name(c: dict) -> str:
    conv = {1: " bf16cvt", 2: " prmt"}.get(c.get("INT8_CONV"), "") if c.get("kind", "int8") == "int8" else ""
    loads = (" xbcast" if c.get("X_BCAST") else "") + (" narrow" if c.get("NARROW_W") else "")
    return f"N{c['BLOCK_N']} K{c['BLOCK_K']} w{c.get('num_warps', '?')} s{c.get('num_stages', '?')}{conv}{loads}"


def _weights(kind: str, n: int, k: int):
    import torch

    from sits.kernels import quantize_weight
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    copies = max(2, -(-PAST_L2 // (n * k * (2 if kind == "bf16" else 1))))
    if kind == "bf16":   # plain weights (v1.8: cuBLAS)
        return [w * (1 + 0.01 * c) for c in range(copies)]
    return [quantize_weight(w * (1 + 0.01 * c), kind) for c in range(copies)]


def measure(kinds, rows, sweep: str, deadline: float) -> tuple[list[dict], list[dict]]:
    import torch
    import triton

    from bench.kernel_timings import bench_graph, rel_err
    from bench.stream_read import stream_read
    from sits.kernels import get_kernel_set
    from sits.kernels import linear_gemv as lg
    from sits.kernels.triton_env import tuned_launcher
    v18, v19 = get_kernel_set("triton-v1.8"), get_kernel_set("triton-v1.9")
    table, swept = [], []
    for kind in kinds:
        for shape, (n, k) in SHAPES.items():
            ws = _weights(kind, n, k)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            plain = kind == "bf16"
            ref = v18.linear(x, ws[0])
            row = {"kind": kind, "shape": shape, "n": n, "k": k, "m": 1,
                   "weight_mb": n * k * (2 if plain else 1) / 2**20}
            row["v18_us"] = 1e3 * bench_graph([lambda q=q: v18.linear(x, q) for q in ws])
            flat = [(q if plain else q.qweight).view(torch.int8).view(-1) for q in ws]
            sums = torch.empty(triton.cdiv(flat[0].numel(), 16384), dtype=torch.int32, device="cuda")
            row["read_us"] = 1e3 * bench_graph([lambda f=f: stream_read(f, sums) for f in flat])
            out = v19.linear(x, ws[0])
            row["v19_err"] = rel_err(out, ref)
            row["v19_us"] = 1e3 * bench_graph([lambda q=q: v19.linear(x, q) for q in ws])
            wdt = ws[0].dtype if plain else ws[0].qweight.dtype
            tuned = tuned_launcher(lg._gemv_tuned, (x.device, n, k, x.dtype, wdt, False, False, 0))
            row["v19_config"] = _name({**tuned.constexprs, "kind": kind}) if tuned is not None else "?"
            o = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
            best = None
            configs = {"full": lambda: sweep_configs(2 if plain else 1), "candidates": lambda: candidate_configs(kind),
                       "none": lambda: []}[sweep]()
            for cfg in configs:
                if time.monotonic() > deadline:
                    print("sweep: out of budget, stopping here", flush=True)
                    sweep = "none"
                    break
                try:
                    lg.gemv(x, ws[0], None, o, config=cfg)
                    err = rel_err(o, ref)
                    us = 1e3 * bench_graph([lambda q=q: lg.gemv(x, q, None, o, config=cfg) for q in ws])
                    # as the autotuner times it: one weight tensor replayed (do_bench_cudagraph flushes nothing)
                    hot = 1e3 * bench_graph([lambda: lg.gemv(x, ws[0], None, o, config=cfg)])
                except Exception as e:   # a config that does not compile: recorded, not fatal
                    swept.append({"kind": kind, "shape": shape, **cfg, "error": str(e)[:200]})
                    continue
                swept.append({"kind": kind, "shape": shape, **cfg, "us": us, "hot_us": hot, "err": err})
                cfg = {**cfg, "kind": kind}
                if best is None or us < best[0]:
                    best = (us, cfg, err)
            if best is not None:
                row.update(best_us=best[0], best_config=_name(best[1]), best_err=best[2])
                best = (best[0], {kk: v for kk, v in best[1].items() if kk != "kind"}, best[2])
                for m in rows:
                    if m == 1:
                        continue
                    xm = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    om = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    bm = (lambda q: v18.linear(xm, q))  # noqa: E731
                    lg.gemv(xm, ws[0], None, om, config=best[1])
                    row[f"m{m}_err"] = rel_err(om, bm(ws[0]))
                    row[f"m{m}_v18_us"] = 1e3 * bench_graph([lambda q=q: bm(q) for q in ws])
                    row[f"m{m}_gemv_us"] = 1e3 * bench_graph([lambda q=q: lg.gemv(xm, q, None, om, config=best[1])
                                                               for q in ws])
            if shape == "gate_up":   # the fused op: v1.8 (v1.7's epilogue on the MMA kernel) vs v1.9
                fr = v18.linear_silu_and_mul(x, ws[0])
                row["fused_err"] = rel_err(v19.linear_silu_and_mul(x, ws[0]), fr)
                row["fused_v18_us"] = 1e3 * bench_graph([lambda q=q: v18.linear_silu_and_mul(x, q) for q in ws])
                row["fused_v19_us"] = 1e3 * bench_graph([lambda q=q: v19.linear_silu_and_mul(x, q) for q in ws])
            table.append(row)
            print(json.dumps({kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            del ws
            torch.cuda.empty_cache()
    return table, swept


def tuner_view(swept: list[dict]) -> list[dict]:
    """Per weight kind and shape: the config that wins when each is timed on one weight tensor replayed (L2-hot, as
    the autotuner times its candidates), its time past the L2 (as the engine runs it), and the config that wins past
    the L2. Where the two winners differ, tuning from the L2 costs `lost_us` a call."""
    out = []
    timed = sorted((s for s in swept if "us" in s and "hot_us" in s), key=lambda s: (s["kind"], s["shape"]))
    for (kind, shape), group in itertools.groupby(timed, key=lambda s: (s["kind"], s["shape"])):
        group = list(group)
        hot = min(group, key=lambda s: s["hot_us"])
        cold = min(group, key=lambda s: s["us"])
        out.append({"kind": kind, "shape": shape, "hot_pick": _name(hot), "hot_pick_hot_us": hot["hot_us"],
                    "hot_pick_us": hot["us"], "cold_pick": _name(cold), "cold_pick_us": cold["us"],
                    "lost_us": hot["us"] - cold["us"]})
    return out


def report(res: dict) -> None:
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: us per call at one row (llama3-8b); "
          f"TB/s over the weight bytes; 'read' = a kernel that only reads them")
    print(f"{'kind':5s} {'shape':8s} {'read us':>8s} {'v1.8 us':>8s} {'v1.9 us':>8s} {'v1.9 cfg':>22s} "
          f"{'best us':>8s} {'best cfg':>22s} {'v1.9 TB/s':>9s} {'% read':>7s} {'err':>8s}")
    steps: dict = {}
    for r in res["rows"]:
        tb = r["weight_mb"] * 2**20 / (r.get("v19_us") or r.get("best_us") or float("nan")) / 1e6
        main = r.get("v19_us") or r.get("best_us") or float("nan")
        print(f"{r['kind']:5s} {r['shape']:8s} {r['read_us']:8.1f} {r['v18_us']:8.1f} "
              f"{r.get('v19_us', float('nan')):8.1f} {r.get('v19_config', '-'):>22s} "
              f"{r.get('best_us', float('nan')):8.1f} {r.get('best_config', '-'):>22s} {tb:9.2f} "
              f"{100 * r['read_us'] / main:6.0f}% {r.get('v19_err', r.get('best_err', float('nan'))):8.1e}")
        s = steps.setdefault(r["kind"], {"read": 0.0, "v18": 0.0, "v19": 0.0, "best": 0.0})
        s["read"] += r["read_us"]
        s["v18"] += r["v18_us"]
        s["v19"] += r.get("v19_us", float("nan"))
        s["best"] += r.get("best_us", float("nan"))
    print(f"\nlinears of one batch-1 decode step ({LAYERS} layers), ms:")
    print(f"{'kind':5s} {'read':>7s} {'v1.8':>7s} {'v1.9':>7s} {'best swept':>10s}")
    for kind, s in steps.items():
        print(f"{kind:5s} " + " ".join(f"{LAYERS * s[c] / 1e3:7.2f}" for c in ("read", "v18", "v19"))
              + f" {LAYERS * s['best'] / 1e3:10.2f}")
    more = [r for r in res["rows"] if any(key.endswith("_gemv_us") for key in r)]
    if more:
        print("\nmore rows at each shape's best config (us): v1.8 / GEMV")
        for r in more:
            cells = [f"M={key[1:-8]} {r[key.replace('_gemv', '_v18')]:.1f} / {r[key]:.1f}"
                     for key in r if key.endswith("_gemv_us")]
            print(f"  {r['kind']:5s} {r['shape']:8s} " + "  ".join(cells))
    view = tuner_view(res.get("sweep", []))
    if view:
        print("\ntiming from the L2 (one weight replayed, as the autotuner does) against past it, us:")
        print(f"{'kind':5s} {'shape':8s} {'L2-hot pick':>30s} {'hot':>6s} {'past L2':>8s} {'past-L2 pick':>30s} "
              f"{'past L2':>8s} {'lost':>6s}")
        for v in view:
            print(f"{v['kind']:5s} {v['shape']:8s} {v['hot_pick']:>30s} {v['hot_pick_hot_us']:6.1f} "
                  f"{v['hot_pick_us']:8.1f} {v['cold_pick']:>30s} {v['cold_pick_us']:8.1f} {v['lost_us']:6.1f}")
        lost: dict = {}
        for v in view:
            lost[v["kind"]] = lost.get(v["kind"], 0.0) + v["lost_us"]
        print("  a batch-1 step's linears lose, ms: " + ", ".join(f"{k} {LAYERS * us / 1e3:.3f}"
                                                              for k, us in lost.items()))
    fused = [r for r in res["rows"] if "fused_v19_us" in r]
    for r in fused:
        print(f"fused gate/up + SiLU-and-mul, {r['kind']}: v1.8 {r['fused_v18_us']:.1f} us, v1.9 "
              f"{r['fused_v19_us']:.1f} us (rel. err {r['fused_err']:.1e})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="int8,fp8,bf16")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--sweep", choices=("full", "candidates", "none"), default="full")
    ap.add_argument("--budget-s", type=float, default=300.0, help="the sweep stops past this (the table still prints)")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import triton
    if not torch.cuda.is_available():
        print("bench/gemv_rows.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    rows, swept = measure(a.kinds.split(","), [int(r) for r in a.rows.split(",")], a.sweep,
                          t0 + a.budget_s)
    res = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": rows, "sweep": swept}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    ok = sorted((s for s in swept if "us" in s), key=lambda s: (s["kind"], s["shape"], s["us"]))
    print("\nsweep, the five best per kind and shape:")
    for (kind, shape), group in itertools.groupby(ok, key=lambda s: (s["kind"], s["shape"])):
        print(f"  {kind:5s} {shape:8s} " + "; ".join(f"{_name(s)} {s['us']:.1f}" for s in list(group)[:5]))
    report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
