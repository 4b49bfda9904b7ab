"""Offline throughput as a user sees it: `LLM(...).generate(...)` after `LLMEngine.warmup()`, the first run after the
warm-up counted, each figure next to its floor and (batch-1 decode) Hugging Face transformers on the same shape.

    python3 bench/throughput.py [--rows hf,ttft,decode1,b32,b256,decode1-int8,b32-int8] [--json OUT.json] [--profile-log F]
    python3 bench/throughput.py --kernels triton-v1.4 --rows decode1,b32,b256,decode1-fp8,b32-fp8,b256-fp8   # bf16 vs fp8
    python3 bench/throughput.py --kernels triton-v1.3 --rows b256 --kv-cache-dtype both   # bf16 vs FP8 KV pages
    .venv/bin/python bench/throughput.py --smoke          # tiny model on CPU, small shapes: a test of this script

Rows (llama3-8b preset, random weights, random prompt tokens so that the prefix cache never hits, greedy,
ignore_eos):
- ttft: one 2048-token prompt, max_tokens=1; first run after warm-up and the median of 5 more.
- decode1: one 128-token prompt, 256 output tokens; first run and second.
- b32: 32 prompts x 2048 tokens, 512 output tokens each; first run after warm-up, then a second ("steady").
- b256: 256 x 2048 / 512, once.
- ttft-int8, decode1-int8, b32-int8, b256-int8 / ttft-fp8, decode1-fp8, ...: the same with `--quantization int8` / `fp8`
  weights (each kind's engine in a process of its own, before the bf16 engine), and their ratios to bf16 last.
- hf: transformers' LlamaForCausalLM (same config, random bf16 weights, sdpa attention, default dynamic cache)
  `generate` of 256 tokens after a 128-token prompt.
Output tok/s = output tokens / wall time of the generate call (prefill included). Floors: prefill FLOPs (2 x weight
elements per token + causal attention) at the bf16 matmul rate measured in the same run, plus for every decode step
the weight bytes and the KV bytes it reads at the copy bandwidth measured in the same run.
Per row also: Triton compilations and autotune benchmark runs during the row (kernels.jit_watch.JitWatch), and for
decode steps the engine thread's host time: step wall time minus the time it waits for the GPU.
--kv-cache-dtype fp8 stores the KV pages as e4m3 with a scale per token and kv head (a kernel set that takes it:
triton-v1.3); its rows are named "... fp8kv", and its warm-up row has the KV capacity in tokens. `both` runs every
engine row with the model-dtype cache and then with the FP8 one, each in a process of its own (so each engine sizes
its cache from the same free memory), and prints their ratios last.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

QUANTS = ("int8", "fp8")   # --quantization kinds: their rows are the bf16 rows' names + "-int8" / "-fp8"
ALL_ROWS = ("hf", "ttft", "decode1", "b32", "b256",
            *(f"{r}-{q}" for q in QUANTS for r in ("ttft", "decode1", "b32", "b256")))
DEFAULT_ROWS = ("hf", "ttft", "decode1", "b32", "b256", "decode1-int8", "b32-int8")
KV_CACHE_DTYPES = ("auto", "fp8", "both")
FULL = dict(ttft_len=2048, d1_in=128, d1_out=256, b32=32, b_in=2048, b_out=512, b256=256, ttft_reps=5)
SMOKE = dict(ttft_len=40, d1_in=8, d1_out=6, b32=3, b_in=20, b_out=4, b256=5, ttft_reps=2)


def _sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def ceilings(device: str) -> tuple[float, float]:
    """(copy TB/s counting read + write, bf16 matmul TFLOP/s), measured here."""
    import torch
    from engine_decode import copy_tbs
    copy = copy_tbs(device)
    n = 8192 if device == "cuda" else 256
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    return copy, 2 * n ** 3 * 10 / (time.perf_counter() - t0) / 1e12


class Shape:
    """What one forward pass must move and compute (weights, KV per token, FLOPs)."""

    def __init__(self, engine):
        from engine_decode import weight_bytes
        mc = engine.model_config
        self.weight_bytes = weight_bytes(engine)
        model = engine.model_runner.model
        elems = 0
        for layer in model.layers:
            for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
                n, k = lin.weight.shape
                elems += n * k
        self.matmul_elems = elems + mc.vocab_size * mc.hidden_size
        self.kv_bytes_per_token = engine.model_runner.block_bytes() // engine.config.block_size
        self.attn_flops_per_pair = 4 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim  # QK^T + PV

    def prefill_s(self, batch: int, prompt: int, tflops: float, tbs: float) -> float:
        flops = batch * (2 * self.matmul_elems * prompt + self.attn_flops_per_pair * prompt * (prompt + 1) / 2)
        return max(flops / (tflops * 1e12), self.weight_bytes / (tbs * 1e12))

    def decode_s(self, batch: int, prompt: int, out: int, tbs: float) -> float:
        # out-1 decode steps (the first token comes from the prefill); step i reads the weights + the KV of
        # prompt + i tokens per sequence
        steps = out - 1
        kv_tokens = batch * (steps * prompt + steps * (steps + 1) / 2)
        return (steps * self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / (tbs * 1e12)


class StepMeter:
    """Wraps engine.step: wall time of decode-only steps and the part of it the engine thread waits for the GPU
    (the runner's own counter when it has one, else a synchronize placed just before sampling); the wall time of
    every step by kind (`by_kind`: where a batch row's time goes); cProfile of a few steps with `profile_at` sequences
    running."""

    def __init__(self, engine, device: str, profile_at: int | None = None, profile_steps: int = 8):
        import torch
        self.engine, self.device = engine, device
        self.rows: list[tuple[int, float, float, float]] = []  # (batch, wall s, gpu wait s, thread cpu s)
        self.steps: list[tuple[bool, int, float]] = []   # every step: (decode only, sequences running, wall s)
        self.profile_at, self.profile_steps = profile_at, profile_steps
        self.profile: cProfile.Profile | None = None
        self.profiled = 0
        self._step = engine.step
        runner = engine.model_runner
        self._wait = 0.0
        if not hasattr(runner, "gpu_wait_s"):  # the runner before issue 20: it waits inside _sample's tolist()
            orig = runner._sample

            def sample(*a, **k):
                t0 = time.perf_counter()
                if device == "cuda":
                    torch.cuda.synchronize()
                self._wait += time.perf_counter() - t0
                return orig(*a, **k)
            runner._sample = sample
            self._read_wait = lambda: self._wait
        else:
            self._read_wait = lambda: runner.gpu_wait_s
        engine.step = self.step

    def step(self):
        sched = self.engine.scheduler
        n = len(sched.running)
        # decoding: one token to compute, or none while its step is in flight (engine/execution/async_decode.py)
        decode_only = n > 0 and not sched.waiting and all(s.num_uncomputed_tokens <= 1 for s in sched.running)
        prof = None
        if decode_only and self.profile_at and n == self.profile_at and self.profiled < self.profile_steps:
            self.profile = self.profile or cProfile.Profile()
            prof = self.profile
            self.profiled += 1
        w0, c0, t0 = self._read_wait(), time.thread_time(), time.perf_counter()
        if prof:
            prof.enable()
        outs = self._step()
        if prof:
            prof.disable()
        t1, c1, w1 = time.perf_counter(), time.thread_time(), self._read_wait()
        if decode_only and not prof:
            self.rows.append((n, t1 - t0, w1 - w0, c1 - c0))
        self.steps.append((decode_only, n, t1 - t0))
        return outs

    def by_kind(self, batch: int) -> dict:
        """Steps and their summed wall time: those that carry prompt tokens (and decode what is already running), the
        decode-only steps at `batch`, and the decode-only steps of fewer sequences (the tail as sequences finish)."""
        kinds = {"prefill": [], "decode_full": [], "decode_fewer": []}
        for decode_only, n, wall in self.steps:
            kinds["decode_full" if decode_only and n == batch else "decode_fewer" if decode_only
                  else "prefill"].append(wall)
        return {k: {"steps": len(w), "s": sum(w)} for k, w in kinds.items()}

    def detach(self) -> None:
        self.engine.step = self._step

    def summary(self, batch: int) -> dict | None:
        rows = [r for r in self.rows if r[0] == batch]
        if not rows:
            return None
        wall = statistics.median(r[1] for r in rows)
        host = statistics.median(r[1] - r[2] for r in rows)
        cpu = statistics.median(r[3] for r in rows)
        return {"batch": batch, "steps": len(rows), "step_ms": 1e3 * wall, "host_ms": 1e3 * host,
                "thread_cpu_ms": 1e3 * cpu}

    def profile_text(self, limit: int = 25) -> str:
        if self.profile is None:
            return ""
        out = io.StringIO()
        pstats.Stats(self.profile, stream=out).sort_stats("tottime").print_stats(limit)
        return f"cProfile over {self.profiled} decode steps at {self.profile_at} running:\n{out.getvalue()}"


def prompts(rng: random.Random, n: int, length: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def gpu_clocks() -> dict:
    """The GPU's SM clock (MHz), power draw (W) and active clock-throttle reasons as nvidia-smi reports them now
    (an empty dict where it cannot): read between timed runs, outside their timings."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
                              "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True,
                             timeout=10).stdout.strip().splitlines()
        sm, power, reasons = (v.strip() for v in out[0].split(","))
        return {"sm_mhz": int(float(sm)), "power_w": float(power), "throttle": reasons}
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return {}


def timed_generate(llm, device, batch, **kw) -> tuple[float, list]:
    from sits.kernels.jit_watch import JitWatch
    _sync(device)
    with JitWatch() as watch:
        t0 = time.perf_counter()
        res = llm.generate(batch, use_tqdm=False, **kw)
        _sync(device)
        wall = time.perf_counter() - t0
    return wall, res, watch


def build(model: str, kernels: str, device: str, quant: str | None, max_num_seqs: int, **engine_kw):
    from sits.engine import LLM
    from sits.kernels.jit_watch import JitWatch
    t0 = time.perf_counter()
    llm = LLM(model=model, kernels=kernels, device=device, quantization=quant, max_num_seqs=max_num_seqs, **engine_kw)
    t1 = time.perf_counter()
    with JitWatch() as watch:   # what warm-up spends: Triton compilations (or on-disk cache loads) and autotuning
        llm.engine.warmup()
        _sync(device)
    mem = {}
    if device == "cuda":
        import torch
        free, total = torch.cuda.mem_get_info()
        mem = {"gpu_free_gib": free / 2**30, "gpu_allocated_gib": torch.cuda.memory_allocated() / 2**30}
    return llm, {**mem, "load_s": t1 - t0, "warmup_s": time.perf_counter() - t1,
                 "kv_capacity_tokens": llm.engine.stats().num_total_blocks * llm.engine.config.block_size,
                 "kv_bytes_per_token": llm.engine.model_runner.kv_layout.bytes_per_token(),
                 "warmup_compiles": len(watch.compiles), "warmup_autotune_runs": watch.autotune_runs,
                 "warmup_autotune_s": watch.autotune_s,
                 "warmup_autotune_by_kernel": {k: {"runs": n, "s": round(t, 2)}
                                               for k, (n, t) in watch.autotune_by_kernel.items()}}


def run_engine_rows(args, sz, device, copy, tflops, quant, rows, out_rows, logs) -> None:
    import torch

    from sits.engine import SamplingParams
    max_seqs = max(sz["b256"] if any(r.split("-")[0] == "b256" for r in rows) else sz["b32"], 1)
    llm, info = build(args.model, args.kernels, device, quant, max_seqs, kv_cache_dtype=args.kv_cache_dtype)
    engine = llm.engine
    shape = Shape(engine)
    vocab = engine.model_config.vocab_size
    rng = random.Random(20)
    kv = " fp8kv" if args.kv_cache_dtype == "fp8" else ""   # every row name of an FP8-KV engine ends so
    label = (quant or "bf16") + kv
    print(json.dumps({"engine": label, **info}), flush=True)
    out_rows.append({"row": f"warm-up {label}", **info})

    def add(name, wall, n_out, floor_s, watch, extra=None):
        r = {"row": name, "wall_s": wall, "out_tok_s": n_out / wall, "floor_tok_s": n_out / floor_s,
             "floor_s": floor_s, "compiles": len(watch.compiles), "autotune_runs": watch.autotune_runs,
             **(extra or {})}
        out_rows.append(r)
        print(json.dumps(r), flush=True)
        if watch.compiles or watch.autotune_runs:
            logs.append(f"{name}: {watch.summary()}")

    if (f"ttft-{quant}" if quant else "ttft") in rows:
        n = sz["ttft_len"]
        p = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        floor = shape.prefill_s(1, n, tflops, copy)
        walls, clocks = [], []
        for i in range(sz["ttft_reps"] + 1):
            wall, _, watch = timed_generate(llm, device, prompts(rng, 1, n, vocab), sampling_params=p)
            walls.append(wall)
            # each run's wall and the GPU's clock right after it: whether later runs are slower at a lower clock
            clocks.append(gpu_clocks() if device == "cuda" else {})
            if i == 0:
                add(f"ttft {n}{' ' + quant if quant else ''} first{kv}", wall, 1, floor, watch,
                    {"ttft_ms": 1e3 * wall, "floor_ms": 1e3 * floor, **clocks[0]})
        med = statistics.median(walls[1:])
        add(f"ttft {n}{' ' + quant if quant else ''} median{kv}", med, 1, floor, watch,
            {"ttft_ms": 1e3 * med, "floor_ms": 1e3 * floor, "runs_ms": [round(1e3 * w, 2) for w in walls],
             "runs_sm_mhz": [c.get("sm_mhz") for c in clocks], "runs_throttle": [c.get("throttle") for c in clocks]})
    if (f"decode1-{quant}" if quant else "decode1") in rows:
        p = SamplingParams(max_tokens=sz["d1_out"], temperature=0.0, ignore_eos=True)
        floor = shape.prefill_s(1, sz["d1_in"], tflops, copy) + shape.decode_s(1, sz["d1_in"], sz["d1_out"], copy)
        for i in range(2):
            meter = StepMeter(engine, device)
            wall, _, watch = timed_generate(llm, device, prompts(rng, 1, sz["d1_in"], vocab), sampling_params=p)
            meter.detach()
            add(f"decode b1 {quant or 'bf16'} {'first' if i == 0 else 'second'}{kv}", wall, sz["d1_out"],
                floor, watch,
                meter.summary(1))
    for key, runs in (("b32", ("first", "steady")), ("b256", ("first",))):
        if (f"{key}-{quant}" if quant else key) not in rows:
            continue
        b = sz[key]
        p = SamplingParams(max_tokens=sz["b_out"], temperature=0.0, ignore_eos=True)
        floor = shape.prefill_s(b, sz["b_in"], tflops, copy) + shape.decode_s(b, sz["b_in"], sz["b_out"], copy)
        for run in runs:
            meter = StepMeter(engine, device, profile_at=b if (key == "b256" and args.profile_log) else None)
            wall, res, watch = timed_generate(llm, device, prompts(rng, b, sz["b_in"], vocab), sampling_params=p)
            meter.detach()
            assert all(len(r.token_ids) == sz["b_out"] for r in res)
            add(f"{b} x {sz['b_in']}/{sz['b_out']}{' ' + quant if quant else ''} {run}{kv}", wall, b * sz["b_out"], floor,
                watch,
                {"decode_steps_at_full_batch": meter.summary(b), "steps_by_kind": meter.by_kind(b)})
            if meter.profile is not None:
                logs.append(meter.profile_text())
    del llm, engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_hf(args, sz, device, copy, tflops, out_rows) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sits.engine.model.presets import PRESETS
    mc = PRESETS[args.model] if args.model in PRESETS else None
    if mc is None:
        return
    cfg = LlamaConfig(vocab_size=mc.vocab_size, hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size,
                      num_hidden_layers=mc.num_hidden_layers, num_attention_heads=mc.num_attention_heads,
                      num_key_value_heads=mc.num_key_value_heads, max_position_embeddings=mc.max_position_embeddings,
                      rms_norm_eps=mc.rms_norm_eps, rope_theta=mc.rope_theta, tie_word_embeddings=False)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dt).eval()
    ids = torch.randint(10, mc.vocab_size, (1, sz["d1_in"]), device=device)
    n = sz["d1_out"]
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        walls = []
        for _ in range(2):
            _sync(device)
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            _sync(device)
            walls.append(time.perf_counter() - t0)
    assert out.shape[1] == sz["d1_in"] + n
    r = {"row": "decode b1 bf16 transformers", "wall_s": min(walls), "out_tok_s": n / min(walls)}
    out_rows.append(r)
    print(json.dumps(r), flush=True)
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def rows_in_fresh_process(args, rows: set[str], *flags: str) -> list[dict]:
    """`rows` measured by a new process of this script: this one keeps what its engine held (Triton's autotuners keep
    their last call's arguments, the KV cache among them), so a later engine here would get less memory."""
    import subprocess
    import tempfile
    import torch
    torch.cuda.empty_cache()   # what this process's allocator caches (the ceilings' matrices) is free for it
    with tempfile.TemporaryDirectory() as tmp:
        sub = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, __file__, "--rows", ",".join(sorted(rows)), "--model", args.model,
                        "--kernels", args.kernels, "--json", str(sub), *flags], check=True)
        return json.loads(sub.read_text())["rows"]


