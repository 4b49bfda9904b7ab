"""How far FP8 moves a model's answers: an FP8 KV cache (`--kv-cache-dtype fp8`) and fp8 weights (`--quantization fp8`,
weight-only and W8A8) against the model-dtype baseline, with bf16 compute against the same baseline for scale.

    .venv/bin/python bench/kv_fp8_accuracy.py [--model tiny|PATH] [--kernels torch] [--device cpu]
    .venv/bin/python bench/train_tiny.py --out /tmp/tiny-trained && .venv/bin/python bench/kv_fp8_accuracy.py --model /tmp/tiny-trained

The prompts are slices of this repository's Python sources (the byte-level tokenizer of the tiny model and of
bench/train_tiny.py's checkpoints reads them as text). The baseline runs in `--dtype` (default float32) with the
model-dtype cache: its greedy continuations, then every variant scores prompt + continuation with teacher forcing.
Per variant: top-1 agreement with the baseline at every scored position, the largest change of a chosen token's
logprob, the mean negative log-likelihood, and the greedy common prefix of a fresh generation. The fp8-weight rows
run in bf16: "weight-only" is the torch set (x exact, as triton-v1.4 below 33 rows), "W8A8" the set "torch-w8a8"
registered here, whose linear is triton-v1.4's numerics in torch (kernels/linear_w8a8.py `linear_w8a8_torch`: x
rounded to e4m3 per row from 33 rows on -- every scored prefill here).

`--qp`: one more row, FP8 pages read by attention whose q and softmax weights are e4m3 too (the set "torch-e4m3-qp"
registered here, never shipped): the numerics of kernels/paged_decode_attention_fp8_dots.py (S^T = K q^T and O^T =
V^T P^T as fp8 MMAs), in torch, prefill and decode alike. q is rounded per (token, head) with the scale max|q| / 448;
each softmax numerator exp(s - max), in (0, 1], times its value's scale t_j and a power of two c (the largest t_j
near 448) is rounded (the normalizer sums the numerators unrounded, as the kernels do). An estimate of the kernel:
one max and one c per row rather than a running max and a c per tile.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCES = ("engine/llm_engine.py", "engine/scheduling/scheduler.py", "engine/scheduling/block_manager.py",
           "kernels/registry.py", "kernels/rms_norm.py", "engine/config.py")


def prompts(n_chars: int) -> list[str]:
    return [(ROOT / f).read_text()[i * 400:i * 400 + n_chars] for f in SOURCES for i in (1, 3)]


def measure(args) -> dict:
    from sits.engine import LLM, SamplingParams

    def llm(kv: str, dtype: str, quant: str | None = None, kernels: str | None = None):
        return LLM(model=args.model, kernels=kernels or args.kernels, device=args.device, dtype=dtype,
                   kv_cache_dtype=kv, quantization=quant,
                   max_num_batched_tokens=96)   # longer prompts prefill in chunks that read the earlier chunks' pages

    def score(engine, seqs):
        out = engine.generate(seqs, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1), use_tqdm=False)
        return [[(e["top_logprobs"][0][0], e["logprob"]) for e in r.prompt_logprobs] for r in out]

    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    texts = prompts(args.prompt_chars)
    base = llm("auto", args.dtype)
    gen = base.generate(texts, greedy, use_tqdm=False)
    seqs = [base.tokenizer.encode(t) + g.token_ids for t, g in zip(texts, gen)]
    ref = score(base, seqs)
    n = sum(len(r) for r in ref)
    res = {"model": args.model, "kernels": args.kernels, "device": args.device, "baseline_dtype": args.dtype,
           "prompts": len(texts), "scored_positions": n, "greedy_tokens": args.max_tokens * len(texts),
           "baseline_mean_nll": -sum(lp for r in ref for _, lp in r) / n, "variants": []}
    variants = [("fp8", args.dtype, None, None), ("auto", "bfloat16", None, None), ("fp8", "bfloat16", None, None)]
    if args.weights:
        variants += [("auto", "bfloat16", "fp8", "torch"), ("auto", "bfloat16", "fp8", _w8a8_set())]
    if args.qp:
        variants += [("fp8", args.dtype, None, _qp_set())]
    for kv, dtype, quant, kernels in variants:
        engine = llm(kv, dtype, quant, kernels)
        got = score(engine, seqs)
        pairs = [(a, b) for ra, rb in zip(ref, got) for a, b in zip(ra, rb)]
        again = engine.generate(texts, greedy, use_tqdm=False)
        prefix = sum(next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
                     for a, b in zip(gen, again))
        res["variants"].append({
            "kv_cache_dtype": kv, "dtype": dtype,
            "weights": "bf16" if quant is None else "fp8 W8A8" if kernels == "torch-w8a8" else "fp8 weight-only",
            "attention": "e4m3 q and p" if kernels == "torch-e4m3-qp" else "exact q and p",
            "top1_agreement": sum(a[0] == b[0] for a, b in pairs) / n,
            "max_logprob_change": max(abs(a[1] - b[1]) for a, b in pairs),
            "mean_nll": -sum(b[1] for _, b in pairs) / n, "greedy_common_prefix": prefix})
    return res


def _w8a8_set() -> str:
    """The torch set with triton-v1.4's fp8 linear numerics (a plugin set of this script, never shipped)."""
    from sits.kernels import get_kernel_set, register_kernel_set
    from sits.kernels.linear_w8a8 import linear_w8a8_torch
    register_kernel_set(get_kernel_set("torch").derive(
        "torch-w8a8", "1.0.0-w8a8", description="torch with triton-v1.4's W8A8 numerics for fp8 weights",
        linear=linear_w8a8_torch), replace=True)
    return "torch-w8a8"


