"""The fp8 linear by row count, llama3-8b's four weight shapes: triton-v1.4's (kernels/linear_w8a8.py: weight-only,
then torch._scaled_mm, then the Triton W8A8 GEMM, by rows) and triton-v1.5's (kernels/linear_fp8_f16.py: fp16 dots
up to 32 rows) against triton-v1.3's (weight-only below 64 rows, W8A8
GEMM tuned once per shape above), torch's own fp8 GEMM (`torch._scaled_mm`, row-wise scales) at every row count and
cuBLAS on bf16 weights; and a sweep of the Triton W8A8 GEMM's tile configs at the large row counts, so the
autotuner's candidate list holds the ones that win.

    python3 bench/fp8_rows.py [--rows 1,16,32,64,128,256,512,2048] [--json OUT.json] [--no-sweep]

Times: microseconds per call from a CUDA graph replaying calls round-robin over enough weight copies to be past the
L2 (bench/kernel_timings.py's `bench_graph`); each output checked against its torch reference first. "floor": the
weight bytes (1 per element) at the device-to-device copy rate measured in the same run. A short table last: one
engine step's linears (four shapes x 32 layers) per row count.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
LAYERS = 32
PAST_L2 = 256 * 2**20
# (block_m, block_n, block_k, num_warps, num_stages) of the Triton W8A8 GEMM, swept at the large row counts
GEMM_SWEEP = [(128, 256, 128, 8, 3), (128, 128, 128, 8, 4), (256, 128, 128, 8, 3), (128, 128, 128, 4, 4),
              (128, 256, 64, 8, 4), (64, 256, 128, 8, 3)]
SWEEP_ROWS = (1024, 2048)


def measure(rows: list[int], sweep: bool) -> dict:
    import torch
    import torch.nn.functional as F
    import triton
    from engine_decode import copy_tbs
    from kernel_timings import bench_graph, rel_err

    from sits.kernels import linear_dequant as v13
    from sits.kernels import linear_fp8_f16 as v15
    from sits.kernels import linear_w8a8 as v14
    from sits.kernels import quantize_weight
    from sits.kernels.fp8_gemm import quantize_rows
    copy = copy_tbs("cuda")
    res: dict = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(),
                 "torch": torch.__version__, "triton": triton.__version__, "copy_tbs": copy, "rows": [], "sweep": []}
    print(json.dumps({k: v for k, v in res.items() if k not in ("rows", "sweep")}), flush=True)

    def scaled_mm(x, q):
        xq, xs = quantize_rows(x)
        return torch._scaled_mm(xq, q.qweight.t(), scale_a=xs[:, None], scale_b=q.scale[None, :],
                                out_dtype=torch.bfloat16)

    for name, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        copies = max(2, -(-PAST_L2 // (n * k)))
        qws = [quantize_weight(w * (1 + 0.01 * c), "fp8") for c in range(copies)]
        wbs = [w * (1 + 0.01 * c) for c in range(max(2, copies // 2))]
        floor_us = n * k / (copy * 1e12) * 1e6
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), qws[0].dequantize()).to(torch.bfloat16)  # the fp8 weights, x unrounded
            row = {"shape": name, "n": n, "k": k, "m": m, "floor_us": floor_us}
            for path, fn in (("v1.3", v13.linear_dequant_many_rows), ("v1.4", v14.linear_w8a8),
                             ("v1.5", v15.linear_fp8_f16), ("scaled_mm", scaled_mm)):
                try:
                    row[f"{path}_err"] = rel_err(fn(x, qws[0]), ref)
                    row[f"{path}_us"] = 1e3 * bench_graph([lambda q=q, fn=fn: fn(x, q) for q in qws])
                except Exception as e:  # noqa: BLE001 - report (e.g. a shape torch's fp8 GEMM refuses), go on
                    row[f"{path}_us"] = None
                    row[f"{path}_error"] = str(e).splitlines()[0][:160]
            row["bf16_us"] = 1e3 * bench_graph([lambda wb=wb: F.linear(x, wb) for wb in wbs])
            res["rows"].append(row)
            f = lambda v: f"{v:8.1f}" if v is not None else "   error"  # noqa: E731
            print(f"{name:8s} M={m:5d}  v1.3 {f(row['v1.3_us'])} us  v1.4 {f(row['v1.4_us'])} us  v1.5 "
                  f"{f(row['v1.5_us'])} us  scaled_mm "
                  f"{f(row['scaled_mm_us'])} us  bf16 {row['bf16_us']:8.1f} us  floor {floor_us:6.1f} us  err "
                  f"{row.get('v1.3_err', float('nan')):.1e}/{row.get('v1.4_err', float('nan')):.1e}", flush=True)
            if sweep and m in SWEEP_ROWS:
                for bm, bn, bk, nw, ns in GEMM_SWEEP:
                    cfg = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns)
                    name_c = f"M{bm} N{bn} K{bk} w{nw} s{ns}"
                    try:
                        err = rel_err(v14.linear_w8a8_gemm(x, qws[0], **cfg), ref)
                        us = 1e3 * bench_graph([lambda q=q: v14.linear_w8a8_gemm(x, q, **cfg) for q in qws])
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: report, go on
                        res["sweep"].append({"shape": name, "m": m, "config": name_c, "error": str(e)[:160]})
                        print(f"   sweep {name_c}: {str(e).splitlines()[0][:120]}", flush=True)
                        continue
                    res["sweep"].append({"shape": name, "m": m, "config": name_c, "us": us, "err": err,
                                         "tflops": 2 * m * n * k / us / 1e6})
        del w, qws, wbs
        torch.cuda.empty_cache()
    return res


def sweep_table(res: dict) -> str:
    lines = ["| shape | rows | best GEMM config | us | TFLOP/s | runner-up |", "|---|---:|---|---:|---:|---|"]
    groups: dict = {}
    for s in res["sweep"]:
        if "us" in s:
            groups.setdefault((s["shape"], s["m"]), []).append(s)
    for (shape, m), ss in groups.items():
        ss.sort(key=lambda s: s["us"])
        second = f"{ss[1]['config']} {ss[1]['us']:.1f}" if len(ss) > 1 else ""
        lines.append(f"| {shape} | {m} | {ss[0]['config']} | {ss[0]['us']:.1f} | {ss[0]['tflops']:.0f} | {second} |")
    return "\n".join(lines)


def step_table(res: dict) -> str:
    by_m: dict = {}
    for r in res["rows"]:
        s = by_m.setdefault(r["m"], {})
        for p in ("v1.3", "v1.4", "v1.5", "scaled_mm", "bf16", "floor"):
            v = r.get(f"{p}_us")
            s[p] = None if v is None or s.get(p, 0.0) is None else s.get(p, 0.0) + v * LAYERS / 1e3
    lines = ["| rows | fp8 v1.3 ms/step | fp8 v1.4 ms/step | fp8 v1.5 ms/step | torch _scaled_mm ms/step | "
             "bf16 cuBLAS ms/step | fp8 bytes at copy ms |", "|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    for m, s in sorted(by_m.items()):
        lines.append(f"| {m} | {f(s['v1.3'])} | {f(s['v1.4'])} | {f(s['v1.5'])} | {f(s['scaled_mm'])} | {f(s['bf16'])} | "
                     f"{f(s['floor'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,32,64,128,256,512,1024,2048", help="comma list of row counts (M)")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    ap.add_argument("--no-sweep", action="store_true", help="skip the GEMM tile-config sweep")
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rows {args.rows!r}: expected a comma list of integers")
    if not rows or min(rows) < 1:
        ap.error("--rows: at least one row count, each >= 1")
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("bench/fp8_rows.py needs a CUDA GPU with fp8 tensor cores (sm_89+)", file=sys.stderr)
        return 2
    res = measure(rows, not args.no_sweep)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if res["sweep"]:
        print("\nW8A8 GEMM tile configs (bench/fp8_rows.py GEMM_SWEEP):")
        print(sweep_table(res))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}, copy {res['copy_tbs']:.2f} TB/s; one "
          f"step's linears ({LAYERS} layers x {len(SHAPES)} shapes):")
    print(step_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
