"""Is the int8 GEMV bound by its int8 -> 16-bit conversion? An experiment on a GPU (H200), not a product kernel.

    python3 bench/gemv_conversion.py [--json OUT.json]

One plain GEMV kernel (the production tile: 16 x 64 x 256, 4 warps, 4 stages, no split-K), weights [14336 x 4096]
int8, M = 1 and 16, in variants that differ only in how the weight tile becomes an MMA operand:
- `bf16`: `w.to(bfloat16)` (what kernels/linear.py does; Triton 3.6 emits 2 PRMT + 4 LOP3 + 2 HADD2 per 4 values);
- `fp16-magic`: inline PTX, 1 LOP3 + 2 PRMT + 2 HSUB2 per 4 values into fp16 (exact), x converted to fp16;
- `no-arith` (wrong results, a bound): the bytes are only moved into 16-bit halves (2 PRMT per 4 values), x in fp16.
Also the production wrapper (`linear_with_config`, same tile) as a check that the plain kernel is representative.
Timing as in bench/kernel_timings.py's GEMV table: CUDA-graph replay over 8 weight copies (past the L2).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _i8_to_f16_magic(w):
    # 4 int8 per register -> 4 fp16, exact: the halves 0x64XX hold 1024 + (w ^ 0x80) = 1152 + w; subtract 1152
    return tl.inline_asm_elementwise(
        asm="{\n.reg .b32 t, c;\nxor.b32 t, $2, 0x80808080;\nmov.b32 c, 0x64806480;\n"
            "prmt.b32 $0, t, 0x64646464, 0x4140;\nprmt.b32 $1, t, 0x64646464, 0x4342;\n"
            "sub.f16x2 $0, $0, c;\nsub.f16x2 $1, $1, c;\n}",
        constraints="=r,=r,r", args=[w], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _i8_bytes_only(w):
    # the bound: bytes moved into 16-bit halves, no arithmetic (the values are wrong)
    return tl.inline_asm_elementwise(
        asm="prmt.b32 $0, $2, 0x64646464, 0x4140;\nprmt.b32 $1, $2, 0x64646464, 0x4342;",
        constraints="=r,=r,r", args=[w], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CONV: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (rm % M)[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        w = tl.load(w_ptrs, eviction_policy="evict_first")
        if CONV == 0:
            acc = tl.dot(x, w.to(x.dtype), acc)
        elif CONV == 1:
            acc = tl.dot(x.to(tl.float16), _i8_to_f16_magic(w), acc)
        else:
            acc = tl.dot(x.to(tl.float16), _i8_bytes_only(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc = acc * tl.load(scale_ptr + rn)[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])


VARIANTS = {"bf16": 0, "fp16-magic": 1, "no-arith": 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    from bench.kernels import bench_graph, rel_err
    from sits.kernels import quantize_weight
    from sits.kernels.linear import linear_ref, linear_with_config
    if not torch.cuda.is_available():
        print("bench/gemv_conversion.py needs a CUDA GPU", file=sys.stderr)
        return 2
    n, k = 14336, 4096
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    qws = [quantize_weight(w * (1 + 0.01 * c), "int8") for c in range(8)]
    rows = []
    for m in (1, 16):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = linear_ref(x, qws[0])

        def plain(q, conv):
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            _gemv_kernel[(n // 64,)](x, q.qweight, q.scale, out, m, n, k, x.stride(0), q.qweight.stride(0),
                                     out.stride(0), BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, CONV=conv, num_warps=4,
                                     num_stages=4)
            return out
        for name, conv in VARIANTS.items():
            ms = bench_graph([lambda q=q: plain(q, conv) for q in qws])
            rows.append({"m": m, "variant": name, "us": 1e3 * ms, "tbs": (n * k + 4 * n) / ms / 1e9,
                         "rel_err": rel_err(plain(qws[0], conv), ref)})
        ms = bench_graph([lambda q=q: linear_with_config(x, q, block_m=16, block_n=64, block_k=256, split_k=1,
                                                         num_warps=4, num_stages=4) for q in qws])
        rows.append({"m": m, "variant": "production linear_with_config", "us": 1e3 * ms,
                     "tbs": (n * k + 4 * n) / ms / 1e9, "rel_err": rel_err(linear_with_config(x, qws[0]), ref)})
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"{res['device']}, torch {res['torch']}, triton {res['triton']}; int8 W [{n}x{k}]")
    print(f"{'M':>3s} {'variant':32s} {'us':>7s} {'TB/s':>6s} {'rel_err':>8s}")
    for r in rows:
        print(f"{r['m']:3d} {r['variant']:32s} {r['us']:7.2f} {r['tbs']:6.2f} {r['rel_err']:8.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
