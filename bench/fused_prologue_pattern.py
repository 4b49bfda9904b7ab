"""The correctness gate's request pattern, in one process, against triton-v1.6 -- with the model's weights checked.

triton-v1.6's GPU canary was rolled back because some prompts' answers went flat (token 0 at a zero margin) from the
row of their first generated token on -- in the greedy continuation and in the teacher-forced echo alike, although
the echo's forward ran v1.5's ops (BENCHMARKS.md "Fused decode layers"). The failing prompts were those whose
requests met the other replay workers' requests in flight. bench/fused_prologue_served.py replays that against served
engines; this drives the same pattern through `LLMEngine` in-process, step by step, where the engine's state can be
inspected: `--workers` clients (default 4, the gate's concurrency) take the prompts in order, each sending a greedy
request (16 tokens, top-5 logprobs) and, once it ends, its teacher-forced echo (prompt + the reference tokens,
prompt logprobs), worker i starting `--stagger` x i steps late. Per engine: the prompts whose continuation holds
token 0 after its first token or whose teacher-forced top-1 is under 50 %, and whether every weight tensor of the
model (embedding, linears, norms, head) is bit for bit what it was before the pattern ran (a kernel writing outside
its buffers would show there). The reference is production's set with one prompt at a time; the control runs the
pattern on production's set too.

    python3 bench/fused_prologue_pattern.py [--model llama3-8b] [--quantization int8]
    .venv/bin/python bench/fused_prologue_pattern.py --device cpu --model tiny --canary torch --baseline torch
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


_NOT_WEIGHTS = frozenset({"ks", "tp", "cfg"})   # the kernel set (its ops), the tensor-parallel group, the config


def weight_tensors(model) -> dict[str, object]:
    """Every tensor the model holds (names by attribute path), QuantizedWeight's qweight and scale included."""
    import torch
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(obj, path: str, depth: int) -> None:
        if id(obj) in seen or depth > 8:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out[path] = obj
            return
        if isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                walk(x, f"{path}[{i}]", depth + 1)
            return
        attrs = getattr(obj, "__dict__", None)
        if attrs is None and hasattr(obj, "__slots__"):
            attrs = {k: getattr(obj, k) for k in obj.__slots__ if hasattr(obj, k)}
        for k, v in (attrs or {}).items():
            if k not in _NOT_WEIGHTS:
                walk(v, f"{path}.{k}" if path else k, depth + 1)
    walk(model, "", 0)
    return out


def fingerprint(model) -> dict[str, float]:
    """Per tensor: the float64 sum of its values (a kernel's stray write changes it)."""
    import torch
    return {name: float(t.to(torch.float32).sum(dtype=torch.float64)) for name, t in weight_tensors(model).items()}


def reference(llm, prompts: list[str], tokens: int) -> list[list[int]]:
    """Production's greedy tokens, one prompt at a time."""
    from sits.engine.sampling_params import SamplingParams
    return [llm.generate([p], SamplingParams(temperature=0, max_tokens=tokens), use_tqdm=False)[0].token_ids
            for p in prompts]


def run_pattern(llm, prompts: list[str], ref: list[list[int]], workers: int, stagger: int, tokens: int) -> list[dict]:
    """The gate's pattern through the engine, step by step -> per prompt: greedy tokens, forced top-1 positions."""
    from sits.engine.sampling_params import SamplingParams
    eng = llm.engine
    greedy = SamplingParams(temperature=0, max_tokens=tokens, logprobs=5)
    echo = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=5)
    todo = deque(range(len(prompts)))
    state: list[tuple | None] = [None] * workers    # (kind, prompt index, request id) per busy worker
    got: dict[str, dict] = {}
    result: list[dict] = [{} for _ in prompts]
    step = 0
    while todo or any(state) or eng.has_unfinished_requests():
        for w in range(workers):
            if state[w] is None and todo and step >= w * stagger:
                i = todo.popleft()
                rid = f"g{i}"
                eng.add_request(rid, prompts[i], greedy)
                state[w] = ("greedy", i, rid)
        for out in eng.step():
            acc = got.setdefault(out.request_id, {"tokens": [], "prompt_logprobs": None})
            acc["tokens"] += out.new_token_ids
            if out.prompt_logprobs is not None:
                acc["prompt_logprobs"] = out.prompt_logprobs
            acc["done"] = out.finished
        for w in range(workers):
            if state[w] is None or not got.get(state[w][2], {}).get("done"):
                continue
            kind, i, rid = state[w]
            if kind == "greedy":
                result[i]["tokens"] = got[rid]["tokens"]
                ids = eng.tokenizer.encode(prompts[i])
                result[i]["prompt_len"] = len(ids)
                eng.add_request(f"e{i}", ids + list(ref[i]), echo)
                state[w] = ("echo", i, f"e{i}")
            else:
                lps = got[rid]["prompt_logprobs"] or []
                first = result[i]["prompt_len"] - 1    # entry p - 1 scores prompt token p
                forced = lps[first:first + len(ref[i])]
                result[i]["forced_top1"] = (sum(e["logprob"] >= max((v for _, v in e["top_logprobs"]),
                                                                    default=e["logprob"]) for e in forced)
                                            / len(forced)) if forced else None
                state[w] = None
        step += 1
    return result


