"""Host time per call of the kernel wrappers the engine calls eagerly (Python + launch, no GPU wait), on a GPU.

    python3 bench/launch_overhead.py [--json OUT.json] [--profile]

Each op is called 2000 times back to back on tiny inputs with no synchronisation in between; host microseconds per
call = wall time / calls, measured while the GPU queue is not full (the kernels are far shorter than the launches).
--profile also prints the top functions (cProfile) of the quantized linear wrapper.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def host_us(fn, calls: int = 2000) -> float:
    import torch
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * dt / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("bench/launch_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from sits.kernels import get_kernel_set, quantize_weight
    from sits.kernels.linear import linear
    ks = get_kernel_set("triton-v1.1")
    dev, dt = "cuda", torch.bfloat16
    n, k = 4096, 4096
    w = torch.randn(n, k, device=dev, dtype=dt) * 0.02
    qw = quantize_weight(w, "int8")
    x1 = torch.randn(1, k, device=dev, dtype=dt)
    x16 = torch.randn(16, k, device=dev, dtype=dt)
    hn = torch.randn(16, k, device=dev, dtype=dt)
    res = torch.randn(16, k, device=dev, dtype=dt)
    nw = torch.ones(k, device=dev, dtype=dt)
    gu = torch.randn(16, 2 * 1024, device=dev, dtype=dt)
    ops = {
        "torch empty [1, 4096] (floor)": lambda: torch.empty(1, n, device=dev, dtype=dt),
        "F.linear bf16 M=1 4096x4096 (cuBLAS)": lambda: F.linear(x1, w),
        "linear int8 M=1 4096x4096": lambda: linear(x1, qw),
        "linear int8 M=16 4096x4096": lambda: linear(x16, qw),
        "rms_norm [16, 4096]": lambda: ks.rms_norm(hn, nw, 1e-5),
        "fused_add_rms_norm [16, 4096]": lambda: ks.fused_add_rms_norm(hn, res, nw, 1e-5),
        "silu_and_mul [16, 2048]": lambda: ks.silu_and_mul(gu),
    }
    rows = [{"op": name, "host_us": host_us(fn)} for name, fn in ops.items()]
    for r in rows:
        print(f"{r['op']:44s} {r['host_us']:8.1f} us")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            linear(x1, qw)
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
