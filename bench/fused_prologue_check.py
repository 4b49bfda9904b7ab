"""Does triton-v1.6 (SiLU-and-mul in the down projection's prologue) compute what triton-v1.5 computes, in the engine?

Its GPU canary on llama3-8b with int8 weights (bench/gpu_demo.sh prologue, 2026-12-05) was rolled back by the
answer-level gate: from the second token on the canary's greedy continuations were token 0 with a zero margin (a flat
or non-finite distribution), while the op-level conformance of `silu_and_mul_linear` passed at the served shapes. This
runs the public offline API (`LLM(...).generate`) with both sets, with and without CUDA graphs, on the same prompts
and weights, and prints per run the greedy tokens' agreement with triton-v1.5 (CUDA graphs), how many tokens are 0
and whether every logprob is finite; then the fused op alone, eager and replayed from a CUDA graph, against the two
ops at llama3-8b's down projection with activations of the model's own magnitude.

    python3 bench/fused_prologue_check.py [--model llama3-8b] [--quantization int8] [--tokens 16] [--split-k-off]
"""
from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ["Q: What is 17 times 3?\nA:", "SELECT name FROM users WHERE", "1, 2, 3, 4, 5,",
           "A canary release sends a small share of traffic to a new version"]


def without_split_k() -> None:
    """Every weight-only linear's tuning candidates with SPLIT_K = 1 from now on in this process (no lock counters, no
    fp32 partials between a launch's programs), tuned afresh: tells a split-K state fault from the arithmetic."""
    import triton

    from sits.kernels import linear as lin
    from sits.kernels import triton_env
    for tuner in (lin._linear_small_m, *lin._linear_mid_m.values()):
        tuner.configs = [triton.Config({**c.kwargs, "SPLIT_K": 1}, num_warps=c.num_warps, num_stages=c.num_stages)
                         for c in tuner.configs]
        tuner.cache.clear()
    triton_env._LAUNCHERS.clear()


def run_engine(model: str, kernels: str, quantization: str, eager: bool, tokens: int) -> dict:
    import torch

    from sits.engine.llm import LLM
    from sits.engine.sampling_params import SamplingParams
    t0 = time.perf_counter()
    llm = LLM(model, kernels, device="cuda", quantization=quantization, enforce_eager=eager,
              gpu_memory_utilization=0.3, max_model_len=2048, max_num_seqs=8)
    llm.engine.warmup()   # as `sits-engine serve` does: without it the decode graphs are never captured (eager)
    load = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=tokens, logprobs=2)
    res = llm.generate(PROMPTS, params, use_tqdm=False)
    # each prompt alone too: the served replay at concurrency 1 failed on every prompt (batch-1 decode steps)
    alone = [llm.generate([p], params, use_tqdm=False)[0].token_ids for p in PROMPTS]
    out = {"tokens": [r.token_ids for r in res], "alone": alone, "load_s": load,
           "finite": all(math.isfinite(lp["logprob"]) for r in res for lp in (r.logprobs or [])),
           "margins": [[round(lp["logprob"] - next((l for t, l in lp["top_logprobs"] if t != lp["token_id"]),
                                                   float("nan")), 3) for lp in (r.logprobs or [])][:4] for r in res]}
    llm.close()
    del llm, res
    gc.collect()   # the engine's graphs and caches hold GPU memory until collected: the next engine needs it
    torch.cuda.empty_cache()
    return out


def op_check(model: str, quantization: str) -> list[str]:
    """The fused op against the two ops at the model's down projection, eager and from a CUDA graph, for x of
    std 1 and std 30 (random llama3-8b's MLP inputs are far from unit scale)."""
    import torch

    from sits.engine.model.presets import preset
    from sits.kernels import get_kernel_set, quantize_weight
    cfg = preset(model)
    n, i = cfg.hidden_size, cfg.intermediate_size
    v15, v16 = get_kernel_set("triton-v1.5"), get_kernel_set("triton-v1.6")
    w = quantize_weight(torch.randn(n, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5, quantization)
    lines = []
    for scale in (1.0, 30.0):
        for m in (1, 2, 8, 16, 24, 32):
            x = torch.randn(m, 2 * i, device="cuda", dtype=torch.bfloat16) * scale
            ref = v15.linear(v15.silu_and_mul(x), w)
            eager = v16.silu_and_mul_linear(x, w)
            static_x = x.clone()
            v16.silu_and_mul_linear(static_x, w)   # warm (tuned) before capture
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_y = v16.silu_and_mul_linear(static_x, w)
            g.replay()
            g.replay()
            torch.cuda.synchronize()
            def rel(a):
                return ((a.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()
            lines.append(f"x std {scale:>4g} rows {m:2d}: eager rel err {rel(eager):.2e}, graph {rel(static_y):.2e}, "
                         f"finite {bool(torch.isfinite(static_y).all())}")
    return lines


def summary(got: dict, header: str) -> list[str]:
    """The table: per (set, eager) run its greedy tokens equal to triton-v1.5 with CUDA graphs (the baseline run),
    how many are token 0 (what a flat or non-finite distribution yields) and whether every logprob was finite."""
    base = got[("triton-v1.5", False)]["tokens"]
    total = sum(len(t) for t in base)
    lines = [header, f"{'set':22} {'mode':6} {'batch':>5} {'tokens = v1.5 graphs':>20} {'tokens = 0':>10} "
                     f"{'logprobs finite':>15}"]
    for (ks, eager), r in got.items():
        for batch, key in ((len(base), "tokens"), (1, "alone")):
            same = sum(x == y for t, b in zip(r[key], base) for x, y in zip(t, b))
            zeros = sum(x == 0 for t in r[key] for x in t)
            lines.append(f"{ks:22} {'eager' if eager else 'graphs':6} {batch:>5} {f'{same}/{total}':>20} "
                         f"{zeros:>10} {str(r['finite']) if key == 'tokens' else '':>15}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--quantization", default="int8")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--split-k-off", action="store_true",
                   help="then triton-v1.6 once more with every weight-only linear tuned among SPLIT_K = 1 candidates")
    a = p.parse_args(argv)
    got = {}
    for ks, eager in (("triton-v1.5", False), ("triton-v1.6", False), ("triton-v1.6", True), ("triton-v1.5", True)):
        got[(ks, eager)] = r = run_engine(a.model, ks, a.quantization, eager, a.tokens)
        print(f"{ks} {'eager' if eager else 'graphs'}: loaded in {r['load_s']:.0f} s; first tokens "
              f"{[t[:6] for t in r['tokens']]}, alone {[t[:6] for t in r['alone']]}; first margins {r['margins']}",
              flush=True)
    for line in op_check(a.model, a.quantization):
        print(line, flush=True)
    if a.split_k_off:   # last: it changes the process's tuners for good
        without_split_k()
        got[("triton-v1.6 no split-K", False)] = r = run_engine(a.model, "triton-v1.6", a.quantization, False,
                                                                 a.tokens)
        print(f"triton-v1.6 graphs, SPLIT_K 1 only: first tokens {[t[:6] for t in r['tokens']]}, alone "
              f"{[t[:6] for t in r['alone']]}", flush=True)
    print()
    print("\n".join(summary(got, f"{a.model}, {a.quantization} weights, {len(PROMPTS)} prompts x {a.tokens} greedy "
                                 "tokens")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
