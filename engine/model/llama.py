"""LLaMA-family decoder (Llama 2/3: GQA, RMSNorm, SwiGLU, RoPE with llama3 scaling, optional tied embeddings).

Every norm / rope / attention / activation / matmul runs through the kernel set, so a new kernel set changes the
model's kernels without touching this file. Weights use Hugging Face names; q/k/v and gate/up load into fused
matrices.

Tensor parallelism (Megatron-LM's split, engine/parallel/): with a group of N ranks, rank r holds the r-th N-th of the
query and KV heads (q/k/v column-parallel), of the intermediate size (gate/up column-parallel), and the matching
input columns of o_proj and down_proj (row-parallel), whose partial outputs are summed by an all-reduce. The
embedding, the norms and the LM head are replicated. Without a group (N = 1) nothing of this runs.
"""

from __future__ import annotations

import re
from typing import Protocol

import torch
import torch.nn.functional as F

from sits.engine.config import ModelConfig
from sits.engine.errors import UnknownModelError
from sits.engine.model.layers.attention import Attention, AttentionMetadata
from sits.engine.model.layers.layernorm import RMSNorm
from sits.engine.model.layers.linear import Linear
from sits.engine.model.layers.rotary_embedding import rope_cos_sin
from sits.kernels import QuantizedWeight

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
_SHARDS = {  # HF sub-module -> (attribute of LlamaDecoderLayer, shard index)
    "self_attn.q_proj": ("qkv_proj", 0), "self_attn.k_proj": ("qkv_proj", 1), "self_attn.v_proj": ("qkv_proj", 2),
    "self_attn.o_proj": ("o_proj", 0), "mlp.gate_proj": ("gate_up_proj", 0), "mlp.up_proj": ("gate_up_proj", 1),
    "mlp.down_proj": ("down_proj", 0), "input_layernorm": ("input_layernorm", None),
    "post_attention_layernorm": ("post_attention_layernorm", None),
}
# the dimension of a HF weight that tensor parallelism splits: output rows (column-parallel), input columns (row-)
_SPLIT_DIM = {"qkv_proj": 0, "gate_up_proj": 0, "o_proj": 1, "down_proj": 1}


class TensorParallelGroup(Protocol):
    """This rank's place in a tensor-parallel group (engine/parallel/group.py)."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...   # the sum over the ranks, in place


class LlamaDecoderLayer:
    def __init__(self, cfg: ModelConfig, ks, device, dtype, tp: TensorParallelGroup | None = None):
        h, d, n = cfg.hidden_size, cfg.head_dim, tp.size if tp is not None else 1
        # this rank's heads and intermediate size (all of them without a group)
        self.hq, self.hkv, self.d = cfg.num_attention_heads // n, cfg.num_key_value_heads // n, d
        self.intermediate = cfg.intermediate_size // n
        self.tp = tp
        self.input_layernorm = RMSNorm(ks, h, cfg.rms_norm_eps, device, dtype)
        self.qkv_proj = Linear(ks, h, [self.hq * d, self.hkv * d, self.hkv * d], device, dtype)
        self.o_proj = Linear(ks, self.hq * d, [h], device, dtype)
        self.attn = Attention(ks, self.hq, self.hkv, d)
        self.post_attention_layernorm = RMSNorm(ks, h, cfg.rms_norm_eps, device, dtype)
        self.gate_up_proj = Linear(ks, h, [self.intermediate, self.intermediate], device, dtype)
        self.down_proj = Linear(ks, self.intermediate, [h], device, dtype)
        self.ks = ks

    def __call__(self, hidden, residual, positions, cos, sin, k_cache, v_cache, meta: AttentionMetadata):
        # hidden/residual: [T, H]
        qkv, residual = self.qkv(hidden, residual)
        return self.after_attention(self.attention(qkv, positions, cos, sin, k_cache, v_cache, meta), residual)

    # the three parts of a layer, also run apart: engine/execution/piecewise_graphs.py captures qkv and after_attention
    # in CUDA graphs and runs attention (whose shapes follow the batch's layout) between them
    def qkv(self, hidden, residual):
        """(input norm, with the residual add from the layer before) and the q/k/v projection -> (qkv, residual):
        the set's fused op, or the composition of its rms_norm / fused_add_rms_norm and linear (KernelSet.op)."""
        return self.ks.op("add_rms_norm_linear")(hidden, self.qkv_proj.weight, residual, self.input_layernorm.weight,
                                                 self.input_layernorm.eps)

    def attention(self, qkv, positions, cos, sin, k_cache, v_cache, meta: AttentionMetadata):
        """RoPE, the KV-cache write and attention over qkv [T, (Hq + 2 Hkv) D] -> [T, Hq D]."""
        t = qkv.shape[0]
        q_size, kv_size = self.hq * self.d, self.hkv * self.d
        # strided views into qkv, no copies: rope_and_cache takes any row/head strides (unit stride along head_dim)
        q = qkv[:, :q_size].view(t, self.hq, self.d)
        k = qkv[:, q_size:q_size + kv_size].view(t, self.hkv, self.d)
        v = qkv[:, q_size + kv_size:].view(t, self.hkv, self.d)
        return self.attn(q, k, v, positions, cos, sin, k_cache, v_cache, meta).reshape(t, q_size)

    def after_attention(self, attn, residual):
        """The output projection, the post-attention norm (with the residual add) and the MLP -> (hidden, residual)."""
        hidden = self.o_proj(attn)
        if self.tp is not None:   # row-parallel: each rank holds a partial sum
            hidden = self.tp.all_reduce(hidden)
        norm = self.post_attention_layernorm
        if self.ks.add_rms_norm_linear_silu_and_mul is not None:   # norm, gate/up projection and activation in one op
            act, residual = self.ks.add_rms_norm_linear_silu_and_mul(hidden, self.gate_up_proj.weight, residual,
                                                                     norm.weight, norm.eps)
            out = self.down_proj(act)
        else:
            x, residual = norm(hidden, residual)
            if self.ks.linear_silu_and_mul is not None:   # a set that fuses the activation into the gate/up projection
                out = self.down_proj(self.ks.linear_silu_and_mul(x, self.gate_up_proj.weight))
            elif self.ks.silu_and_mul_linear is not None:   # ... or into the down projection
                out = self.ks.silu_and_mul_linear(self.gate_up_proj(x), self.down_proj.weight)
            else:
                out = self.down_proj(self.ks.silu_and_mul(self.gate_up_proj(x)))
        if self.tp is not None:
            out = self.tp.all_reduce(out)
        return out, residual


