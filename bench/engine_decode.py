"""Engine decode speed on a GPU: llama3-8b (random weights, bf16) per kernel set and quantization, against the
memory-bandwidth floor of one decode step (every weight byte read once).

    python3 bench/engine_decode.py [--json OUT.json] [--tokens 64] [--batches 1,32]
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

CONFIGS = (("torch", None), ("triton-v1.1", None), ("triton-v1.1", "int8"))


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
    from kernels import QuantizedWeight
    model = engine.model_runner.model
    total = 0
    for layer in model.layers:
        for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
            w = lin.weight
            total += w.nbytes() if isinstance(w, QuantizedWeight) else w.numel() * w.element_size()
    head = model.lm_head.weight if model.lm_head is not None else model.embed_tokens
    return total + head.numel() * head.element_size()


def run_config(model: str, device: str, kernels: str, quant: str | None, batches: list[int], tokens: int,
               copy: float) -> list[dict]:
    import torch

    from engine import LLM, SamplingParams
    llm = LLM(model=model, kernels=kernels, quantization=quant, max_num_seqs=max(batches), device=device)
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
        rows.append({"kernels": kernels, "quantization": quant or "none", "batch": b,
                     "decode_tok_s": done / wall, "step_ms_median": med, "floor_ms": floor_ms,
                     "step_over_floor": med / floor_ms, "steps": len(step_ms)})
        print(json.dumps(rows[-1]), flush=True)
    del llm, engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--model", default="llama3-8b")
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
    for kernels, quant in CONFIGS:
        res["rows"] += run_config(args.model, device, kernels, quant, batches, args.tokens, copy)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"copy {copy:.2f} TB/s; floor = weight bytes / copy bandwidth")
    print(f"{'kernels':12s} {'quant':6s} {'batch':>5s} {'tok/s':>8s} {'step ms':>8s} {'floor ms':>8s} {'x floor':>7s}")
    for r in res["rows"]:
        print(f"{r['kernels']:12s} {r['quantization']:6s} {r['batch']:5d} {r['decode_tok_s']:8.0f} "
              f"{r['step_ms_median']:8.2f} {r['floor_ms']:8.2f} {r['step_over_floor']:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
