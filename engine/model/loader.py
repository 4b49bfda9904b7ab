"""Model sources: presets with random weights, or Hugging Face style checkpoint directories (read and write)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sits.engine.config import ModelConfig
from sits.engine.errors import UnknownModelError
from sits.engine.model.presets import PRESETS, preset, random_weights

if TYPE_CHECKING:   # resolving a model and its tokenizer needs no torch (the engine's API front); the weights do
    import torch

    WeightIter = Iterator[tuple[str, torch.Tensor]]
INDEX_FILE = "model.safetensors.index.json"


@dataclass(slots=True)
class ModelSource:
    name: str  # what /v1/models reports
    config: ModelConfig
    weights: Callable[[torch.device, torch.dtype], WeightIter]  # (HF name, tensor) on the device, in the dtype
    path: Path | None  # checkpoint directory (tokenizer.json lives there), None for presets


def resolve_model(model: str, seed: int = 0) -> ModelSource:
    """A preset name ("tiny", "llama3-8b") or a checkpoint directory."""
    if model in PRESETS:
        cfg = preset(model)
        return ModelSource(model, cfg, lambda device, dtype: random_weights(cfg, seed, device, dtype), None)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise UnknownModelError(f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}) "
                                f"nor a checkpoint directory")
    if not (path / "config.json").is_file():
        raise UnknownModelError(f"checkpoint directory {str(path)!r} has no config.json")
    try:
        cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    except json.JSONDecodeError as e:
        raise UnknownModelError(f"{path / 'config.json'} is not valid JSON: {e}") from None
    gen_cfg = path / "generation_config.json"
    if gen_cfg.is_file():  # instruct checkpoints list extra end-of-turn ids here (e.g. Llama 3's <|eot_id|>)
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
        for t in ([eos] if isinstance(eos, int) else eos or []):
            if t not in cfg.eos_token_id:
                cfg.eos_token_id.append(t)
    files = safetensors_files(path)
    return ModelSource(path.name or str(path), cfg,
                       lambda device, dtype: _read_safetensors(files, device, dtype), path)


def safetensors_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        files = sorted({path / f for f in weight_map.values()})
        missing = [str(f.name) for f in files if not f.is_file()]
        if missing:
            raise UnknownModelError(f"{index} names missing shard(s): {', '.join(missing)}")
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnknownModelError(f"checkpoint directory {str(path)!r} has no *.safetensors files")
    return files


def _read_safetensors(files: list[Path], device: torch.device, dtype: torch.dtype) -> WeightIter:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():
                yield name, st.get_tensor(name).to(device=device, dtype=dtype)


def write_checkpoint(path: str | Path, cfg: ModelConfig, weights: WeightIter, *, shards: int = 1) -> Path:
    """Write config.json and model.safetensors, or `shards` files plus model.safetensors.index.json."""
    from safetensors.torch import save_file

    if shards < 1:
        raise ValueError("shards must be >= 1")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in weights}
    (path / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2) + "\n")
    meta = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata=meta)
        return path
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        save_file(part, str(path / fname), metadata=meta)
        weight_map.update({n: fname for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (path / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                              indent=2) + "\n")
    return path


def write_tiny(path: str | Path, *, shards: int = 1, seed: int = 0, **overrides) -> Path:
    """The `tiny` preset's weights (same seed -> same model as EngineConfig(model="tiny")) as a checkpoint dir.

    `overrides` replace ModelConfig fields (e.g. tie_word_embeddings=True, rope_scaling=...).
    """
    import dataclasses

    cfg = dataclasses.replace(preset("tiny"), **overrides)
    return write_checkpoint(path, cfg, random_weights(cfg, seed), shards=shards)
