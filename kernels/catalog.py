"""The registry as data: what the control plane shows and validates about each kernel set, without importing torch.

`catalogue()` lists every registered set (plugins named by SITS_KERNEL_PLUGINS included) in registration order with
what the registry records (`KernelSet.catalogue_entry`): its parent and the ops it overrides (filled by `derive`),
and whether it is an example regression (`wrong` or `slow` on purpose). `sits-engine kernels --json` prints it.
catalog.json beside this file is `builtin_catalogue()` committed, so `identity` names a built-in set without torch.
Nothing here writes files: `make catalog` (.ci/kernel_catalog.py) regenerates catalog.json and the copies the control
plane and the Helm chart read, and tests/kernels/test_catalog.py keeps every copy equal to the registry.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from sits.kernels.registry import PLUGINS_ENV, KernelSet, get_kernel_set, list_kernel_sets

SHIPPED = Path(__file__).with_name("catalog.json")


def catalogue() -> list[dict]:
    """Every registered set: what `sits-engine kernels --json` prints."""
    return [get_kernel_set(n).catalogue_entry() for n in list_kernel_sets()]


def builtin_catalogue() -> list[dict]:
    """The sets kernels/sets.py registers (no plugins, nothing a test registered): what catalog.json holds."""
    from sits.kernels import sets
    builtin = {v.name for v in vars(sets).values() if isinstance(v, KernelSet)}
    return [e for e in catalogue() if e["name"] in builtin]


def identity(name: str) -> tuple[str, str]:
    """(name, version) of the kernel set `name` for a process that only labels with it (the engine's API front, whose
    engine core loads the kernels): a built-in set from the committed catalogue, without importing torch; with
    plugins configured (they may add sets), or a name the catalogue lacks, from the registry itself, which raises
    UnknownKernelSetError for an unknown name."""
    if not os.environ.get(PLUGINS_ENV):
        try:
            shipped = json.loads(SHIPPED.read_text())["kernel_sets"]
        except (OSError, ValueError, KeyError):
            shipped = []
        for e in shipped:
            if e.get("name") == name and isinstance(e.get("version"), str):
                return name, e["version"]
    from sits import kernels   # registers the built-in sets (and imports torch)
    ks = kernels.get_kernel_set(name)
    return ks.name, ks.version


def dumps(entries: list[dict]) -> str:
    return json.dumps({"kernel_sets": entries}, indent=1) + "\n"
