"""Which autotune candidates win at warm-up, and by how much: build an engine as bench/throughput.py does (llama3-8b,
random weights), warm it up, then read every autotuner's timings from Triton's on-disk cache (the autotuners persist
them: kernels/triton_env.py `autotune`) and print, per kernel and tuning key, the candidates from fastest to slowest.

    python3 bench/tuning_winners.py [--kernels triton-v1.8] [--quantization fp8] [--kv-cache-dtype fp8] [--json OUT]

Why: a cold warm-up spends most of its autotuning on candidates that never win (the FP8 prefill attention's took
18-25 s of a 64-79 s fp8 warm-up on the H200, BENCHMARKS.md "FP8 end to end"); the candidate lists keep the winners
and those within a few percent of them. Needs a GPU (the interpreter tunes nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_timings(cache_dir: str) -> list[dict]:
    """Every `*.autotune.json` under cache_dir: {kernel, key, candidates: [(config, ms)] fastest first}."""
    out = []
    for path in sorted(Path(cache_dir).rglob("*.autotune.json")):
        data = json.loads(path.read_text())
        rows = []
        for cfg, timings in data.get("configs_timings", []):
            ms = timings[0] if isinstance(timings, list) else timings
            rows.append((cfg, float(ms)))
        rows.sort(key=lambda r: r[1])
        out.append({"kernel": path.name.removesuffix(".autotune.json"), "key": data.get("key"), "candidates": rows})
    return out


def describe(cfg: dict) -> str:
    kw = cfg.get("kwargs", cfg)
    parts = [f"{k}={v}" for k, v in sorted(kw.items())] if isinstance(kw, dict) else [str(kw)]
    for k in ("num_warps", "num_stages"):
        if k in cfg:
            parts.append(f"{k[4:]}={cfg[k]}")
    return " ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--kernels", default="triton-v1.8")
    ap.add_argument("--quantization", default=None, help="fp8 | int8 | none")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--json", type=Path, help="write the timings here too")
    args = ap.parse_args(argv)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sits-tune-")   # cold: every candidate timed here
    from bench.throughput import build
    quant = None if args.quantization in (None, "none") else args.quantization
    _, info = build(args.model, args.kernels, "cuda", quant, args.max_num_seqs, kv_cache_dtype=args.kv_cache_dtype)
    print(f"warm-up {info['warmup_s']:.1f} s, autotuning {info['warmup_autotune_s']:.1f} s: "
          f"{info['warmup_autotune_by_kernel']}")
    tables = read_timings(os.environ["TRITON_CACHE_DIR"])
    if args.json:
        args.json.write_text(json.dumps(tables, indent=1))
    for t in tables:
        best = t["candidates"][0][1] if t["candidates"] else float("nan")
        print(f"\n{t['kernel']}  key {t['key']}")
        for cfg, ms in t["candidates"]:
            print(f"   {ms * 1e3:9.1f} us  {ms / best:5.2f}x  {describe(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
