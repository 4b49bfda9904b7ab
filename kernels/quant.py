"""Weight-only quantization with one fp32 scale per output channel: w[n, :] ~= qweight[n, :] * scale[n]."""
from __future__ import annotations

from dataclasses import dataclass

import torch

QUANT_KINDS = ("int8", "fp8")
_QDTYPE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
_QMAX = {"int8": 127.0, "fp8": 448.0}  # 448 = largest finite float8_e4m3fn


class QuantizationError(ValueError):
    """Bad quantization input (unknown kind, wrong shape or dtype)."""


@dataclass(slots=True)
class QuantizedWeight:
    """`qweight` is row-major [N, K], or -- with `tile` (TN, TK) set by `pack_weight` -- packed tiles
    [ceil(N / TN), ceil(K / TK), TN, TK], zero-padded, so that each (TN x TK) tile is one contiguous block.
    `shape` is [N, K] either way; `rows()` gives the row-major matrix."""
    qweight: torch.Tensor  # int8 | float8_e4m3fn
    scale: torch.Tensor  # [N] fp32
    kind: str  # "int8" | "fp8"
    tile: tuple[int, int] | None = None  # (TN, TK) when packed
    in_features_: int = -1  # K of a packed weight (its storage is padded)
    k_major: bool = False  # packed tiles ordered [ceil(K / TK), ceil(N / TN), TN, TK]

    def __post_init__(self):
        if self.kind not in QUANT_KINDS:
            raise QuantizationError(f"quantization kind {self.kind!r} is not one of {QUANT_KINDS}")
        want_dim = 2 if self.tile is None else 4
        if self.qweight.dim() != want_dim or self.qweight.dtype != _QDTYPE[self.kind]:
            raise QuantizationError(f"{self.kind} qweight must be {want_dim}-D {_QDTYPE[self.kind]}, got "
                                    f"{tuple(self.qweight.shape)} {self.qweight.dtype}")
        n = self.qweight.shape[0] if self.tile is None else self.scale.shape[0] if self.scale.dim() == 1 else -1
        if self.scale.shape != (n,) or self.scale.dtype != torch.float32:
            raise QuantizationError(f"scale must be fp32 [N], got {tuple(self.scale.shape)} {self.scale.dtype}")
        if self.tile is not None:
            tn, tk = self.tile
            k = self.in_features_
            grid = (-(-k // tk), -(-n // tn)) if self.k_major else (-(-n // tn), -(-k // tk))
            if (tuple(self.qweight.shape) != (*grid, tn, tk) or k < 1
                    or not self.qweight.is_contiguous()):
                raise QuantizationError(f"packed qweight {tuple(self.qweight.shape)} does not hold [{n}, {k}] in "
                                        f"contiguous {tn}x{tk} tiles")
        if self.scale.device != self.qweight.device:
            raise QuantizationError("qweight and scale must be on the same device")

    @property
    def shape(self) -> torch.Size:
        if self.tile is None:
            return self.qweight.shape
        return torch.Size((self.scale.shape[0], self.in_features_))

    def rows(self) -> torch.Tensor:
        """The quantized values as a row-major [N, K] tensor (a copy when packed)."""
        if self.tile is None:
            return self.qweight
        q = self.qweight.transpose(0, 1) if self.k_major else self.qweight
        nt, kt, tn, tk = q.shape
        n, k = self.shape
        return q.permute(0, 2, 1, 3).reshape(nt * tn, kt * tk)[:n, :k]

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    def to(self, device) -> QuantizedWeight:
        return QuantizedWeight(self.qweight.to(device), self.scale.to(device), self.kind, self.tile,
                               self.in_features_, self.k_major)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.rows().to(torch.float32) * self.scale[:, None]).to(dtype)

    def nbytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * 4


def quantize_weight(w: torch.Tensor, kind: str) -> QuantizedWeight:
    """Symmetric per-output-channel quantization of w [N, K] (absmax of each row maps to the type's max)."""
    if kind not in QUANT_KINDS:
        raise QuantizationError(f"quantization kind {kind!r} is not one of {QUANT_KINDS}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise QuantizationError("quantize_weight expects a 2-D floating-point tensor [N, K]")
    w32 = w.detach().to(torch.float32)
    qmax = _QMAX[kind]
    # all-zero rows get scale 1 so dequantization stays exact (0 * 1)
    amax = w32.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    scaled = (w32 / scale[:, None]).clamp(-qmax, qmax)
    if kind == "int8":
        q = scaled.round().to(torch.int8)
    else:
        q = scaled.to(torch.float8_e4m3fn)
    return QuantizedWeight(q.contiguous(), scale.contiguous(), kind)


def pack_weight(qw: QuantizedWeight, tile_n: int, tile_k: int, k_major: bool = False) -> QuantizedWeight:
    """The same weight with its values stored as contiguous (tile_n x tile_k) tiles, zero-padded at the edges: a
    kernel whose k-step reads one whole tile then streams one contiguous block instead of tile_n short row pieces."""
    if not isinstance(qw, QuantizedWeight):
        raise QuantizationError(f"pack_weight expects a QuantizedWeight, got {type(qw).__name__}")
    if min(tile_n, tile_k) < 1 or tile_n & (tile_n - 1) or tile_k & (tile_k - 1):
        raise QuantizationError(f"pack tile ({tile_n}, {tile_k}) must be powers of two")
    q = qw.rows()
    n, k = q.shape
    nt, kt = -(-n // tile_n), -(-k // tile_k)
    padded = torch.zeros(nt * tile_n, kt * tile_k, dtype=q.dtype, device=q.device)
    padded[:n, :k] = q
    packed = padded.view(nt, tile_n, kt, tile_k).permute(2, 0, 1, 3) if k_major else \
        padded.view(nt, tile_n, kt, tile_k).permute(0, 2, 1, 3)
    return QuantizedWeight(packed.contiguous(), qw.scale, qw.kind, (tile_n, tile_k), k, k_major)
