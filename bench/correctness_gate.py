"""The kernel-correctness gate: what it costs, how often it fails equivalent sets, and the smallest bug it catches.

    .venv/bin/python bench/correctness_gate.py cost [--replays 3]        # real engines over HTTP (CPU, tiny)
    .venv/bin/python bench/correctness_gate.py equivalence [--replays 100] [--budget-s 300] [--model M --dtype D]
    .venv/bin/python bench/correctness_gate.py smallest-bug [--model M --dtype D]
    .venv/bin/python bench/correctness_gate.py margins [--model tiny,.cache/tiny-trained --dtype bfloat16]
    .venv/bin/python bench/correctness_gate.py speed                     # the example sets' speed vs torch
    python3 bench/correctness_gate.py gpu --model .cache/tiny-trained,tiny,llama3-8b --dtype bfloat16

--model takes presets or checkpoint directories (bench/train_tiny.py builds the trained tiny one; a missing
.cache/tiny-trained is trained first); --dtype is the engines' compute dtype and the tolerances applied.

cost: two `sits-engine serve` processes (torch, torch), one gate replay of the default prompt set through
    adapters/inference/correctness.py: requests, tokens, wall seconds.
equivalence: the torch set against itself in-process (offline engine), the baseline run one prompt at a time, the
    canary with the prompt set shuffled into random batches next to random filler requests (a different batch
    composition every replay); the false-fail rate of the default policy, plus the drift statistics.
smallest-bug: torch with the attention softmax scale off by 10 %, 1 %, 0.1 %, 0.01 % (--scale-errors; derived
    in-process), the split-K set (equivalent) and the two example sets, each against torch: which the default policy
    fails, and on what.
margins: the baseline's runner-up margins (top-1 minus top-2 logprob) over the default set's continuations, and for
    each canary (--canary; the baseline's own set, --baseline, default torch: itself in other batches) the largest
    margin at which a token flipped and the drift at confident positions: what the half-precision and quantized
    confident_margin rest on (`--baseline triton-v1.24 --quantization fp8 --kv-cache-dtype fp8 --dtype bfloat16
    --device cuda`: both engines' flags; every replay is kept whole in --json, `load_replays` reads it back).
    `--scale-sets` registers bench-scale-E (--scale-errors) from the baseline; bench-wrong-rope is registered always.
gpu: per model, the baseline set (--baseline, default torch) against itself (other batches), then the canaries
    (--canary; default triton-v1 and torch-wrong-rope) against it in --dtype with the default policy, a table last
    (--quantization / --kv-cache-dtype: both engines' flags, e.g. `--model llama3-8b --baseline triton-v1.24
    --canary triton-v1.25 --quantization fp8 --kv-cache-dtype fp8`); one device call of a few minutes at most (a
    fixed KV cache and eager decode; --json is rewritten after every row). `--device cpu` runs the same path on the
    CPU, with the split-K set (bench-split-k, an equivalent GEMM) in place of triton-v1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRAINED = ROOT / ".cache" / "tiny-trained"   # bench/train_tiny.py's default output

from sits.control_plane.analysis import Continuation, CorrectnessPolicy, PromptReplay, TokenLogprob, compare_replays
from sits.control_plane.analysis.correctness import runner_up_margin  # noqa: E402
from sits.control_plane.analysis.prompts import DEFAULT_PROMPTS  # noqa: E402


def _tok(e: dict) -> TokenLogprob:
    return TokenLogprob(e["token_id"], e["logprob"], tuple((t, lp) for t, lp in e["top_logprobs"]))


def offline_replay(base_llm, canary_llm, prompts, policy: CorrectnessPolicy, *, shuffle: random.Random | None = None,
                   filler: int = 0) -> list[PromptReplay]:
    """Greedy continuations from both engines, and both engines' teacher-forced scores of the baseline's tokens."""
    from sits.engine import SamplingParams
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
    score = lambda j: SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=policy.top_logprobs)  # noqa: E731
    fed = [tok.encode(p) + b.token_ids for p, b in zip(prompts, base)]
    scored = batched(canary_llm, fed, score)
    # the baseline scores its own continuation too, in batches of its own, as the product's probe does
    # (adapters/inference/correctness.py): like compared with like, one prefill against one prefill
    scored_base = batched(base_llm, fed, score)
    out = []
    for p, b, c, s, sb in zip(prompts, base, can, scored, scored_base):
        n_prompt = len(tok.encode(p))
        forced = tuple(_tok(e) for e in s.prompt_logprobs[n_prompt - 1:])
        forced_base = tuple(_tok(e) for e in sb.prompt_logprobs[n_prompt - 1:])
        out.append(PromptReplay(p, Continuation(tuple(b.token_ids), b.text, tuple(map(_tok, b.logprobs))),
                                Continuation(tuple(c.token_ids), c.text, tuple(map(_tok, c.logprobs))),
                                Continuation(tuple(b.token_ids), b.text, forced),
                                Continuation(tuple(b.token_ids), b.text, forced_base)))
    return out


def _summary(v) -> dict:
    return {"outcome": v.outcome.value, "identical_fraction": v.identical_fraction,
            "top1_agreement": v.top1_agreement, "drift_mean": v.drift_mean, "drift_max": v.drift_max,
            "diverged": v.diverged, "positions": v.positions, "confident_positions": v.confident_positions,
            "confident_top1": v.confident_top1, "confident_drift_mean": v.confident_drift_mean,
            "confident_drift_max": v.confident_drift_max, "failed": list(v.failed), "reason": v.reason}


def _row(v) -> str:
    return (f"{v.outcome.value:12s} identical {v.identical_fraction:4.0%} top1 {v.top1_agreement:6.1%} drift mean "
            f"{v.drift_mean:.2e} max {v.drift_max:.2e} | confident {v.confident_positions:3d}/{v.positions:3d} "
            f"top1 {v.confident_top1:6.1%} drift mean {v.confident_drift_mean:.2e} max {v.confident_drift_max:.2e}"
            f" | failed {','.join(v.failed) or '-'}")


def position_stats(replays: list[PromptReplay]) -> list[tuple[float | None, float, bool]]:
    """Per teacher-forced position: (baseline runner-up margin, |canary - baseline| logprob, canary top-1 agrees)."""
    out = []
    for r in replays:
        # the baseline's own scoring where present: the gate compares one prefill with another (analysis/correctness)
        for f, b in zip(r.forced.logprobs, (r.forced_baseline or r.baseline).logprobs):
            out.append((runner_up_margin(b), abs(f.logprob - b.logprob), f.is_top1))
    return out


def load_replays(rows: list[dict]) -> list[PromptReplay]:
    """margins' saved replays (dataclasses.asdict of PromptReplay) back as PromptReplay."""
    def cont(d: dict) -> Continuation:
        lps = tuple(TokenLogprob(e["token_id"], e["logprob"], tuple(map(tuple, e["top"]))) for e in d["logprobs"])
        return Continuation(**{**d, "token_ids": tuple(d["token_ids"]), "logprobs": lps})
    return [PromptReplay(r["prompt"], *(cont(r[k]) for k in ("baseline", "canary", "forced", "forced_baseline")))
            for r in rows]


