"""The registry as data: what the control plane shows and validates about each kernel set, without importing torch.

`catalogue()` lists every registered set (plugins named by SITS_KERNEL_PLUGINS included) in registration order with
what the registry records (`KernelSet.catalogue_entry`): its parent and the ops it overrides (filled by `derive`),
and whether it is an example regression (`wrong` or `slow` on purpose). `sits-engine kernels --json` prints it; control_plane/adapters/kernel_catalog.json is its
committed copy for the built-in sets (tests/kernels/test_catalog.py keeps the two equal:
`python -m kernels.catalog --write` regenerates it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kernels.registry import get_kernel_set, list_kernel_sets

SHIPPED = Path(__file__).resolve().parent.parent / "control_plane" / "adapters" / "kernel_catalog.json"


def catalogue() -> list[dict]:
    return [get_kernel_set(n).catalogue_entry() for n in list_kernel_sets()]


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
