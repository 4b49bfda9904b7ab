"""What bounds decode attention over FP8 pages: reads alone against the kernels, in one run.

    python3 bench/decode_attention_bound.py [--json OUT.json] [--shape 256x2304]
    TRITON_INTERPRET=1 .venv/bin/python bench/decode_attention_bound.py --smoke   # CPU: the probes' sums checked

Every FP8 decode attention kernel built so far (triton-v1.3, v1.5, v1.8, the fp8-dots kernel) takes 543-555 us a
layer at 256 x 2,304 tokens on the H200, the same time as the bf16 kernel reading twice the bytes (BENCHMARKS.md
"FP8 decode attention"). Four kernels that differ in their conversions, dots and registers but not in how they walk
the pages point at the walk. This script separates the two:
- **read probes**: a kernel with the attention kernels' grid and address walk (a sequence's kv heads side by side,
  128-token tiles of K and V through the block table, the per-token scales) that only sums what it reads: the rate
  at which this access pattern can be read at all, with FP8 pages as the engine stores them ([blocks, page, kv heads,
  head_dim]: a head's 128-byte rows 1 KB apart), head-major ([blocks, kv heads, page, head_dim]: a head's page one
  8 KB run), and bf16 pages (256-byte rows 2 KB apart);
- the kernels on the same pages: the bf16 kernel (triton-v1) at the full context and at half of it (the FP8 pages'
  bytes), and triton-v1.8 at its config and at one and two warps a program (never swept before; --small-programs: a
  wider sweep of those, stages 2-4, 1x and 2x the splits, without the FP8 read probes).
Times: medians of triton.testing.do_bench (the L2 flushed) unless said; the copy rate measured first.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sits.kernels.triton_env import tl, triton  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 64
SMALL_PROGRAMS = ((1, 16), (1, 32), (1, 64), (2, 32), (2, 64))   # (warps, BLOCK_N) of --small-programs


@triton.jit
def _read_probe_kernel(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, ctx_ptr, out_ptr,
                       stride_kb, stride_ks, stride_kh, stride_ssb, stride_sss, stride_ssh, stride_bt,
                       HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                       SCALES: tl.constexpr):
    # the attention kernels' walk (HEADS_FIRST grid: kv head, sequence, split), summing instead of attending; V has
    # K's strides (both caches are allocated alike)
    kv_head = tl.program_id(0)
    seq = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    tiles_per_split = tl.cdiv(tl.cdiv(ctx, BLOCK_N), NUM_SPLITS)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(ctx, lo + tiles_per_split * BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    srow = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        blk = tl.load(bt_ptr + seq * stride_bt + offs_n // PAGE, mask=mask_n, other=0).to(tl.int64)
        slot = offs_n % PAGE
        off = blk[:, None] * stride_kb + slot[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :]
        k = tl.load(k_ptr + off, mask=mask_n[:, None], other=0.0)
        v = tl.load(v_ptr + off, mask=mask_n[:, None], other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
        if SCALES:
            soff = blk * stride_ssb + slot * stride_sss + kv_head * stride_ssh
            srow += tl.load(ks_ptr + soff, mask=mask_n, other=0.0) + tl.load(vs_ptr + soff, mask=mask_n, other=0.0)
    total = tl.sum(tl.sum(acc, 1) + srow, 0)
    tl.store(out_ptr + (seq * tl.num_programs(0) + kv_head) * NUM_SPLITS + split, total)


def probe(k, v, ks, vs, tables, lens, *, block_n: int, warps: int, stages: int, splits: int):
    """The read probe as a call that launches it and returns its sums (one per program). k/v: [blocks, page, heads, D] views (any strides
    whose last is 1); ks/vs: [blocks, page, heads] scales, or None."""
    import torch
    s = tables.shape[0]
    out = torch.empty(s * HKV * splits, device=k.device, dtype=torch.float32)
    scales = ks is not None
    ks_, vs_ = (ks, vs) if scales else (out, out)
    sstr = ks.stride() if scales else (0, 0, 0)

    def call():
        _read_probe_kernel[(HKV, s, splits)](k, v, ks_, vs_, tables, lens, out, k.stride(0), k.stride(1),
                                             k.stride(2), *sstr, tables.stride(0), HEAD_DIM=D, PAGE=PAGE,
                                             BLOCK_N=block_n, NUM_SPLITS=splits, SCALES=scales, num_warps=warps,
                                             num_stages=stages)
        return out
    return call


def expected_sum(k, v, ks, vs, tables, lens):
    """What the probe sums, from torch (fp64): every read token's K and V values and scales."""
    import torch
    total = 0.0
    for i, n in enumerate(lens.tolist()):
        blocks = tables[i, :-(-n // PAGE)].long()
        for c, sc in ((k, ks), (v, vs)):
            rows = c[blocks].reshape(-1, HKV, D)[:n]
            total += rows.double().sum().item()
            if sc is not None:
                total += sc[blocks].reshape(-1, HKV)[:n].double().sum().item()
    return total


def smoke() -> int:
    """CPU (TRITON_INTERPRET=1): each probe's sum equals torch's, for both page layouts and with scales."""
    import torch

    from sits.kernels.kv_fp8 import quantize
    torch.manual_seed(0)
    lens = torch.tensor([70, 130, 5], dtype=torch.int32)
    nb = [-(-n // PAGE) for n in lens.tolist()]
    perm = torch.randperm(sum(nb))
    tables = torch.zeros(len(nb), max(nb), dtype=torch.int32)
    used = 0
    for i, n in enumerate(nb):
        tables[i, :n] = perm[used:used + n].int()
        used += n
    kc = torch.randn(sum(nb), PAGE, HKV, D)
    vc = torch.randn(sum(nb), PAGE, HKV, D)
    (k8, ks), (v8, vs) = quantize(kc), quantize(vc)
    hm_k, hm_v = (x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for x in (k8, v8))
    bad = 0
    for name, k, v, a, b in (("fp8 rows + scales", k8, v8, ks, vs), ("fp8 head-major", hm_k, hm_v, None, None),
                             ("fp32 rows", kc, vc, None, None)):
        got = probe(k, v, a, b, tables, lens, block_n=64, warps=4, stages=1, splits=2)().double().sum().item()
        want = expected_sum(k, v, a, b, tables, lens)
        ok = abs(got - want) <= 1e-3 * max(1.0, abs(want))
        bad += not ok
        print(f"{name:<20} probe {got:14.4f}  torch {want:14.4f}  {'ok' if ok else 'MISMATCH'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--shape", default="256x2304", help="BATCHxCONTEXT")
    ap.add_argument("--small-programs", action="store_true",
                    help="the bf16 rows, then triton-v1.8 with one and two warps a program, stages 2-4, 1x and 2x "
                         "the splits (no FP8 read probes)")
    ap.add_argument("--smoke", action="store_true", help="CPU, under TRITON_INTERPRET=1: the probes' sums checked")
    args = ap.parse_args(argv)
    if args.smoke:
        from bench.kernel_timings import run_smoke
        return run_smoke(smoke)
    import torch
    if not torch.cuda.is_available():
        print("bench/decode_attention_bound.py needs a CUDA GPU (or --smoke under TRITON_INTERPRET=1)",
              file=sys.stderr)
        return 2
    from bench.kernel_timings import bench, paged, rel_err
    from sits.kernels.kv_fp8 import Fp8Pages, quantize
    from sits.kernels.paged_decode_attention import choose_num_splits, paged_decode_attention
    from sits.kernels.paged_decode_attention_fp8 import (V18_CONFIG, DecodeLaunch,
                                                         paged_decode_attention_fp8kv_staged)
    b, ctx = (int(x) for x in args.shape.lower().split("x"))
    res = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__, "shape": args.shape}
    n = 1 << 30
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    res["copy_tbs"] = copy = 2 * n * 2 / bench(lambda: dst.copy_(src)) / 1e9
    del src, dst
    fp8_bytes = 2 * b * ctx * HKV * (D + 4)
    fp8_data = 2 * b * ctx * HKV * D
    bf16_bytes = 2 * b * ctx * HKV * D * 2
    rows: list[dict] = []

    def row(what: str, ms: float, nbytes: int, note: str = "") -> None:
        rows.append({"what": what, "us": ms * 1e3, "tbs": nbytes / ms / 1e9, "note": note})
        print(f"  {what:<52} {ms * 1e3:8.1f} us  {nbytes / ms / 1e9:5.2f} TB/s  {note}", flush=True)

    kc, vc, tables = paged([ctx] * b, HKV, D, torch.bfloat16)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
    scale = D ** -0.5
    auto = choose_num_splits(b, HKV, q.device)
    res["auto_splits"] = auto
    print(f"{res['device']}: copy {copy:.2f} TB/s; {b} x {ctx} tokens, FP8 pages {fp8_bytes / 1e9:.2f} GB a layer "
          f"({fp8_bytes / copy / 1e6:.0f} us at copy), bf16 {bf16_bytes / 1e9:.2f} GB; splits {auto}", flush=True)
    # the kernels first: bf16 at the full context and at half (the FP8 pages' bytes)
    row("bf16 kernel (triton-v1)", bench(lambda: paged_decode_attention(q, kc, vc, tables, lens, scale)),
        bf16_bytes)
    half = torch.full((b,), ctx // 2, dtype=torch.int32, device="cuda")
    row("bf16 kernel, half the context", bench(lambda: paged_decode_attention(q, kc, vc, tables, half, scale)),
        bf16_bytes // 2)
    for bn in (128, 64):
        for w in (4, 2):
            for st in (2, 3):
                try:
                    ms = bench(probe(kc, vc, None, None, tables, lens, block_n=bn, warps=w, stages=st, splits=auto))
                except Exception as e:  # noqa: BLE001 - a config that does not fit is a row too
                    print(f"  bf16 probe BLOCK_N {bn} w{w} s{st}: {type(e).__name__}: {str(e)[:100]}")
                    continue
                row(f"read probe, bf16 rows, BLOCK_N {bn} w{w} s{st}", ms, bf16_bytes)
    (k8d, k8s), (v8d, v8s) = quantize(kc), quantize(vc)
    del kc, vc
    torch.cuda.empty_cache()
    k8, v8 = Fp8Pages(k8d, k8s), Fp8Pages(v8d, v8s)
    ref = paged_decode_attention_fp8kv_staged(q, k8, v8, tables, lens, scale)
    row("triton-v1.8 FP8 kernel, its config", bench(lambda: paged_decode_attention_fp8kv_staged(
        q, k8, v8, tables, lens, scale)), fp8_bytes, f"{V18_CONFIG}")

    def v18(w: int, st: int, bn: int, sp: int):
        launch = DecodeLaunch.prepare(q, k8, v8, tables, lens, scale, sp, f16_dot=True, staged=True, heads_first=True)

        def call():
            launch.run(BLOCK_N=bn, num_warps=w, num_stages=st)
            return launch.merge()
        return call
    for sp in (auto, auto * 2) if args.small_programs else (auto,):
        for w, bn in SMALL_PROGRAMS if args.small_programs else ((2, 128), (2, 64), (1, 64), (1, 32)):
            for st in (2, 3, 4) if args.small_programs else (2, 3):
                try:
                    call = v18(w, st, bn, sp)
                    err = rel_err(call(), ref)
                    row(f"triton-v1.8 FP8 kernel, splits {sp} BLOCK_N {bn} w{w} s{st}", bench(call), fp8_bytes,
                        f"err {err:.1e}")
                except Exception as e:  # noqa: BLE001
                    print(f"  v1.8 splits {sp} BLOCK_N {bn} w{w} s{st}: {type(e).__name__}: {str(e)[:100]}")
    if args.small_programs:   # no FP8 read probes: measured once (BENCHMARKS.md)
        return report(res, rows, args, b, ctx, copy)
    for layout, (kd, vd) in (("rows (the engine's)", (k8d, v8d)),
                             ("head-major", tuple(x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
                                                  for x in (k8d, v8d)))):
        for scales in (True, False):
            for bn, w, st in ((128, 4, 2), (128, 4, 3), (64, 4, 3), (128, 8, 3), (256, 4, 2)):
                try:
                    ms = bench(probe(kd, vd, k8s if scales else None, v8s if scales else None, tables, lens,
                                     block_n=bn, warps=w, stages=st, splits=auto))
                except Exception as e:  # noqa: BLE001
                    print(f"  fp8 probe BLOCK_N {bn} w{w} s{st}: {type(e).__name__}: {str(e)[:100]}")
                    continue
                row(f"read probe, FP8 {layout}{' + scales' if scales else ''}, BLOCK_N {bn} w{w} s{st}", ms,
                    fp8_bytes if scales else fp8_data)
    return report(res, rows, args, b, ctx, copy)


def report(res: dict, rows: list[dict], args, b: int, ctx: int, copy: float) -> int:
    res["rows"] = rows
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}, copy {copy:.2f} TB/s; llama3-8b decode "
          f"attention (H{HQ}/{HKV} D{D}, pages of {PAGE}), {b} x {ctx}, one layer:")
    print("| what | us | TB/s | |\n|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['what']} | {r['us']:.0f} | {r['tbs']:.2f} | {r['note']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
