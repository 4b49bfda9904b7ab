"""Shared kernel-test helpers: paged-cache builders, verbose error checks, and the comparison every op's file runs
(the kernel's error vs the fp64 reference at most 2x the torch reference's own error in the kernel's precision, plus
a small atol scaled by the output's magnitude: flash-attention's criterion)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sits.kernels import get_kernel_set
from sits.kernels.kv_fp8 import Fp8Pages, quantize_pages

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
# the torch reference against independent fp64 formulations: (dtype, atol, rtol)
REF_DTYPES = [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 2e-3), (torch.bfloat16, 2e-2, 2e-2)]


def compile_for_sm90(script: str) -> str:
    """Run `script` (Python that compiles kernels with triton.compile for GPUTarget("cuda", 90, 32) and prints what it
    finds) in a process without Triton's interpreter, from the repository root; its stdout. No GPU needed; skips
    where this Triton has no ptxas."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode and "ptxas" in proc.stderr.lower() and "not found" in proc.stderr.lower():
        pytest.skip("this Triton has no ptxas to compile for sm_90")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def on_gpu(test):
    """A full-size test on a GPU: marked `gpu` (bench/gpu_session.sh runs `-m gpu`), skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


def assert_verbose_allclose(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float,
                            max_print: int = 8) -> None:
    """torch.allclose with the first mismatching indices and values in the failure message."""
    a, e = actual.detach().to(torch.float64).cpu(), expected.detach().to(torch.float64).cpu()
    assert a.shape == e.shape, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    bad = ~((a - e).abs() <= atol + rtol * e.abs())
    bad |= a.isnan() != e.isnan()
    if bad.any():
        idx = bad.nonzero()[:max_print]
        lines = [f"  {tuple(i.tolist())}: got {a[tuple(i)].item():.6g} expected {e[tuple(i)].item():.6g}" for i in idx]
        raise AssertionError(f"{int(bad.sum())}/{bad.numel()} elements differ (atol={atol}, rtol={rtol}); "
                             f"max abs err {(a - e).abs().nan_to_num(float('inf')).max().item():.3g}\n" + "\n".join(lines))


def assert_close_to_fp64(out: torch.Tensor, same_precision: torch.Tensor, ref64: torch.Tensor, atol: float,
                         factor: float = 2.0) -> None:
    """The kernel's max error vs the fp64 reference is at most factor x torch's same-precision error + atol."""
    ref = ref64.detach().to(torch.float64).cpu()
    err_torch = (same_precision.detach().to(torch.float64).cpu() - ref).abs().max().item()
    bound = factor * err_torch + atol
    assert not out.isnan().any(), "kernel output has NaNs"
    assert_verbose_allclose(out, ref, atol=bound, rtol=0.0)


def make_paged_kv(context_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype, device,
                  seed: int = 0, extra_blocks: int = 3):
    """Random K/V for each sequence scattered over shuffled cache blocks.

    Returns k_cache, v_cache [NB, BS, Hkv, D], block_tables [B, max_blocks] int32 padded with -1, and the contiguous
    per-sequence K/V lists ([L, Hkv, D]) for independent checks.
    """
    g = torch.Generator().manual_seed(seed)
    nblocks = [-(-n // block_size) for n in context_lens]
    total = sum(nblocks) + extra_blocks
    perm = torch.randperm(total, generator=g)
    k_cache = torch.randn(total, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(total, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    max_blocks = max(nblocks) + 1
    tables = torch.full((len(context_lens), max_blocks), -1, dtype=torch.int32)
    ks, vs, used = [], [], 0
    for b, n in enumerate(context_lens):
        blocks = perm[used:used + nblocks[b]]
        used += nblocks[b]
        tables[b, :nblocks[b]] = blocks.to(torch.int32)
        ks.append(k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n])
        vs.append(v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n])
    return (k_cache.to(device), v_cache.to(device), tables.to(device),
            [k.to(device) for k in ks], [v.to(device) for v in vs])


def rope_tables(max_pos: int, head_dim: int, theta: float = 10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def args_to(args, dtype=None, device=None):
    """The tensors of `args` on `device`, floating-point ones cast to `dtype`; other arguments as they are."""
    out = []
    for a in args:
        if isinstance(a, Fp8Pages):   # stored e4m3 + fp32 whatever the compute dtype: moved, never cast
            a = a.to(device) if device is not None else a
        elif isinstance(a, torch.Tensor):
            a = a.to(device) if device is not None else a
            if dtype is not None and a.is_floating_point():
                a = a.to(dtype)
        out.append(a)
    return out


def check_op(name, args, dtype, dev, index=None, atol_scale=1.0, kernel_set=None):
    """Run op `name` of `kernel_set` (triton-v1) on `dev` and compare with torch-in-dtype and torch-in-fp64 (CPU)."""
    kernel_set = kernel_set or get_kernel_set("triton-v1")
    ref = get_kernel_set("torch")
    pick = (lambda r: r) if index is None else (lambda r: r[index])
    got = pick(getattr(kernel_set, name)(*args_to(args, device=dev)))
    same = pick(getattr(ref, name)(*args_to(args, device=dev)))
    ref64 = pick(getattr(ref, name)(*args_to(args, dtype=torch.float64, device="cpu")))
    assert got.dtype == dtype and got.shape == ref64.shape
    atol = ATOL[dtype] * atol_scale * max(1.0, ref64.abs().max().item())
    assert_close_to_fp64(got, same, ref64, atol)
    return got


def check_op_on_gpu(name, args, dtype, atol_scale=1.0, kernel_set=None):
    """check_op at full size on the GPU: the fp64 reference runs there too (first output of a tuple)."""
    kernel_set = kernel_set or get_kernel_set("triton-v1")
    ref = get_kernel_set("torch")
    args = args_to(args, device="cuda")
    got = getattr(kernel_set, name)(*args)
    same = getattr(ref, name)(*args)
    ref64 = getattr(ref, name)(*args_to(args, dtype=torch.float64))
    got, same, ref64 = (r[0] if isinstance(r, tuple) else r for r in (got, same, ref64))
    assert_close_to_fp64(got, same, ref64, ATOL[dtype] * atol_scale * max(1.0, ref64.abs().max().item()))


def prefill_args(ctx, qlens, hq, hkv, d, dtype, seed):
    """prefill_attention's arguments: new tokens `qlens` at the end of contexts `ctx`, 64-token pages (CPU)."""
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cpu", seed=seed)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    cu = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    return q, k_cache, v_cache, tables, cu, torch.tensor(ctx, dtype=torch.int32), d ** -0.5


