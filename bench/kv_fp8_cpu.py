"""The torch kernel set over FP8 KV pages on the CPU against plain pages: what `--kv-cache-dtype fp8` costs there.

The CPU demo canaries an FP8 KV cache as an engine-flag release (`sits-control demo --scenario kvfp8`), so its
request latency is judged against plain pages. Through the public offline API (`LLM(...).generate`, tiny model,
torch set, 2 threads), after one warm-up call per engine: 16 prompts of 60-400 bytes x 24 greedy tokens (the batch
decodes over contexts of mixed lengths, as the demo's traffic does), and one 400-byte prompt's prefill alone;
medians of --repeats runs, plain pages first, the ratio last.

    .venv/bin/python bench/kv_fp8_cpu.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LENGTHS = (60, 120, 250, 400, 64, 80, 300, 100)


def prompts() -> list[str]:
    text = "The canary sang about kernels and pages " * 12
    return [text[:n] for n in LENGTHS] * 2


def measure(kv: str, repeats: int) -> tuple[float, float]:
    import torch

    from sits.engine.llm import LLM
    from sits.engine.sampling_params import SamplingParams
    torch.set_num_threads(2)
    llm = LLM("tiny", "torch", device="cpu", kv_cache_dtype=kv, max_model_len=1024)
    batch, one = SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=0, max_tokens=1)
    ps = prompts()
    llm.generate(ps[:2], batch, use_tqdm=False)
    batch_s, prefill_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.generate(ps, batch, use_tqdm=False)
        batch_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        llm.generate(ps[3:4], one, use_tqdm=False)
        prefill_s.append(time.perf_counter() - t0)
    llm.close()
    return statistics.median(batch_s), statistics.median(prefill_s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    got = {kv: measure(kv, a.repeats) for kv in ("auto", "fp8")}
    print(f"tiny model, torch set, CPU (2 threads), medians of {a.repeats}")
    print(f"{'KV pages':10} {'16 x 24 tokens (ms)':>20} {'one 400-byte prefill (ms)':>26}")
    for kv, (b, f) in got.items():
        print(f"{kv:10} {b * 1e3:20.0f} {f * 1e3:26.1f}")
    (b0, f0), (b1, f1) = got["auto"], got["fp8"]
    print(f"{'fp8/auto':10} {b1 / b0:19.2f}x {f1 / f0:25.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
