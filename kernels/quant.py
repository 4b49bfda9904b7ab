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
    qweight: torch.Tensor  # [N, K] int8 | float8_e4m3fn
    scale: torch.Tensor  # [N] fp32
    kind: str  # "int8" | "fp8"

    def __post_init__(self):
        if self.kind not in QUANT_KINDS:
            raise QuantizationError(f"quantization kind {self.kind!r} is not one of {QUANT_KINDS}")
        if self.qweight.dim() != 2 or self.qweight.dtype != _QDTYPE[self.kind]:
            raise QuantizationError(f"{self.kind} qweight must be 2-D {_QDTYPE[self.kind]}, got "
                                    f"{tuple(self.qweight.shape)} {self.qweight.dtype}")
        if self.scale.shape != (self.qweight.shape[0],) or self.scale.dtype != torch.float32:
            raise QuantizationError(f"scale must be fp32 [{self.qweight.shape[0]}], got "
                                    f"{tuple(self.scale.shape)} {self.scale.dtype}")
        if self.scale.device != self.qweight.device:
            raise QuantizationError("qweight and scale must be on the same device")

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    def to(self, device) -> QuantizedWeight:
        return QuantizedWeight(self.qweight.to(device), self.scale.to(device), self.kind)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.to(torch.float32) * self.scale[:, None]).to(dtype)

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
