"""Decode attention over FP8 pages by batch size: which launch config and split count wins at each, in one run.

    python3 bench/decode_attention_batch.py [--json OUT.json] [--batches 8,16,32,64,96,128,192,256] [--no-sweep]
        [--configs 1x32,4x128] [--stages 2,3,5] [--split-factors 1,2]   # the sweep's (warps x BLOCK_N), stages, splits
        [--k-conversion staged,in-dot]   # the key tile staged as fp16 (the sets') or converted in the dot's layout
    TRITON_INTERPRET=1 .venv/bin/python bench/decode_attention_batch.py --smoke   # CPU: every config's values checked

triton-v1.14 runs triton-v1.8's kernel at one warp a program on 32-token tiles, measured at 256 x 2,304 tokens only;
in the 256 x 2048/512 row its steps that carry prompt tokens and its tail (fewer sequences) lose to v1.13's four
warps on 128 (bench/throughput.py's step kinds), and at 64 and 128 sequences one warp with the split count chosen
for four-warp programs (~4 programs an SM) leaves most of each SM idle (bench/decode_attention_bound.py
--small-programs). This sweeps, at each batch size, llama3-8b's decode attention (32 / 8 heads, head_dim 128, pages
of 64) over contexts drawn from 2,048-2,560 tokens (the row's): warps x BLOCK_N x stages x split counts (the
four-warp rule's and 1/2x to 8x it), with triton-v1.13's and v1.14's own calls as the baselines, each config's output
checked against v1.13's, triton-v1.15's call (v1.14's config or v1.8's, whichever fills the GPU's waves of
programs better: kernels/occupancy.py `WavesRule`) with the config it picked and the programs an SM it counted
for each, and triton-v1.26's (v1.15's with the key tile converted in the dot's layout). Times: medians of
triton.testing.do_bench (the L2 flushed). The table last: per batch v1.13, v1.14, v1.15, v1.26, the best config and
the best at each warp count (--no-sweep: the four sets only).
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HQ, HKV, D, PAGE = 32, 8, 128, 64
CONFIGS = ((1, 16), (1, 32), (1, 64), (2, 32), (2, 64), (4, 64), (4, 128))   # (warps, BLOCK_N)
STAGES = (2, 3)
SPLIT_FACTORS = (0.5, 1, 2, 4, 8)   # times the four-warp rule's split count (choose_num_splits)


def split_counts(auto: int, factors=SPLIT_FACTORS) -> list[int]:
    """The split counts swept around the rule's `auto` (powers of two, 1-64)."""
    return sorted({min(64, max(1, int(auto * f))) for f in factors})


