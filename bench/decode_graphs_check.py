"""Do decode steps through the CUDA graphs give the eager engine's answers, per engine size, one request at a time?

The served gate replay of 2026-12-05 (bench/fused_prologue_served.py, H200, llama3-8b int8) failed at concurrency 1
for the canary AND the baseline (triton-v1.6 and v1.5, both with CUDA graphs): continuations of token 0 from the
second token on, while the same engines in-process (bench/fused_prologue_check.py: max_num_seqs 8, max_model_len 2048)
answered right one prompt at a time. The served engines ran with max_num_seqs 64 and the default max_model_len
(8192). Those in-process runs never called `LLMEngine.warmup()`, which `serve` calls and which captures the decode graphs
(and measures the op-level conformance): they were eager. With it (2026-12-05, fifth session, H200) triton-v1.5 int8
at 64 x 8192 answered wrong one prompt at a time (4 of 64 tokens as the eager engine's) and right four at a time;
at 8 x 2048 right. The cause (kernels/linear.py `_split_k_locks`): the batch-1 graph, captured first by warm-up's
request, counted split-K arrivals in a lock buffer that a 64-row capture then outgrew and freed. This runs `LLM.generate` after `warmup()`, one prompt at a
time and all together (greedy, logprobs as the gate asks), eagerly, with CUDA graphs, and with graphs but without
the conformance measurement, and prints per run the tokens equal to the eager run's, the count of token 0 and any
split-K arrival counter left non-zero (each launch's last split resets its tiles' counters).

    python3 bench/decode_graphs_check.py [--kernels triton-v1.5] [--sizes 64x8192,8x2048]
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ["Q: What is 17 times 3?\nA:", "SELECT name FROM users WHERE", "1, 2, 3, 4, 5,",
           "A canary release sends a small share of traffic to a new version"]


def nonzero_locks() -> list[str]:
    """Split-K arrival counters that are not 0 between launches (each launch's last split resets its tiles'), in
    every stream's buffer and in the outgrown ones kept for the graphs that captured them (kernels/linear.py)."""
    import torch

    from sits.kernels import linear as lin
    torch.cuda.synchronize()
    out = []
    buffers = [(f"stream {stream}", locks) for (_, stream), locks in lin._LOCKS.items()]
    buffers += [(f"outgrown #{i}", locks) for i, locks in enumerate(lin._RETIRED)]
    for name, locks in buffers:
        nz = torch.nonzero(locks).flatten().tolist()
        if nz:
            out.append(f"{name}: {len(nz)} of {locks.numel()} counters, e.g. {[(i, int(locks[i])) for i in nz[:4]]}")
    return out


def run(model: str, kernels: str, quantization: str, seqs: int, max_len: int, mode: str, tokens: int,
        utilization: float) -> dict:
    import torch

    from sits.engine.llm import LLM
    from sits.engine.sampling_params import SamplingParams
    from sits.kernels import paged_decode_attention as pda
    tune_min_blocks = pda._TUNE_MIN_BLOCKS
    if mode == "graphs-no-attn-tuning":   # decode attention never autotuned (restored below)
        pda._TUNE_MIN_BLOCKS = 1 << 40
    t0 = time.perf_counter()
    llm = LLM(model, kernels, device="cuda", quantization=quantization or None, enforce_eager=mode == "eager",
              gpu_memory_utilization=utilization, max_model_len=max_len, max_num_seqs=seqs,
              conformance=mode != "graphs-no-conformance")
    if mode == "graphs-capture-first":   # every size captured largest first before anything runs (warm-up's first
        llm.engine.model_runner.capture_decode_graphs()   # request otherwise captures batch 1 on demand, first)
    llm.engine.warmup()   # as `sits-engine serve` does: warm-up steps, conformance, the decode graphs' capture
    if mode == "graphs-recapture-1":   # batch 1's graph, captured first (on demand by warm-up's request), again now
        graphs = llm.engine.model_runner.decode_graphs
        del graphs.graphs[1]
        graphs.capture_all()
    ready = time.perf_counter() - t0
    locks_after_warmup = nonzero_locks()
    params = SamplingParams(temperature=0, max_tokens=tokens, logprobs=5)
    alone = [llm.generate([p], params, use_tqdm=False)[0].token_ids for p in PROMPTS]
    together = [r.token_ids for r in llm.generate(PROMPTS, params, use_tqdm=False)]
    print(f"  {kernels} {mode}: split-K counters not 0 after warm-up: {locks_after_warmup or 'none'}; after the "
          f"requests: {nonzero_locks() or 'none'}", flush=True)
    llm.close()
    pda._TUNE_MIN_BLOCKS = tune_min_blocks
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {"alone": alone, "together": together, "ready_s": ready}


def same(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for s, t in zip(a, b) for x, y in zip(s, t))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--kernels", default="triton-v1.5")
    p.add_argument("--quantization", default="int8", help="'' for none")
    p.add_argument("--sizes", default="64x8192", help="max_num_seqs x max_model_len, ...")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--modes", default="graphs,graphs-no-conformance",
                   help="runs beside the eager one: graphs, graphs-no-conformance, graphs-capture-first, "
                        "graphs-recapture-1, graphs-no-attn-tuning")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--split-k-off", action="store_true",
                   help="every weight-only linear tuned among SPLIT_K = 1 candidates (bench/fused_prologue_check.py)")
    a = p.parse_args(argv)
    if a.split_k_off:
        from bench.fused_prologue_check import without_split_k
        without_split_k()
    sizes = []
    for s in a.sizes.split(","):
        try:
            seqs, max_len = (int(x) for x in s.split("x"))
        except ValueError:
            p.error(f"--sizes {s!r}: SEQSxLEN, e.g. 64x8192")
        sizes.append((seqs, max_len))
    modes = ["eager", *[m for m in a.modes.split(",") if m and m != "eager"]]
    rows = []
    for seqs, max_len in sizes:
        got = {m: run(a.model, a.kernels, a.quantization, seqs, max_len, m, a.tokens, a.gpu_memory_utilization)
               for m in modes}
        ref = got["eager"]
        total = sum(len(t) for t in ref["alone"])
        for m in modes:
            r = got[m]
            rows.append((seqs, max_len, m, same(r["alone"], ref["alone"]), sum(t == 0 for s in r["alone"] for t in s),
                         same(r["together"], ref["together"]), sum(t == 0 for s in r["together"] for t in s), total))
            print(f"max_num_seqs {seqs} max_model_len {max_len} {m}: alone {[t[:5] for t in r['alone']]} (ready in "
                  f"{r['ready_s']:.0f} s)", flush=True)
    print(f"\n{a.model}, {a.kernels}, {a.quantization or 'no'} quantization: {len(PROMPTS)} prompts x {a.tokens} "
          "greedy tokens after LLMEngine.warmup(), against the eager engine of the same size")
    print(f"{'max_num_seqs':>12} {'max_model_len':>13} {'mode':>22} {'alone = eager':>14} {'alone 0s':>8} "
          f"{'batch = eager':>14} {'batch 0s':>8}")
    for seqs, max_len, m, sa, za, sb, zb, total in rows:
        print(f"{seqs:>12} {max_len:>13} {m:>22} {f'{sa}/{total}':>14} {za:>8} {f'{sb}/{total}':>14} {zb:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
