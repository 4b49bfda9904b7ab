"""The correctness gate's op-level conformance on each wrong release and each good one: caught or not, by which op,
how long the engine's measurement took -- through the engine's own warm-up (LLMEngine.warmup, what `sits-engine
serve` runs before it is ready) and the gate's own judgement (control_plane/analysis/conformance.py) against
production's report (triton-v1 on CUDA, torch on CPU).

    python3 bench/conformance.py --device cuda [--tiny PATH] [--json OUT]   # the H200 run (bench/gpu_conformance.sh)
    .venv/bin/python bench/conformance.py --device cpu                       # TRITON_INTERPRET=1, tiny model

Models: the tiny architecture (a trained checkpoint with --tiny, else random weights: the measurement uses random
inputs, never the weights) with a full engine per set; on CUDA also llama3-8b (random bf16 weights), where production
and one wrong set run a full engine and the rest are measured at the engine's exact shapes without loading 16 GB of
weights each time (engine/execution/conformance.py `measure`, the function warm-up calls). Sets: the four wrong fixture
releases (tests/fixtures/wrong_kernels.py), the example triton-v1-floor-pages, and the good triton-v1.1 / triton-v1.2
(bf16 and int8 weights). A short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SITS_KERNEL_PLUGINS", "tests.fixtures.wrong_kernels")

import torch  # noqa: E402

from sits.control_plane.analysis.conformance import judge  # noqa: E402
from sits.control_plane.analysis.gate_policy import ConformancePolicy  # noqa: E402
from sits.engine.execution import conformance  # noqa: E402
from sits.engine.config import EngineConfig  # noqa: E402
from sits.engine.model.layers.rotary_embedding import rope_cos_sin  # noqa: E402
from sits.engine.llm_engine import DEFAULT_MAX_MODEL_LEN, LLMEngine  # noqa: E402
from sits.engine.model.presets import PRESETS  # noqa: E402
from sits.kernels import get_kernel_set  # noqa: E402

WRONG = ("bug-softmax-scale", "bug-context-off-by-one", "bug-rope-interleaved", "bug-int8-per-tensor-scale",
         "triton-v1-floor-pages")
GOOD = ("triton-v1.1", "triton-v1.2")
INT8 = {"bug-int8-per-tensor-scale"}   # judged where its bug exists: int8 weights (and triton-v1.2's int8 path too)


def cases(device: str) -> list[tuple[str, str | None, bool]]:
    """(set, quantization, expected wrong)"""
    good = GOOD if device == "cuda" else ("torch-slow-attn",)
    out = [(s, "int8" if s in INT8 else None, True) for s in WRONG]
    out += [(s, None, False) for s in good]
    if device == "cuda":
        out.append(("triton-v1.2", "int8", False))
    return out


def _serve_one(model: str, kernels: str, device: str, quantization: str | None, out: str) -> None:
    """(In its own process) load an engine, warm it up as `sits-engine serve` does, write its conformance report."""
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(model=model, kernels=kernels, device=device, quantization=quantization))
    load = time.perf_counter() - t0
    engine.warmup()
    Path(out).write_text(json.dumps(dict(engine.conformance, engine_load_s=round(load, 1),
                                         warmup_s=round(time.perf_counter() - t0 - load, 1))))


def engine_report(model: str, kernels: str, device: str, quantization: str | None) -> dict:
    """The report of a real engine, each in a fresh process: one engine's GPU memory (weights, CUDA graph pools,
    the allocator's cache) never crowds the next, as with engines the deployers start."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        p = subprocess.run([sys.executable, __file__, "--one", json.dumps([model, kernels, device, quantization,
                                                                             f.name])],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"engine {model}/{kernels} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
        return json.loads(Path(f.name).read_text())


def shape_report(model: str, kernels: str, device: str, quantization: str | None) -> dict:
    """What the engine's warm-up measures for `model`, without loading its weights: the same shapes (EngineConfig's
    defaults), RoPE tables and function."""
    cfg, ec = PRESETS[model], EngineConfig(model=model)
    max_len = min(cfg.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    shapes = conformance.Shapes(
        hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
        q_heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        block_size=ec.block_size, max_num_seqs=ec.max_num_seqs, max_tokens=ec.max_num_batched_tokens,
        max_model_len=max_len, eps=cfg.rms_norm_eps, quantization=quantization, tied_embeddings=cfg.tie_word_embeddings)
    cos, sin = rope_cos_sin(cfg.head_dim, max_len, cfg.rope_theta, cfg.rope_scaling, device)
    dev = torch.device(device)
    return conformance.measure(get_kernel_set(kernels), shapes, dev, torch.bfloat16 if device == "cuda"
                               else torch.float32, cos, sin)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", default=None, help="a trained tiny checkpoint directory (default: the random preset)")
    p.add_argument("--no-llama", action="store_true", help="CUDA: skip llama3-8b")
    p.add_argument("--json", default=None, help="write every report and verdict here")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # internal: one engine in this process
    a = p.parse_args()
    if a.one:
        _serve_one(*json.loads(a.one))
        return 0
    production = "triton-v1" if a.device == "cuda" else "torch"
    policy = ConformancePolicy()
    rows, dump = [], []
    models = [("tiny" if not a.tiny else a.tiny, "engine")]
    if a.device == "cuda" and not a.no_llama:
        models.append(("llama3-8b", "shapes"))
    for model, how in models:
        label = "tiny (trained)" if a.tiny and model == a.tiny else model
        base = {q: engine_report(model, production, a.device, q) for q in (None, "int8")}
        print(f"[{label}] production {production}: {len(base[None]['measured_ops'])} ops, {len(base[None]['cases'])} "
              f"cases in {base[None]['seconds']:.1f} s (engine load {base[None]['engine_load_s']} s, warm-up "
              f"{base[None]['warmup_s']} s)", flush=True)
        for kernels, quant, expect_wrong in cases(a.device):
            full = how == "engine" or kernels == "bug-softmax-scale"
            t0 = time.perf_counter()
            report = engine_report(model, kernels, a.device, quant) if full else \
                shape_report(model, kernels, a.device, quant)
            v = judge(report, base[quant], policy)
            caught = v.outcome.value == "fail"
            row = {"model": label, "set": kernels + (f" ({quant})" if quant else ""), "path": "engine warm-up" if full
                   else "engine shapes", "expected": "wrong" if expect_wrong else "good", "verdict": v.outcome.value,
                   "ok": caught == expect_wrong, "judged": ",".join(v.judged_ops) or "-",
                   "failed_ops": ",".join(sorted({f.op for f in v.failures})) or "-", "cases": v.cases,
                   "failed_cases": v.failed_cases, "measure_s": report["seconds"],
                   "worst": (f"{v.worst.error:.3g}/{v.worst.allowed:.3g}" if v.worst and v.worst.error is not None
                             else "-"),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            rows.append(row)
            dump.append({**row, "reason": v.reason, "report": report})
            print(f"[{label}] {row['set']}: {v.outcome.value.upper()} (expected {row['expected']}) judged "
                  f"{row['judged']} in {report['seconds']:.2f} s -- {v.reason[:220]}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(dump, indent=1, default=str))
    print(f"\nop-level conformance, {a.device} ({torch.cuda.get_device_name(0) if a.device == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}; production {production}; k={policy.k:g}")
    cols = ("model", "set", "path", "expected", "verdict", "ok", "failed_ops", "cases", "failed_cases", "measure_s",
            "worst")
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} as expected" + (": NOT " + ", ".join(r["set"] for r in bad) if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
