"""Engine decode speed on a GPU: llama3-8b (random weights, bf16) per kernel set, quantization and with or without
CUDA graphs, against the memory-bandwidth floor of one decode step (every weight byte read once).

    python3 bench/engine_decode.py [--json OUT.json] [--tokens 64] [--batches 1,32] [--configs ...] [--profile]
    .venv/bin/python bench/engine_decode.py --model tiny --cpu --batches 1,4 --tokens 8   # smoke test, no GPU

For each configuration the engine is built once; each batch size runs a greedy decode of --tokens tokens after a
64-token prompt per sequence. Reported: decode tokens/s, the mean wall time of a decode step (engine.step(), prefill
steps excluded), and the floor = weight bytes / copy bandwidth measured in the same run. A step far above its floor
is bound by the host (Python and kernel launches), not by the GPU.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (kernel set, quantization, CUDA graphs); the torch set is never captured (its reference ops read values back)
CONFIGS = (("torch", None, False), ("triton-v1.1", None, False), ("triton-v1.1", None, True),
           ("triton-v1.1", "int8", False), ("triton-v1.1", "int8", True))


def copy_tbs(device: str) -> float:
    import torch
    n = 1 << (29 if device == "cuda" else 24)
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    times = []
    for _ in range(20):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n * 2 / sorted(times)[len(times) // 2] / 1e12


def _sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def weight_bytes(engine) -> int:
    from sits.kernels import QuantizedWeight
    model = engine.model_runner.model
    total = 0
    for layer in model.layers:
        for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
            w = lin.weight
            total += w.nbytes() if isinstance(w, QuantizedWeight) else w.numel() * w.element_size()
    head = model.lm_head.weight if model.lm_head is not None else model.embed_tokens
    return total + head.numel() * head.element_size()


def run_config(model: str, device: str, kernels: str, quant: str | None, graphs: bool, batches: list[int],
               tokens: int, copy: float, profile: bool = False) -> list[dict]:
    import torch

    from sits.engine import LLM, SamplingParams
    llm = LLM(model=model, kernels=kernels, quantization=quant, max_num_seqs=max(batches), device=device,
              enforce_eager=not graphs)
    engine = llm.engine
    floor_ms = weight_bytes(engine) / (copy * 1e12) * 1e3  # every weight byte read once per step
    rows = []
    for b in batches:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        vocab = engine.model_config.vocab_size
        # warm up: every kernel compiled and tuned for this batch size
        llm.generate([[(3000 + i) % vocab] * 64 for i in range(b)], SamplingParams(max_tokens=4, ignore_eos=True))
        for i in range(b):
            engine.add_request(f"b{b}-{i}", [(1000 + 7 * i + j) % vocab for j in range(64)], params)
        step_ms = []
        done = 0
        t_start = None
        while engine.has_unfinished_requests():
            _sync(device)
            t0 = time.perf_counter()
            outs = engine.step()
            _sync(device)
            dt = time.perf_counter() - t0
            decode_step = all(len(o.new_token_ids) == 1 for o in outs) and len(outs) == b and t_start is not None
            if decode_step:
                step_ms.append(1e3 * dt)
                done += b
            if t_start is None and len(outs) == b:
                t_start = time.perf_counter()  # the prefill step produced every first token
        wall = time.perf_counter() - t_start
        step_ms.sort()
        med = step_ms[len(step_ms) // 2]
        rows.append({"kernels": kernels, "quantization": quant or "none", "graphs": graphs, "batch": b,
                     "decode_tok_s": done / wall, "step_ms_median": med, "floor_ms": floor_ms,
                     "step_over_floor": med / floor_ms, "steps": len(step_ms)})
        print(json.dumps(rows[-1]), flush=True)
        if profile:
            profile_steps(engine, b, params, device, f"{kernels} {quant or 'none'} graphs={graphs} batch {b}")
    del llm, engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def profile_steps(engine, batch: int, params, device: str, title: str, steps: int = 8) -> None:
    """Where a decode step's time goes: the top Python functions (cProfile, host) and the top GPU kernels
    (torch.profiler), over `steps` decode steps after a prefill."""
    import cProfile
    import io
    import pstats

    import torch
    vocab = engine.model_config.vocab_size
    for i in range(batch):
        engine.add_request(f"prof{batch}-{i}", [(500 + 3 * i + j) % vocab for j in range(64)], params)
    engine.step()  # the prefill
    _sync(device)
    prof = cProfile.Profile()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        engine.step()
    _sync(device)
    prof.disable()
    host_ms = 1e3 * (time.perf_counter() - t0) / steps
    with torch.profiler.profile(activities=acts) as tp:
        for _ in range(steps):
            engine.step()
        _sync(device)
    while engine.has_unfinished_requests():
        engine.step()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    print(f"\n=== profile: {title}: {host_ms:.2f} ms per step under cProfile ===")
    lines = out.getvalue().splitlines()
    print("\n".join(lines[next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0):]))
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(tp.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=60), flush=True)


def parse_config(spec: str) -> tuple[str, str | None, bool]:
    parts = spec.split(":")
    graphs = parts[-1] == "graphs"
    if graphs:
        parts.pop()
    if len(parts) > 2 or (len(parts) == 2 and parts[1] not in ("int8", "fp8", "none")):
        raise SystemExit(f"--configs: {spec!r} is not KERNELS[:int8|fp8|none][:graphs]")
    quant = parts[1] if len(parts) == 2 and parts[1] != "none" else None
    return parts[0], quant, graphs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--configs", default="", help="comma list of KERNELS[:QUANT][:graphs] (default: every "
                                                   "configuration), e.g. triton-v1.1:int8:graphs,torch")
    ap.add_argument("--profile", action="store_true", help="also print where a decode step's time goes")
    ap.add_argument("--cpu", action="store_true", help="run on CPU (a smoke test of this script; Triton interpreted)")
    args = ap.parse_args(argv)
    import torch
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench/engine_decode.py needs a CUDA GPU (or --cpu for a smoke test)", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    copy = copy_tbs(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    res = {"device": name, "model": args.model, "torch": torch.__version__, "copy_tbs": copy, "rows": []}
    configs = [parse_config(c) for c in args.configs.split(",") if c] or CONFIGS
    for kernels, quant, graphs in configs:
        res["rows"] += run_config(args.model, device, kernels, quant, graphs, batches, args.tokens, copy,
                                  args.profile)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"copy {copy:.2f} TB/s; floor = weight bytes / copy bandwidth")
    print(f"{'kernels':12s} {'quant':6s} {'graphs':6s} {'batch':>5s} {'tok/s':>8s} {'step ms':>8s} {'floor ms':>8s} "
          f"{'x floor':>7s}")
    for r in res["rows"]:
        print(f"{r['kernels']:12s} {r['quantization']:6s} {'yes' if r['graphs'] else 'no':6s} {r['batch']:5d} "
              f"{r['decode_tok_s']:8.0f} "
              f"{r['step_ms_median']:8.2f} {r['floor_ms']:8.2f} {r['step_over_floor']:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
