"""Typed engine errors. Bad user input raises InvalidRequestError (a ValueError) naming the bad field."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class QueueFullError(EngineError):
    """The waiting queue holds max_waiting requests; the caller should retry later (HTTP 429/503)."""


class UnknownModelError(EngineError):
    """The model name is neither a preset nor a checkpoint directory."""


class StepError(EngineError):
    """The model failed during LLMEngine.step(). The sequences of that step were aborted (their blocks freed) and
    `.outputs` holds their final RequestOutputs (finish_reason "abort"); the engine stays usable."""

    def __init__(self, message: str, outputs: list):
        super().__init__(message)
        self.outputs = outputs