def _quantiles(xs: list[float], qs=(0.1, 0.25, 0.5, 0.75, 0.9)) -> list[float]:
    xs = sorted(xs)
    return [round(xs[min(len(xs) - 1, int(q * len(xs)))], 4) for q in qs] if xs else []


def margins(args) -> dict:
    """The baseline's margins per model, and what equivalent canaries (--canary; other batches) do at each margin."""
    policy = CorrectnessPolicy()
    register_bench_sets(args.scale_errors if args.scale_sets else (), base=args.baseline)
    out, key = {}, _tolerances(args)
    # on a GPU: gpu's fixed KV cache and eager decode, so that two 8B engines fit side by side
    kw = {"num_kv_blocks": 512, "enforce_eager": True} if args.device == "cuda" else {}
    for model in _models(args):
        base = _llm(args, model, args.baseline, **kw)
        for name in args.canary.split(","):
            canary = base if name == args.baseline else _llm(args, model, name, **kw)   # itself: other batches
            rng = random.Random(args.seed)
            stats, flips, kept = [], [], []
            for _ in range(args.replays):
                reps = offline_replay(base, canary, DEFAULT_PROMPTS, policy, shuffle=rng, filler=2)
                kept.append([dataclasses.asdict(r) for r in reps])
                stats += position_stats(reps)
                v = compare_replays(reps, policy, key)
                flips += [r.baseline_margin for r in v.evidence if r.baseline_margin is not None]
                print(f"{model} {name} vs {args.baseline} {key}: {_row(v)}", flush=True)
            known = [m for m, _, _ in stats if m is not None]
            disagree = [m for m, _, ok in stats if m is not None and not ok]
            res = {"positions": len(stats), "margin_quantiles_10_25_50_75_90": _quantiles(known),
                   "fraction_margin_gt": {t: round(sum(m > t for m in known) / max(1, len(known)), 3)
                                          for t in (0.1, 0.5, 1.0, 2.0, 4.0)},
                   "teacher_forced_flips": len(disagree),
                   "largest_margin_of_a_teacher_forced_flip": max(disagree, default=None),
                   "largest_margin_of_a_greedy_divergence": max(flips, default=None),
                   "max_drift_at_margin_gt": {t: max((d for m, d, _ in stats if m is not None and m > t), default=None)
                                              for t in (0.5, 1.0, 2.0, 3.0)},
                   "mean_drift_at_margin_gt_3": _mean([d for m, d, _ in stats if m is not None and m > 3.0]),
                   "mean_drift_at_margin_gt_1": _mean([d for m, d, _ in stats if m is not None and m > 1.0]),
                   "max_drift_all": max((d for _, d, _ in stats), default=None)}
            print(model, name, json.dumps(res), flush=True)
            # every replay whole (`load_replays` reads them back): other tolerances can be judged on them offline
            out[f"{model} {name}"] = {**res, "replays": kept}
            del canary
            _free()
        del base
        _free()
    return out


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def _llm(args, model: str, kernels: str, **kw):
    from sits.engine import LLM
    flags = {"quantization": getattr(args, "quantization", None),
             "kv_cache_dtype": getattr(args, "kv_cache_dtype", None)}
    return LLM(model=model, kernels=kernels, dtype=args.dtype, device=args.device,
               **{k: v for k, v in flags.items() if v is not None}, **kw)


