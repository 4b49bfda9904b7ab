"""Shared test helpers: paged-cache builders and verbose error checks."""
from __future__ import annotations

import torch


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
