"""The gate/up projection with fp8 weights at prefill sizes: triton-v1.15's two ops (the W8A8 GEMM writing [T, 2I],
then SiLU-and-mul) against triton-v1.16's one (the same GEMM with the SiLU-and-mul epilogue,
kernels/linear_w8a8_silu.py), at llama3-8b's gate/up shape [28,672, 4,096], in one run.

    python3 bench/w8a8_silu_rows.py [--rows 576,1024,2048,4096] [--json OUT.json]
    TRITON_INTERPRET=1 .venv/bin/python bench/w8a8_silu_rows.py --smoke   # CPU: the two agree bit for bit

Each op is called once first (its autotuning at that row count), its output checked against v1.15's, then timed:
medians of triton.testing.do_bench (the L2 flushed). "32 layers": the per-call difference times llama3-8b's layers,
what one prefill step of that many tokens would save. The table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

I, H, LAYERS = 14336, 4096, 32


def _ops():
    from sits.kernels import get_kernel_set
    return get_kernel_set("triton-v1.15").linear_silu_and_mul, get_kernel_set("triton-v1.16").linear_silu_and_mul


def smoke() -> int:
    """Under TRITON_INTERPRET=1 on CPU: small shapes past 512 rows, the two sets' ops bit for bit."""
    import torch

    from sits.kernels import quantize_weight
    v115, v116 = _ops()
    g = torch.Generator().manual_seed(0)
    qw = quantize_weight(torch.randn(96, 64, generator=g) * 0.125, "fp8")
    x = torch.randn(520, 64, generator=g)
    same = torch.equal(v115(x, qw), v116(x, qw))
    print(f"smoke: 520 rows x [96, 64] gate/up, v1.16 {'equals' if same else 'DIFFERS FROM'} v1.15")
    return 0 if same else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="576,1024,2048,4096")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU, under TRITON_INTERPRET=1: the two ops agree")
    args = ap.parse_args(argv)
    if args.smoke:
        from bench.kernel_timings import run_smoke
        return run_smoke(smoke)
    import torch
    import triton
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        print("bench/w8a8_silu_rows.py needs a CUDA GPU with fp8 tensor cores (or --smoke)", file=sys.stderr)
        return 2
    from bench.kernel_timings import bench, rel_err
    from sits.kernels import quantize_weight
    v115, v116 = _ops()
    g = torch.Generator(device="cuda").manual_seed(0)
    qw = quantize_weight(torch.randn(2 * I, H, device="cuda", generator=g) * H ** -0.5, "fp8")
    res = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    print(f"{res['device']}: llama3-8b gate/up [{2 * I}, {H}] fp8, x bf16", flush=True)
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, H, device="cuda", generator=g).to(torch.bfloat16)
        want, got = v115(x, qw), v116(x, qw)   # each tunes here, once per row count
        row = {"rows": m, "err": rel_err(got, want), "v115_us": bench(lambda: v115(x, qw)) * 1e3,
               "v116_us": bench(lambda: v116(x, qw)) * 1e3}
        res["rows"].append(row)
        print(f"  {m} rows: v1.15 {row['v115_us']:.0f} us, v1.16 {row['v116_us']:.0f} us, "
              f"relative difference {row['err']:.1e}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: gate/up projection + SiLU-and-mul, fp8 "
          "weights, us a call")
    print("| rows | v1.15 (GEMM, then SiLU-and-mul) | v1.16 (epilogue) | v1.16 / v1.15 | 32 layers, ms saved | "
          "relative difference |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in res["rows"]:
        print(f"| {r['rows']} | {r['v115_us']:.0f} | {r['v116_us']:.0f} | {r['v116_us'] / r['v115_us']:.2f} | "
              f"{(r['v115_us'] - r['v116_us']) * LAYERS / 1e3:.2f} | {r['err']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
