"""SITS inference engine: a LLaMA-family model over a paged KV cache with continuous batching."""

from engine.config import EngineConfig
from engine.errors import EngineError, InvalidRequestError, QueueFullError, StepError, UnknownModelError
from engine.llm import LLM, GenerationResult
from engine.llm_engine import LLMEngine
from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "GenerationResult", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput",
           "EngineStats", "EngineError", "InvalidRequestError", "QueueFullError", "StepError", "UnknownModelError"]
