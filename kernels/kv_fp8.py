"""The FP8 KV-cache page format (`--kv-cache-dtype fp8`): e4m3 values with one fp32 scale per (token, kv head).

An `Fp8Pages` stands where a plain `[num_blocks, block_size, num_kv_heads, head_dim]` cache tensor stands in
`rope_and_cache`, `prefill_attention` and `paged_decode_attention`; the kernel sets whose `kv_cache_dtypes` include
"fp8" quantize it when they write and dequantize it when they read (in-kernel for the Triton ones).

Each token's vector x of one kv head (head_dim values, K after RoPE, V as projected) is stored as
    scale = max_i |x_i| / 448  (1 for an all-zero x),   data = e4m3(clamp(x / scale, -448, 448)),   x ~ data * scale
with the division and the rounding in fp32. Why a scale per (token, head) rather than a static one per layer:
- e4m3 is floating point: a scale only has to keep a vector's largest value at or below 448 and the rest above the
  subnormals (2^-6 x scale, 1/28,672 of the largest); then every element keeps e4m3's relative precision, 3 mantissa
  bits: |x - x~| <= 2^-4 |x| (below the subnormals, 2^-10 x scale). A static scale must do that for every token the
  layer will ever see (calibration, and a token beyond it saturates); a scale per vector does it exactly for each, and
  an outlier token or head costs only its own vector's precision;
- the kernels apply it per key: a key's scale multiplies its column of q.k^T and a value's scale its column of the
  softmax weights before p.v, so a tile is dequantized by [rows x keys] multiplies, not [keys x head_dim].
The scale costs 4 bytes beside head_dim bytes: 132 bytes per token and kv head at head_dim 128 against 256 in bf16,
1.94x the tokens in the same memory (1.88x at head_dim 64).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from sits.kernels.paged import PagedAttentionError, gather_kv

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0   # the largest finite e4m3fn value
SCALE_DTYPE = torch.float32


@dataclass(frozen=True, slots=True, eq=False)   # eq=False: compared by identity, never tensor by tensor
class Fp8Pages:
    """One layer's K (or V) cache in FP8: data [num_blocks, block_size, num_kv_heads, head_dim] e4m3fn and
    scale [num_blocks, block_size, num_kv_heads] fp32 (x ~ data * scale[..., None])."""

    data: torch.Tensor
    scale: torch.Tensor

    def __post_init__(self) -> None:
        if self.data.dtype != FP8_DTYPE or self.data.dim() != 4:
            raise PagedAttentionError(f"Fp8Pages: data must be [num_blocks, block_size, num_kv_heads, head_dim] "
                                      f"{FP8_DTYPE}, got {tuple(self.data.shape)} {self.data.dtype}")
        if self.scale.dtype != SCALE_DTYPE or self.scale.shape != self.data.shape[:3]:
            raise PagedAttentionError(f"Fp8Pages: scale must be {list(self.data.shape[:3])} {SCALE_DTYPE}, got "
                                      f"{tuple(self.scale.shape)} {self.scale.dtype}")
        if self.scale.device != self.data.device:
            raise PagedAttentionError(f"Fp8Pages: data on {self.data.device}, scale on {self.scale.device}")

    @classmethod
    def zeros(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, device) -> "Fp8Pages":
        data = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.uint8, device=device)
        return cls(data.view(FP8_DTYPE),   # zero bytes: +0.0 in e4m3
                   torch.ones(num_blocks, block_size, num_kv_heads, dtype=SCALE_DTYPE, device=device))

    def to(self, device) -> "Fp8Pages":
        return Fp8Pages(self.data.to(device), self.scale.to(device))

    def clone(self) -> "Fp8Pages":
        return Fp8Pages(self.data.clone(), self.scale.clone())

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole cache in `dtype` (tests; the ops dequantize only what they read)."""
        return dequantize(self.data, self.scale, dtype)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def check_fp8_device(op: str, pages: Fp8Pages) -> None:
    """Triton converts e4m3 on NVIDIA GPUs of compute capability 8.9 and newer (Ada, Hopper, Blackwell); elsewhere the
    Triton kernels cannot compile, so say so before they try. The interpreter (CPU) emulates it."""
    dev = pages.data.device
    if dev.type == "cuda" and _capability(dev.index if dev.index is not None else torch.cuda.current_device()) < (8, 9):
        raise PagedAttentionError(f"{op}: FP8 KV pages need a GPU of compute capability 8.9 or newer for the Triton "
                                  f"kernels ({torch.cuda.get_device_name(dev)} is "
                                  f"{'.'.join(map(str, torch.cuda.get_device_capability(dev)))}): use the torch kernel "
                                  "set or --kv-cache-dtype auto")


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] (any float dtype) -> (data [..., head_dim] e4m3fn, scale [...] fp32), in fp32."""
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    data = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return data, scale


@functools.lru_cache(maxsize=None)
def _decode_table(dtype: torch.dtype) -> torch.Tensor:
    """Every e4m3fn byte's value in `dtype` (on the CPU), indexed by the byte."""
    return torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).to(dtype)


