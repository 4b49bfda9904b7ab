"""SITS inference engine: a LLaMA-family model over a paged KV cache with continuous batching.

Public names are imported lazily, so `import sits.engine.errors` (or the torch-free scheduler) does not load torch.
"""

import importlib

_EXPORTS = {
    "LLM": "sits.engine.llm", "GenerationResult": "sits.engine.llm", "LLMEngine": "sits.engine.llm_engine",
    "EngineConfig": "sits.engine.config", "SamplingParams": "sits.engine.sampling_params",
    "RequestOutput": "sits.engine.outputs", "EngineStats": "sits.engine.outputs",
    "EngineError": "sits.engine.errors", "InvalidRequestError": "sits.engine.errors", "QueueFullError": "sits.engine.errors",
    "StepError": "sits.engine.errors", "UnknownModelError": "sits.engine.errors",
    "TensorParallelError": "sits.engine.errors",
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