def smoke() -> int:
    """Under TRITON_INTERPRET=1 on CPU: every swept (warps, BLOCK_N) at two split counts against the torch reference."""
    import torch

    from sits.kernels.kv_fp8 import Fp8Pages, quantize
    from sits.kernels.paged_decode_attention import paged_decode_attention_ref
    from sits.kernels.paged_decode_attention_fp8 import DecodeLaunch
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([70, 130], dtype=torch.int32)
    kc = torch.randn(6, PAGE, 2, 32, generator=g)
    vc = torch.randn(6, PAGE, 2, 32, generator=g)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    q = torch.randn(2, 8, 32, generator=g)
    (kd, ks), (vd, vs) = quantize(kc), quantize(vc)
    k8, v8 = Fp8Pages(kd, ks), Fp8Pages(vd, vs)
    ref = paged_decode_attention_ref(q, k8, v8, tables, lens, 32 ** -0.5)
    worst = 0.0
    for w, bn in CONFIGS[:3]:
        for sp in (1, 4):
            launch = DecodeLaunch.prepare(q, k8, v8, tables, lens, 32 ** -0.5, sp, f16_dot=False, heads_first=True)
            launch.run(BLOCK_N=bn, num_warps=w, num_stages=1, DOT_F32=True)
            got = launch.merge()
            worst = max(worst, ((got - ref).norm() / ref.norm()).item())
    print(f"smoke: {len(CONFIGS[:3]) * 2} configs against the reference, worst relative error {worst:.1e}")
    return 0 if worst < 1e-4 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batches", default="8,16,32,64,96,128,192,256")
    ap.add_argument("--no-sweep", action="store_true", help="the sets' calls only (v1.13, v1.14, v1.15, v1.26)")
    ap.add_argument("--configs", default=",".join(f"{w}x{bn}" for w, bn in CONFIGS),
                    help="the sweep's launch configs, WARPSxBLOCK_N (default: %(default)s)")
    ap.add_argument("--stages", default=",".join(map(str, STAGES)),
                    help="the sweep's num_stages (Triton 3.6 keeps two K/V tiles in flight from 5 at BLOCK_N 32, "
                         "bench/kernel_resources.py --kernels decode; default: %(default)s)")
    ap.add_argument("--split-factors", default=",".join(map(str, SPLIT_FACTORS)),
                    help="the split counts swept, as factors of the four-warp rule's (default: %(default)s)")
    ap.add_argument("--k-conversion", default="staged",
                    help="the key tile's path, comma list: staged (converted where loaded and staged as fp16 through "
                         "shared memory, as v1.8 .. v1.25 do) or in-dot (converted by Triton in the q.k dot's operand "
                         "layout: the kernel's STAGE_K=False, triton-v1.26's); default: %(default)s")
    ap.add_argument("--smoke", action="store_true", help="CPU, under TRITON_INTERPRET=1: every config's values checked")
    args = ap.parse_args(argv)
    try:
        configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",") if c]
        stages = [int(x) for x in args.stages.split(",") if x]
        factors = [float(x) for x in args.split_factors.split(",") if x]
    except ValueError:
        ap.error("--configs takes WARPSxBLOCK_N pairs (e.g. 1x32,4x128); --stages and --split-factors numbers")
    if any(len(c) != 2 for c in configs):
        ap.error("--configs takes WARPSxBLOCK_N pairs, e.g. 1x32,4x128")
    k_paths = [x for x in args.k_conversion.split(",") if x]
    if not k_paths or set(k_paths) - {"staged", "in-dot"}:
        ap.error("--k-conversion takes staged and/or in-dot")
    if args.smoke:
        from bench.kernel_timings import run_smoke
        return run_smoke(smoke)
    import torch
    import triton
    if not torch.cuda.is_available():
        print("bench/decode_attention_batch.py needs a CUDA GPU (or --smoke under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    from bench.kernel_timings import bench, paged, rel_err
    from sits.kernels.kv_fp8 import Fp8Pages, quantize
    from sits.kernels.paged_decode_attention import choose_num_splits
    from sits.kernels.occupancy import programs_per_sm_of, sm_limits
    from sits.kernels.triton_env import pdl_launches
    from sits.kernels import paged_decode_attention_fp8 as fp8
    from sits.kernels.paged_decode_attention_fp8 import (DecodeLaunch, paged_decode_attention_by_waves,
                                                         paged_decode_attention_k_in_dot,
                                                         paged_decode_attention_one_warp, paged_decode_attention_pdl)
    batches = [int(x) for x in args.batches.split(",")]
    res = {"date": dt.datetime.now().isoformat(timespec="minutes"), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "triton": triton.__version__, "batches": []}
    g = torch.Generator().manual_seed(1)
    ctx_all = torch.randint(2048, 2561, (max(batches),), generator=g).tolist()
    kc, vc, tables_all = paged(ctx_all, HKV, D, torch.bfloat16)
    (k8d, k8s), (v8d, v8s) = quantize(kc), quantize(vc)
    del kc, vc
    torch.cuda.empty_cache()
    k8, v8 = Fp8Pages(k8d, k8s), Fp8Pages(v8d, v8s)
    scale = D ** -0.5
    print(f"{res['device']}: llama3-8b decode attention over FP8 pages, contexts 2,048-2,560; batches {batches}",
          flush=True)
    for b in batches:
        tables = tables_all[:b].contiguous()
        lens = torch.tensor(ctx_all[:b], dtype=torch.int32, device="cuda")
        q = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * sum(ctx_all[:b]) * HKV * (D + 4)
        auto = choose_num_splits(b, HKV, q.device)
        ref = paged_decode_attention_pdl(q, k8, v8, tables, lens, scale)
        row = {"batch": b, "auto_splits": auto, "bytes": nbytes,
               "v113_us": bench(lambda: paged_decode_attention_pdl(q, k8, v8, tables, lens, scale)) * 1e3,
               "v114_us": bench(lambda: paged_decode_attention_one_warp(q, k8, v8, tables, lens, scale)) * 1e3,
               "v115_us": bench(lambda: paged_decode_attention_by_waves(q, k8, v8, tables, lens, scale)) * 1e3,
               "v126_us": bench(lambda: paged_decode_attention_k_in_dot(q, k8, v8, tables, lens, scale)) * 1e3,
               "v126_err": rel_err(paged_decode_attention_k_in_dot(q, k8, v8, tables, lens, scale), ref),
               "configs": []}
        with pdl_launches():   # as v1.15's call prepares it
            launch = DecodeLaunch.prepare(q, k8, v8, tables, lens, scale, None, f16_dot=True, staged=True,
                                          heads_first=True)
        picked = fp8.v115_config(launch)
        per_sm = {c["num_warps"]: programs_per_sm_of(launch, c, sm_limits(q.device)) for c in fp8.V115_CONFIGS}
        picked_126 = fp8.v126_config(launch)
        per_sm_126 = {c["num_warps"]: programs_per_sm_of(launch, c, sm_limits(q.device)) for c in fp8.V126_CONFIGS}
        row["v115_config"], row["programs"], row["per_sm"] = picked, math.prod(launch.grid), per_sm
        row["v126_config"], row["per_sm_v126"] = picked_126, per_sm_126
        print(f"batch {b}: {nbytes / 1e6:.0f} MB, rule's splits {auto}; v1.13 {row['v113_us']:.0f} us, "
              f"v1.14 {row['v114_us']:.0f} us, v1.15 {row['v115_us']:.0f} us (w{picked['num_warps']}: "
              f"{row['programs']} programs, an SM holds {per_sm}), v1.26 {row['v126_us']:.0f} us "
              f"(w{picked_126['num_warps']}, an SM holds {per_sm_126}, err {row['v126_err']:.1e})", flush=True)
        for sp in () if args.no_sweep else split_counts(auto, factors):
            launch = DecodeLaunch.prepare(q, k8, v8, tables, lens, scale, sp, f16_dot=True, staged=True,
                                          heads_first=True)
            for (w, bn), st, kp in itertools.product(configs, stages, k_paths):
                def call():
                    launch.run(BLOCK_N=bn, num_warps=w, num_stages=st, STAGE_K=kp == "staged")
                    return launch.merge()
                try:
                    err = rel_err(call(), ref)
                    us = bench(call) * 1e3
                except Exception as e:  # noqa: BLE001 - a config that does not fit is a row too
                    print(f"  splits {sp} w{w} BLOCK_N {bn} s{st} K {kp}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                row["configs"].append({"splits": sp, "warps": w, "block_n": bn, "stages": st, "k": kp, "us": us,
                                       "err": err})
        if not row["configs"]:
            res["batches"].append(row)
            continue
        best = min(row["configs"], key=lambda c: c["us"])
        print(f"  best: splits {best['splits']} w{best['warps']} BLOCK_N {best['block_n']} s{best['stages']} "
              f"K {best['k']} {best['us']:.0f} us ({nbytes / best['us'] / 1e6:.2f} TB/s), err {best['err']:.1e}",
              flush=True)
        res["batches"].append(row)
        del q
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}: FP8 decode attention, one layer, us "
          "(TB/s of FP8 pages)")
    print("| batch | v1.13 | v1.14 | v1.15 (its pick) | v1.26 | best | best config | best w1 | best w2 | best w4 |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for row in res["batches"]:
        b, nb = row["batch"], row["bytes"]
        sets = (f"| {b} | {row['v113_us']:.0f} | {row['v114_us']:.0f} | {row['v115_us']:.0f} "
                f"(w{row['v115_config']['num_warps']}) | {row['v126_us']:.0f} (w{row['v126_config']['num_warps']}) |")
        if not row["configs"]:
            print(sets + " - | - | - | - | - |")
            continue
        best = min(row["configs"], key=lambda c: c["us"])
        per_w = []
        for w in (1, 2, 4):
            cs = [c for c in row["configs"] if c["warps"] == w]
            c = min(cs, key=lambda c: c["us"]) if cs else None
            per_w.append(f"{c['us']:.0f} (sp{c['splits']} BN{c['block_n']} s{c['stages']} K {c['k']})" if c else "-")
        print(sets + f" {best['us']:.0f} ({nb / best['us'] / 1e6:.2f}) | splits {best['splits']} w{best['warps']} "
              f"BLOCK_N {best['block_n']} s{best['stages']} K {best['k']} | "
              + " | ".join(per_w) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