def bad_prompts(result: list[dict]) -> list[tuple[int, int, float | None]]:
    """(index, token-0 count after the first token, forced top-1) of the prompts with the failure's signature."""
    out = []
    for i, r in enumerate(result):
        zeros = sum(t == 0 for t in r.get("tokens", [])[1:])
        top1 = r.get("forced_top1")
        if zeros or (top1 is not None and top1 < 0.5):
            out.append((i, zeros, top1))
    return out


def table(rows: list[dict], header: str) -> list[str]:
    out = [header, f"{'engine':34} {'= reference':>12} {'bad':>4} {'weights':>10}  bad prompts (index:zeros)"]
    for r in rows:
        out.append(f"{r['label']:34} {r['same']:>12} {len(r['bad']):>4} {r['weights']:>10}  "
                   + " ".join(f"{i}:{z}" for i, z, _ in r["bad"][:10]))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--quantization", default="int8", help="'' for none")
    p.add_argument("--device", default="cuda")
    p.add_argument("--canary", default="triton-v1.6")
    p.add_argument("--baseline", default="triton-v1.5")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--stagger", type=int, default=3, help="steps between the workers' starts")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--prompts", type=int, default=32, help="the first N of the gate's default prompt set")
    p.add_argument("--json", type=Path, default=None, help="write the rows here too")
    a = p.parse_args(argv)
    import torch

    from sits.control_plane.analysis.prompts import DEFAULT_PROMPTS
    from sits.engine.llm import LLM
    prompts = list(DEFAULT_PROMPTS[:a.prompts])
    kw = dict(device=a.device, quantization=a.quantization or None, max_model_len=2048, max_num_seqs=64)
    if a.device == "cuda":
        kw["gpu_memory_utilization"] = 0.3
    rows, ref = [], None
    for label, kernels in ((f"{a.baseline} (control)", a.baseline), (a.canary, a.canary)):
        t0 = time.perf_counter()
        llm = LLM(a.model, kernels, **kw)
        print(f"{kernels}: loaded and warmed up in {time.perf_counter() - t0:.0f} s", flush=True)
        if ref is None:
            ref = reference(llm, prompts, a.tokens)
        before = fingerprint(llm.engine.model_runner.model)
        result = run_pattern(llm, prompts, ref, a.workers, a.stagger, a.tokens)
        after = fingerprint(llm.engine.model_runner.model)
        changed = sorted(k for k in before if before[k] != after.get(k))
        same = sum(r.get("tokens") == list(t) for r, t in zip(result, ref))
        row = {"label": label, "same": f"{same}/{len(prompts)}", "bad": bad_prompts(result),
               "weights": "unchanged" if not changed else f"{len(changed)} CHANGED"}
        rows.append(row)
        print(f"[{label}] {row['same']} continuations = reference; signature in {len(row['bad'])} prompt(s) "
              f"{row['bad'][:8]}; weights {row['weights']}{': ' + ', '.join(changed[:6]) if changed else ''} "
              f"({len(before)} tensors)", flush=True)
        llm.close()
        del llm
        if a.device == "cuda":
            torch.cuda.empty_cache()
    if a.json:
        import json
        a.json.write_text(json.dumps(rows, indent=1))
    print()
    print("\n".join(table(rows, f"{a.model}, {a.quantization or 'no'} quantization, {a.device}: the gate's request "
                                f"pattern in-process ({a.workers} workers, stagger {a.stagger} steps)")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
