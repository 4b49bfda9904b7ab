"""The W8A8 GEMM at prefill row counts: the persistent TMA kernel (kernels/fp8_gemm_tma.py) against the pointer kernel
that triton-v1.4 .. v1.21 run past 512 rows (kernels/fp8_gemm.py `_linear_fp8_kernel`, tuned as kernels/linear_w8a8.py
tunes it) and torch's fp8 GEMM (`torch._scaled_mm`, cuBLASLt, row-wise scales), on llama3-8b's four weight shapes and
the gate/up projection with triton-v1.16's SiLU-and-mul epilogue, x already quantized per row (the quantization is
the same for all three and not timed).

    python3 bench/fp8_gemm_tma.py [--rows 576,1024,2048,4096] [--square 8192] [--sweep-rows 2048] [--json OUT.json]

Times: microseconds per call from a CUDA graph replaying calls round-robin over enough weight copies to be past the
L2 (bench/kernel_timings.py's `bench_graph`); host microseconds a call with the GPU kept busy (`host_ms`), for the
TMA kernel through Triton's launch (triton-v1.22) and through the project's FastLauncher (v1.23; its output must be
the other launch's bits); for the gate/up projection also with its gate and up rows paired in one accumulator
(triton-v1.24, fast launch). Each output is checked first: the TMA kernel against the pointer kernel (max |difference|
in units of the output's last place, and relative error against the fp32 reference of the same quantized operands).
`--sweep-rows`: every TMA candidate at that many rows, so the candidate list holds the winners (at 512 rows or fewer
also 64-row tiles no set uses: e.g. `--rows 256,2048 --sweep-rows 256,2048` asks whether a TMA route would beat
torch._scaled_mm at a decode batch of 256). The short table last:
one prefill step's linears (q/k/v, o, gate/up + SiLU-and-mul, down; 32 layers), and with the gate/up rows paired.
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

# (name, N, K, SiLU-and-mul epilogue): the weight is [N, K]; with the epilogue the output is [M, N / 2]
SHAPES = (("qkv", 6144, 4096, False), ("o", 4096, 4096, False), ("gate_up+silu", 28672, 4096, True),
          ("down", 4096, 14336, False))
# the tiny model's (hidden 256, intermediate 768) at its default step of 2,048 tokens: where the host's launch cost
# is the question (kernels/linear_w8a8_tma.py TMA_MIN_WORK)
TINY = (("tiny qkv", 768, 256, False), ("tiny gate_up+silu", 1536, 256, True), ("tiny down", 256, 768, False))
LAYERS = 32
PAST_L2 = 256 * 2**20
# bench-only candidates at decode-batch row counts (up to kernels/linear_w8a8.py SCALED_MM_MAX_M, where the sets run
# torch._scaled_mm and a separate SiLU-and-mul): 64-row tiles, so that 256 rows fill more of the SMs; whether a TMA
# route there would pay is the question (no set uses them)
SMALL_M_ROWS = 512
SMALL_M_CONFIGS = ((64, 128, 4, 4), (64, 256, 4, 3), (64, 64, 4, 4))             # (BLOCK_M, BLOCK_N, warps, stages)
SMALL_M_CONFIGS_PAIRED = ((64, 256, 4, 3), (64, 128, 4, 4))                        # BLOCK_N: gate + up columns
PATHS = ("pointer", "tma", "scaled_mm")


def _ulp_diff(a, b) -> float:
    """max |a - b| in units of b's last place (bf16: 2^-7 of the value's binade)."""
    import torch
    a, b = a.float(), b.float()
    ulp = torch.ldexp(torch.ones_like(b), torch.frexp(b.abs().clamp(min=1e-30)).exponent - 8)
    return ((a - b).abs() / ulp).max().item()


def measure(rows: list[int], square: int, sweep_rows: set[int]) -> dict:
    import torch
    import torch.nn.functional as F
    import triton
    from engine_decode import copy_tbs
    from kernel_timings import bench_graph, host_ms, rel_err

    from sits.kernels import fp8_gemm_tma as tma
    from sits.kernels import quantize_weight
    from sits.kernels.fp8_gemm import quantize_rows
    from sits.kernels.linear_w8a8 import _gemm_launch
    from sits.kernels.silu_and_mul import silu_and_mul
    res: dict = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(),
                 "torch": torch.__version__, "triton": triton.__version__, "copy_tbs": copy_tbs("cuda"), "rows": [],
                 "sweep": []}
    print(json.dumps({k: v for k, v in res.items() if k not in ("rows", "sweep")}), flush=True)
    cases = [(name, n, k, silu, rows) for name, n, k, silu in SHAPES]
    if square:
        cases.append((f"square {square}", square, square, False, [square]))
    cases += [(name, n, k, silu, [2048]) for name, n, k, silu in TINY]
    for name, n, k, silu, ms in cases:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        copies = max(2, -(-PAST_L2 // (n * k)))
        qws = [quantize_weight(w * (1 + 0.01 * c), "fp8") for c in range(copies)]
        del w
        n_out = n // 2 if silu else n
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = quantize_rows(x)
            outs = {p: torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16) for p in PATHS}
            ref = (xq.float() @ qws[0].qweight.float().t()) * xs[:, None] * qws[0].scale[None, :]
            if silu:
                gate, up = ref[:, :n_out].to(torch.bfloat16).float(), ref[:, n_out:].to(torch.bfloat16).float()
                ref = F.silu(gate) * up

            def call(path, q, cfg=None):
                if path == "pointer":
                    _gemm_launch(xq, xs, q, None, outs[path], None, silu_epi=silu)
                elif path in ("tma", "tma_fast", "tma_paired"):
                    tma.gemm_tma(xq, xs, q, None, outs[path], silu_epi=silu, config=cfg,
                                 fast_launch=path != "tma", paired=path == "tma_paired")
                else:
                    y = torch._scaled_mm(xq, q.qweight.t(), scale_a=xs[:, None], scale_b=q.scale[None, :],
                                         out_dtype=torch.bfloat16)
                    # with SiLU-and-mul: the engine's route up to 512 rows (v1.21's op): the project's kernel after
                    outs[path] = silu_and_mul(y) if silu else y

            row = {"shape": name, "n": n, "k": k, "m": m, "silu": silu}
            for path in PATHS:
                call(path, qws[0])
                row[f"{path}_err"] = rel_err(outs[path], ref)
                row[f"{path}_us"] = 1e3 * bench_graph([lambda q=q, p=path: call(p, q) for q in qws])
                row[f"{path}_host_us"] = 1e3 * host_ms(lambda p=path: call(p, qws[0]), calls=16)
            # triton-v1.23's launch of the same kernel: the host time it costs (its GPU time is the TMA column's)
            outs["tma_fast"] = torch.empty_like(outs["tma"])
            call("tma_fast", qws[0])
            row["tma_fast_equal"] = bool(torch.equal(outs["tma_fast"], outs["tma"]))
            row["tma_fast_host_us"] = 1e3 * host_ms(lambda: call("tma_fast", qws[0]), calls=16)
            row["tma_vs_pointer_ulp"] = _ulp_diff(outs["tma"], outs["pointer"])
            row["tma_config"] = tma._BEST.get((xq.device, n_out, k, torch.bfloat16, False, silu, False))
            flops = 2 * m * n * k
            if silu:   # triton-v1.24: the gate and up rows paired in one accumulator, through FastLauncher
                outs["tma_paired"] = torch.empty_like(outs["tma"])
                call("tma_paired", qws[0])
                row["tma_paired_err"] = rel_err(outs["tma_paired"], ref)
                row["tma_paired_us"] = 1e3 * bench_graph([lambda q=q: call("tma_paired", q) for q in qws])
                row["tma_paired_host_us"] = 1e3 * host_ms(lambda: call("tma_paired", qws[0]), calls=16)
                row["tma_paired_vs_pointer_ulp"] = _ulp_diff(outs["tma_paired"], outs["pointer"])
                row["tma_paired_config"] = tma._BEST.get((xq.device, n_out, k, torch.bfloat16, False, True, True))
                print(f"{name:14s} M={m:5d}  tma paired {row['tma_paired_us']:8.1f} us "
                      f"({flops / row['tma_paired_us'] / 1e6:5.0f} TFLOP/s)  paired-pointer "
                      f"{row['tma_paired_vs_pointer_ulp']:.0f} ulp  err {row['tma_paired_err']:.1e}  host "
                      f"{row['tma_paired_host_us']:.0f} us  {row['tma_paired_config']}", flush=True)
            res["rows"].append(row)
            print(f"{name:14s} M={m:5d}  pointer {row['pointer_us']:8.1f} us ({flops / row['pointer_us'] / 1e6:5.0f} "
                  f"TFLOP/s)  tma {row['tma_us']:8.1f} us ({flops / row['tma_us'] / 1e6:5.0f})  scaled_mm "
                  f"{row['scaled_mm_us']:8.1f} us ({flops / row['scaled_mm_us'] / 1e6:5.0f})  tma-pointer "
                  f"{row['tma_vs_pointer_ulp']:.0f} ulp  err {row['pointer_err']:.1e}/{row['tma_err']:.1e}  host "
                  f"{row['pointer_host_us']:.0f}/{row['tma_host_us']:.0f}/{row['tma_fast_host_us']:.0f} us (fast "
                  f"launch {'same bits' if row['tma_fast_equal'] else 'DIFFERENT BITS'})  {row['tma_config']}",
                  flush=True)
            if m in sweep_rows:
                candidates = [("tma", c) for c in (tma.CONFIGS_SILU if silu else tma.CONFIGS)]
                candidates += [("tma_paired", c) for c in (tma.CONFIGS_PAIRED if silu else ())]
                if m <= SMALL_M_ROWS:
                    candidates += [("tma_paired" if silu else "tma", tma._config(bm, bn, w, st, False))
                                   for bm, bn, w, st in (SMALL_M_CONFIGS_PAIRED if silu else SMALL_M_CONFIGS)]
                for path, c in candidates:
                    cfg = {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}
                    label = (f"{'paired ' if path == 'tma_paired' else ''}{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x"
                             f"{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"
                             f"{' split' if cfg['EPILOGUE_SPLIT'] else ''}")
                    try:
                        us = 1e3 * bench_graph([lambda q=q, p=path: call(p, q, cfg) for q in qws])
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: report, go on
                        res["sweep"].append({"shape": name, "m": m, "config": label, "error": str(e)[:160]})
                        continue
                    res["sweep"].append({"shape": name, "m": m, "config": label, "us": us,
                                         "tflops": flops / us / 1e6})
        del qws
        torch.cuda.empty_cache()
    return res


def sweep_table(res: dict) -> str:
    lines = ["| shape | rows | TMA config | us | TFLOP/s |", "|---|---:|---|---:|---:|"]
    for s in res["sweep"]:
        tail = f"{s['us']:.1f} | {s['tflops']:.0f}" if "us" in s else f"error: {s['error'][:60]} |"
        lines.append(f"| {s['shape']} | {s['m']} | {s['config']} | {tail} |")
    return "\n".join(lines)


def call_table(res: dict) -> str:
    """Every call: GPU us (TFLOP/s) by path, host us a call, the TMA kernel's distance from the pointer kernel's."""
    lines = ["| shape | rows | pointer us (TFLOP/s) | TMA us (TFLOP/s) | torch._scaled_mm us (TFLOP/s) | "
             "TMA / pointer | host us a call, pointer / TMA / TMA fast launch | TMA - pointer, max ulp |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        flops = 2 * r["m"] * r["n"] * r["k"]
        cell = lambda p: f"{r[p + '_us']:.1f} ({flops / r[p + '_us'] / 1e6:.0f})"  # noqa: E731
        lines.append(f"| {r['shape']} | {r['m']} | {cell('pointer')} | {cell('tma')} | {cell('scaled_mm')} | "
                     f"{r['tma_us'] / r['pointer_us']:.3f} | {r['pointer_host_us']:.0f} / {r['tma_host_us']:.0f} / "
                     f"{r['tma_fast_host_us']:.0f}{'' if r['tma_fast_equal'] else ' (bits differ)'} | "
                     f"{r['tma_vs_pointer_ulp']:.0f} |")
        if "tma_paired_us" in r:   # triton-v1.24's gate/up: GPU time, its host time (fast launch), its distance
            lines.append(f"| {r['shape']}, rows paired | {r['m']} | | {cell('tma_paired')} | | "
                         f"{r['tma_paired_us'] / r['pointer_us']:.3f} | {r['tma_paired_host_us']:.0f} (fast launch) | "
                         f"{r['tma_paired_vs_pointer_ulp']:.0f} |")
    return "\n".join(lines)


def step_table(res: dict) -> str:
    """One llama3-8b prefill step's four linears x LAYERS per row count."""
    lines = ["| rows | pointer ms/step | TMA ms/step | TMA, gate/up paired ms/step | torch._scaled_mm ms/step | "
             "TMA / pointer | paired / pointer |", "|---:|---:|---:|---:|---:|---:|---:|"]
    by_m: dict = {}
    for r in res["rows"]:
        if r["shape"] not in {s[0] for s in SHAPES}:
            continue
        s = by_m.setdefault(r["m"], dict.fromkeys((*PATHS, "paired"), 0.0))
        for p in PATHS:
            s[p] += r[f"{p}_us"] * LAYERS / 1e3
        s["paired"] += r.get("tma_paired_us", r["tma_us"]) * LAYERS / 1e3
    for m, s in sorted(by_m.items()):
        lines.append(f"| {m} | {s['pointer']:.2f} | {s['tma']:.2f} | {s['paired']:.2f} | {s['scaled_mm']:.2f} | "
                     f"{s['tma'] / s['pointer']:.3f} | {s['paired'] / s['pointer']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="576,1024,2048,4096", help="comma list of row counts (M)")
    ap.add_argument("--square", type=int, default=8192, help="also M = N = K = this (0: none)")
    ap.add_argument("--sweep-rows", default="2048", help="row counts at which every TMA candidate is timed")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",") if r.strip()]
        sweep = {int(r) for r in args.sweep_rows.split(",") if r.strip()}
    except ValueError:
        ap.error("--rows / --sweep-rows: expected comma lists of integers")
    if not rows or min(rows) < 1:
        ap.error("--rows: at least one row count, each >= 1")
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("bench/fp8_gemm_tma.py needs a CUDA GPU with TMA and fp8 tensor cores (sm_90+)", file=sys.stderr)
        return 2
    res = measure(rows, args.square, sweep)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    if res["sweep"]:
        print("\nTMA candidates (kernels/fp8_gemm_tma.py CONFIGS, CONFIGS_SILU, CONFIGS_PAIRED):")
        print(sweep_table(res))
    print("\nEvery call (GPU time from CUDA graphs past the L2; host time with the GPU kept busy):")
    print(call_table(res))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}; one prefill step's linears ({LAYERS} "
          f"layers x {len(SHAPES)} shapes, x quantized beforehand):")
    print(step_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