def _tolerances(args) -> str:
    """The tolerances the product's gate would judge these engines by (both run the same flags):
    analysis/gate_policy.py `tolerances_key` over what each quantizes (`quantized_by`, as adapters/inference/
    correctness.py reads an engine's /version)."""
    from sits.control_plane.analysis.gate_policy import quantized_by, tolerances_key
    q = quantized_by(getattr(args, "quantization", None), getattr(args, "kv_cache_dtype", None))
    return tolerances_key(args.dtype, q, q)


def _model(args) -> str:
    return _models(args)[0]


def _models(args) -> list[str]:
    """--model entries; the trained tiny checkpoint is built first when it is named and missing."""
    out = []
    for m in args.model.split(","):
        p = Path(m)
        if p.resolve() == TRAINED.resolve() and not (p / "model.safetensors").is_file():
            from bench.train_tiny import build
            build(p, device=args.device if args.device != "auto" else "cpu")
        out.append(m)
    return out


def equivalence(args) -> dict:
    policy = CorrectnessPolicy()
    model = _model(args)
    register_bench_sets()
    base = _llm(args, model, "torch")
    canary = _llm(args, model, args.canary)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    fails, drift_max, worst_identical, worst_top1, n, sure_max, outcomes = 0, 0.0, 1.0, 1.0, 0, 0.0, {}
    while n < args.replays and time.perf_counter() - t0 < args.budget_s:
        v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy, shuffle=rng, filler=2), policy,
                            args.dtype)
        n += 1
        outcomes[v.outcome.value] = outcomes.get(v.outcome.value, 0) + 1
        sure_max = max(sure_max, 0.0 if math.isnan(v.confident_drift_max) else v.confident_drift_max)
        fails += v.outcome.value == "fail"
        drift_max = max(drift_max, v.drift_max)
        worst_identical = min(worst_identical, v.identical_fraction)
        worst_top1 = min(worst_top1, v.top1_agreement)
    return {"replays": n, "false_fails": fails, "false_fail_rate": fails / n if n else math.nan,
            "max_drift": drift_max, "worst_identical_fraction": worst_identical, "worst_top1": worst_top1,
            "max_confident_drift": sure_max, "outcomes": outcomes, "model": model, "dtype": args.dtype,
            "seconds": round(time.perf_counter() - t0, 1)}