def _e4m3_rows(x):
    """x (fp32) rounded to e4m3 along its last dim with the scale max|x| / 448, back in fp32."""
    import torch

    from sits.kernels.kv_fp8 import FP8_DTYPE, FP8_MAX
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (x / scale).to(FP8_DTYPE).float() * scale


def _attend_e4m3_qp(q, k, v, first_pos: int, scale: float):
    """One sequence's attention: q [n, Hq, D], the new tokens at positions first_pos.. of k, v [L, Hkv, D] (the
    pages dequantized, fp32), with q and the softmax weights rounded to e4m3 (the module docstring)."""
    import torch

    from sits.kernels.kv_fp8 import FP8_DTYPE, FP8_MAX
    g = q.shape[1] // k.shape[1]
    qf = _e4m3_rows(q.float()).transpose(0, 1)                              # [Hq, n, D]
    kf = k.float().repeat_interleave(g, dim=1).transpose(0, 1)              # [Hq, L, D]
    vf = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale                   # [Hq, n, L]
    qpos = torch.arange(first_pos, first_pos + q.shape[0], device=q.device)
    scores = scores.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > qpos[:, None], float("-inf"))
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    # the value scales t_j (max|v_j| / 448: the pages hold v_j / t_j) go into the rounded weights, raised by a power
    # of two c that puts the largest t_j near 448, as kernels/paged_decode_attention_fp8_dots.py does per tile
    t = vf.abs().amax(dim=-1) / FP8_MAX                                     # [Hq, L]
    t = torch.where(t > 0, t, torch.ones_like(t))
    c = torch.exp2(torch.floor(-torch.log2(t.amax(dim=-1, keepdim=True) / FP8_MAX)))   # [Hq, 1]
    w8 = (e * (t * c)[:, None, :]).to(FP8_DTYPE).float() / c[:, None, :]
    out = torch.matmul(w8, vf / t[..., None]) / e.sum(dim=-1, keepdim=True)
    return out.transpose(0, 1).to(q.dtype)


def _decode_e4m3_qp(q, k_cache, v_cache, block_tables, context_lens, scale):
    import torch

    from sits.kernels.kv_fp8 import gather_tokens
    out = torch.empty_like(q)
    for i, length in enumerate(context_lens.tolist()):
        k, v = (gather_tokens(c, block_tables[i], length, torch.float32) for c in (k_cache, v_cache))
        out[i:i + 1] = _attend_e4m3_qp(q[i:i + 1], k, v, length - 1, scale)
    return out


def _prefill_e4m3_qp(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    import torch

    from sits.kernels.kv_fp8 import gather_tokens
    from sits.kernels.prefill_attention_ref import _sequences
    out = torch.zeros_like(q)
    for i, s, n, length in _sequences(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens):
        k, v = (gather_tokens(c, block_tables[i], length, torch.float32) for c in (k_cache, v_cache))
        out[s:s + n] = _attend_e4m3_qp(q[s:s + n], k, v, length - n, scale)
    return out


def _qp_set() -> str:
    """The torch set whose attention reads q and the softmax weights in e4m3 (a plugin set of this script)."""
    from sits.kernels import get_kernel_set, register_kernel_set
    register_kernel_set(get_kernel_set("torch").derive(
        "torch-e4m3-qp", "1.0.0-e4m3-qp", description="torch with e4m3 q and softmax weights in attention",
        kv_cache_dtypes=("auto", "fp8"), prefill_attention=_prefill_e4m3_qp,
        paged_decode_attention=_decode_e4m3_qp), replace=True)
    return "torch-e4m3-qp"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="preset or checkpoint directory (bench/train_tiny.py writes one)")
    ap.add_argument("--kernels", default="torch", help="a kernel set that takes fp8 pages (torch, triton-v1.3)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="the baseline's compute dtype (and the fp8 run's)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-chars", type=int, default=300)
    ap.add_argument("--no-weights", dest="weights", action="store_false",
                    help="skip the fp8-weight rows (weight-only and W8A8)")
    ap.add_argument("--qp", action="store_true",
                    help="also FP8 pages read with e4m3 q and softmax weights (the module docstring)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    res = measure(args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(f"{res['model']} ({res['kernels']}, {res['device']}), baseline {res['baseline_dtype']} with its own KV "
          f"dtype: {res['prompts']} prompts, {res['scored_positions']} scored positions, mean NLL "
          f"{res['baseline_mean_nll']:.4f}")
    print(f"{'KV cache / compute / weights (attention)':52s} {'top-1':>8s} {'max |dlogprob|':>15s} {'mean NLL':>9s} {'greedy prefix':>14s}")
    for v in res["variants"]:
        qp = " (e4m3 q, p)" if v["attention"] != "exact q and p" else ""
        what = f"{v['kv_cache_dtype']} / {v['dtype']} / {v['weights']}{qp}"
        print(f"{what:52s} {100 * v['top1_agreement']:7.2f}% "
              f"{v['max_logprob_change']:15.4f} {v['mean_nll']:9.4f} "
              f"{v['greedy_common_prefix']:>6d}/{res['greedy_tokens']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
