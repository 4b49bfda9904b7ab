"""Could decode attention that computes in e4m3 be released? The correctness gate's op-level conformance
(engine/execution/conformance.py `measure`, control_plane/analysis/conformance.py `judge`) on decode attention over
FP8 pages whose q and softmax weights are rounded to e4m3 too -- kernels/paged_decode_attention_fp8_dots.py, the fp8
tensor-core kernel -- beside triton-v1.8's (exact conversions, fp16 dots) and two wrong decode kernels the gate must
catch (tests/fixtures/wrong_kernels.py's bugs applied to v1.8's kernel: softmax scale 15 % too large, one key short).

    .venv/bin/python bench/e4m3_attention_gate.py [--seeds 3] [--device cpu|cuda] [--max-model-len 700]

Each set is the torch reference with only its decode attention replaced, measured as an engine serving bf16 with
`--kv-cache-dtype fp8` measures at warm-up (llama3-8b's attention: 32 query heads, 8 kv heads, head_dim 128, pages of
64; the linears' shapes are small here, they are not measured), then judged against the torch set as the gate judges
a canary. Besides the gate as it is, each case is judged under a hypothetical allowance that admits e4m3 q and weights
the way the gate admits W8A8's e4m3 activations: the reference error taken as the larger of torch's and that of the
same attention computed with e4m3 q and weights ("torch-e4m3-qp", bench/kv_fp8_accuracy.py --qp). The question it
answers: does a tolerance loose enough for the kernel still catch the wrong kernels? Under TRITON_INTERPRET=1 on CPU
(set here when there is no --device cuda) it takes a few minutes.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECODE = "paged_decode_attention"


def decode_sets() -> dict[str, object]:
    """name -> a decode attention over FP8 pages (each becomes a set: torch with that op)."""
    from bench.kv_fp8_accuracy import _decode_e4m3_qp
    from sits.kernels import get_kernel_set
    from sits.kernels.paged_decode_attention_fp8_dots import paged_decode_attention_fp8_dots
    from tests.fixtures.wrong_kernels import _one_key_short, _scale_too_large   # the fixture sets' bugs
    v18 = get_kernel_set("triton-v1.8").paged_decode_attention
    return {"triton-v1.8": v18, "fp8-dots": paged_decode_attention_fp8_dots, "e4m3-qp model": _decode_e4m3_qp,
            "bug: softmax scale +15 %": _scale_too_large(v18), "bug: one key short": _one_key_short(v18)}


def shapes(max_model_len: int, max_num_seqs: int):
    from sits.engine.execution.conformance import Shapes
    return Shapes(hidden=256, intermediate=512, vocab=512, q_heads=32, kv_heads=8, head_dim=128, block_size=64,
                  max_num_seqs=max_num_seqs, max_tokens=64, max_model_len=max_model_len, eps=1e-5, quantization=None,
                  tied_embeddings=False, kv_cache_dtype="fp8")


def measure_all(seed: int, device: str, max_model_len: int, max_num_seqs: int) -> dict[str, dict]:
    """name -> the conformance report of torch-with-that-decode (the same inputs for every set: one seed)."""
    import torch

    from sits.engine.execution import conformance
    from sits.engine.model.layers.rotary_embedding import rope_cos_sin
    from sits.kernels import get_kernel_set
    ref = get_kernel_set("torch")
    s = shapes(max_model_len, max_num_seqs)
    cos, sin = rope_cos_sin(s.head_dim, max_model_len, 500000.0, None, device)
    dev = torch.device(device)
    out = {"torch": conformance.measure(ref, s, dev, torch.bfloat16, cos, sin, seed=seed)}
    for i, (name, fn) in enumerate(decode_sets().items()):
        kset = ref.derive(f"gate-case-{i}", "0.0.0", kv_cache_dtypes=("auto", "fp8"), **{DECODE: fn})
        out[name] = conformance.measure(kset, s, dev, torch.bfloat16, cos, sin, seed=seed)
    return out


def judge_all(reports: dict[str, dict]) -> list[dict]:
    """Per set: the gate's verdict as it is and its worst case's error over what it allows (above 1: caught), and the
    same with e4m3 q and weights admitted."""
    from sits.control_plane.analysis.conformance import judge
    from sits.control_plane.analysis.gate_policy import ConformancePolicy
    policy = ConformancePolicy()
    atol = policy.atol_for("bfloat16")
    qp = {c["case"]: c["error"] for c in reports["e4m3-qp model"]["cases"] if c["op"] == DECODE}
    rows = []
    for name, rep in reports.items():
        if name in ("torch", "e4m3-qp model"):
            continue
        verdict = judge(rep, reports["torch"], policy)
        now, loose = [], []
        for c in (c for c in rep["cases"] if c["op"] == DECODE):
            slack = atol * max(1.0, c["scale"])
            now.append(c["error"] / (policy.k * c["reference_error"] + slack))
            loose.append(c["error"] / (policy.k * max(c["reference_error"], qp[c["case"]]) + slack))
        rows.append({"set": name, "gate": verdict.outcome.value, "cases": len(now), "ratio": max(now),
                     "ratio_qp": max(loose), "gate_qp": "pass" if max(loose) <= 1.0 else "fail"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="independent draws of every case's inputs")
    ap.add_argument("--device", default="cpu", help="cpu (Triton's interpreter) or cuda")
    ap.add_argument("--max-model-len", type=int, default=700, help="the longest context a case decodes")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="the wide batch's sequences")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    print(f"decode attention over FP8 pages, bf16, heads 32/8 x 128, page 64, contexts up to {args.max_model_len}, "
          f"{args.device}; the gate as it is (k x torch's bf16 error + atol) and with e4m3 q and weights admitted",
          flush=True)
    print("| seed | set | cases | gate now | worst error / allowed | with e4m3 q, P admitted | worst error / allowed |")
    print("|---:|---|---:|---|---:|---|---:|")
    for seed in range(args.seeds):
        for r in judge_all(measure_all(seed, args.device, args.max_model_len, args.max_num_seqs)):
            print(f"| {seed} | {r['set']} | {r['cases']} | {r['gate']} | {r['ratio']:.2f} | {r['gate_qp']} | "
                  f"{r['ratio_qp']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