def register_bench_sets(scale_errors=(), base: str = "torch") -> list[tuple[str, str]]:
    """Kernel sets derived in-process for the measurements: (label, name). The softmax scale of both attention ops
    times 1 + e (a bug of size e) and torch-wrong-rope's RoPE as `bench-wrong-rope`, both derived from `base`; and a
    split-K linear (each matmul as two half-K products rounded to the activation dtype, then added): equivalent to
    torch up to one extra rounding per output, which in bf16 is the kind of difference another GEMM kernel makes, and
    on the CPU (where torch's bf16 results do not depend on the batch) the only source of such noise."""
    import torch

    from sits import kernels
    from sits.kernels.registry import register_kernel_set
    from sits.kernels.rope_and_cache import rope_and_cache_fixed_base_ref
    torch_set = kernels.get_kernel_set("torch")
    parent = kernels.get_kernel_set(base)

    def scaled(op, f):
        return lambda *a: op(*a[:-1], a[-1] * f)

    def split_k(x, weight, bias=None):
        if not isinstance(weight, torch.Tensor) or bias is not None or x.shape[-1] < 2:
            return torch_set.linear(x, weight, bias)
        h = x.shape[-1] // 2
        w = weight.to(x.dtype)
        return x[..., :h] @ w[:, :h].T + x[..., h:] @ w[:, h:].T

    out = []
    for err in scale_errors:
        name = f"bench-scale-{err:g}"
        register_kernel_set(parent.derive(
            name, "0.0.1", prefill_attention=scaled(parent.prefill_attention, 1 + err),
            paged_decode_attention=scaled(parent.paged_decode_attention, 1 + err),
            kv_cache_dtypes=parent.kv_cache_dtypes), replace=True)
        out.append((f"softmax scale +{err:.2%}", name))
    # the same KV pages as the parent: torch's RoPE and the scaled ops write and read FP8 pages as the parent's do
    register_kernel_set(parent.derive("bench-wrong-rope", "0.0.1", rope_and_cache=rope_and_cache_fixed_base_ref,
                                      kv_cache_dtypes=parent.kv_cache_dtypes), replace=True)
    register_kernel_set(torch_set.derive("bench-split-k", "0.0.1", linear=split_k), replace=True)
    return out + [("wrong RoPE", "bench-wrong-rope"), ("split-K linear (equivalent)", "bench-split-k")]


def smallest_bug(args) -> dict:
    policy = CorrectnessPolicy()
    model = _model(args)
    base = _llm(args, model, "torch")
    results = {}
    names = register_bench_sets(args.scale_errors)
    names += [("torch-wrong-rope", "torch-wrong-rope"), ("torch-slow-attn", "torch-slow-attn")]
    for label, name in names:
        canary = _llm(args, model, name)
        v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy), policy, args.dtype)
        results[label] = _summary(v)
        print(f"{label:28s} {_row(v)}", flush=True)
        del canary
    return results


def gpu(args) -> dict:
    """Per model: the baseline set (--baseline, default torch) against itself (other batches), then each canary
    (default triton-v1 on CUDA, torch-wrong-rope) against it, in --dtype with the default policy's tolerances (both
    engines with --quantization / --kv-cache-dtype when given, as a release of kernels only would run them); one
    replay each, a table printed last."""
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu: no CUDA device (pass --device cpu to run the same path on the CPU)")
    policy = CorrectnessPolicy()
    baseline = args.baseline
    register_bench_sets(args.scale_errors if args.scale_sets else (), base=baseline)
    # on the CPU (a dry run of this path) triton-v1 cannot run: the split-K set stands in for "another GEMM kernel"
    canaries = args.canary.split(",") if args.canary != "torch" else \
        ["triton-v1" if args.device != "cpu" else "bench-split-k", "torch-wrong-rope"]
    sets = [baseline] + [c for c in canaries if c != baseline]
    flags = " ".join(f"{k} {v}" for k, v in (("quantization", args.quantization),
                                              ("kv-cache", args.kv_cache_dtype)) if v)
    out, rows, tolerances = {}, [], _tolerances(args)
    # a fixed, ample KV cache (the replay holds < 12k tokens at once) instead of 90 % of the GPU, so that several 8B
    # engines fit side by side; eager decode: no graph capture per batch size (graphs do not change the numerics)
    kw = {"num_kv_blocks": 512, "enforce_eager": True}
    for model in _models(args):
        base = _llm(args, model, baseline, **kw)
        for name in sets:
            # the baseline against itself: the same engine, its greedy answers one prompt at a time, the rest in
            # other batches
            canary = base if name == baseline else _llm(args, model, name, **kw)
            t0 = time.perf_counter()
            v = compare_replays(offline_replay(base, canary, DEFAULT_PROMPTS, policy, shuffle=random.Random(0),
                                               filler=2), policy, tolerances)
            key = f"{Path(model).name or model} {name} vs {baseline} {tolerances}{' ' + flags if flags else ''}"
            out[key] = {**_summary(v), "seconds": round(time.perf_counter() - t0, 1),
                        "evidence": [e.to_dict() for e in v.evidence[:2]]}
            rows.append((key, v))
            print(f"{key:48s} {_row(v)}  ({out[key]['seconds']} s)", flush=True)
            if args.json:   # after every row: a run cut short by its time limit keeps what it measured
                args.json.write_text(json.dumps(out, indent=1, default=str))
            del canary
            _free()
        del base
        _free()
    print(f"\n{'canary vs baseline':48s} outcome      stats (all positions | confident positions)")
    for key, v in rows:
        print(f"{key:48s} {_row(v)}")
        print(f"{'':48s} reason: {v.reason[:300]}")
    return out


