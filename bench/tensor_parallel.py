"""Tensor parallelism on one host: llama3-8b (random bf16 weights) through `LLM(...).generate(...)` with
tensor_parallel_size 1 and 2, each size in a fresh process, measured after `LLMEngine.warmup()`; a table last.

    python3 bench/tensor_parallel.py [--sizes 1,2] [--kernels triton-v1.1] [--json OUT.json]
    .venv/bin/python bench/tensor_parallel.py --smoke     # tiny model on CPU (gloo), small shapes: tests this script

Rows (random prompt tokens, so the prefix cache never hits; greedy, ignore_eos):
- decode b1: one 128-token prompt, 256 output tokens; output tok/s of the second of two runs (prefill included).
- ttft 2048: one 2048-token prompt, max_tokens=1; the median wall time of 5 runs after a first one.
- 32 x 2048/512: 32 prompts of 2048 tokens, 512 output tokens each; output tok/s of the second of two runs.
Needs as many visible GPUs as the largest size (rank r runs on cuda:r; CUDA_VISIBLE_DEVICES picks them).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FULL = dict(model="llama3-8b", device="cuda", d1_in=128, d1_out=256, ttft_len=2048, ttft_reps=5, batch=32,
            b_in=2048, b_out=512)
SMOKE = dict(model="tiny", device="cpu", d1_in=8, d1_out=6, ttft_len=40, ttft_reps=2, batch=3, b_in=20, b_out=4)
ROWS = (("decode_b1_tok_s", "decode b1 (tok/s)"), ("ttft_ms", "ttft {ttft_len} (ms, median)"),
        ("batch_tok_s", "{batch} x {b_in}/{b_out} (tok/s)"), ("load_s", "load + warm-up (s)"))


def measure(size: int, kernels: str, sz: dict) -> dict:
    """One engine of `size` ranks (this process is rank 0): every row, in order."""
    from sits.engine import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=sz["model"], kernels=kernels, device=sz["device"], tensor_parallel_size=size,
              max_num_seqs=sz["batch"])
    try:
        llm.engine.warmup()
        out = {"size": size, "load_s": time.perf_counter() - t0,
               "kv_tokens": llm.engine.stats().num_total_blocks * llm.engine.config.block_size}
        vocab = llm.engine.model_config.vocab_size
        rng = random.Random(size)

        def run(n: int, length: int, max_tokens: int) -> float:
            prompts = [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            start = time.perf_counter()
            res = llm.generate(prompts, params, use_tqdm=False)   # tokens on the host: the GPU is done
            wall = time.perf_counter() - start
            assert all(len(r.token_ids) == max_tokens for r in res)
            return wall

        walls = [run(1, sz["d1_in"], sz["d1_out"]) for _ in range(2)]
        out["decode_b1_tok_s"] = sz["d1_out"] / walls[-1]
        walls = [run(1, sz["ttft_len"], 1) for _ in range(sz["ttft_reps"] + 1)]
        out["ttft_ms"] = 1e3 * statistics.median(walls[1:])
        walls = [run(sz["batch"], sz["b_in"], sz["b_out"]) for _ in range(2)]
        out["batch_tok_s"] = sz["batch"] * sz["b_out"] / walls[-1]
        return out
    finally:
        llm.close()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2", help="tensor_parallel_size values, comma-separated")
    ap.add_argument("--kernels", default="triton-v1.1")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, small shapes (tests this script)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)   # a child: measure this size, write --json
    args = ap.parse_args(argv)
    sz = SMOKE if args.smoke else FULL
    kernels = "torch" if args.smoke else args.kernels
    if args.one is not None:
        args.json.write_text(json.dumps(measure(args.one, kernels, sz)))
        return 0
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"--sizes: integers, comma-separated, got {args.sizes!r}") from None
    if not args.smoke and (have := gpu_count()) < max(sizes):
        print(f"bench/tensor_parallel.py: tensor_parallel_size {max(sizes)} needs {max(sizes)} CUDA GPUs (one per "
              f"rank), {have} visible; run it on a multi-GPU host (or --smoke on CPU)", file=sys.stderr)
        return 2
    results = []
    for size in sizes:   # each in a fresh process: one tensor-parallel engine per process, a clean GPU for each
        with tempfile.TemporaryDirectory() as tmp:
            sub = Path(tmp) / "one.json"
            cmd = [sys.executable, __file__, "--one", str(size), "--kernels", kernels, "--json", str(sub)]
            print(f"== tensor_parallel_size {size}: {' '.join(cmd[1:])}", flush=True)
            if subprocess.run(cmd + (["--smoke"] if args.smoke else [])).returncode != 0:
                print(f"bench/tensor_parallel.py: the run with tensor_parallel_size {size} failed", file=sys.stderr)
                return 1
            results.append(json.loads(sub.read_text()))
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model": sz["model"], "kernels": kernels, "runs": results}, indent=1))
    where = f"{gpu_count()} GPUs" if not args.smoke else "CPU (gloo)"
    print(f"\n{sz['model']} {kernels} on {where}")
    head = "".join(f"{'TP ' + str(r['size']):>12s}" for r in results)
    print(f"{'row':32s}{head}" + (f"{'TP ' + str(sizes[-1]) + ' / TP ' + str(sizes[0]):>14s}" if len(sizes) > 1 else ""))
    for key, label in ROWS:
        cells = "".join(f"{r[key]:12.1f}" for r in results)
        ratio = f"{results[-1][key] / results[0][key]:14.2f}" if len(results) > 1 else ""
        print(f"{label.format(**sz):32s}{cells}{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
