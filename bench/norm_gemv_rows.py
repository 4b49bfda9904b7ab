"""triton-v1.10's norm-in-the-GEMV (kernels/norm_linear.py) against triton-v1.9's two ops (the norm kernel, then the
GEMV) at llama3-8b's two normed projections, one row.

    python3 bench/norm_gemv_rows.py [--kinds bf16,int8,fp8] [--json OUT]

Per weight kind and projection (q/k/v: add_rms_norm_linear, 6144 x 4096; gate/up with the SiLU-and-mul epilogue:
add_rms_norm_linear_silu_and_mul, 28672 x 4096), microseconds per call from a CUDA graph replaying calls
round-robin over weight copies past the L2 (bench/kernel_timings.py's `bench_graph`): the norm kernel alone
(kernels/rms_norm.py with the residual add), v1.9's GEMV alone, v1.9's two ops, v1.10's fused op (each autotuned as
the engine tunes it), then every autotuning candidate as a fixed config for the GEMV alone and for the fused GEMV
with h stored inside the main loop (the default) and after the dot products (RES_AFTER). Every fused output is
checked against the two ops' (rel. error) before it is timed. The step columns: 32 layers of both projections. A
table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gemv_rows import LAYERS, _weights  # noqa: E402

OPS = {"qkv": ("add_rms_norm_linear", 6144, False), "gate_up": ("add_rms_norm_linear_silu_and_mul", 28672, True)}
K = 4096
EPS = 1e-5


def measure(kinds: list[str]) -> list[dict]:
    import torch

    from bench.kernel_timings import bench_graph, rel_err
    from sits.kernels import get_kernel_set
    from sits.kernels import linear_gemv as lg
    v19, v110 = get_kernel_set("triton-v1.9"), get_kernel_set("triton-v1.10")
    rows = []
    for kind in kinds:
        for shape, (op, n, silu) in OPS.items():
            ws = _weights(kind, n, K)
            x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
            nw = 1 + 0.1 * torch.randn(K, device="cuda", dtype=torch.bfloat16)
            two, fused = v19.op(op), v110.op(op)
            ref = two(x, ws[0], r, nw, EPS)[0]
            row = {"kind": kind, "shape": shape, "op": op, "n": n, "k": K}
            row["norm_us"] = 1e3 * bench_graph([lambda: v19.fused_add_rms_norm(x, r, nw, EPS)])
            project = v19.linear_silu_and_mul if silu else v19.linear
            row["gemv_us"] = 1e3 * bench_graph([lambda q=q: project(x, q) for q in ws])
            row["two_ops_us"] = 1e3 * bench_graph([lambda q=q: two(x, q, r, nw, EPS) for q in ws])
            row["fused_err"] = rel_err(fused(x, ws[0], r, nw, EPS)[0], ref)
            row["fused_us"] = 1e3 * bench_graph([lambda q=q: fused(x, q, r, nw, EPS) for q in ws])
            out = torch.empty(1, n // 2 if silu else n, device="cuda", dtype=torch.bfloat16)
            res = torch.empty_like(r)
            for c in lg.CANDIDATES:
                cfg = dict(**c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
                name = f"N{cfg['BLOCK_N']} K{cfg['BLOCK_K']} w{cfg['num_warps']}"
                lg.gemv(x, ws[0], None, out, silu_epi=silu, config=cfg)
                plain_us = 1e3 * bench_graph([lambda q=q: lg.gemv(x, q, None, out, silu_epi=silu, config=cfg)
                                              for q in ws])
                cell = {"config": name, "gemv_us": plain_us}
                for after in (False, True):
                    c2 = {**cfg, "RES_AFTER": after}
                    lg.gemv(x, ws[0], None, out, silu_epi=silu, norm=(r, nw, EPS, res), config=c2)
                    cell[f"err_after_{after}"] = rel_err(out, ref)
                    cell[f"fused_after_{after}_us"] = 1e3 * bench_graph(
                        [lambda q=q: lg.gemv(x, q, None, out, silu_epi=silu, norm=(r, nw, EPS, res), config=c2)
                         for q in ws])
                row.setdefault("configs", []).append(cell)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del ws
            torch.cuda.empty_cache()
    return rows


def report(res: dict) -> None:
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: us per call at one row (llama3-8b)")
    print(f"{'kind':5s} {'proj':8s} {'norm':>6s} {'gemv':>7s} {'v1.9 two ops':>12s} {'v1.10 fused':>11s} "
          f"{'err':>8s}")
    steps: dict = {}
    for r in res["rows"]:
        print(f"{r['kind']:5s} {r['shape']:8s} {r['norm_us']:6.1f} {r['gemv_us']:7.1f} {r['two_ops_us']:12.1f} "
              f"{r['fused_us']:11.1f} {r['fused_err']:8.1e}")
        s = steps.setdefault(r["kind"], [0.0, 0.0])
        s[0] += r["two_ops_us"]
        s[1] += r["fused_us"]
    print(f"\nboth normed projections of one batch-1 step ({LAYERS} layers), ms: v1.9 two ops / v1.10 fused")
    for kind, (a, b) in steps.items():
        print(f"  {kind:5s} {LAYERS * a / 1e3:.3f} / {LAYERS * b / 1e3:.3f}")
    print("\nfixed configs (us): GEMV alone / fused, h stored in the loop (default) / fused, h stored after it")
    for r in res["rows"]:
        for c in r.get("configs", []):
            print(f"  {r['kind']:5s} {r['shape']:8s} {c['config']:16s} {c['gemv_us']:7.1f} / "
                  f"{c['fused_after_False_us']:7.1f} / {c['fused_after_True_us']:7.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="bf16,int8,fp8")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import triton
    if not torch.cuda.is_available():
        print("bench/norm_gemv_rows.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = measure(a.kinds.split(","))
    res = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
