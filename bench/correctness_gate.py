"""The kernel-correctness gate: what it costs, how often it fails equivalent sets, and the smallest bug it catches.

    .venv/bin/python bench/correctness_gate.py cost [--replays 3]        # real engines over HTTP (CPU, tiny)
    .venv/bin/python bench/correctness_gate.py equivalence [--replays 100] [--budget-s 300]
    .venv/bin/python bench/correctness_gate.py smallest-bug
    .venv/bin/python bench/correctness_gate.py speed                     # the example sets' speed vs torch
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
    """Two real `sits-engine serve` processes through the LocalDeployer (torch vs torch, then torch-wrong-rope),
    the worker's own probe: requests, tokens and seconds of one gate replay of the default prompt set."""
    import tempfile

    from control_plane.adapters.correctness import CorrectnessProbe
    from control_plane.adapters.deploy import VariantSpec
    from control_plane.adapters.local import LocalConfig, LocalDeployer
    policy = CorrectnessPolicy()
    d = LocalDeployer(LocalConfig(workdir=tempfile.mkdtemp(prefix="sits-gate-"), cpu_threads=1, ready_timeout_s=240))
    out = {}
    try:
        for canary in ("torch", "torch-wrong-rope", "torch-slow-attn"):
            d.deploy(VariantSpec("gatebench", "production", "torch"))
            d.deploy(VariantSpec("gatebench", "baseline", "torch"))
            d.deploy(VariantSpec("gatebench", "canary", canary))
            st = d.status("gatebench")
            runs = [CorrectnessProbe().run(st["canary"].endpoint, st["baseline"].endpoint, policy)
                    for _ in range(args.replays)]
            secs = sorted(r.seconds for r in runs)
            v = runs[-1].verdict
            out[f"torch vs {canary}"] = {"requests": runs[-1].requests, "tokens": runs[-1].tokens,
                                         "seconds_median": round(secs[len(secs) // 2], 2),
                                         "seconds_max": round(secs[-1], 2), "outcome": v.outcome.value,
                                         "dtype": v.dtype, "failed": list(v.failed)}
            print(canary, out[f"torch vs {canary}"], flush=True)
            d.rollback("gatebench")
    finally:
        d.close()
    return out


def speed(args) -> dict:
    """Offline tiny-model throughput of torch and the example sets on CPU: a prefill-heavy and a decode-heavy
    workload, the median of 3 runs each (interleaved, so machine load hits every set alike)."""
    from engine import LLM, SamplingParams
    sets = ("torch", "torch-slow-attn", "torch-wrong-rope")
    llms = {k: LLM(model="tiny", kernels=k) for k in sets}
    work = {"prefill 8 x 95-token prompts, 1 token": (list(DEFAULT_PROMPTS[18:19]) * 8, 1),
            "decode 8 x 64 tokens": (["Once upon a time"] * 8, 64)}
    times = {(k, w): [] for k in sets for w in work}
    for llm in llms.values():
        llm.generate(["warm up"], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    for _ in range(7):
        for w, (prompts, n) in work.items():
            for k, llm in llms.items():
                t0 = time.perf_counter()
                llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
                times[(k, w)].append(time.perf_counter() - t0)
    out = {}
    for w in work:
        base = sorted(times[("torch", w)])[3]
        for k in sets:
            med = sorted(times[(k, w)])[3]
            out[f"{w}: {k}"] = {"seconds": round(med, 4), "vs_torch": round(med / base, 2)}
            print(f"{w:40s} {k:18s} {med * 1000:8.1f} ms  x{med / base:.2f}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("cost", "equivalence", "smallest-bug", "gpu", "speed"))
    ap.add_argument("--replays", type=int, default=None, help="equivalence: 100; cost: 3")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale-errors", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.01, 0.001, 0.0001])
    ap.add_argument("--model", default="tiny,llama3-8b")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.replays is None:
        args.replays = 3 if args.mode == "cost" else 100
    result = {"cost": cost, "equivalence": equivalence, "smallest-bug": smallest_bug, "gpu": gpu,
              "speed": speed}[args.mode](args)
    print(json.dumps(result, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
