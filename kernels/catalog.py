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


def kv_cache_dtype_error(name: str, kv_cache_dtype: str, entries: list[dict] | None = None) -> str | None:
    """Why kernel set `name` cannot take KV pages of `kv_cache_dtype` (naming the sets that can), or None when it can
    or is not in `entries` (an unknown name is identity's and get_kernel_set's to report). `entries`: catalogue
    entries, by default the committed catalogue of the built-in sets (no torch) unless plugins are configured."""
    if entries is None:
        entries = _shipped() if not os.environ.get(PLUGINS_ENV) else catalogue()
    takes = {e["name"]: e.get("kv_cache_dtypes") or ["auto"] for e in entries if isinstance(e.get("name"), str)}
    if name not in takes or kv_cache_dtype in takes[name]:
        return None
    able = [n for n, kinds in takes.items() if kv_cache_dtype in kinds]
    return (f"kv_cache_dtype {kv_cache_dtype!r} needs a kernel set that takes it: {name!r} takes "
            f"{', '.join(takes[name])} only; kernel sets that take {kv_cache_dtype!r}: {', '.join(able) or '(none)'}")


def _shipped() -> list[dict]:
    try:
        return json.loads(SHIPPED.read_text())["kernel_sets"]
    except (OSError, ValueError, KeyError):
        return []


def identity(name: str) -> tuple[str, str]:
    """(name, version) of the kernel set `name` for a process that only labels with it (the engine's API front, whose
    engine core loads the kernels): a built-in set from the committed catalogue, without importing torch; with
    plugins configured (they may add sets), or a name the catalogue lacks, from the registry itself, which raises
    UnknownKernelSetError for an unknown name."""
    if not os.environ.get(PLUGINS_ENV):
        for e in _shipped():
            if e.get("name") == name and isinstance(e.get("version"), str):
                return name, e["version"]
    from sits import kernels   # registers the built-in sets (and imports torch)
    ks = kernels.get_kernel_set(name)
    return ks.name, ks.version


def dumps(entries: list[dict]) -> str:
    return json.dumps({"kernel_sets": entries}, indent=1) + "\n"
