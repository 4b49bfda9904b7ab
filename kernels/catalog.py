"""The registry as data: what the control plane shows and validates about each kernel set, without importing torch.

`catalogue()` lists every registered set (plugins named by SITS_KERNEL_PLUGINS included) in registration order with
its parent (the earlier set it shares the most ops with: `derive` copies every op it does not replace), the ops it
overrides relative to that parent, and, where the registry says so, that it is an example regression (`wrong` or
`slow` on purpose). `sits-engine kernels --json` prints it; control_plane/adapters/kernel_catalog.json is its
committed copy for the built-in sets (tests/kernels/test_catalog.py keeps the two equal:
`python -m kernels.catalog --write` regenerates it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kernels.registry import OP_NAMES, get_kernel_set, list_kernel_sets

SHIPPED = Path(__file__).resolve().parent.parent / "control_plane" / "adapters" / "kernel_catalog.json"


def _impl(fn) -> str:
    """Which implementation an op is: module.qualname (two sets share an op exactly when they share this)."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def catalogue() -> list[dict]:
    sets = [get_kernel_set(n) for n in list_kernel_sets()]
    impls = {ks.name: {op: _impl(fn) for op, fn in ks.ops().items()} for ks in sets}
    out = []
    for i, ks in enumerate(sets):
        mine = impls[ks.name]
        parent, shared = None, 0
        for other in sets[:i]:
            n = sum(1 for op, f in impls[other.name].items() if mine[op] == f)
            if n > shared or (n == shared and n > 0):   # ties go to the later (the more derived) set
                parent, shared = other.name, n
        overrides = [op for op in OP_NAMES if parent is not None and impls[parent][op] != mine[op]]
        out.append({"name": ks.name, "version": ks.version, "devices": list(ks.devices),
                    "description": ks.description, "cuda_graphs": ks.graph_safe, "parent": parent,
                    "overrides": overrides, "regression": getattr(ks, "regression", None), "ops": mine})
    return out


def dumps(entries: list[dict]) -> str:
    return json.dumps({"kernel_sets": entries}, indent=1) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        SHIPPED.write_text(dumps(catalogue()))
        print(f"wrote {SHIPPED}")
        return 0
    sys.stdout.write(dumps(catalogue()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