def dequantize(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """data * scale[..., None] in `dtype`, computed in fp32 (fp64 for fp64). On the CPU the bytes are looked up in a
    256-entry table: torch converts e4m3 there one element at a time, which made the torch set's decode steps over
    FP8 pages ~1.8x as long as over plain ones (the same values: every byte's exact conversion)."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if data.device.type == "cpu":
        values = _decode_table(acc).take(data.view(torch.uint8).long()).view(data.shape)
        return values.mul_(scale.to(acc)[..., None]).to(dtype)
    return (data.to(acc) * scale.to(acc)[..., None]).to(dtype)


def quantize_pages(cache: torch.Tensor) -> Fp8Pages:
    """A plain cache [num_blocks, block_size, num_kv_heads, head_dim] quantized whole (tests, conformance)."""
    return Fp8Pages(*quantize(cache))


def page_tensors(k_cache, v_cache) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensors whose shapes the ops' argument checks read: the caches themselves, or FP8 pages' data (both caches
    in one format)."""
    if isinstance(k_cache, Fp8Pages) != isinstance(v_cache, Fp8Pages):
        raise PagedAttentionError("k_cache and v_cache must both be Fp8Pages or both be tensors")
    if isinstance(k_cache, Fp8Pages):
        return k_cache.data, v_cache.data
    return k_cache, v_cache


def kernel_page_args(op: str, k_cache: "Fp8Pages", v_cache: "Fp8Pages") -> tuple[torch.Tensor, ...]:
    """What the FP8 attention kernels read of the pages, checked for them: (k data, v data, k scale, v scale), the
    data contiguous along head_dim, on a device that converts e4m3."""
    check_fp8_device(op, k_cache)
    kd, vd = k_cache.data, v_cache.data
    if kd.stride(-1) != 1 or vd.stride(-1) != 1:
        raise PagedAttentionError(f"{op}: FP8 pages must be contiguous along head_dim")
    return kd, vd, k_cache.scale, v_cache.scale


# The references index and scatter e4m3 data as bytes (uint8 views): the same values, and no reliance on torch having
# indexing kernels for float8 on every device and version.
def _bytes(data: torch.Tensor) -> torch.Tensor:
    return data.view(torch.uint8)


def take_blocks(cache, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache[index] in `dtype`: whole blocks of plain or FP8 pages ([*index.shape, block_size, kv_heads, head_dim])."""
    if isinstance(cache, Fp8Pages):
        if index.device.type == "cpu":   # each distinct block dequantized once (a batch's tables repeat padding
            blocks, where = torch.unique(index, return_inverse=True)   # blocks); on a GPU unique would sync the host
            return dequantize(_bytes(cache.data)[blocks].view(FP8_DTYPE), cache.scale[blocks], dtype)[where]
        return dequantize(_bytes(cache.data)[index].view(FP8_DTYPE), cache.scale[index], dtype)
    return cache[index].to(dtype)


def gather_tokens(cache, block_row: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The first `length` tokens of one sequence in `dtype` ([length, kv_heads, head_dim]), plain or FP8 pages."""
    if isinstance(cache, Fp8Pages):
        data = gather_kv(_bytes(cache.data), block_row, length).view(FP8_DTYPE)
        return dequantize(data, gather_kv(cache.scale, block_row, length), dtype)
    return gather_kv(cache, block_row, length).to(dtype)


def write_tokens(x: torch.Tensor, pages: Fp8Pages, slots: torch.Tensor) -> None:
    """Quantize x [T, kv_heads, head_dim] into the flat token slots `slots` [T] (all >= 0) of `pages`."""
    data, scale = quantize(x)
    _bytes(pages.data).view(-1, *pages.data.shape[2:])[slots] = _bytes(data)
    pages.scale.view(-1, pages.scale.shape[2])[slots] = scale

