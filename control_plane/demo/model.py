"""Which model the demo's engines serve: a preset or checkpoint path as given, or `tiny-trained` -- the tiny
architecture trained first on the demo's device by bench/train_tiny.py (a subprocess: the control plane never imports
the engine) and cached, so that the correctness gate sees peaked next-token distributions like a real LLM's (random
bf16 weights leave it inconclusive: BENCHMARKS.md "Correctness gate")."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sits.wire.models import PRESET_NAMES

_REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINED = "tiny-trained"
TRAIN_STEPS = 400


@dataclass(slots=True, frozen=True)
class DemoModel:
    path: str          # what `sits-engine serve --model` gets
    label: str         # what the output says


def cache_dir(device: str) -> Path:
    """$SITS_CACHE_DIR/tiny-trained-<device> (default: the repository's .cache, git-ignored)."""
    return (Path(os.environ.get("SITS_CACHE_DIR") or _REPO_ROOT / ".cache") / f"{TRAINED}-{device}").resolve()


def resolve_model(name: str, device: str, out: Callable[[str], None], *, steps: int | None = None,
                  timeout_s: float = 600.0) -> DemoModel:
    """`name` as it is, or for `tiny-trained` the checkpoint trained on `device` (kept from an earlier run when
    cached). ValueError when it cannot be trained (no bench/train_tiny.py in an installed copy, or training failed)."""
    if name != TRAINED:   # a checkpoint path as the rollout needs it: absolute (the engines run here)
        path = name if name in PRESET_NAMES or "://" in name else os.path.abspath(name)
        return DemoModel(path, name)
    steps = steps or TRAIN_STEPS
    out_dir = cache_dir(device)
    script = _REPO_ROOT / "bench" / "train_tiny.py"
    if not (out_dir / "model.safetensors").is_file():
        if not script.is_file():
            raise ValueError(f"{TRAINED} needs bench/train_tiny.py (run the demo from the repository) or a cached "
                             f"checkpoint in {out_dir}; or pass --model tiny|llama3-8b|PATH")
        out(f"      training the tiny model on {device} ({steps} steps, cached in {out_dir}) ...")
        proc = subprocess.run([sys.executable, str(script), "--out", str(out_dir), "--device", device,
                               "--steps", str(steps), "--log-every", str(max(1, steps // 4))],
                              capture_output=True, text=True, timeout=timeout_s, cwd=str(_REPO_ROOT),
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  p for p in (str(_REPO_ROOT), os.environ.get("PYTHONPATH")) if p)})
        lines = [x for x in proc.stdout.splitlines() if x.strip()]
        if proc.returncode != 0 or not (out_dir / "model.safetensors").is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise ValueError(f"training the tiny model failed (exit {proc.returncode}): " + " | ".join(tail))
        if lines:
            out(f"      {lines[-1]}")
    return DemoModel(str(out_dir), f"{TRAINED} (tiny architecture trained on {device}, {out_dir})")
