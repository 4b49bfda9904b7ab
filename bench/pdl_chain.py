"""Programmatic dependent launch (PDL) between a batch-1 decode layer's kernels: does letting each kernel start
while the one before it finishes take the gaps out of a llama3-8b step?

    python3 bench/pdl_chain.py [--kinds bf16,fp8,int8] [--reps 15] [--json OUT]

At one row a llama3-8b step is ~250 kernels in a CUDA graph, each waiting for the last to finish before it launches;
on the H200 a bf16 step of triton-v1.9 is 4.17 ms where its linears take 3.42 (BENCHMARKS.md "A GEMV for batch 1").
With PDL (sm_90+: launched with `launch_pdl=True`, the device side `griddepcontrol`) a kernel's programs start while
the previous kernel's last programs run: the GEMV asks the L2 for its first weight tile, then waits
(`gdc_wait`) for the previous kernel's writes before it reads x; the norm reads its weight, then waits. Both let the
next kernel launch once their main work is done (`gdc_launch_dependents`). The kernels' constexpr `PDL`
(kernels/linear_gemv.py, kernels/rms_norm.py) does this; triton-v1.12 serves it (each op at its tuned config).

The chain, per layer, for `LAYERS` layers in one CUDA graph, one row of bf16 activations, llama3-8b's weights
(random; int8/fp8 quantized per channel): add + RMSNorm -> q/k/v GEMV -> o GEMV (reading the first 4,096 q/k/v
outputs where attention would be: attention and RoPE are not in the chain) -> add + RMSNorm -> gate/up GEMV with the
SiLU-and-mul epilogue -> down GEMV. The norms are the served op (triton-v1.12's launch with PDL); each GEMV at a
fixed launch config (the best swept past the L2 on the H200, bench/gemv_rows.py), then (`--launch tuned`) as the
engine launches it: autotuned, through the FastLauncher, PDL from `pdl_launches()`. Timed: the graph replayed, median
of `--reps`, ms a step; without PDL, then with it. The final
hidden state must be the same bits both ways (and as the chain run eagerly): PDL must not let a kernel read an
input before the kernel that writes it is done. A table last.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, I, QKV = 4096, 14336, 6144   # llama3-8b: hidden, intermediate, q/k/v outputs
LAYERS = 32
EPS = 1e-5
# the best config swept past the L2 per weight kind and projection (bench/gemv_rows.py --sweep candidates, H200,
# 2026-12-05; X_BCAST / NARROW_W left out: no measurable difference)
CONFIGS = {
    "bf16": {"qkv": (8, 512, 4), "o": (4, 2048, 4), "gate_up": (4, 2048, 4), "down": (4, 2048, 4)},
    "fp8": {"qkv": (16, 512, 8), "o": (8, 1024, 4), "gate_up": (16, 256, 4), "down": (8, 1024, 4)},
    "int8": {"qkv": (16, 512, 8), "o": (8, 1024, 4), "gate_up": (16, 256, 4), "down": (8, 1024, 4)},
}


class Chain:
    """One row through `layers` layers of norm and GEMV kernels, launched with or without PDL. dims: (hidden,
    intermediate, q/k/v outputs); configs: (BLOCK_N, BLOCK_K, warps) per projection (CONFIGS[kind] by default), or
    "tuned": each GEMV launched as the engine launches it (autotuned, through the FastLauncher; triton-v1.12's
    launch inside pdl_launches())."""

    def __init__(self, kind: str, *, device: str = "cuda", layers: int = LAYERS, dims=(H, I, QKV),
                 configs: dict | None = None, seed: int = 0):
        import torch

        from sits.kernels import quantize_weight
        g = torch.Generator(device=device).manual_seed(seed)
        self.kind, self.configs = kind, configs or CONFIGS[kind]
        self.h, inter, qkv = dims

        def rand(*shape):
            return torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g)

        def weight(n, k):
            w = rand(n, k) * k ** -0.5
            return w if kind == "bf16" else quantize_weight(w, kind)
        h = self.h
        self.layers = [{"qkv": weight(qkv, h), "o": weight(h, h), "gate_up": weight(2 * inter, h),
                        "down": weight(h, inter), "n1": 1 + 0.1 * rand(h), "n2": 1 + 0.1 * rand(h)}
                       for _ in range(layers)]
        self.x0, self.r0 = rand(1, h), rand(1, h)
        # the GEMVs' outputs in buffers of their own (the norms allocate theirs, from the graph's pool when captured)
        e = lambda n: torch.empty(1, n, device=device, dtype=torch.bfloat16)  # noqa: E731
        self.bufs = [{"qkv": e(qkv), "o": e(h), "act": e(inter), "down": e(h)} for _ in range(layers)]

    def _config(self, proj: str, pdl: bool) -> dict | None:
        if self.configs == "tuned":   # the served launch: autotuned, PDL from pdl_launches() (run() enters it)
            return None
        bn, bk, warps = self.configs[proj]
        return dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=1, PDL=pdl, launch_pdl=pdl)

    @staticmethod
    def _norm(x, r, w, pdl: bool):
        """The served add + RMSNorm (triton-v1.12's launch when pdl): (normed, residual)."""
        from sits.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_pdl
        return (fused_add_rms_norm_pdl if pdl else fused_add_rms_norm)(x, r, w, EPS)

    def run(self, pdl: bool):
        """Launch the whole chain once (on the current stream); returns the last layer's output and residual."""
        from sits.kernels.linear_gemv import gemv
        from sits.kernels.triton_env import pdl_launches
        # tuned GEMVs take PDL from the scope, as triton-v1.12's linear gives it; fixed configs carry it themselves
        with pdl_launches() if pdl and self.configs == "tuned" else contextlib.nullcontext():
            return self._layers(pdl, gemv)

    def _layers(self, pdl: bool, gemv):
        x, r = self.x0, self.r0
        for w, b in zip(self.layers, self.bufs):
            h1, r = self._norm(x, r, w["n1"], pdl)
            gemv(h1, w["qkv"], None, b["qkv"], config=self._config("qkv", pdl))
            gemv(b["qkv"][:, :self.h], w["o"], None, b["o"], config=self._config("o", pdl))
            h2, r = self._norm(b["o"], r, w["n2"], pdl)
            gemv(h2, w["gate_up"], None, b["act"], silu_epi=True, config=self._config("gate_up", pdl))
            gemv(b["act"], w["down"], None, b["down"], config=self._config("down", pdl))
            x = b["down"]
        return x, r


def measure(kind: str, reps: int, launch: str = "fixed") -> dict:
    import torch
    chain = Chain(kind, configs="tuned" if launch == "tuned" else None)
    eager = [t.clone() for t in chain.run(False)]   # compiles both variants' kernels outside any capture
    chain.run(True)
    torch.cuda.synchronize()
    row = {"kind": kind, "launch": launch, "layers": LAYERS, "kernels_a_step": 6 * LAYERS}
    for pdl in (False, True):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = chain.run(pdl)   # the replays write these
        g.replay()
        torch.cuda.synchronize()
        same = all(torch.equal(t, e) for t, e in zip(out, eager))
        times = []
        for _ in range(reps):
            for t in out:
                t.fill_(float("nan"))   # a replay that skipped a kernel would leave NaNs
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            same = same and all(torch.equal(t, e) for t, e in zip(out, eager))
        name = "pdl" if pdl else "plain"
        row[f"{name}_ms"] = statistics.median(times)
        row[f"{name}_min_ms"] = min(times)
        row[f"{name}_same_bits"] = bool(same)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        del g, out
    del chain
    torch.cuda.empty_cache()
    return row


def report(res: dict) -> None:
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: one row through {LAYERS} layers of "
          f"norm + 4 GEMVs (no attention, no RoPE), one CUDA graph, ms a step (median of {res['reps']})")
    print(f"{'kind':5s} {'launch':6s} {'kernels':>8s} {'plain':>8s} {'PDL':>8s} {'saved':>8s} {'a kernel':>9s} "
          f"{'same bits':>10s}")
    for r in res["rows"]:
        saved = r["plain_ms"] - r["pdl_ms"]
        print(f"{r['kind']:5s} {r.get('launch', 'fixed'):6s} {r['kernels_a_step']:8d} {r['plain_ms']:8.3f} "
              f"{r['pdl_ms']:8.3f} {saved:8.3f} "
              f"{1e3 * saved / r['kernels_a_step']:7.2f}us "
              f"{'yes' if r['plain_same_bits'] and r['pdl_same_bits'] else 'NO':>10s}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="bf16,fp8,int8")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--launch", default="fixed,tuned",
                    help="fixed: each GEMV at CONFIGS' launch config; tuned: autotuned and fast-launched as served")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import triton
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("bench/pdl_chain.py needs a CUDA GPU with programmatic dependent launch (sm_90+)", file=sys.stderr)
        return 2
    rows = [measure(kind, a.reps, launch) for launch in a.launch.split(",") for kind in a.kinds.split(",")]
    res = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "reps": a.reps, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    report(res)
    return 0 if all(r["plain_same_bits"] and r["pdl_same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
