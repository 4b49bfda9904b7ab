"""`sits-engine`: generate | kernels | write-tiny | serve (the HTTP server lives in engine.server.main)."""

from __future__ import annotations

import argparse
import sys

from sits.kernels.registry import KV_CACHE_DTYPES


def _generate(args) -> int:
    from sits.engine.llm import LLM
    from sits.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, stop=args.stop or [], ignore_eos=args.ignore_eos)
    with LLM(model=args.model, kernels=args.kernels, device=args.device, dtype=args.dtype,
             kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size) as llm:
        for result in llm.generate(args.prompts, params):
            if len(args.prompts) > 1:
                print(f"--- {result.prompt!r} ({len(result.token_ids)} tokens, {result.finish_reason})")
            print(result.text)
    return 0


def _kernels(args) -> int:
    from sits import kernels
    if args.json:   # what the control plane reads (kernels/catalog.py)
        from sits.kernels.catalog import catalogue, dumps

        sys.stdout.write(dumps(catalogue()))
        return 0

    rows = [("name", "version", "devices", "cuda-graphs", "description")]
    for name in kernels.list_kernel_sets():
        ks = kernels.get_kernel_set(name)
        rows.append((ks.name, ks.version, ",".join(ks.devices), "yes" if ks.graph_safe else "no", ks.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def _write_tiny(args) -> int:
    from sits.engine.model.loader import write_tiny

    path = write_tiny(args.dir, shards=args.shards, seed=args.seed, tie_word_embeddings=args.tie_word_embeddings)
    print(f"wrote a tiny random LLaMA checkpoint to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sits-engine", description="SITS inference engine")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate a completion for each prompt and print it")
    g.add_argument("prompts", nargs="+", metavar="PROMPT")
    g.add_argument("--model", default="tiny", help="preset (tiny, llama3-8b) or checkpoint directory")
    g.add_argument("--kernels", default="torch", help="kernel set name (see `sits-engine kernels`)")
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", default="auto")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="KV-cache pages: auto = the model's dtype; fp8 = e4m3 with a scale per token and kv head "
                        "(a kernel set that takes it: torch, triton-v1.3..v1.5)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split the model over N ranks (processes; one GPU each on CUDA)")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.set_defaults(func=_generate)
    k = sub.add_parser("kernels", help="list the registered kernel sets")
    k.add_argument("--json", action="store_true", help="the catalogue the control plane reads: name, version, "
                   "devices, parent, ops overridden, regression")
    k.set_defaults(func=_kernels)
    w = sub.add_parser("write-tiny", help="write the tiny preset as a Hugging Face style checkpoint directory")
    w.add_argument("dir")
    w.add_argument("--shards", type=int, default=1, help="split the weights over N safetensors files")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--tie-word-embeddings", action="store_true")
    w.set_defaults(func=_write_tiny)
    sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API (see `sits-engine serve --help`)",
                   add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        from sits.engine.server.main import main as serve_main

        return serve_main(argv[1:])
    args = build_parser().parse_args(argv)
    from sits.engine.errors import EngineError

    try:
        return args.func(args)
    except (EngineError, ValueError) as e:
        print(f"sits-engine {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
