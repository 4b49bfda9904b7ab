"""SITS inference engine: a LLaMA-family model over a paged KV cache with continuous batching.

Public names are imported lazily, so `import engine.errors` (or the torch-free scheduler) does not load torch.
"""

import importlib

_EXPORTS = {
    "LLM": "engine.llm", "GenerationResult": "engine.llm", "LLMEngine": "engine.llm_engine",
    "EngineConfig": "engine.config", "SamplingParams": "engine.sampling_params",
    "RequestOutput": "engine.outputs", "EngineStats": "engine.outputs",
    "EngineError": "engine.errors", "InvalidRequestError": "engine.errors", "QueueFullError": "engine.errors",
    "StepError": "engine.errors", "UnknownModelError": "engine.errors",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
