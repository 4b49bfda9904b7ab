"""What the engine hands back: per-step request outputs and cumulative stats.

msgspec Structs (mutable, slotted, like a slots dataclass) so the engine-core process ships them to the API server as
msgpack arrays without converting (engine/core/messages.py): ~4x smaller and ~5x faster than as maps.
"""

from __future__ import annotations

import msgspec


class RequestOutput(msgspec.Struct, array_like=True):
    request_id: str
    new_token_ids: list[int]  # tokens generated this step
    new_text: str  # text added this step (incremental; stop strings cut; held back while it may start a stop string)
    finished: bool
    finish_reason: str | None  # None | "stop" | "length" | "abort"
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    logprobs: list[dict] | None  # per new token: {"token_id", "logprob", "top_logprobs": [(id, logprob), ...]}
    tenant: str
    # SamplingParams.prompt_logprobs: entries for prompt tokens 1.. (token 0 has no context), on the first output
    prompt_logprobs: list[dict] | None = None


class EngineStats(msgspec.Struct, array_like=True):
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    kv_cache_usage: float  # fraction of blocks referenced by live sequences
    prefix_cache_queries: int  # cumulative prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # cumulative prompt tokens found there
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    device_memory_bytes: int = 0  # held by the engine's CUDA caching allocator (weights, KV cache, activations); 0 on CPU