def llama3_mixed_fp8_prefill(dtype, seed):
    """prefill_attention's arguments on the GPU at llama3-8b's heads (32 / 8 x 128) over FP8 pages: a long mixed batch
    of full prompts, decode-like rows, prefix-cache hits and chunks, up to a 4,096-token context."""
    ctx = [1, 63, 64, 65, 1000, 3000, 4096]
    qlens = [1, 63, 64, 1, 1000, 1000, 2048]
    return args_to(fp8_kv(prefill_args(ctx, qlens, 32, 8, 128, dtype, seed=seed)), device="cuda")


def decode_args(ctx, hq, hkv, d, dtype, seed):
    """paged_decode_attention's arguments: one query per sequence of context `ctx`, 64-token pages (CPU)."""
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, 64, dtype, "cpu", seed=seed)
    q = torch.randn(len(ctx), hq, d, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(ctx, dtype=torch.int32), d ** -0.5


def fp8_kv(args):
    """An attention op's arguments (q, k_cache, v_cache, ...) with both caches quantized to FP8 pages."""
    return (args[0], quantize_pages(args[1]), quantize_pages(args[2]), *args[3:])


def sdpa_masked(q, k, v, scale):
    """Causal attention in fp64 by SDPA, the n queries at the end of the L positions."""
    # q: [n, Hq, D], k/v: [L, Hkv, D] contiguous
    n, hq, _ = q.shape
    length, hkv, _ = k.shape
    k = k.repeat_interleave(hq // hkv, 1)
    v = v.repeat_interleave(hq // hkv, 1)
    mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1).double(), k.transpose(0, 1).double(),
                                       v.transpose(0, 1).double(), attn_mask=mask, scale=scale)
    return o.transpose(0, 1)
