"""The fused MLP activations against triton-v1.5's two ops, int8 and fp8 weights, by row count: triton-v1.6's
SiLU-and-mul in the down projection's prologue (llama3-8b's down projection, N 4096, I 14336: silu_and_mul, then the
linear) and triton-v1.7's in the gate/up projection's epilogue (N 2 x 14336, H 4096: the linear, then silu_and_mul).
Optionally (--sweep) fixed launch configs of the weight-only kernel with and without the SILU_MUL prologue at the
down projection, each compiled kernel's registers and spills beside its time.

    python3 bench/fused_rows.py [--rows 1,8,16,32] [--sweep int8:1,int8:32,fp8:1] [--json OUT.json]

Times: microseconds per call from a CUDA graph replaying calls round-robin over weight copies past the L2
(bench/kernel_timings.py's `bench_graph`); every fused output is checked against the two ops first. A table last.
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N, I = 4096, 14336            # llama3-8b: hidden H = N, intermediate I; down [N, I], gate/up [2 I, N]
PAST_L2 = 256 * 2**20         # bytes of weight copies per timing: well past the H200's 60 MB L2


def _weights(kind: str, n: int = N, k: int = I):
    import torch

    from sits.kernels import quantize_weight
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    return [quantize_weight(w * (1 + 0.01 * c), kind) for c in range(max(2, -(-PAST_L2 // (n * k))))]


def measure(rows: list[int]) -> list[dict]:
    import torch

    from bench.kernel_timings import bench_graph, rel_err
    from sits.kernels import get_kernel_set
    v15, v16, v17 = (get_kernel_set(f"triton-v1.{i}") for i in (5, 6, 7))
    out = []
    for kind in ("int8", "fp8"):
        for fusion in ("prologue", "epilogue"):
            qws = _weights(kind) if fusion == "prologue" else _weights(kind, 2 * I, N)
            for m in rows:
                if fusion == "prologue":   # v1.6: [gate | up] -> down projection
                    x = torch.randn(m, 2 * I, device="cuda", dtype=torch.bfloat16) * 2
                    act = v15.silu_and_mul(x)
                    two = v15.linear(act, qws[0])
                    fused = v16.silu_and_mul_linear(x, qws[0])
                    row = {"silu_us": 1e3 * bench_graph([lambda: v15.silu_and_mul(x)] * 2),
                           "linear_us": 1e3 * bench_graph([lambda q=q: v15.linear(act, q) for q in qws]),
                           "two_ops_us": 1e3 * bench_graph([lambda q=q: v15.linear(v15.silu_and_mul(x), q)
                                                            for q in qws]),
                           "fused_us": 1e3 * bench_graph([lambda q=q: v16.silu_and_mul_linear(x, q) for q in qws])}
                else:                      # v1.7: hidden -> gate/up projection -> [T, I]
                    x = torch.randn(m, N, device="cuda", dtype=torch.bfloat16)
                    gu = v15.linear(x, qws[0])
                    two = v15.silu_and_mul(gu)
                    fused = v17.linear_silu_and_mul(x, qws[0])
                    row = {"silu_us": 1e3 * bench_graph([lambda: v15.silu_and_mul(gu)] * 2),
                           "linear_us": 1e3 * bench_graph([lambda q=q: v15.linear(x, q) for q in qws]),
                           "two_ops_us": 1e3 * bench_graph([lambda q=q: v15.silu_and_mul(v15.linear(x, q))
                                                            for q in qws]),
                           "fused_us": 1e3 * bench_graph([lambda q=q: v17.linear_silu_and_mul(x, q) for q in qws])}
                row = {"kind": kind, "fusion": fusion, "m": m, "err_vs_two_ops": rel_err(fused, two), **row}
                out.append(row)
                print(f"{kind} {fusion} M={m:3d}  silu {row['silu_us']:6.1f}  linear {row['linear_us']:6.1f}  two "
                      f"ops {row['two_ops_us']:6.1f}  fused {row['fused_us']:6.1f} us  err {row['err_vs_two_ops']:.1e}",
                      flush=True)
            del qws
            torch.cuda.empty_cache()
    return out


def winners() -> list[dict]:
    """What the weight-only kernel's autotuners chose for each key they saw (key tuple -> config)."""
    from bench.kernel_timings import _config_name
    from sits.kernels import linear as lin
    got = []
    for fam, at in (("small", lin._linear_small_m), ("mid32", lin._linear_mid_m[32]), ("mid64", lin._linear_mid_m[64])):
        for key, cfg in getattr(at, "cache", {}).items():
            got.append({"family": fam, "key": [str(k) for k in key], "config": _config_name(cfg)})
    return got


