"""The kernel-correctness gate: what it costs, how often it fails equivalent sets, and the smallest bug it catches.

    .venv/bin/python bench/correctness_gate.py cost [--replays 3]        # real engines over HTTP (CPU, tiny)
    .venv/bin/python bench/correctness_gate.py equivalence [--replays 100] [--budget-s 300]
    .venv/bin/python bench/correctness_gate.py smallest-bug
    python3 bench/correctness_gate.py gpu [--model tiny,llama3-8b]       # torch vs triton-v1 in bf16 on a GPU

cost: two `sits-engine serve` processes (torch, torch), one gate replay of the default prompt set through
    adapters/correctness.py: requests, tokens, wall seconds.
equivalence: the torch set against itself in-process (offline engine), the baseline run one prompt at a time, the
    canary with the prompt set shuffled into random batches next to random filler requests (a different batch
    composition every replay); the false-fail rate of the default policy, plus the drift statistics.
smallest-bug: torch with the attention softmax scale off by 10 %, 1 %, 0.1 %, 0.01 % (derived in-process) and the
    two example sets, each against torch: which the default policy fails, and on what.
gpu: the same statistics for triton-v1 vs torch, bf16, on CUDA (the measurement the default tolerances rest on).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from control_plane.analysis import (Continuation, CorrectnessPolicy, PromptReplay, TokenLogprob,  # noqa: E402
                                    compare_replays)
from control_plane.analysis.prompts import DEFAULT_PROMPTS  # noqa: E402


def _tok(e: dict) -> TokenLogprob:
    return TokenLogprob(e["token_id"], e["logprob"], tuple((t, lp) for t, lp in e["top_logprobs"]))


def offline_replay(base_llm, canary_llm, prompts, policy: CorrectnessPolicy, *, shuffle: random.Random | None = None,
                   filler: int = 0) -> list[PromptReplay]:
    """Greedy continuations from both engines and the canary's teacher-forced scores of the baseline's tokens."""
    from engine import SamplingParams
    sp = SamplingParams(max_tokens=policy.max_tokens, temperature=0.0, logprobs=policy.top_logprobs)
    base = [base_llm.generate([p], sp, use_tqdm=False)[0] for p in prompts]   # one at a time

    def batched(llm, items, params):
        order = list(range(len(items)))
        if shuffle is not None:
            shuffle.shuffle(order)
        out = [None] * len(items)
        i = 0
        while i < len(order):
            n = shuffle.randint(1, 8) if shuffle is not None else len(order)
            chunk = order[i:i + n]
            extra = [" ".join(["noise"] * shuffle.randint(1, 60)) for _ in range(filler)] if shuffle else []
            res = llm.generate([items[j] for j in chunk] + extra,
                               [params(j) for j in chunk] + [sp] * len(extra), use_tqdm=False)
            for j, r in zip(chunk, res):
                out[j] = r
            i += n
        return out

    can = batched(canary_llm, prompts, lambda j: sp)
    tok = base_llm.tokenizer
    scored = batched(canary_llm, [tok.encode(p) + b.token_ids for p, b in zip(prompts, base)],
                     lambda j: SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=policy.top_logprobs))
    out = []
    for p, b, c, s in zip(prompts, base, can, scored):
        n_prompt = len(tok.encode(p))
        forced = tuple(_tok(e) for e in s.prompt_logprobs[n_prompt - 1:])
        out.append(PromptReplay(p, Continuation(tuple(b.token_ids), b.text, tuple(map(_tok, b.logprobs))),
                                Continuation(tuple(c.token_ids), c.text, tuple(map(_tok, c.logprobs))),
                                Continuation(tuple(b.token_ids), b.text, forced)))
    return out


def _summary(v) -> dict:
    return {"outcome": v.outcome.value, "identical_fraction": v.identical_fraction,
            "top1_agreement": v.top1_agreement, "drift_mean": v.drift_mean, "drift_max": v.drift_max,
            "diverged": v.diverged, "failed": list(v.failed), "reason": v.reason}


def equivalence(args) -> dict:
    from engine import LLM
    policy = CorrectnessPolicy()
    base = LLM(model="tiny", kernels="torch")
    canary = LLM(model="tiny", kernels="torch")
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    fails, drift_max, worst_identical, worst_top1, n = 0, 0.0, 1.0, 1.0, 0
    while n < args.replays and time.perf_counter() - t0 < args.budget_s:
        v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy, shuffle=rng, filler=2), policy)
        n += 1
        fails += v.outcome.value == "fail"
        drift_max = max(drift_max, v.drift_max)
        worst_identical = min(worst_identical, v.identical_fraction)
        worst_top1 = min(worst_top1, v.top1_agreement)
    return {"replays": n, "false_fails": fails, "false_fail_rate": fails / n if n else math.nan,
            "max_drift": drift_max, "worst_identical_fraction": worst_identical, "worst_top1": worst_top1,
            "seconds": round(time.perf_counter() - t0, 1)}


def smallest_bug(args) -> dict:
    import kernels
    from engine import LLM
    from kernels.registry import register_kernel_set
    torch_set = kernels.get_kernel_set("torch")
    policy = CorrectnessPolicy()
    base = LLM(model="tiny", kernels="torch")
    results = {}

    def scaled(op, f):
        return lambda *a: op(*a[:-1], a[-1] * f)

    names = []
    for err in args.scale_errors:
        name = f"bench-scale-{err:g}"
        register_kernel_set(torch_set.derive(
            name, "0.0.1", prefill_attention=scaled(torch_set.prefill_attention, 1 + err),
            paged_decode_attention=scaled(torch_set.paged_decode_attention, 1 + err)), replace=True)
        names.append((f"softmax scale +{err:.2%}", name))
    names += [("torch-wrong-rope", "torch-wrong-rope"), ("torch-slow-attn", "torch-slow-attn")]
    for label, name in names:
        canary = LLM(model="tiny", kernels=name)
        v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy), policy)
        results[label] = _summary(v)
        print(f"{label:28s} {v.outcome.value:5s} identical {v.identical_fraction:.0%} top1 {v.top1_agreement:.1%} "
              f"drift mean {v.drift_mean:.2e} max {v.drift_max:.2e} failed {','.join(v.failed) or '-'}", flush=True)
        del canary
    return results


def gpu(args) -> dict:
    import torch
    from engine import LLM
    if not torch.cuda.is_available():
        raise SystemExit("gpu: no CUDA device")
    policy = CorrectnessPolicy()
    out = {}
    for model in args.model.split(","):
        base = LLM(model=model, kernels="torch", dtype="bfloat16")
        for name in ("torch", "triton-v1"):
            canary = base if name == "torch" else LLM(model=model, kernels=name, dtype="bfloat16")
            rng = random.Random(0)
            t0 = time.perf_counter()
            v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy, shuffle=rng, filler=2), policy)
            out[f"{model} {name} vs torch bf16"] = {**_summary(v), "seconds": round(time.perf_counter() - t0, 1),
                                                     "evidence": [e.to_dict() for e in v.evidence[:3]]}
            print(json.dumps(out[f"{model} {name} vs torch bf16"], default=str)[:2000], flush=True)
            if canary is not base:
                del canary
        del base
        torch.cuda.empty_cache()
    return out


def cost(args) -> dict:
    from bench.correctness_cost import measure_cost   # real processes; kept apart (needs the adapter and deployer)
    return measure_cost(args.replays)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("cost", "equivalence", "smallest-bug", "gpu"))
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale-errors", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.01, 0.001, 0.0001])
    ap.add_argument("--model", default="tiny,llama3-8b")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = {"cost": cost, "equivalence": equivalence, "smallest-bug": smallest_bug, "gpu": gpu}[args.mode](args)
    print(json.dumps(result, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
