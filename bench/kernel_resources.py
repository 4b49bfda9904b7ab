"""What Triton builds for Hopper from the attention kernels, without a GPU: each launch candidate compiled for
sm_90 at llama3-8b's heads (head_dim 128, 4 query heads a kv head, pages of 64, a bf16 model), and from the result its
registers and spill stack (`cuobjdump -res-usage` of Triton's own cubin), its shared memory, and what its key loop does
(Triton's TTGIR): register tiles stored back to shared memory (`local_alloc` of a value), shared-memory tiles loaded
into registers (`local_load`), wgmma dots, and the dots waited for at once (`warp_group_dot_wait {pendings = 0}` inside
the loop; v1.1's P V dot stays in flight across iterations instead), and static SASS instruction counts of the whole
kernel (`cuobjdump -sass`: tensor-core ops, shared-memory loads and stores, warp shuffles, spill traffic). v1.19 is
v1.18's loop with the scores transposed (S^T = K Q^T, O^T += V^T P^T), built after a design probe here showed Triton
then keeps the converted tiles as wgmma's register operands (and measured slower: BENCHMARKS.md). `decode` is the
decode attention kernel over FP8 pages (triton-v1.8 .. v1.15) at v1.14's one-warp config by stages and v1.8's four-warp
one. Every candidate is compiled with a launch's specializations (LAUNCH_INTS: aligned pointers, strides of 1
constant, multiples of 16 marked; before 2026-12-07 they were compiled without, which made the pointer kernels' loads
a byte or two wide). "Tiles in flight": how many K/V tiles Triton's pipeliner buffers for a program's async copies
(decode at BLOCK_N 32: 1 up to 4 stages, 2 from 5).

    python3 bench/kernel_resources.py [--kernels v1.1,v1.17,v1.18,v1.19,decode] [--json OUT.json]
    PYTHONPATH=/path/to/triton-3.6 python3 bench/kernel_resources.py   # what the device's Triton builds

Triton's compiler and its bundled ptxas/cuobjdump do this on CPU (the `triton` wheel carries them). The figures are
the compiler's for this Triton: another Triton (the device's 3.6, the lock's 3.9) builds other code. Registers and
loop structure explain timings, they are not timings (BENCHMARKS.md "FP8 prefill fronts and the issue's rows").
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402  (before the kernels: without a GPU, kernels/triton_env.py would pick the interpreter)
import triton.language as tl  # noqa: E402

HEAD_DIM, GROUP, PAGE = 128, 4, 64
KERNELS = ("v1.1", "v1.17", "v1.18", "v1.19", "decode")
# the integer arguments of a launch at llama3-8b's shapes (q and outputs [tokens, 32, 128]; FP8 pages [blocks, 64, 8,
# 128], their scales [blocks, 64, 8]; block tables 40 wide; 3 sequences of a prefill, 256 of a decode), which every
# candidate is compiled with as a launch specializes on them: 1 becomes a constant, a multiple of 16 is marked so
# (without that a pointer kernel's loads compile a byte or two at a time)
LAUNCH_INTS = dict(stride_qt=4096, stride_qs=4096, stride_qh=128, stride_ot=4096, stride_os=4096, stride_oh=128,
                   stride_kb=65536, stride_ks=1024, stride_kh=128, stride_vb=65536, stride_vs=1024, stride_vh=128,
                   stride_ksb=512, stride_kss=8, stride_ksh=1, stride_vsb=512, stride_vss=8, stride_vsh=1,
                   stride_bt=40, num_seqs=3, TOKENS_BUCKET=2048, num_q_heads=32, BATCH_BUCKET=256)
_IDX = {"bt_ptr", "cu_q_ptr", "ctx_ptr"}


def _kernels():
    """(name, jit function, pointer types, fixed constexprs, candidates: (constexprs, num_warps, num_stages))."""
    from sits.kernels import prefill_attention as v1
    from sits.kernels import prefill_attention_fp8 as v117
    from sits.kernels import prefill_attention_fp8_tma as v118
    from sits.kernels import paged_decode_attention_fp8 as dec
    bf16 = {"q_ptr": "*bf16", "o_ptr": "*bf16", **{n: "*i32" for n in _IDX}}
    scales = {"k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"}
    desc = f"[{PAGE}, {HEAD_DIM}]>"
    fp8_tma = {**bf16, **scales, "k_desc": "tensordesc<fp8e4nv" + desc, "v_desc": "tensordesc<fp8e4nv" + desc}
    heads = dict(HEAD_DIM=HEAD_DIM, GROUP=GROUP, PAGE=PAGE)
    return {
        "v1.1": ("triton-v1.1 TMA, bf16 pages", v1._prefill_attention_tma_kernel,
                 {**bf16, "k_desc": "tensordesc<bf16" + desc, "v_desc": "tensordesc<bf16" + desc},
                 dict(**heads, DOT_F32=False), [(c.kwargs, c.num_warps, c.num_stages) for c in v1._TMA_CONFIGS]),
        "v1.17": ("triton-v1.17 pointer gather, FP8 pages", v117._prefill_attention_fp8_kernel,
                  {**bf16, **scales, "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"},
                  dict(**heads, HEAD_DIM_P=HEAD_DIM, DOT_F32=False, DOT_PRECISION="tf32", F16_DOT=True),
                  [(c.kwargs, c.num_warps, c.num_stages) for c in v117._FP8_CONFIGS]),
        "v1.18": ("triton-v1.18 TMA, FP8 pages", v118._prefill_attention_fp8_tma_kernel, fp8_tma,
                  dict(**heads, F16_DOT=True, TRANSPOSED=False),
                  [(c.kwargs, c.num_warps, c.num_stages) for c in v118._CONFIGS]),
        "v1.19": ("triton-v1.19 TMA, FP8 pages, scores transposed", v118._prefill_attention_fp8_tma_kernel, fp8_tma,
                  dict(**heads, F16_DOT=True, TRANSPOSED=True),
                  [(c.kwargs, c.num_warps, c.num_stages) for c in v118._T_CONFIGS]),
        # decode attention over FP8 pages (triton-v1.8 .. v1.15's kernel, one split): v1.14's one-warp config at 2-5
        # stages (at 5 Triton keeps two K/V tiles in flight) and v1.8's four-warp one
        "decode": ("decode attention, FP8 pages", dec._paged_decode_attention_fp8_kernel,
                   {**bf16, **scales, "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "part_o_ptr": "*fp32",
                    "part_lse_ptr": "*fp32"},
                   dict(**heads, HEAD_DIM_P=HEAD_DIM, GROUP_P=16, NUM_SPLITS=1, DOT_F32=False, DOT_PRECISION="tf32",
                        F16_DOT=True, STAGED=True, HEADS_FIRST=True, PDL=True),
                   [(dict(BLOCK_N=32), 1, st) for st in (2, 3, 4, 5)] + [(dict(BLOCK_N=32), 2, 5)]
                   + [(dict(BLOCK_N=128), 4, st) for st in (2, 5)]
                   # the key tile converted in the dot's operand layout instead of staged as fp16 (STAGE_K=False)
                   + [(dict(BLOCK_N=32, STAGE_K=False), 1, 3), (dict(BLOCK_N=128, STAGE_K=False), 4, 2)]),
    }


def tiles_in_flight(ttgir: str) -> int:
    """How many K/V tiles a program's copies keep in flight: the leading dimension of the multi-buffered shared
    tiles Triton's pipeliner allocates for the loop's async copies (`memdesc<Nx...xf8E4M3FN, ..., mutable>`; 0:
    none)."""
    return max((int(n) for n in re.findall(r"memdesc<(\d+)x\d+x\d+x[a-zA-Z0-9]+, [^>]*mutable>", ttgir)), default=0)


def loop_ops(ttgir: str) -> dict[str, int]:
    """Counts in the body of the TTGIR's busiest `scf.for` (the most wgmma dots; ties: the first, the unmasked key
    loop): register tiles stored to shared memory, tiles loaded from it, dots, and dots waited for at once."""
    lines, loops = ttgir.splitlines(), []
    for i, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for inner in lines[i + 1:]:
            if len(inner) - len(inner.lstrip()) <= indent and inner.strip().startswith("}"):
                break
            body.append(inner)
        loops.append("\n".join(body))
    if not loops:
        return {"loops": 0, "stores": 0, "loads": 0, "dots": 0, "waited_at_once": 0}
    body = max(loops, key=lambda b: len(re.findall(r"warp_group_dot |tt\.dot ", b)))
    return {"loops": len(loops),
            "stores": len(re.findall(r"ttg\.local_alloc %", body)),   # a value written to shared memory
            "loads": len(re.findall(r"ttg\.local_load ", body)),
            "dots": len(re.findall(r"warp_group_dot |tt\.dot ", body)),
            "waited_at_once": len(re.findall(r"warp_group_dot_wait .*pendings = 0", body))}


def _cuobjdump(cubin: bytes, tools: Path, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tools / "cuobjdump"), flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def resources(cubin: bytes, tools: Path) -> dict[str, int]:
    """Registers and spill stack of a cubin, by cuobjdump -res-usage."""
    out = _cuobjdump(cubin, tools, "-res-usage")
    got = {k: re.search(rf"{k}:(\d+)", out) for k in ("REG", "STACK")}
    if not all(got.values()):
        raise RuntimeError(f"cuobjdump -res-usage printed no REG/STACK: {out[-500:]}")
    return {"registers": int(got["REG"].group(1)), "spill_stack_bytes": int(got["STACK"].group(1))}


SASS_KINDS = {"tensor-core ops": ("HGMMA", "HMMA"), "shared loads": ("LDS", "LDSM"), "shared stores": ("STS",),
              "shuffles": ("SHFL",), "spill loads+stores": ("LDL", "STL")}


def sass_counts(cubin: bytes, tools: Path) -> dict[str, int]:
    """Static instruction counts in the whole kernel (its loops once each, prologue and epilogue), by SASS_KINDS,
    from `cuobjdump -sass`: not what runs (a loop's body runs once a key tile), what Triton asked the SM to do."""
    sass = _cuobjdump(cubin, tools, "-sass")
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, flags=re.M)
    if not ops:
        raise RuntimeError(f"cuobjdump -sass printed no instructions: {sass[-500:]}")
    return {kind: sum(op in names for op in ops) for kind, names in SASS_KINDS.items()} | {"instructions": len(ops)}


