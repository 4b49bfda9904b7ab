"""Where a step's time goes, per throughput row: torch.profiler (CUPTI) kernel times of real engine steps, by kind of
kernel, next to the step's wall time and its floor (issue 23: "profile first, then fix what the profile shows").

    python3 bench/profile_steps.py [--cases decode1,ttft,b32,b256,arrivals] [--quantization int8] [--json OUT.json]
    .venv/bin/python bench/profile_steps.py --smoke        # tiny model on CPU, small shapes: a test of this script
                                                            # (its "kernels" are the innermost aten ops)

Cases (llama3-8b preset, random weights and prompt tokens, kernel set triton-v1.1, after `LLMEngine.warmup()`):
- decode1: one 128-token prompt decoding (the batch-1 rows); decode steps replay CUDA graphs;
- ttft: one 2048-token prompt, max_tokens 1 (the TTFT row): one prefill step;
- b32: 32 x 2048-token prompts (the 32 x 2048/512 row): its 2048-token prefill steps, then decode steps at 32;
- b256: 256 x 2048 (the 256 x 2048/512 row): a few of its prefill steps, then decode steps at 256;
- arrivals: 128 short prompts decoding while one more arrives every 6 steps (open-loop serving): the wall time of steps
  that only decode and of steps that also prefill, then the profile of arrival steps.
Each kind of step is timed without the profiler first (median wall time, the GPU synchronized after each step), then
profiled. Per kind: wall ms per step; GPU busy ms per step (the union of kernel intervals); kernel ms per step by kind
(matmul = cuBLAS / cuBLASLt / Triton linear kernels, attention, norm, rope, activation, other); the floor (weights and KV
read once at the copy bandwidth, or the FLOPs at the matmul rate, both measured at the start of the run); the top
kernels. "gaps" = wall - GPU busy: time the GPU waits for the host (launches, Python) or for a copy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import Shape, _sync, build, ceilings, prompts  # noqa: E402  (bench/throughput.py, beside this one)

FULL = dict(d1_in=128, ttft_len=2048, b32=32, b256=256, b_in=2048, timed=20, profiled=10, prefill_profiled=3,
            arrivals_batch=128, arrivals_steps=240)
SMOKE = dict(d1_in=8, ttft_len=40, b32=3, b256=5, b_in=20, timed=3, profiled=2, prefill_profiled=1,
             arrivals_batch=4, arrivals_steps=18)
CASES = ("decode1", "ttft", "b32", "b256", "arrivals")
KINDS = ("matmul", "attention", "norm", "rope", "activation", "other")


def kind_of(name: str) -> str:
    n = name.lower()
    if "attention" in n or "attn" in n or "flash" in n:
        return "attention"
    if any(k in n for k in ("gemm", "gemv", "w8a8", "nvjet", "xmma", "cutlass", "linear", "matmul", "splitk",
                            "cublas")):
        return "matmul"
    if "rms" in n or "norm" in n:
        return "norm"
    if "rope" in n or "rotary" in n:
        return "rope"
    if "silu" in n or "gelu" in n or "act" in n:
        return "activation"
    return "other"


def _kernel_events(prof, device: str):
    """(name, start us, end us) of every device kernel the profiler saw (on CPU, for --smoke: the aten ops that
    call no other aten op, the nearest thing to kernels)."""
    out = []
    for e in prof.events():
        if device == "cuda":
            if "CUDA" not in str(getattr(e, "device_type", "")):
                continue
        elif not e.name.startswith("aten::") or any(c.name.startswith("aten::") for c in e.cpu_children):
            continue
        tr = e.time_range
        if tr.end > tr.start:
            out.append((e.name, tr.start, tr.end))
    return out


def _busy_us(events) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for _, s, e in sorted(events, key=lambda x: x[1]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _idle_gaps(events, top: int = 5) -> tuple[float, list]:
    """Idle time between kernels (GPU waiting for the host in mid-step): total us, and the longest gaps as (us,
    kernel before, kernel after)."""
    ev = sorted(events, key=lambda x: x[1])
    gaps, end, before = [], None, None
    for name, s, e in ev:
        if end is not None and s > end:
            gaps.append((s - end, before, name))
        if end is None or e > end:
            end, before = e, name
    gaps.sort(key=lambda g: -g[0])
    return sum(g[0] for g in gaps), [(round(g, 1), a[:50], b[:50]) for g, a, b in gaps[:top]]


def profile(label: str, steps: int, run_step, device: str, floor_ms: float | None, extra: dict) -> dict:
    """Time `steps` calls of run_step() without the profiler, then profile as many more; a summary dict."""
    walls = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        if run_step() is False:
            break
        _sync(device)
        walls.append(time.perf_counter() - t0)
    row = {"case": label, "timed_steps": len(walls), "wall_ms": 1e3 * statistics.median(walls) if walls else None,
           "floor_ms": floor_ms, **extra}
    import torch
    from torch.profiler import ProfilerActivity
    done = 0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            if run_step() is False:
                break
            done += 1
        _sync(device)
    events = _kernel_events(prof, device)
    if not done or not events:
        row["profile"] = "no kernels recorded"
        return row
    by_kind = dict.fromkeys(KINDS, 0.0)
    by_name: dict[str, list[float]] = {}
    for name, s, e in events:
        by_kind[kind_of(name)] += e - s
        by_name.setdefault(name, []).append(e - s)
    per = 1e-3 / done
    idle_us, longest = _idle_gaps(events)
    row.update(profiled_steps=done, kernels_per_step=len(events) / done, busy_ms=_busy_us(events) * per,
               idle_between_kernels_ms=idle_us * per, longest_idle=longest,
               kind_ms={k: v * per for k, v in by_kind.items()},
               top=[(n[:70], len(v) / done, sum(v) * per, statistics.median(v)) for n, v in
                    sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]])
    return row


def decoding(engine) -> bool:
    s = engine.scheduler
    return bool(s.running) and not s.waiting and all(q.num_uncomputed_tokens <= 1 for q in s.running)


def arrivals(engine, add, abort_all, sz, device) -> dict:
    """Open-loop serving in miniature: `arrivals_batch` short prompts decoding, one more 20-token prompt arriving every
    few steps; each step's wall time (no synchronization: as the server's step histogram sees it), split into steps
    that only decode and steps that also prefill; then the profile of arrival steps."""
    batch, every, steps = sz["arrivals_batch"], 6, sz["arrivals_steps"]
    add(batch, 20, 4000)
    while not decoding(engine):
        engine.step()
    shapes: list[tuple[int, int]] = []
    schedule = engine.scheduler.schedule

    def recording():
        b = schedule()
        shapes.append((sum(n for n in b.num_new_tokens if n > 1), sum(1 for n in b.num_new_tokens if n == 1)))
        return b

    engine.scheduler.schedule = recording
    walls: dict[str, list[float]] = {"decode only": [], "with a prefill": []}
    try:
        for i in range(steps):
            if i % every == 0:
                add(1, 20, 4000)
            n0 = len(shapes)
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            kinds = shapes[n0:]
            walls["with a prefill" if any(p for p, _ in kinds) else "decode only"].append(dt)
    finally:
        engine.scheduler.schedule = schedule

    def q(xs, p):
        xs = sorted(xs)
        return 1e3 * xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

    split = {k: {"steps": len(v), "p50_ms": q(v, .5), "p90_ms": q(v, .9), "max_ms": q(v, 1.0)}
             for k, v in walls.items()}

    def arrival_step():
        add(1, 20, 4000)
        engine.step()

    row = profile(f"arrivals: {batch} decoding, a 20-token prompt arrives (that step)", sz["profiled"], arrival_step,
                  device, None, {"split": split, "running": len(engine.scheduler.running)})
    abort_all()
    return row


def run(args) -> list[dict]:
    import random

    from sits.engine import SamplingParams

    sz = SMOKE if args.smoke else FULL
    device = "cpu" if args.smoke else "cuda"
    model = "tiny" if args.smoke else args.model
    kernels = "torch" if args.smoke else args.kernels
    copy, tflops = ceilings(device)
    print(f"ceilings: copy {copy:.2f} TB/s, bf16 matmul {tflops:.0f} TFLOP/s", flush=True)
    llm, info = build(model, kernels, device, args.quantization, 256, piecewise_graphs=args.piecewise_graphs,
                      kv_cache_dtype=args.kv_cache_dtype)
    engine = llm.engine
    shape = Shape(engine)
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    print(f"engine ready: load {info['load_s']:.1f} s, warm-up {info['warmup_s']:.1f} s", flush=True)
    rows: list[dict] = []
    uid = iter(range(10 ** 9))

    def step():
        engine.step()

    def drain():
        while engine.has_unfinished_requests():
            engine.step()

    def abort_all():
        for seq in list(engine.scheduler.running) + list(engine.scheduler.waiting):
            engine.abort_request(seq.request_id)
        drain()

    def add(batch: int, length: int, out: int) -> None:
        for p in prompts(rng, batch, length, vocab):
            engine.add_request(f"p{next(uid)}", p, SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True))

    def decode_floor(batch: int, context: int) -> float:
        return 1e3 * (shape.weight_bytes + batch * context * shape.kv_bytes_per_token) / (copy * 1e12)

    def prefill_floor(tokens: int, length: int) -> float:
        seqs = tokens / length
        return 1e3 * shape.prefill_s(1, length, tflops, copy) * seqs

    cases = args.cases
    if "arrivals" in cases:
        rows.append(arrivals(engine, add, abort_all, sz, device))
    if "decode1" in cases:
        add(1, sz["d1_in"], 2000)
        while not decoding(engine):
            engine.step()
        rows.append(profile("decode, batch 1", sz["timed"], step, device, decode_floor(1, sz["d1_in"] + 20), {}))
        abort_all()
    if "ttft" in cases:
        def one_prefill():
            add(1, sz["ttft_len"], 1)
            drain()
        rows.append(profile(f"prefill, one {sz['ttft_len']}-token prompt (TTFT)", sz["prefill_profiled"] + 2,
                            one_prefill, device, prefill_floor(sz["ttft_len"], sz["ttft_len"]), {}))
    for key, label in (("b32", "b32"), ("b256", "b256")):
        if label not in cases:
            continue
        batch = sz[key]
        add(batch, sz["b_in"], 2 * batch + 100)   # none finishes before the last one's prefill is done

        def prefill_step():
            if decoding(engine):
                return False
            engine.step()

        tokens = min(engine.config.max_num_batched_tokens, batch * sz["b_in"])   # a step's prompt tokens
        rows.append(profile(f"{batch} x {sz['b_in']}: prefill steps ({tokens} tokens)", sz["prefill_profiled"],
                            prefill_step, device, prefill_floor(tokens, sz["b_in"]), {}))
        while not decoding(engine):
            engine.step()
        rows.append(profile(f"{batch} x {sz['b_in']}: decode steps at {batch}", sz["profiled"], step, device,
                            decode_floor(batch, sz["b_in"] + 40), {}))
        abort_all()
    return rows


def report(rows: list[dict], title: str) -> str:
    lines = [f"### {title}", "",
             "| step | wall ms | floor ms | GPU busy ms | gaps ms | kernels | " + " | ".join(KINDS) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(KINDS)]
    for r in rows:
        wall = r.get("wall_ms")
        fl = r.get("floor_ms") or float("nan")
        if "kind_ms" not in r:
            lines.append(f"| {r['case']} | {wall or float('nan'):.2f} | {fl or float('nan'):.2f} | "
                         f"{r.get('profile', 'not profiled')} |")
            continue
        kinds = " | ".join(f"{r['kind_ms'][k]:.2f}" for k in KINDS)
        lines.append(f"| {r['case']} | {wall:.2f} | {fl:.2f} | {r['busy_ms']:.2f} | {wall - r['busy_ms']:.2f} | "
                     f"{r['kernels_per_step']:.0f} | {kinds} |")
    for r in rows:
        for kind, st in r.get("split", {}).items():
            lines.append(f"  {r['case']}: {kind}: {st['steps']} steps, wall p50 {st['p50_ms']:.2f} / p90 "
                         f"{st['p90_ms']:.2f} / max {st['max_ms']:.2f} ms")
    for r in rows:
        if r.get("top"):
            lines += ["", f"top kernels, {r['case']} (calls per step, ms per step, median us per call):"]
            lines += [f"  {ms:7.3f} ms  {calls:5.1f}x  {med:8.1f} us  {name}" for name, calls, ms, med in r["top"]]
            lines.append(f"  GPU idle between kernels: {r['idle_between_kernels_ms']:.2f} ms per step (profiled steps, "
                         f"the gaps between steps included); longest: "
                         + "; ".join(f"{us:.0f} us after {a} before {b}" for us, a, b in r["longest_idle"][:3]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=lambda v: [x for x in v.split(",") if x], default=list(CASES))
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--kernels", default="triton-v1.1")
    p.add_argument("--quantization", choices=["int8", "fp8"], default=None)
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                   help="FP8 KV pages need a set that takes them (triton-v1.3, triton-v1.4)")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--piecewise-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="steps with prefill tokens replayed piecewise from CUDA graphs "
                        "(engine/execution/piecewise_graphs.py; the engine's default); --no-piecewise-graphs runs "
                        "them eagerly")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, small shapes (aten ops stand in for kernels)")
    args = p.parse_args(argv)
    unknown = set(args.cases) - set(CASES)
    if unknown:
        p.error(f"unknown case(s) {', '.join(sorted(unknown))}: choose from {', '.join(CASES)}")
    rows = run(args)
    title = f"{'tiny (smoke)' if args.smoke else args.model}, {args.kernels if not args.smoke else 'torch'}, " \
            f"{args.quantization or 'bf16'} weights" + (", FP8 KV pages" if args.kv_cache_dtype == "fp8" else "") \
        + ("" if args.piecewise_graphs else ", no piecewise graphs")
    print(report(rows, title), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