def _free() -> None:
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cost(args) -> dict:
    """Two real `sits-engine serve` processes through the LocalDeployer (torch vs torch, then torch-wrong-rope),
    the worker's own probe: requests, tokens and seconds of one gate replay of the default prompt set."""
    import tempfile

    from sits.control_plane.adapters.inference.correctness import CorrectnessProbe
    from sits.control_plane.adapters.deploy import VariantSpec
    from sits.control_plane.adapters.deploy.local.config import LocalConfig
    from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
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
    from sits.engine import LLM, SamplingParams
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
    ap.add_argument("mode", choices=("cost", "equivalence", "smallest-bug", "margins", "gpu", "speed"))
    ap.add_argument("--replays", type=int, default=None, help="equivalence: 100; cost: 3")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale-errors", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.01, 0.001, 0.0001])
    ap.add_argument("--model", default=None, help="presets or checkpoint dirs, comma-separated (gpu, margins: "
                    "several; default tiny; gpu: .cache/tiny-trained,tiny,llama3-8b)")
    ap.add_argument("--dtype", default=None, help="engine dtype and tolerances (default float32; gpu: bfloat16)")
    ap.add_argument("--canary", default="torch", help="margins, equivalence: the equivalent canary set(s), e.g. "
                    "torch,torch-slow-attn,bench-split-k; gpu: the canaries (default torch,triton-v1,torch-wrong-rope"
                    "; on the CPU bench-split-k for triton-v1)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default cpu; gpu: cuda)")
    ap.add_argument("--baseline", default="torch", help="gpu: the baseline's kernel set (default torch)")
    ap.add_argument("--quantization", default=None, help="gpu: both engines' weights (int8, fp8)")
    ap.add_argument("--kv-cache-dtype", default=None, help="gpu: both engines' KV pages (auto, fp8)")
    ap.add_argument("--scale-sets", action="store_true", help="gpu, margins: also register the --scale-errors sets "
                    "(bench-scale-E, derived from --baseline) so that --canary can name them")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.replays is None:
        args.replays = {"cost": 3, "margins": 2}.get(args.mode, 100)
    gpu_mode = args.mode == "gpu"
    args.model = args.model or (f"{TRAINED},tiny,llama3-8b" if gpu_mode else "tiny")
    args.dtype = args.dtype or ("bfloat16" if gpu_mode else "float32")
    args.device = args.device or ("cuda" if gpu_mode else "cpu")
    result = {"cost": cost, "equivalence": equivalence, "smallest-bug": smallest_bug, "margins": margins,
              "gpu": gpu, "speed": speed}[args.mode](args)
    if args.mode != "gpu":   # gpu: its table is the last thing printed (the JSON goes to --json)
        shown = {k: {f: x for f, x in v.items() if f != "replays"} if isinstance(v, dict) else v
                 for k, v in result.items()}   # margins: the replays whole only in --json
        print(json.dumps(shown, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