class LlamaForCausalLM:
    def __init__(self, cfg: ModelConfig, kernel_set, device: torch.device, dtype: torch.dtype,
                 max_positions: int, tp: TensorParallelGroup | None = None):
        self.cfg = cfg
        self.device, self.dtype = device, dtype
        self.tp = tp   # None: the whole model on this device
        self.embed_tokens = torch.empty(cfg.vocab_size, cfg.hidden_size, device=device, dtype=dtype)
        self.layers = [LlamaDecoderLayer(cfg, kernel_set, device, dtype, tp) for _ in range(cfg.num_hidden_layers)]
        self.norm = RMSNorm(kernel_set, cfg.hidden_size, cfg.rms_norm_eps, device, dtype)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(kernel_set, cfg.hidden_size, [cfg.vocab_size],
                                                                  device, dtype)
        self.ks = kernel_set
        self.cos, self.sin = rope_cos_sin(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling, device)
        self._embed_loaded = False

    @torch.inference_mode()
    def load_weights(self, weights) -> None:
        """weights: iterable of (HF name, tensor). Raises UnknownModelError if a weight is missing or misshapen."""
        for name, tensor in weights:
            try:
                self._load_one(name, tensor)
            except ValueError as e:
                raise UnknownModelError(f"checkpoint weight {name!r}: {e}") from None
        missing = [name for name, loaded in self._loaded_flags() if not loaded]
        if missing:
            raise UnknownModelError(f"checkpoint lacks {len(missing)} weight(s), e.g. {missing[:3]}")

    def _load_one(self, name: str, tensor: torch.Tensor) -> None:
        if name == "model.embed_tokens.weight":
            if tensor.shape != self.embed_tokens.shape:
                raise ValueError(f"shape {tuple(tensor.shape)}, expected {tuple(self.embed_tokens.shape)}")
            self.embed_tokens.copy_(tensor)
            self._embed_loaded = True
        elif name == "model.norm.weight":
            self.norm.load(tensor)
        elif name == "lm_head.weight":
            if self.lm_head is not None:  # tied checkpoints may still carry a copy
                self.lm_head.load(tensor)
        elif m := _LAYER_KEY.match(name):
            idx, sub = int(m.group(1)), m.group(2)
            if idx >= len(self.layers) or sub not in _SHARDS:
                return  # e.g. rotary_emb buffers of old checkpoints
            attr, shard = _SHARDS[sub]
            if self.tp is not None and attr in _SPLIT_DIM:   # this rank's slice (the sizes divide: parallel/)
                tensor = tensor.chunk(self.tp.size, _SPLIT_DIM[attr])[self.tp.rank]
            module = getattr(self.layers[idx], attr)
            module.load(tensor) if shard is None else module.load(tensor, shard)

    def _loaded_flags(self):
        yield "model.embed_tokens.weight", self._embed_loaded
        yield "model.norm.weight", self.norm.loaded[0]
        if self.lm_head is not None:
            yield "lm_head.weight", self.lm_head.loaded[0]
        for i, layer in enumerate(self.layers):
            for sub, (attr, shard) in _SHARDS.items():
                yield f"model.layers.{i}.{sub}.weight", getattr(layer, attr).loaded[shard or 0]

    def quantize(self, kind: str) -> None:
        """Weight-only quantization of every decoder linear (embeddings and lm_head stay in the model dtype)."""
        for layer in self.layers:
            for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
                lin.quantize(kind)

    def largest_quantized_weight(self) -> int:
        """Elements of the largest quantized weight (0 when none is): a quantized linear may materialize one weight
        at a time in the model dtype (kernels/linear_dequant.py, the torch reference's upcast)."""
        return max((lin.weight.qweight.numel() for layer in self.layers
                    for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)
                    if isinstance(lin.weight, QuantizedWeight)), default=0)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, ...]],
                meta: AttentionMetadata) -> torch.Tensor:
        # input_ids/positions: [T] -> final hidden states [T, H]
        hidden = F.embedding(input_ids, self.embed_tokens)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, positions, self.cos, self.sin, k_cache, v_cache, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, H] (only the rows that sample) -> [B, V] fp32
        if self.lm_head is None:
            return self.ks.linear(hidden, self.embed_tokens).float()
        return self.lm_head(hidden).float()