def run_rows(args, sz, device, copy, tflops, rows, out_rows, logs) -> None:
    """The engine rows for args.kv_cache_dtype: each quantization kind's first (in a fresh process when other rows
    follow on a GPU), then the bf16 ones here."""
    for quant in QUANTS:
        if mine := {r for r in rows if r.endswith(f"-{quant}")}:
            if rows <= mine or args.smoke:
                run_engine_rows(args, sz, device, copy, tflops, quant, rows, out_rows, logs)
            else:
                out_rows += rows_in_fresh_process(args, mine, "--kv-cache-dtype", args.kv_cache_dtype)
    if rows & {"ttft", "decode1", "b32", "b256"}:
        run_engine_rows(args, sz, device, copy, tflops, None, rows, out_rows, logs)


def kv_comparison(rows: list[dict]) -> list[str]:
    """FP8 KV against the model-dtype KV: capacity and every row measured both ways."""
    by = {r["row"]: r for r in rows}
    lines = []
    for name, r in by.items():
        other = by.get(f"{name} fp8kv")
        if other is None:
            continue
        if "kv_capacity_tokens" in r:
            lines.append(f"{name}: KV capacity {r['kv_capacity_tokens']} -> {other['kv_capacity_tokens']} tokens "
                         f"({other['kv_capacity_tokens'] / r['kv_capacity_tokens']:.2f}x), "
                         f"{r['kv_bytes_per_token']} -> {other['kv_bytes_per_token']} bytes a token")
        elif "out_tok_s" in r:
            lines.append(f"{name}: {r['out_tok_s']:.0f} -> {other['out_tok_s']:.0f} tok/s "
                         f"({other['out_tok_s'] / r['out_tok_s']:.2f}x) with FP8 KV")
    return lines


