"""Linear layers with (optionally fused) weights; every matmul goes through the kernel set's `linear`."""

from __future__ import annotations

import torch

from sits.kernels import QuantizedWeight, quantize_weight


class Linear:
    """y = x W^T with W [sum(out_splits), in_features]; the HF shards (q/k/v, gate/up) load into row slices."""

    def __init__(self, kernel_set, in_features: int, out_splits: list[int], device, dtype):
        self.ks = kernel_set
        self.out_splits = out_splits
        self.weight: torch.Tensor | QuantizedWeight = torch.empty(sum(out_splits), in_features, device=device,
                                                                  dtype=dtype)
        self.loaded = [False] * len(out_splits)

    def load(self, tensor: torch.Tensor, shard: int = 0) -> None:
        start = sum(self.out_splits[:shard])
        rows = self.out_splits[shard]
        if tuple(tensor.shape) != (rows, self.weight.shape[1]):
            raise ValueError(f"weight shard {shard} has shape {tuple(tensor.shape)}, expected "
                             f"{(rows, self.weight.shape[1])}")
        self.weight[start:start + rows].copy_(tensor)
        self.loaded[shard] = True

    def quantize(self, kind: str) -> None:
        self.weight = quantize_weight(self.weight, kind)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.ks.linear(x, self.weight)
