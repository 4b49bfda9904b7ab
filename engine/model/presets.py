"""Named model presets with random weights (deterministic from a seed, identical in every process)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from typing import TYPE_CHECKING

from sits.engine.config import ModelConfig

if TYPE_CHECKING:   # torch loads with the weights: the engine's API front reads presets without it
    import torch

# Llama 3.1 style scaling, shrunk to the tiny model's context: extends 1024 trained positions to 4096.
TINY_ROPE_SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 1024}

PRESETS: dict[str, ModelConfig] = {
    # ~3.5M parameters; head_dim 64 with GQA (4 query heads over 2 kv heads) and llama3 rope scaling on.
    "tiny": ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
                        rope_theta=500000.0, rope_scaling=dict(TINY_ROPE_SCALING), max_position_embeddings=4096,
                        tie_word_embeddings=False, bos_token_id=256, eos_token_id=[257]),
    # The exact Meta-Llama-3-8B shape (random weights, for GPU benchmarks).
    "llama3-8b": ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                             rope_theta=500000.0, rope_scaling=None, max_position_embeddings=8192,
                             tie_word_embeddings=False, bos_token_id=128000, eos_token_id=[128001]),
}

GPU_ONLY = frozenset({"llama3-8b"})  # 8B random fp32 weights on a CPU would take minutes and 32 GB

_INIT_STD = 0.02
_SMALL_MODEL_PARAMS = 50_000_000  # below this, generate on CPU so every device gets the same weights


def preset(name: str) -> ModelConfig:
    return dataclasses.replace(PRESETS[name], eos_token_id=list(PRESETS[name].eos_token_id),
                               rope_scaling=dict(PRESETS[name].rope_scaling) if PRESETS[name].rope_scaling else None)


def weight_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Hugging Face LlamaForCausalLM parameter names and shapes, in a fixed order."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (cfg.num_attention_heads * d, h)),
            (p + "self_attn.k_proj.weight", (cfg.num_key_value_heads * d, h)),
            (p + "self_attn.v_proj.weight", (cfg.num_key_value_heads * d, h)),
            (p + "self_attn.o_proj.weight", (h, cfg.num_attention_heads * d)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.tie_word_embeddings:
        shapes.append(("lm_head.weight", (cfg.vocab_size, h)))
    return shapes


def num_params(cfg: ModelConfig) -> int:
    total = 0
    for _, shape in weight_shapes(cfg):
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def random_weights(cfg: ModelConfig, seed: int = 0, device: str | torch.device = "cpu",
                   dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) with N(0, 0.02) matrices and N(1, 0.1) norm weights, one tensor at a time, in `dtype`
    (None: float32).

    Small models are drawn on the CPU (the same weights on every device); large ones directly on `device`, which
    makes an 8B model take seconds on a GPU.
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    gen_device = torch.device("cpu") if num_params(cfg) < _SMALL_MODEL_PARAMS else torch.device(device)
    gen = torch.Generator(device=gen_device).manual_seed(seed)
    for name, shape in weight_shapes(cfg):
        t = torch.empty(shape, dtype=torch.float32 if gen_device.type == "cpu" else dtype, device=gen_device)
        t.normal_(1.0 if len(shape) == 1 else 0.0, 0.1 if len(shape) == 1 else _INIT_STD, generator=gen)
        yield name, t.to(device=device, dtype=dtype)