def compile_sm90(fn, ptrs: dict, const: dict, warps: int, stages: int):
    """One candidate of `fn` compiled for sm_90: `const` its constexprs, `ptrs` its pointer and descriptor types (the
    other arguments i32, qk_scale fp32); Triton's compiled kernel (`.asm` ttgir/ptx/cubin, `.metadata`). Specialized
    as a launch with LAUNCH_INTS' integer arguments would be: pointers 16-byte aligned, an integer of 1 a constant, a
    multiple of 16 marked divisible; constexprs not in `const` at their defaults."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    # constexprs left out take their defaults, as at a launch (else the signature below would type them i32)
    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **const}
    const = {**const, **{n: 1 for n, v in LAUNCH_INTS.items() if v == 1 and n in fn.arg_names}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n not in const and (n in ptrs or LAUNCH_INTS.get(n, 1) % 16 == 0)}
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n == "qk_scale" else "i32") for n in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
                    attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def compile_candidate(fn, ptrs: dict, const: dict, warps: int, stages: int, tools: Path) -> dict:
    k = compile_sm90(fn, ptrs, const, warps, stages)
    return {**resources(k.asm["cubin"], tools), "shared_kib": round(k.metadata.shared / 1024, 1),
            **loop_ops(k.asm["ttgir"]), "tiles_in_flight": tiles_in_flight(k.asm["ttgir"]),
            "sass": sass_counts(k.asm["cubin"], tools)}


def run(names: list[str]) -> list[dict]:
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (tools / "cuobjdump").exists():
        raise SystemExit(f"this Triton ({triton.__version__}) carries no cuobjdump in {tools}")
    kernels, rows = _kernels(), []
    for name in names:
        what, fn, ptrs, fixed, candidates = kernels[name]
        for kw, warps, stages in candidates:
            const = {**fixed, **kw}
            config = ", ".join(f"{k} {v}" for k, v in kw.items()) + f", {warps} warps, {stages} stages"
            print(f"  {what}: {config} ...", flush=True)
            rows.append({"kernel": what, "config": config, **compile_candidate(fn, ptrs, const, warps, stages, tools)})
    return rows


def table(rows: list[dict], version: str) -> str:
    out = [f"Triton {version}, sm_90, llama3-8b's heads (head_dim {HEAD_DIM}, {GROUP} query heads a kv head, pages "
           f"of {PAGE}), a bf16 model; the key loop: the scf.for with the most dots",
           "| kernel | config | registers | spill stack, B | shared, KiB | loop: tiles back to shared memory | "
           "loop: shared -> registers | loop: dots | loop: dots waited at once | tiles in flight | SASS: "
           + " / ".join(SASS_KINDS) + " / all |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['kernel']} | {r['config']} | {r['registers']} | {r['spill_stack_bytes']} | {r['shared_kib']} | "
            f"{r['stores']} | {r['loads']} | {r['dots']} | {r['waited_at_once']} | {r['tiles_in_flight']} | "
            + " / ".join(str(r["sass"][k]) for k in (*SASS_KINDS, "instructions")) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default=",".join(KERNELS), help=f"comma list of: {', '.join(KERNELS)}")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    names = [n for n in args.kernels.split(",") if n]
    unknown = sorted(set(names) - set(KERNELS))
    if unknown or not names:
        ap.error(f"unknown kernels {unknown}; known: {', '.join(KERNELS)}")
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("run this without TRITON_INTERPRET: it compiles the kernels, the interpreter only runs them")
    rows = run(names)
    if args.json:
        args.json.write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))
    print(table(rows, triton.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
