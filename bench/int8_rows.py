"""The weight-only int8 linear by row count, llama3-8b's four weight shapes: the Triton kernel (triton-v1/v1.1), the
dequantize-then-cuBLAS path (triton-v1.2 from DEQUANT_MIN_M rows on) and cuBLAS on bf16 weights; plus what each
autotuner's candidates measured, so the candidate lists can be kept to the ones that win.

    python3 bench/int8_rows.py [--rows 16,32,64,128,256,512,1024,2048] [--json OUT.json]

Times: microseconds per call from a CUDA graph replaying calls round-robin over enough weight copies to be past the
L2 (bench/kernel_timings.py's `bench_graph`), each output checked against the torch reference first. "step" columns: the
four shapes x 32 layers, i.e. one engine step's linears. A short table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
LAYERS = 32
PAST_L2 = 256 * 2**20  # bytes of weight copies per timing: well past the H200's 60 MB L2


def _family(m: int) -> str:
    return "small" if m <= 16 else "mid32" if m <= 32 else "mid64" if m <= 64 else "large"


def measure(rows: list[int]) -> dict:
    import torch
    import torch.nn.functional as F

    from bench.kernel_timings import _config_name, bench_graph, rel_err
    from sits.kernels import linear as lin
    from sits.kernels import linear_dequant as deq
    from sits.kernels import quantize_weight
    res: dict = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                 "torch": torch.__version__, "rows": [], "autotune": []}
    import triton
    res["triton"] = triton.__version__
    default = deq.DEQUANT_MIN_M
    tuned: set = set()
    for name, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        copies = max(2, -(-PAST_L2 // (n * k)))
        qws = [quantize_weight(w * (1 + 0.01 * c), "int8") for c in range(copies)]
        wbs = [w * (1 + 0.01 * c) for c in range(max(2, copies // 2))]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = lin.linear_ref(x, qws[0])
            row = {"shape": name, "n": n, "k": k, "m": m}
            for path, fn in (("triton", lin.linear), ("dequant", deq.linear_dequant_many_rows)):
                deq.DEQUANT_MIN_M = 1  # every row count through the path under test
                try:
                    row[f"{path}_err"] = rel_err(fn(x, qws[0]), ref)
                    row[f"{path}_us"] = 1e3 * bench_graph([lambda q=q, fn=fn: fn(x, q) for q in qws])
                finally:
                    deq.DEQUANT_MIN_M = default
                fam = _family(m)
                at = lin.autotuner_for(m)
                if path == "triton" and (fam, n, k) not in tuned and hasattr(at, "best_config"):  # it tuned
                    tuned.add((fam, n, k))
                    timings = {_config_name(c): (t[0] if isinstance(t, (list, tuple)) else t) * 1e3
                               for c, t in getattr(at, "configs_timings", {}).items()}
                    res["autotune"].append({"family": fam, "shape": name, "best": _config_name(at.best_config),
                                            "us": timings})
            row["bf16_us"] = 1e3 * bench_graph([lambda wb=wb: F.linear(x, wb) for wb in wbs])
            res["rows"].append(row)
            print(f"{name:8s} M={m:5d}  triton {row['triton_us']:9.1f} us  dequant+cuBLAS {row['dequant_us']:9.1f} us"
                  f"  bf16 cuBLAS {row['bf16_us']:9.1f} us  err {row['triton_err']:.1e}/{row['dequant_err']:.1e}",
                  flush=True)
        del w, qws, wbs
        torch.cuda.empty_cache()
    return res


def step_table(res: dict) -> str:
    by_m: dict = {}
    for r in res["rows"]:
        s = by_m.setdefault(r["m"], {"triton": 0.0, "dequant": 0.0, "bf16": 0.0, "shapes": 0})
        for p in ("triton", "dequant", "bf16"):
            s[p] += r[f"{p}_us"] * LAYERS / 1e3
        s["shapes"] += 1
    lines = ["| rows | int8 Triton ms/step | int8 dequantize + cuBLAS ms/step | bf16 cuBLAS ms/step | faster |",
             "|---:|---:|---:|---:|---|"]
    for m, s in sorted(by_m.items()):
        best = "dequantize + cuBLAS" if s["dequant"] < s["triton"] else "Triton"
        lines.append(f"| {m} | {s['triton']:.2f} | {s['dequant']:.2f} | {s['bf16']:.2f} | {best} |")
    return "\n".join(lines)


def autotune_table(res: dict) -> str:
    lines = []
    for a in res["autotune"]:
        best = min(a["us"].values()) if a["us"] else float("nan")
        ranked = sorted(a["us"].items(), key=lambda kv: kv[1])
        lines.append(f"{a['family']:6s} {a['shape']:8s} best {a['best']:40s} " +
                     ", ".join(f"{c} {t / best:.2f}x" for c, t in ranked[1:]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,32,64,128,256,512,1024,2048", help="comma list of row counts (M)")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rows {args.rows!r}: expected a comma list of integers")
    if not rows or min(rows) < 1:
        ap.error("--rows: at least one row count, each >= 1")
    import torch
    if not torch.cuda.is_available():
        print("bench/int8_rows.py needs a CUDA GPU", file=sys.stderr)
        return 2
    res = measure(rows)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print("\nautotune candidates (time relative to the winner):")
    print(autotune_table(res))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}; one step's linears "
          f"({LAYERS} layers x {len(SHAPES)} shapes):")
    print(step_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