def sweep(cases: list[tuple[str, int]]) -> list[dict]:
    import torch

    from bench.kernel_timings import bench_graph
    from sits.kernels import linear as lin
    from sits.kernels.linear_fp8_f16 import F16_DOT_MAX_M
    res = []
    for kind, m in cases:
        qws = _weights(kind)
        f16 = kind == "fp8" and m <= F16_DOT_MAX_M
        bm = 16 if m <= 16 else 32
        xs = {False: torch.randn(m, I, device="cuda", dtype=torch.bfloat16),
              True: torch.randn(m, 2 * I, device="cuda", dtype=torch.bfloat16)}
        o = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        for bk, split, stages, warps, silu in itertools.product((128, 256), (2, 4, 8), (2, 4), (4, 8), (False, True)):
            cfg = dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages)
            try:
                ck = lin._launch(xs[silu], qws[0], None, o, "tf32", cfg, f16, silu)
                us = 1e3 * bench_graph([lambda q=q: lin._launch(xs[silu], q, None, o, "tf32", cfg, f16, silu)
                                        for q in qws])
            except Exception as e:   # a config that does not compile (shared memory): recorded, not fatal
                res.append({"kind": kind, "m": m, "silu_mul": silu, **cfg, "error": str(e)[:200]})
                continue
            r = {"kind": kind, "m": m, "silu_mul": silu, **cfg, "us": us,
                 "regs": getattr(ck, "n_regs", None), "spills": getattr(ck, "n_spills", None)}
            res.append(r)
            print(f"{kind} M={m:3d} {'fused' if silu else 'plain'}  K{bk} split{split} s{stages} w{warps}  "
                  f"{us:7.1f} us  regs {r['regs']} spills {r['spills']}", flush=True)
        del qws
        torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,16,32")
    ap.add_argument("--sweep", default="", help="kind:rows cases of a prologue config sweep, e.g. int8:1,fp8:1")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import triton
    if not torch.cuda.is_available():
        print("bench/fused_rows.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = measure([int(r) for r in a.rows.split(",")])
    won = winners()
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in a.sweep.split(",") if c]
    swept = sweep(cases)
    res = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": rows, "autotune": won, "sweep": swept}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print("\nautotune winners:")
    for w in won:
        print(f"  {w['family']:6s} {' '.join(w['key'][:4])}  {w['config']}")
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: us per call; prologue = v1.6 at the down "
          f"projection ({N} x {I}), epilogue = v1.7 at the gate/up projection ({2 * I} x {N})")
    print(f"{'kind':5s} {'fusion':9s} {'M':>3s} {'silu':>7s} {'linear':>7s} {'two ops':>8s} {'fused':>7s} "
          f"{'fused/two':>9s} {'swept best fused/plain':>23s}")
    for r in rows:
        ok = [s for s in swept if s["kind"] == r["kind"] and s["m"] == r["m"] and "us" in s]
        best = {f: min((s["us"] for s in ok if s["silu_mul"] is f), default=float("nan")) for f in (True, False)}
        swept_txt = f"{best[True]:.1f} / {best[False]:.1f}" if ok and r["fusion"] == "prologue" else "-"
        print(f"{r['kind']:5s} {r['fusion']:9s} {r['m']:3d} {r['silu_us']:7.1f} {r['linear_us']:7.1f} "
              f"{r['two_ops_us']:8.1f} {r['fused_us']:7.1f} {r['fused_us'] / r['two_ops_us']:9.2f} {swept_txt:>23s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