def quant_comparison(rows: list[dict]) -> list[str]:
    """Each quantized row against the same row with bf16 weights (same KV format)."""
    by = {r["row"]: r for r in rows if "out_tok_s" in r}
    lines = []
    for name, r in by.items():
        for q in QUANTS:
            base = name.replace(f" {q} ", " bf16 " if name.startswith("decode b1") else " ", 1)
            if f" {q} " in name and base != name and base in by:
                b = by[base]
                if "ttft_ms" in r:
                    lines.append(f"{name}: {r['ttft_ms']:.1f} ms against {b['ttft_ms']:.1f} with bf16 weights")
                else:
                    lines.append(f"{name}: {r['out_tok_s']:.0f} tok/s against {b['out_tok_s']:.0f} with bf16 "
                                 f"weights ({r['out_tok_s'] / b['out_tok_s']:.2f}x)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma list of: {','.join(ALL_ROWS)}")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--kernels", default="triton-v1.1")
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                    help="KV pages in the model's dtype (auto), FP8 e4m3 with scales (fp8; kernel set triton-v1.3 or "
                         "torch), or each in turn (both)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile-log", type=Path, help="write compile logs and a cProfile of decode steps at b256 here")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU, small shapes (tests this script)")
    args = ap.parse_args(argv)
    import torch
    rows = set(args.rows.split(","))
    if bad := rows - set(ALL_ROWS):
        raise SystemExit(f"--rows: unknown {sorted(bad)}; known: {','.join(ALL_ROWS)}")
    if args.smoke:
        device, sz = "cpu", SMOKE
        args.model, args.kernels = "tiny", "torch" if args.kernels == "triton-v1.1" else args.kernels
    else:
        if not torch.cuda.is_available():
            print("bench/throughput.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
            return 2
        device, sz = "cuda", FULL
    copy, tflops = ceilings(device)
    import triton
    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "model": args.model, "kernels": args.kernels,
           "kv_cache_dtype": args.kv_cache_dtype, "copy_tbs": copy,
           "matmul_tflops": tflops, "rows": []}
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}), flush=True)
    logs: list[str] = []
    if "hf" in rows:
        run_hf(args, sz, device, copy, tflops, res["rows"])
    engine_rows = rows - {"hf"}
    if args.kv_cache_dtype != "both":
        run_rows(args, sz, device, copy, tflops, engine_rows, res["rows"], logs)
    elif args.smoke:
        for args.kv_cache_dtype in ("auto", "fp8"):
            run_rows(args, sz, device, copy, tflops, engine_rows, res["rows"], logs)
    elif engine_rows:   # each KV-cache dtype in a process of its own: both size their cache from the same free memory
        for kv in ("auto", "fp8"):
            res["rows"] += rows_in_fresh_process(args, engine_rows, "--kv-cache-dtype", kv)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if args.profile_log:
        args.profile_log.write_text("\n\n".join(logs))
    print(f"\n{res['device']}, torch {res['torch']}, triton {res['triton']}, {args.model} {args.kernels}; "
          f"copy {copy:.2f} TB/s, bf16 matmul {tflops:.0f} TFLOP/s")
    print(f"{'row':34s} {'wall s':>8s} {'tok/s':>8s} {'floor':>8s} {'jit':>4s} {'tune':>4s}  decode step ms "
          f"(wall/host/cpu)")
    for r in res["rows"]:
        if "out_tok_s" not in r:
            print(f"{r['row']:34s} load {r['load_s']:.1f} s, warm-up {r['warmup_s']:.1f} s "
                  f"({r['warmup_compiles']} jit, {r['warmup_autotune_runs']} tune runs in "
                  f"{r['warmup_autotune_s']:.1f} s), "
                  f"KV {r['kv_capacity_tokens']} tokens")
            for name, t in sorted(r.get("warmup_autotune_by_kernel", {}).items(), key=lambda kv: -kv[1]["s"]):
                print(f"{'':34s}   tuning {name}: {t['runs']} runs, {t['s']:.1f} s")
            continue
        st = r.get("decode_steps_at_full_batch") or (r if "step_ms" in r else None)
        step = f"{st['step_ms']:.2f}/{st['host_ms']:.2f}/{st['thread_cpu_ms']:.2f}" if st else ""
        floor = f"{r['floor_tok_s']:8.0f}" if "floor_tok_s" in r else f"{'':8s}"
        extra = f" ttft {r['ttft_ms']:.1f} ms (floor {r['floor_ms']:.1f})" if "ttft_ms" in r else ""
        print(f"{r['row']:34s} {r['wall_s']:8.2f} {r['out_tok_s']:8.0f} {floor} {r.get('compiles', ''):>4} "
              f"{r.get('autotune_runs', ''):>4}  {step}{extra}")
        if r.get("steps_by_kind"):   # where a batch row's wall goes, step kind by step kind
            k = r["steps_by_kind"]
            outside = r["wall_s"] - sum(v["s"] for v in k.values())
            print(f"{'':34s}   steps: " + ", ".join(
                f"{v['steps']} {name} {v['s']:.2f} s" for name, v in
                (("with prompt tokens", k["prefill"]), ("decode-only at full batch", k["decode_full"]),
                 ("decode-only below full batch", k["decode_fewer"]))) + f"; outside steps {outside:.2f} s")
        if r.get("runs_ms"):   # the TTFT runs one by one, with the SM clock after each where nvidia-smi told it
            clocks = r.get("runs_sm_mhz") or []
            print(f"{'':34s}   runs: " + ", ".join(
                f"{ms:.1f} ms" + (f" @ {mhz} MHz" if mhz else "") for ms, mhz in
                zip(r["runs_ms"], clocks + [None] * (len(r["runs_ms"]) - len(clocks)))))
    for line in logs:
        if not line.startswith("cProfile"):
            print(line)
    for line in kv_comparison(res["rows"]) + quant_comparison(res["rows"]):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
