"""What bounds decode attention over FP8 pages: Nsight Compute's counters for one launch each of the bf16 kernel
(triton-v1, bf16 pages), triton-v1.5's and triton-v1.8's FP8 kernels, at 256 sequences of 2,304 tokens (llama3-8b's
attention: 32 query heads, 8 kv heads, head_dim 128, pages of 64 tokens in shuffled blocks).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \\
        --metrics "$(python3 bench/decode_attention_ncu.py --stall-metrics)" --csv --page details \\
        python3 bench/decode_attention_ncu.py > ncu.csv
    python3 bench/decode_attention_ncu.py --summary ncu.csv       # the metrics that matter, one row per kernel

Why: bench/decode_attention_fp8.py found every FP8 variant at 2.2-2.3 TB/s (543-570 us a layer) where the bf16
kernel reads twice the bytes at 4.2-4.4 TB/s, and cutting the FP8 kernel's instructions by a third (triton-v1.8's
conversions where the tiles are loaded) changed the time by 1-4 %: the counters say what does bound it. Each kernel
runs (compiles, tunes) before the profiled region; inside it, one launch each, in the order above.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HQ, HKV, D = 32, 8, 128
# (section of ncu's details page, metric name): what the summary prints
METRICS = ["Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput", "Registers Per Thread",
           "Achieved Occupancy", "Theoretical Occupancy", "Block Limit Registers", "Block Limit Shared Mem",
           "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "L2 Hit Rate", "L1/TEX Hit Rate",
           "Mem Busy", "Max Bandwidth", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block"]


STALLS = ["long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "lg_throttle", "wait", "math_pipe_throttle",
          "not_selected", "selected", "dispatch_stall", "membar", "no_instruction", "drain", "imc_miss", "tex_throttle",
          "branch_resolving", "misc"]


def stall_metrics() -> str:
    """ncu --metrics: warps stalled on each reason per issued instruction (their sum is Warp Cycles Per Issued
    Instruction)."""
    return ",".join(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS)


def run(b: int, ctx: int) -> None:
    import torch

    from bench.decode_attention_fp8 import fp8_pages
    from bench.kernel_timings import paged
    from sits.kernels.paged_decode_attention import paged_decode_attention
    from sits.kernels.paged_decode_attention_fp8 import (paged_decode_attention_fp8kv_f16,
                                                         paged_decode_attention_fp8kv_staged)
    kc, vc, tables = paged([ctx] * b, HKV, D, torch.bfloat16)
    q = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    k8, v8 = fp8_pages(kc), fp8_pages(vc)
    calls = [("bf16 (triton-v1)", lambda: paged_decode_attention(q, kc, vc, tables, lens, scale)),
             ("fp8 triton-v1.5", lambda: paged_decode_attention_fp8kv_f16(q, k8, v8, tables, lens, scale)),
             ("fp8 triton-v1.8", lambda: paged_decode_attention_fp8kv_staged(q, k8, v8, tables, lens, scale))]
    for _, call in calls:   # compile and tune outside the profiled region
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in calls:
        print(f"profiling {name}", file=sys.stderr, flush=True)
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def summary(path: Path) -> None:
    """ncu's --csv --page details output: one row per (kernel launch, section, metric)."""
    rows = list(csv.DictReader(line for line in path.read_text().splitlines() if line.startswith('"')))
    by_launch: dict[str, dict[str, str]] = {}
    names: dict[str, str] = {}
    for r in rows:
        launch = r.get("ID", "?")
        names[launch] = r.get("Kernel Name", "?")[:40]
        value = f"{r.get('Metric Value', '')} {r.get('Metric Unit', '')}".strip()
        by_launch.setdefault(launch, {})[r.get("Metric Name", "")] = value
    launches = sorted(by_launch, key=lambda x: int(x) if x.isdigit() else 0)
    print("| metric | " + " | ".join(f"{i}: {names[i]}" for i in launches) + " |")
    print("|---|" + "---:|" * len(launches))
    for m in METRICS:
        print(f"| {m} | " + " | ".join(by_launch[i].get(m, "") for i in launches) + " |")
    # the warp stall reasons (stall_metrics), largest first for the last launch

    def value(m, i):
        try:
            return float(by_launch[i].get(m, "0").split()[0].replace(",", ""))
        except ValueError:
            return 0.0
    stalls = [m for m in {m for i in launches for m in by_launch[i]} if "issue_stalled" in m]
    for m in sorted(stalls, key=lambda m: -value(m, launches[-1])):
        short = m.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
        print(f"| {short} | " + " | ".join(f"{value(m, i):.2f}" for i in launches) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="256x2304", help="BATCHxCONTEXT")
    ap.add_argument("--summary", type=Path, help="print the summary of this ncu CSV instead of running kernels")
    ap.add_argument("--stall-metrics", action="store_true", help="print the --metrics list for ncu")
    args = ap.parse_args(argv)
    if args.stall_metrics:
        print(stall_metrics())
        return 0
    if args.summary:
        summary(args.summary)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench/decode_attention_ncu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    b, ctx = (int(x) for x in args.shape.lower().split("x"))
    run(b, ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
