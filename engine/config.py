"""EngineConfig (what the user picks) and ModelConfig (the LLaMA architecture, from a preset or config.json)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sits.engine.errors import InvalidRequestError, UnknownModelError
from sits.kernels.registry import KV_CACHE_DTYPES

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = (None, "int8", "fp8")


@dataclass(slots=True)
class EngineConfig:
    model: str = "tiny"  # preset name or checkpoint directory
    kernels: str = "torch"
    device: str = "auto"  # auto = cuda if available else cpu
    dtype: str = "auto"  # auto = bfloat16 on cuda, float32 on cpu
    block_size: int = 64
    num_kv_blocks: int | None = None  # None = from free memory (cuda) or a fixed budget (cpu)
    # fraction of the GPU's memory this engine may take for weights + activations + KV cache (vLLM's flag); None =
    # 0.9 of the GPU minus what every process already uses (the old default)
    gpu_memory_utilization: float | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048  # per-step token budget (chunked prefill)
    # prefill tokens a step may carry while decodes ride along (None: the whole budget); smaller bounds the
    # inter-token gaps that prefills open, at the cost of time to first token under bursts
    # (engine/scheduling/scheduler.py)
    max_prefill_tokens_while_decoding: int | None = None
    max_model_len: int | None = None  # None = min(max_position_embeddings, 8192)
    enable_prefix_caching: bool = True
    max_waiting: int = 1024
    quantization: str | None = None
    # KV-cache pages: "auto" = the model's dtype; "fp8" = e4m3 with an fp32 scale per (token, kv head), ~2x the
    # tokens in the same memory (kernels/kv_fp8.py), with a kernel set that takes it (KernelSet.kv_cache_dtypes)
    kv_cache_dtype: str = "auto"
    max_blocks_per_tenant: int | None = None
    seed: int = 0  # seeds the weights of presets and the sampler of unseeded requests
    enforce_eager: bool = False  # True: no CUDA graphs (decode steps launch every kernel from Python)
    # steps with prefill tokens (up to 512) replayed piecewise from CUDA graphs, attention eager between the pieces
    # (engine/execution/piecewise_graphs.py), wherever decode steps use graphs; on the H200 it cut the open-loop ITL p99
    # by 24-53 % (BENCHMARKS.md "Piecewise graphs (H200)")
    piecewise_graphs: bool = True
    # warm-up measures every op of the kernel set that is not the reference's against it at the served shapes
    # (engine/execution/conformance.py); the report is served at GET /conformance for the correctness gate
    conformance: bool = True
    # ranks the model is split over (Megatron-style tensor parallelism, engine/parallel/): 1 = one process, no
    # torch.distributed; N > 1 = rank 0 here and N - 1 worker processes, one GPU each on CUDA (cuda:0..N-1)
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if not isinstance(self.model, str) or not self.model:
            raise InvalidRequestError("model must be a preset name or a checkpoint directory", "model")
        if not isinstance(self.kernels, str) or not self.kernels:
            raise InvalidRequestError("kernels must be a kernel set name", "kernels")
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            raise InvalidRequestError(f"device must be one of {DEVICES} or cuda:N, got {self.device!r}", "device")
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype must be one of {DTYPES}, got {self.dtype!r}", "dtype")
        if self.quantization not in QUANTIZATIONS:
            raise InvalidRequestError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}",
                                      "quantization")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidRequestError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}",
                                      "kv_cache_dtype")
        _positive(self.block_size, "block_size")
        _positive(self.max_num_seqs, "max_num_seqs")
        _positive(self.max_num_batched_tokens, "max_num_batched_tokens")
        _positive(self.max_waiting, "max_waiting")
        _positive(self.tensor_parallel_size, "tensor_parallel_size")
        if self.tensor_parallel_size > 1 and str(self.device).startswith("cuda:"):
            raise InvalidRequestError(f"device {self.device!r} names one GPU, but tensor_parallel_size "
                                      f"{self.tensor_parallel_size} runs rank r on cuda:r of the visible GPUs: use "
                                      f"device 'cuda' or 'auto' (CUDA_VISIBLE_DEVICES picks the GPUs)", "device")
        for name in ("num_kv_blocks", "max_model_len", "max_blocks_per_tenant", "max_prefill_tokens_while_decoding"):
            if getattr(self, name) is not None:
                _positive(getattr(self, name), name)
        g = self.gpu_memory_utilization
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0.0 < g <= 1.0):
            raise InvalidRequestError(f"gpu_memory_utilization must be a fraction in (0, 1], got {g!r}",
                                      "gpu_memory_utilization")
        for name in ("enforce_eager", "piecewise_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a boolean", name)
        if not isinstance(self.enable_prefix_caching, bool):
            raise InvalidRequestError("enable_prefix_caching must be a boolean", "enable_prefix_caching")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidRequestError("seed must be an integer", "seed")


@dataclass(slots=True)
class ModelConfig:
    """LLaMA-family architecture (Llama 2/3 config.json fields)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0  # 0 = hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3", "factor", "low_freq_factor", ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            _positive(getattr(self, name), name, UnknownModelError)
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnknownModelError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise UnknownModelError(f"head_dim must be even, got {self.head_dim}")
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        self.eos_token_id = list(self.eos_token_id or [])
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ("default", "llama3", "linear"):
                raise UnknownModelError(f"unsupported rope_scaling type {kind!r} (supported: llama3, linear)")

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        """Parse a Hugging Face config.json (transformers 4 `rope_scaling` or 5 `rope_parameters` layout)."""
        if cfg.get("model_type", "llama") not in ("llama", "mistral") and \
                not any("Llama" in a for a in cfg.get("architectures", [])):
            raise UnknownModelError(f"only LLaMA-family checkpoints are supported, got model_type "
                                    f"{cfg.get('model_type')!r}")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
        theta = cfg.get("rope_theta", (rope or {}).get("rope_theta", 10000.0))
        if rope is not None:
            rope = {k: v for k, v in rope.items() if k != "rope_theta"}
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = None
        try:
            return cls(
                vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
                num_attention_heads=cfg["num_attention_heads"],
                num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                head_dim=cfg.get("head_dim") or 0, rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
                rope_theta=float(theta), rope_scaling=rope,
                max_position_embeddings=cfg.get("max_position_embeddings", 2048),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id") or [],
            )
        except KeyError as e:
            raise UnknownModelError(f"config.json lacks the field {e.args[0]!r}") from None

    def to_hf(self) -> dict:
        """The config.json a transformers LlamaForCausalLM loads (rope_scaling layout, read by v4 and v5)."""
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings, "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        }
        if self.bos_token_id is not None:
            cfg["bos_token_id"] = self.bos_token_id
        if self.eos_token_id:
            cfg["eos_token_id"] = self.eos_token_id[0] if len(self.eos_token_id) == 1 else self.eos_token_id
        return cfg


def _positive(value, name: str, error=InvalidRequestError) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise error(f"{name} must be a positive integer, got {value!r}", *((name,) if error is InvalidRequestError else ()))
