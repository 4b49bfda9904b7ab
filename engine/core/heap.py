"""Garbage-collector policy of a serving process: after start-up, everything alive is moved out of the collector's
reach (`gc.freeze()`), as vLLM does after its server's init and warm-up (vllm/utils/gc_utils.py, `freeze_gc_heap`).

Start-up leaves hundreds of thousands of long-lived objects (torch, transformers, the model's modules, tokenizer
tables, the app). CPython's oldest-generation collection walks all of them, which can take tens of milliseconds, and
it runs every so often under a steady allocation rate: every stream waits for it. (One A/B run on an H200 showed no
consistent ITL difference either way: BENCHMARKS.md "Where the engine's time goes".) Frozen objects are never scanned again; what requests allocate later
is collected as before. At exit they are unfrozen again, so that interpreter teardown frees them as it always did
(extension modules such as nanobind's report objects still alive then as leaks). `SITS_GC_FREEZE=off` keeps the
default behaviour (to measure the difference).
"""
from __future__ import annotations

import atexit
import gc
import logging
import os

log = logging.getLogger(__name__)


def freeze_startup_heap(who: str) -> int:
    """Collect once, then freeze what is left; returns how many objects were frozen (0 when switched off)."""
    if os.environ.get("SITS_GC_FREEZE", "on").lower() in ("off", "0", "false", "no"):
        return 0
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    n = gc.get_freeze_count()
    log.info("%s: %d start-up objects frozen out of the garbage collector's scans", who, n)
    return n
