"""Decode attention of triton-v1 against its two example regressions on the GPU, at the GPU demo's shapes (tiny: 4
query / 2 kv heads of 64) and llama3-8b's (32 / 8 of 128), bf16, 64-token pages: median time per call (one per layer
per decode step) with CUDA-graph replays, and how far each drifts from the fp32 torch reference.

    python3 bench/gpu_demo_kernels.py       # prints one table; bench/gpu_demo.sh runs it
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from sits.kernels import get_kernel_set  # noqa: E402

SETS = ("triton-v1", "triton-v1-unsplit", "triton-v1-floor-pages")


def case(batch: int, ctx: int, hq: int, hkv: int, d: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    page = 64
    nb = -(-ctx // page)
    k = torch.randn(batch * nb + 4, page, hkv, d, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.randperm(batch * nb + 4, device="cuda", generator=g)[:batch * nb].view(batch, nb).int()
    # ragged contexts around ctx (never a multiple of the page: the last page partly filled, as in decode)
    lens = torch.randint(ctx // 2, ctx, (batch,), device="cuda", generator=g).int()
    lens += (lens % page == 0).int()
    q = torch.randn(batch, hq, d, device="cuda", generator=g, dtype=torch.bfloat16)
    return q, k, v, tables, lens, d ** -0.5


def main() -> int:
    ref = get_kernel_set("torch").paged_decode_attention
    rows = []
    for label, hq, hkv, d, batch, ctx in (("tiny", 4, 2, 64, 16, 1200), ("tiny", 4, 2, 64, 64, 1200),
                                           ("llama3-8b", 32, 8, 128, 16, 1200)):
        args = case(batch, ctx, hq, hkv, d)
        want = ref(args[0].float(), args[1].float(), args[2].float(), *args[3:])
        base_ms = None
        for name in SETS:
            fn = get_kernel_set(name).paged_decode_attention
            out = fn(*args)
            torch.cuda.synchronize()
            err = (out.float() - want).abs().max().item()
            ms = triton.testing.do_bench_cudagraph(lambda: fn(*args), rep=60, return_mode="median")
            base_ms = base_ms or ms
            rows.append((label, batch, ctx, name, ms * 1e3, ms / base_ms, err))
    print(f"{'shape':10} {'batch':>5} {'ctx':>5} {'set':22} {'us/call':>9} {'x v1':>6} {'max |err| vs fp32':>18}")
    for label, b, c, name, us, x, err in rows:
        print(f"{label:10} {b:5d} {c:5d} {name:22} {us:9.1f} {x:6.2f} {err:18.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
